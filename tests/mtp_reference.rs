//! The qwen35moe MTP block (`Model::mtp_ops`, MODELS.md section 2 "MTP") against an independent
//! float64 reference of the spec's steps, written here from MODELS.md: the enorm / hnorm inputs
//! and `eh_proj` over `[embedding; hidden]`, a Qwen3.5 gated full-attention block with its own
//! causal KV cache over the MTP positions (per-head q/k norm, partial NEOX RoPE, GQA, the sigmoid
//! output gate), the routed experts (softmax, top-k, renormalised) plus the gated shared expert,
//! and the head norm and head (the block's own `nextn.*` tensors, or the trunk's).
//!
//! The reference reads every weight from the GGUF file by its tensor name (dequantized with the
//! f32 dequantizer, which is exact; no Strata step code): so it checks the loader's split of
//! `attn_q` into query and gate rows and its fallbacks as well. What it takes from Strata is the
//! trunk's output-normed hidden state h_p (the MTP's input; the trunk has tests of its own).
//!
//! On the CPU executor, for a random sequence S of `L` tokens, the trunk runs positions
//! 0..=L-2 and the MTP block the same positions fed S[p+1], in windows of 1, 3 and 8 tokens: the
//! MTP logits must be the same bits in every window size, and close to the reference (NMSE per
//! position, top-1 agreement). Then three chained one-token MTP steps (fed random ids) read the
//! MTP's own hidden state of the previous step, as the draft loop does; the reference is fed its
//! own h'. Each comparison shows it has power: the same figures against references broken on
//! purpose (the hidden state of another position, the next token's embedding replaced by the
//! current one's, the concatenation in the other order, no output gate, adjacent-pair RoPE, the
//! chain fed the previous position's h', the trunk's head where the file has the block's own)
//! must be far past the thresholds; and Strata's MTP op list broken on purpose (the concatenation
//! swapped, no output gate, no `LastRowFirst`, the trunk's attention cache) must fail the checks.
//!
//! Where the router's top-k boundary is a near-tie (probabilities within [`TIE_MARGIN`]), rounding
//! may choose either way: the reference then also computes the other selections and compares with
//! the closest (such positions are printed, with where ours took another selection).
mod common;

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::gguf::{GgmlType, GgufFile, GgufWriter};
use strata::host::model::synth::{build_in_memory, SynthSpec};
use strata::host::model::{float_format, Model};
use strata::host::reference::dequant_row_f32;
use strata::host::step::cpu::CpuExecutor;
use strata::host::step::{Executor, Op, Pick, Window};

/// Sequence length: the MTP runs positions 0..=L-2 (the token after each is known).
const L: usize = 40;
/// Window sizes the trunk and the MTP block run in (8: the largest window).
const WINDOWS: [usize; 3] = [1, 3, 8];
/// Chained one-token MTP steps after the windows.
const CHAIN: usize = 3;

// Thresholds. Measured on 60 seeds of each test (120 runs, 39 positions each): logits NMSE median
// 8.5e-5 to 1.2e-4, largest position 2.1e-4; h' largest 1.7e-4; chained steps largest 3.8e-4;
// top-1 agreement 89.7 % to 100 %, every disagreement a near-tie (the reference puts our choice
// at most 0.031 RMS below its maximum). Broken on purpose, smallest median: 0.42 to 256 (input,
// concatenation, chain and head mistakes), 3.5e-2 (no output gate), 2.3e-3 (adjacent-pair RoPE,
// weak here: 16 of 64 dims rotate, and at base 1e6 only the first few pairs turn much over 40
// positions; its largest position is 7.7e-3 or more, also past NMSE_MAX).
/// Median NMSE of the MTP logits over positions (2.7 x the largest measured).
const MEDIAN_NMSE_MAX: f64 = 3e-4;
/// No position's logits NMSE beyond this, chained steps included (2.6 x the largest measured).
const NMSE_MAX: f64 = 1e-3;
/// NMSE of the MTP's own hidden state h' (what the chain reads), every position.
const HIDDEN_NMSE_MAX: f64 = 1e-3;
/// Top-1 agreement of the logits at least.
const TOP1_MIN: f64 = 0.85;
/// Where the top-1 differs, the reference may put our choice at most this far (in units of the
/// reference row's RMS) below its maximum: a near-tie that rounding flips, not a wrong row
/// (measured at most 0.031; the broken references: up to 7).
const TOP1_GAP_MAX: f64 = 0.25;
/// A router whose selected and unselected experts' probabilities are closer than this is a
/// near-tie, which Strata's rounding may resolve either way (its router probabilities are off by
/// about 1e-3): the reference then accepts every such selection, the closest to ours.
const TIE_MARGIN: f64 = 1e-2;
/// A broken reference's median NMSE must be at least this many times MEDIAN_NMSE_MAX (measured:
/// at least 117 x); adjacent-pair RoPE at least [`ROPE_POWER_FACTOR`] x (measured: at least 7.8 x).
const POWER_FACTOR: f64 = 50.0;
const ROPE_POWER_FACTOR: f64 = 4.0;

/// A matrix of `rows` x `cols` dequantized values (ggml's ne1 x ne0).
struct Mat {
    rows: usize,
    cols: usize,
    v: Vec<f64>,
}

impl Mat {
    fn mul(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.cols);
        self.v.chunks_exact(self.cols).map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
    }

    fn row(&self, i: usize) -> &[f64] {
        &self.v[i * self.cols..(i + 1) * self.cols]
    }
}

/// Every value of tensor `name` of `file`, dequantized, and its dims.
fn tensor_f64(file: &GgufFile, name: &str) -> (Vec<usize>, Vec<f64>) {
    let t = file.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let data = file.data(t);
    let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    let k = dims[0];
    let rows = dims[1..].iter().product::<usize>();
    let mut out = Vec::with_capacity(k * rows);
    match t.ty {
        GgmlType::Quant(format) => {
            let rb = format.row_bytes(k);
            let mut tmp = Vec::with_capacity(k);
            for r in 0..rows {
                tmp.clear();
                dequant_row_f32(format, &data[r * rb..(r + 1) * rb], k, &mut tmp);
                out.extend(tmp.iter().map(|&v| v as f64));
            }
        }
        ty => {
            let f = float_format(ty).expect("a float type");
            let rb = k * f.bytes();
            for r in 0..rows {
                out.extend((0..k).map(|j| f.get(&data[r * rb..(r + 1) * rb], j) as f64));
            }
        }
    }
    (dims, out)
}

fn vector(file: &GgufFile, name: &str, n: usize) -> Vec<f64> {
    let (dims, v) = tensor_f64(file, name);
    assert_eq!(dims, [n], "{name}");
    v
}

fn matrix(file: &GgufFile, name: &str, cols: usize, rows: usize) -> Mat {
    let (dims, v) = tensor_f64(file, name);
    assert_eq!(dims, [cols, rows], "{name}");
    Mat { rows, cols, v }
}

/// A stack of `n` expert matrices `{cols, rows, n}`.
fn experts(file: &GgufFile, name: &str, cols: usize, rows: usize, n: usize) -> Vec<Mat> {
    let (dims, v) = tensor_f64(file, name);
    assert_eq!(dims, [cols, rows, n], "{name}");
    v.chunks_exact(rows * cols).map(|c| Mat { rows, cols, v: c.to_vec() }).collect()
}

/// The first tensor of `names` the file has.
fn first_of<'a>(file: &GgufFile, names: &[&'a str]) -> &'a str {
    names.iter().copied().find(|n| file.tensor(n).is_ok()).unwrap_or_else(|| panic!("none of {names:?}"))
}

/// The MTP block's weights, read by name (MODELS.md section 2), and the hyper-parameters.
struct MtpRef {
    n_embd: usize,
    n_head: usize,
    n_kv: usize,
    hd: usize,
    n_rot: usize,
    k_used: usize,
    eps: f64,
    base: f64,
    embed: Mat,
    enorm: Vec<f64>,
    hnorm: Vec<f64>,
    eh_proj: Mat,
    attn_norm: Vec<f64>,
    /// `attn_q` whole: per head [query (hd) | gate (hd)].
    q_full: Mat,
    k: Mat,
    v: Mat,
    q_norm: Vec<f64>,
    k_norm: Vec<f64>,
    o: Mat,
    post_norm: Vec<f64>,
    router: Mat,
    gate_exps: Vec<Mat>,
    up_exps: Vec<Mat>,
    down_exps: Vec<Mat>,
    sh_gate_inp: Vec<f64>,
    sh_gate: Mat,
    sh_up: Mat,
    sh_down: Mat,
    head_norm: Vec<f64>,
    head: Mat,
}

/// Which of the block's own optional tensors the reference takes (`own`), or the trunk's
/// fallbacks whatever the file has (a broken reference, where the file has its own).
fn mtp_ref(model: &Model, own: bool) -> MtpRef {
    let (f, c) = (&*model.weights.file, &model.config);
    let (n, n_embd, hd) = (c.n_layer, c.n_embd, c.head_dim);
    let h = c.hybrid.as_ref().expect("qwen35moe");
    let b = |t: &str| format!("blk.{n}.{t}.weight");
    let nx = |t: &str| format!("blk.{n}.nextn.{t}.weight");
    for fused in ["attn_qkv", "ffn_gate_up_exps"] {
        assert!(f.tensor(&b(fused)).is_err(), "the reference reads separate tensors, not {}", b(fused));
    }
    let (embed_own, norm_own, head_own) = (nx("embed_tokens"), nx("shared_head_norm"), nx("shared_head_head"));
    let pick = |own_name: &str, fallback: &[&str]| -> String {
        if own && f.tensor(own_name).is_ok() {
            own_name.to_string()
        } else {
            first_of(f, fallback).to_string()
        }
    };
    let embed_name = pick(&embed_own, &["token_embd.weight"]);
    let norm_name = pick(&norm_own, &["output_norm.weight"]);
    let head_name = pick(&head_own, &["output.weight", "token_embd.weight"]);
    let (q_dim, kv_dim) = (c.n_head * hd, c.n_head_kv * hd);
    MtpRef {
        n_embd,
        n_head: c.n_head,
        n_kv: c.n_head_kv,
        hd,
        n_rot: c.n_rot,
        k_used: c.n_expert_used,
        eps: c.rms_eps as f64,
        base: c.rope_freq_base as f64,
        embed: matrix(f, &embed_name, n_embd, c.n_vocab),
        enorm: vector(f, &nx("enorm"), n_embd),
        hnorm: vector(f, &nx("hnorm"), n_embd),
        eh_proj: matrix(f, &nx("eh_proj"), 2 * n_embd, n_embd),
        attn_norm: vector(f, &b("attn_norm"), n_embd),
        q_full: matrix(f, &b("attn_q"), n_embd, 2 * q_dim),
        k: matrix(f, &b("attn_k"), n_embd, kv_dim),
        v: matrix(f, &b("attn_v"), n_embd, kv_dim),
        q_norm: vector(f, &b("attn_q_norm"), hd),
        k_norm: vector(f, &b("attn_k_norm"), hd),
        o: matrix(f, &b("attn_output"), q_dim, n_embd),
        post_norm: vector(f, &b("post_attention_norm"), n_embd),
        router: matrix(f, &b("ffn_gate_inp"), n_embd, c.n_expert),
        gate_exps: experts(f, &b("ffn_gate_exps"), n_embd, c.n_ff_exp, c.n_expert),
        up_exps: experts(f, &b("ffn_up_exps"), n_embd, c.n_ff_exp, c.n_expert),
        down_exps: experts(f, &b("ffn_down_exps"), c.n_ff_exp, n_embd, c.n_expert),
        sh_gate_inp: vector(f, &b("ffn_gate_inp_shexp"), n_embd),
        sh_gate: matrix(f, &b("ffn_gate_shexp"), n_embd, h.n_ff_shexp),
        sh_up: matrix(f, &b("ffn_up_shexp"), n_embd, h.n_ff_shexp),
        sh_down: matrix(f, &b("ffn_down_shexp"), h.n_ff_shexp, n_embd),
        head_norm: vector(f, &norm_name, n_embd),
        head: matrix(f, &head_name, n_embd, c.n_vocab),
    }
}

/// A mistake built into a reference on purpose.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Bug {
    None,
    /// concat(ĥ, e) instead of concat(e, ĥ).
    SwappedConcat,
    /// The attention output without its sigmoid gate.
    NoOutputGate,
    /// RoPE pairing adjacent dims (2i, 2i+1) instead of NEOX's (i, i + n_rot/2).
    RopeAdjacent,
}

/// The reference's own KV cache of the MTP attention: per position, K and V (after norm and
/// RoPE), `n_kv * hd` each.
#[derive(Default, Clone)]
struct Cache {
    k: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

/// What one reference MTP position gives.
struct RefOut {
    logits: Vec<f64>,
    /// h' = RMSNorm(x) · head_norm: what a chained step reads.
    hidden: Vec<f64>,
    /// The router's k-th minus (k+1)-th probability (how close routing came to a tie).
    router_margin: f64,
    /// At a router near-tie (experts within [`TIE_MARGIN`] of the top-k boundary): the same
    /// position with each other selection of those experts, which rounding may choose as well.
    alt: Vec<RefOut>,
}

impl RefOut {
    /// The candidate (this output or a near-tie alternative) closest to `ours`.
    fn closest(&self, ours: &[f32]) -> &RefOut {
        std::iter::once(self).chain(&self.alt).min_by(|a, b| nmse(ours, &a.logits).total_cmp(&nmse(ours, &b.logits))).unwrap()
    }
}

/// Every way to choose `k` of `items`.
fn combinations(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![vec![]];
    }
    if items.len() < k {
        return vec![];
    }
    let mut with: Vec<Vec<usize>> = combinations(&items[1..], k - 1).into_iter().map(|mut c| {
        c.insert(0, items[0]);
        c
    }).collect();
    with.extend(combinations(&items[1..], k));
    with
}

fn rms(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    assert_eq!(x.len(), w.len());
    let s = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * s * w).collect()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

impl MtpRef {
    /// RoPE of one head's first `n_rot` dims at `pos` (the rest pass through).
    fn rope(&self, x: &mut [f64], pos: usize, bug: Bug) {
        let half = self.n_rot / 2;
        for i in 0..half {
            let theta = pos as f64 * self.base.powf(-2.0 * i as f64 / self.n_rot as f64);
            let (s, c) = theta.sin_cos();
            let (a, b) = if bug == Bug::RopeAdjacent { (2 * i, 2 * i + 1) } else { (i, i + half) };
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }

    /// One MTP position `pos`: token `token` (the one after `pos`) and hidden state `h` (the
    /// trunk's output-normed state at `pos`, or the previous MTP step's h'). Appends to `cache`,
    /// which must hold positions `0..pos`. At a router near-tie, `alt` holds the other choices.
    fn step(&self, cache: &mut Cache, pos: usize, token: u32, h: &[f64], bug: Bug) -> RefOut {
        let x = self.attend(cache, pos, token, h, bug);
        // 4: the router: softmax over all experts, the top k.
        let u = rms(&x, &self.post_norm, self.eps);
        let logits = self.router.mul(&u);
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = exp.iter().sum();
        let probs: Vec<f64> = exp.iter().map(|e| e / total).collect();
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let k = self.k_used;
        let mut out = self.experts_head(&x, &u, &probs, &order[..k]);
        if k < probs.len() {
            out.router_margin = probs[order[k - 1]] - probs[order[k]];
            // Rounding may choose either way among the selected experts within TIE_MARGIN of the
            // best unselected one and the unselected within TIE_MARGIN of the last selected.
            let (last_in, first_out) = (probs[order[k - 1]], probs[order[k]]);
            let near: Vec<usize> = (order[..k].iter().filter(|&&e| probs[e] - first_out < TIE_MARGIN))
                .chain(order[k..].iter().filter(|&&e| last_in - probs[e] < TIE_MARGIN))
                .copied()
                .collect();
            let sure: Vec<usize> = order[..k].iter().copied().filter(|e| !near.contains(e)).collect();
            for pick in combinations(&near, k - sure.len()) {
                let chosen: Vec<usize> = sure.iter().copied().chain(pick).collect();
                let mut sorted = chosen.clone();
                sorted.sort();
                let mut top = order[..k].to_vec();
                top.sort();
                if sorted != top {
                    out.alt.push(self.experts_head(&x, &u, &probs, &chosen));
                }
            }
        }
        out
    }

    /// Steps 1-3: the block's input and its gated attention, to the residual after it.
    fn attend(&self, cache: &mut Cache, pos: usize, token: u32, h: &[f64], bug: Bug) -> Vec<f64> {
        assert_eq!(cache.k.len(), pos, "the reference's cache holds positions 0..{pos}");
        let (n, hd, eps) = (self.n_embd, self.hd, self.eps);
        // 1-2: e, ĥ, x = eh_proj · concat(e, ĥ).
        let e = rms(self.embed.row(token as usize), &self.enorm, eps);
        let hh = rms(h, &self.hnorm, eps);
        let eh: Vec<f64> = if bug == Bug::SwappedConcat { [hh, e].concat() } else { [e, hh].concat() };
        let mut x = self.eh_proj.mul(&eh);
        assert_eq!(x.len(), n);
        // 3: gated attention.
        let a = rms(&x, &self.attn_norm, eps);
        let qf = self.q_full.mul(&a);
        let (mut q, mut gate) = (Vec::with_capacity(self.n_head * hd), Vec::with_capacity(self.n_head * hd));
        for head in qf.chunks_exact(2 * hd) {
            let mut qh = rms(&head[..hd], &self.q_norm, eps);
            self.rope(&mut qh, pos, bug);
            q.extend(qh);
            gate.extend_from_slice(&head[hd..]);
        }
        let (kx, vx) = (self.k.mul(&a), self.v.mul(&a));
        let mut k = Vec::with_capacity(self.n_kv * hd);
        for head in kx.chunks_exact(hd) {
            let mut kh = rms(head, &self.k_norm, eps);
            self.rope(&mut kh, pos, bug);
            k.extend(kh);
        }
        cache.k.push(k);
        cache.v.push(vx);
        let scale = 1.0 / (hd as f64).sqrt();
        let group = self.n_head / self.n_kv;
        let mut attn = vec![0.0; self.n_head * hd];
        for hq in 0..self.n_head {
            let kvh = hq / group;
            let qh = &q[hq * hd..(hq + 1) * hd];
            let scores: Vec<f64> = (0..=pos).map(|p| scale * qh.iter().zip(&cache.k[p][kvh * hd..(kvh + 1) * hd]).map(|(a, b)| a * b).sum::<f64>()).collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = w.iter().sum();
            let out = &mut attn[hq * hd..(hq + 1) * hd];
            for (p, wp) in w.iter().enumerate() {
                for (o, v) in out.iter_mut().zip(&cache.v[p][kvh * hd..(kvh + 1) * hd]) {
                    *o += wp / sum * v;
                }
            }
            if bug != Bug::NoOutputGate {
                for (o, g) in out.iter_mut().zip(&gate[hq * hd..(hq + 1) * hd]) {
                    *o *= sigmoid(*g);
                }
            }
        }
        for (xi, d) in x.iter_mut().zip(self.o.mul(&attn)) {
            *xi += d;
        }
        x
    }

    /// Steps 4-5 from the residual `x` and its normed `u`: the experts `chosen` (weighted by
    /// their renormalised probabilities), the gated shared expert, the head norm and head.
    fn experts_head(&self, x: &[f64], u: &[f64], probs: &[f64], chosen: &[usize]) -> RefOut {
        let norm: f64 = chosen.iter().map(|&e| probs[e]).sum::<f64>().max(6.1e-5);
        let mut ffn = vec![0.0; self.n_embd];
        let swiglu = |g: &Mat, up: &Mat, down: &Mat| {
            let act: Vec<f64> = g.mul(u).into_iter().zip(up.mul(u)).map(|(g, u)| silu(g) * u).collect();
            down.mul(&act)
        };
        for &e in chosen {
            let y = swiglu(&self.gate_exps[e], &self.up_exps[e], &self.down_exps[e]);
            for (f, y) in ffn.iter_mut().zip(y) {
                *f += probs[e] / norm * y;
            }
        }
        let s = sigmoid(self.sh_gate_inp.iter().zip(u).map(|(a, b)| a * b).sum());
        let y = swiglu(&self.sh_gate, &self.sh_up, &self.sh_down);
        let x: Vec<f64> = x.iter().zip(ffn).zip(y).map(|((xi, f), y)| xi + f + s * y).collect();
        // 5: head norm and head.
        let hidden = rms(&x, &self.head_norm, self.eps);
        assert_eq!(self.head.rows, self.embed.rows);
        RefOut { logits: self.head.mul(&hidden), hidden, router_margin: f64::INFINITY, alt: vec![] }
    }
}

/// Per-position NMSE and top-1 agreement of our rows against reference rows.
struct Stats {
    nmse: Vec<f64>,
    median: f64,
    max: f64,
    worst: usize,
    top1: f64,
    /// Where the top-1 differs: how far below the reference's maximum the reference puts our
    /// choice, in units of the reference row's RMS (the largest such gap).
    top1_gap: f64,
}

fn nmse(ours: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(ours.len(), reference.len());
    let (mut err, mut norm) = (0.0, 0.0);
    for (&a, &b) in ours.iter().zip(reference) {
        err += (a as f64 - b).powi(2);
        norm += b * b;
    }
    if err.is_nan() {
        f64::INFINITY
    } else {
        err / norm
    }
}

fn argmax<T: Copy + Into<f64>>(row: &[T]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i].into() > row[best].into() { i } else { best })
}

impl Stats {
    /// `rows`: (label position, our row, reference row).
    fn of<'a>(rows: impl Iterator<Item = (usize, &'a [f32], &'a [f64])>) -> Stats {
        let (mut nmse_all, mut agree, mut worst, mut max, mut top1_gap) = (Vec::new(), 0usize, 0, f64::MIN, 0f64);
        for (position, ours, theirs) in rows {
            let e = nmse(ours, theirs);
            if e > max || e.is_nan() {
                (worst, max) = (position, e);
            }
            nmse_all.push(e);
            let (a, b) = (argmax(ours), argmax(theirs));
            agree += usize::from(a == b);
            let rms = (theirs.iter().map(|v| v * v).sum::<f64>() / theirs.len() as f64).sqrt();
            top1_gap = top1_gap.max((theirs[b] - theirs[a]) / rms);
        }
        let n = nmse_all.len();
        let mut sorted = nmse_all.clone();
        sorted.sort_by(f64::total_cmp);
        let median = (sorted[(n - 1) / 2] + sorted[n / 2]) / 2.0;
        Stats { nmse: nmse_all, median, max, worst, top1: agree as f64 / n as f64, top1_gap }
    }

    fn line(&self) -> String {
        format!(
            "NMSE median {:.2e}, max {:.2e} (position {}), {} positions; top-1 agreement {:.1} % (largest gap {:.2e} RMS)",
            self.median,
            self.max,
            self.worst,
            self.nmse.len(),
            self.top1 * 100.0,
            self.top1_gap
        )
    }
}

/// What one executor produced: per MTP position its logits and (window 1 only, every
/// position; else the positions not in row 0) its h', the trunk's h_p, and the chained steps'
/// logits.
struct Run {
    window: usize,
    trunk_hidden: Vec<Vec<f32>>,
    mtp_logits: Vec<Vec<f32>>,
    mtp_hidden: Vec<Option<Vec<f32>>>,
    chain_logits: Vec<Vec<f32>>,
    /// Windows (by first position) after which row 0 of the hidden buffer was not the last row's.
    row0_wrong: Vec<usize>,
}

/// The trunk and the MTP block over positions 0..=L-2 of `seq` in windows of `window`, then
/// `chain.len()` chained one-token MTP steps fed `chain`, the MTP block's ops `mtp`.
fn run_strata(model: &Arc<Model>, mtp: &[Op], seq: &[u32], window: usize, chain: &[u32]) -> Run {
    let (n_embd, n_vocab) = (model.config.n_embd, model.config.n_vocab);
    let step = model.step_ops(Op::Pick(Pick::Greedy));
    let mut exec = CpuExecutor::new(model.clone(), L + CHAIN + 8).expect("cpu executor");
    let mut run = Run { window, trunk_hidden: vec![], mtp_logits: vec![], mtp_hidden: vec![], chain_logits: vec![], row0_wrong: vec![] };
    let last = L - 2;
    let mut pos0 = 0;
    while pos0 <= last {
        let tokens = window.min(last + 1 - pos0);
        let w = Window { tokens, pos0 };
        exec.set_tokens(&seq[pos0..pos0 + tokens]).unwrap();
        exec.run(&step, w).unwrap();
        exec.next_ids(tokens).unwrap();
        let h = exec.hidden(tokens).unwrap();
        run.trunk_hidden.extend(h.chunks_exact(n_embd).map(<[f32]>::to_vec));
        exec.set_tokens(&seq[pos0 + 1..=pos0 + tokens]).unwrap();
        exec.run(mtp, w).unwrap();
        let picked = exec.next_ids(tokens).unwrap();
        let logits = exec.logits(tokens).unwrap();
        for (row, &id) in logits.chunks_exact(n_vocab).zip(&picked) {
            assert_eq!(row[id as usize], row[argmax(row)], "window {window}, position {pos0}+: the MTP picked {id}, not its row's maximum");
        }
        run.mtp_logits.extend(logits.chunks_exact(n_vocab).map(<[f32]>::to_vec));
        // Row 0 holds the last row's h' after the step (the chain's input); rows 1.. their own.
        let hid = exec.hidden(tokens).unwrap();
        for (t, row) in hid.chunks_exact(n_embd).enumerate() {
            run.mtp_hidden.push((t > 0 || tokens == 1).then(|| row.to_vec()));
        }
        if hid[..n_embd] != hid[(tokens - 1) * n_embd..] {
            run.row0_wrong.push(pos0);
        }
        pos0 += tokens;
    }
    for (i, &d) in chain.iter().enumerate() {
        exec.set_tokens(&[d]).unwrap();
        exec.run(mtp, Window { tokens: 1, pos0: L - 1 + i }).unwrap();
        exec.next_ids(1).unwrap();
        run.chain_logits.push(exec.logits(1).unwrap());
    }
    run
}

/// Per position the reference output (or its near-tie alternative) closest to our row.
fn closest_rows<'a>(outs: &'a [RefOut], ours: &[Vec<f32>]) -> Vec<&'a RefOut> {
    outs.iter().zip(ours).map(|(o, ours)| o.closest(ours)).collect()
}

fn first_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> Option<String> {
    for (p, (x, y)) in a.iter().zip(b).enumerate() {
        if let Some(i) = x.iter().zip(y).position(|(u, v)| u.to_bits() != v.to_bits()) {
            return Some(format!("position {p} value {i}: {:e} vs {:e}", x[i], y[i]));
        }
    }
    None
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// The whole check on `model` with the MTP block's ops `mtp`: window invariance, the reference,
/// the chain, the power checks; what failed (empty: all passed). `own_head`: the file carries the
/// block's own embedding, head norm and head (then a reference using the trunk's must be far off).
fn check(label: &str, model: &Arc<Model>, mtp: &[Op], seed: u64, own_head: bool) -> Vec<String> {
    let c = &model.config;
    assert!(model.weights.mtp.is_some(), "{label}: no MTP block loaded");
    eprintln!("{label}: {}", model.describe());
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0f_5e9);
    let seq: Vec<u32> = (0..L).map(|_| rng.random_range(0..c.n_vocab as u32)).collect();
    let chain: Vec<u32> = (0..CHAIN).map(|_| rng.random_range(0..c.n_vocab as u32)).collect();
    let positions = L - 1;
    let mut failures = Vec::new();

    // Strata, every window size: the same bits.
    let runs: Vec<Run> = WINDOWS.iter().map(|&w| run_strata(model, mtp, &seq, w, &chain)).collect();
    let base = &runs[0];
    assert_eq!(base.mtp_logits.len(), positions);
    if !base.mtp_logits.iter().flatten().all(|v| v.is_finite()) {
        failures.push("non-finite MTP logits".to_string());
    }
    for r in &runs {
        if !r.row0_wrong.is_empty() {
            failures.push(format!("windows of {}: row 0 of the hidden buffer is not the last row's h' after the windows at {:?}", r.window, r.row0_wrong));
        }
    }
    for r in &runs[1..] {
        if let Some(d) = first_difference(&base.trunk_hidden, &r.trunk_hidden) {
            failures.push(format!("the trunk's hidden state in windows of {} differs from windows of 1 at {d}", r.window));
        }
        if let Some(d) = first_difference(&base.mtp_logits, &r.mtp_logits) {
            failures.push(format!("MTP logits in windows of {} differ from windows of 1 at {d}", r.window));
        }
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        if let Some(p) = (0..positions).find(|&p| matches!((&base.mtp_hidden[p], &r.mtp_hidden[p]), (Some(a), Some(b)) if !same(a, b))) {
            failures.push(format!("MTP h' at position {p} differs in windows of {} from windows of 1", r.window));
        }
        if let Some(d) = first_difference(&base.chain_logits, &r.chain_logits) {
            failures.push(format!("chained MTP logits after windows of {} differ from after windows of 1 at chained {d}", r.window));
        }
    }
    if failures.is_empty() {
        eprintln!("{label}: MTP logits, h' and chained logits the same bits in windows of {WINDOWS:?}");
    }

    // The reference, fed Strata's trunk hidden states.
    let reference = mtp_ref(&model, true);
    let h: Vec<Vec<f64>> = base.trunk_hidden.iter().map(|r| to_f64(r)).collect();
    let pass = |r: &MtpRef, bug: Bug, hidden: &dyn Fn(usize) -> usize, token: &dyn Fn(usize) -> u32| -> (Vec<RefOut>, Cache) {
        let mut cache = Cache::default();
        let outs = (0..positions).map(|p| r.step(&mut cache, p, token(p), &h[hidden(p)], bug)).collect();
        (outs, cache)
    };
    let right_h = |p: usize| p;
    let right_t = |p: usize| seq[p + 1];
    // Per position the reference's output (or its near-tie alternative) closest to ours.
    let compare = |outs: &[RefOut]| {
        let chosen: Vec<Vec<f64>> = closest_rows(outs, &base.mtp_logits).into_iter().map(|o| o.logits.clone()).collect();
        Stats::of(base.mtp_logits.iter().zip(&chosen).enumerate().map(|(p, (a, b))| (p, a.as_slice(), b.as_slice())))
    };
    let (want, mut cache) = pass(&reference, Bug::None, &right_h, &right_t);
    let logits = compare(&want);
    eprintln!("{label}: MTP logits vs float64 reference: {}", logits.line());
    let want_hidden: Vec<&[f64]> = closest_rows(&want, &base.mtp_logits).into_iter().map(|o| o.hidden.as_slice()).collect();
    let hidden = Stats::of(
        base.mtp_hidden.iter().zip(&want_hidden).enumerate().map(|(p, (a, b))| (p, a.as_deref().expect("window 1 keeps every h'"), *b)),
    );
    eprintln!("{label}: MTP h' vs float64 reference: NMSE median {:.2e}, max {:.2e} (position {})", hidden.median, hidden.max, hidden.worst);
    let margin = want.iter().map(|o| o.router_margin).fold(f64::INFINITY, f64::min);
    let ties: Vec<usize> = (0..positions).filter(|&p| !want[p].alt.is_empty()).collect();
    let flipped: Vec<usize> = ties.iter().copied().filter(|&p| !std::ptr::eq(closest_rows(&want, &base.mtp_logits)[p], &want[p])).collect();
    eprintln!(
        "{label}: smallest router margin (k-th minus (k+1)-th probability) {margin:.2e}; near-ties (< {TIE_MARGIN:.0e}) at {ties:?}, where ours matches another selection at {flipped:?}"
    );

    // The chain: the reference fed its own h' of the last position, then of each chained step
    // (at a near-tie, the selection closest to ours).
    let chained = |cache: &mut Cache, mut prev: Vec<f64>| -> Vec<Vec<f64>> {
        chain
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let o = reference.step(cache, L - 1 + i, d, &prev, Bug::None);
                let c = o.closest(&base.chain_logits[i]);
                prev = c.hidden.clone();
                c.logits.clone()
            })
            .collect()
    };
    let chain_stats = |want: &[Vec<f64>]| Stats::of(base.chain_logits.iter().zip(want).enumerate().map(|(i, (a, b))| (L - 1 + i, a.as_slice(), b.as_slice())));
    let mut broken_cache = cache.clone();
    let chain_want = chained(&mut cache, want_hidden[positions - 1].to_vec());
    let chain = chain_stats(&chain_want);
    eprintln!("{label}: chained MTP logits vs float64 reference: {}", chain.line());

    // Broken on purpose: each must be far off.
    let mut broken: Vec<(String, Stats, f64)> = Vec::new();
    let mut add = |what: &str, s: Stats| {
        eprintln!("{label}: broken on purpose, {what}: {}", s.line());
        let factor = if what == "RopeAdjacent" { ROPE_POWER_FACTOR } else { POWER_FACTOR };
        broken.push((what.to_string(), s, factor));
    };
    let prev_h = |p: usize| (p + positions - 1) % positions;
    add("the hidden state of the previous position", compare(&pass(&reference, Bug::None, &prev_h, &right_t).0));
    add("the current token instead of the next", compare(&pass(&reference, Bug::None, &right_h, &|p| seq[p]).0));
    for bug in [Bug::SwappedConcat, Bug::NoOutputGate, Bug::RopeAdjacent] {
        add(&format!("{bug:?}"), compare(&pass(&reference, bug, &right_h, &right_t).0));
    }
    if own_head {
        add("the trunk's embedding, head norm and head", compare(&pass(&mtp_ref(&model, false), Bug::None, &right_h, &right_t).0));
    }
    // The chain fed the h' of the position before the last (a stale row 0).
    add("the chain fed the previous position's h'", chain_stats(&chained(&mut broken_cache, want_hidden[positions - 2].to_vec())));

    if !(logits.median <= MEDIAN_NMSE_MAX) {
        failures.push(format!("MTP logits median NMSE {:.2e} > {MEDIAN_NMSE_MAX:.0e}", logits.median));
    }
    if !(logits.max <= NMSE_MAX) {
        failures.push(format!("MTP logits NMSE {:.2e} at position {} > {NMSE_MAX:.0e}", logits.max, logits.worst));
    }
    if logits.top1 < TOP1_MIN {
        failures.push(format!("MTP top-1 agreement {:.1} % < {:.0} %", logits.top1 * 100.0, TOP1_MIN * 100.0));
    }
    for (what, s) in [("MTP", &logits), ("chained MTP", &chain)] {
        if !(s.top1_gap <= TOP1_GAP_MAX) {
            failures.push(format!("{what} top-1 differs where the reference puts ours {:.2e} RMS below its maximum (> {TOP1_GAP_MAX})", s.top1_gap));
        }
    }
    if !(hidden.max <= HIDDEN_NMSE_MAX) {
        failures.push(format!("MTP h' NMSE {:.2e} at position {} > {HIDDEN_NMSE_MAX:.0e}", hidden.max, hidden.worst));
    }
    if !(chain.max <= NMSE_MAX) {
        failures.push(format!("chained MTP logits NMSE {:.2e} at position {} > {NMSE_MAX:.0e}", chain.max, chain.worst));
    }
    for (what, s, factor) in &broken {
        if !(s.median >= factor * MEDIAN_NMSE_MAX) {
            failures.push(format!("no power: broken on purpose ({what}) has median NMSE {:.2e}, under {factor} x {MEDIAN_NMSE_MAX:.0e}", s.median));
        }
    }
    eprintln!(
        "{label}: thresholds: median NMSE {MEDIAN_NMSE_MAX:.0e}, every position {NMSE_MAX:.0e}, h' {HIDDEN_NMSE_MAX:.0e}, top-1 {:.0} % (disagreements within {TOP1_GAP_MAX} RMS); broken references at least {POWER_FACTOR} x the median bar ({ROPE_POWER_FACTOR} x for RoPE pairing)",
        TOP1_MIN * 100.0
    );
    failures
}

/// `SynthSpec::qwen35moe_tiny()` (4 layers, an MTP block with no embedding or head of its own),
/// random weights from `seed`.
fn tiny_spec(seed: u64) -> SynthSpec {
    let mut spec = SynthSpec::qwen35moe_tiny();
    spec.seed = seed;
    spec
}

fn load(bytes: Vec<u8>, what: &str) -> Arc<Model> {
    let file = GgufFile::from_bytes(bytes, what).expect("a synthetic file parses");
    Arc::new(Model::load(Arc::new(file)).expect("a synthetic qwen35moe loads"))
}

/// The MTP block with the trunk's embedding, output norm and head (the file has no `nextn.*`
/// of its own).
#[test]
fn mtp_matches_float64_reference() {
    let seed = common::seed("mtp_matches_float64_reference");
    let model = load(build_in_memory(&tiny_spec(seed)), "<synthetic qwen35moe with MTP>");
    let n = model.config.n_layer;
    for t in ["embed_tokens", "shared_head_norm", "shared_head_head"] {
        assert!(model.weights.file.tensor(&format!("blk.{n}.nextn.{t}.weight")).is_err(), "the preset is meant to fall back to the trunk's tensors");
    }
    let failures = check("mtp (trunk head)", &model, &model.mtp_ops().expect("an MTP block"), seed, false);
    assert!(failures.is_empty(), "seed {seed}: {}", failures.join("; "));
}

/// The same file with the block's own `nextn.embed_tokens` (the trunk head's values),
/// `nextn.shared_head_head` (the trunk embedding's values) and `nextn.shared_head_norm` (random):
/// Strata must use them, not the trunk's.
#[test]
fn mtp_own_embedding_and_head_match_float64_reference() {
    let seed = common::seed("mtp_own_embedding_and_head_match_float64_reference");
    let f = GgufFile::from_bytes(build_in_memory(&tiny_spec(seed)), "<synthetic>").expect("parses");
    let n = f.metadata.iter().find(|(k, _)| k == "qwen35moe.block_count").and_then(|(_, v)| v.as_u64()).expect("block_count") - 1;
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata.iter().filter(|(k, _)| k != "general.alignment") {
        w.meta(k, v.clone());
    }
    for t in &f.tensors {
        w.tensor(&t.name, &t.dims, t.ty, f.data(t).to_vec()).expect("a valid tensor");
    }
    let embd = f.tensor("token_embd.weight").unwrap();
    let out = f.tensor("output.weight").expect("the preset has an untied head");
    assert_eq!((&embd.dims, embd.ty), (&out.dims, out.ty), "embedding and head are alike, so they can swap");
    w.tensor(&format!("blk.{n}.nextn.embed_tokens.weight"), &out.dims, out.ty, f.data(out).to_vec()).unwrap();
    w.tensor(&format!("blk.{n}.nextn.shared_head_head.weight"), &embd.dims, embd.ty, f.data(embd).to_vec()).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x4ead);
    let norm: Vec<u8> = (0..embd.dims[0]).flat_map(|_| rng.random_range(0.5f32..1.5).to_le_bytes()).collect();
    w.tensor(&format!("blk.{n}.nextn.shared_head_norm.weight"), &[embd.dims[0]], GgmlType::F32, norm).unwrap();
    let model = load(w.to_bytes(), "<synthetic qwen35moe with its own MTP head>");
    let mtp = model.weights.mtp.as_ref().expect("an MTP block");
    let w = &model.weights;
    assert!(mtp.embed != w.token_embd && mtp.head != w.output && mtp.head_norm != w.output_norm, "the loader took the trunk's tensors");
    let failures = check("mtp (own head)", &model, &model.mtp_ops().expect("an MTP block"), seed, true);
    assert!(failures.is_empty(), "seed {seed}: {}", failures.join("; "));
}

/// The test has power over Strata itself: the MTP op list broken on purpose (one mistake each)
/// must fail the checks above.
#[test]
fn mtp_op_lists_broken_on_purpose_fail() {
    let seed = common::seed("mtp_op_lists_broken_on_purpose_fail");
    let model = load(build_in_memory(&tiny_spec(seed)), "<synthetic qwen35moe with MTP>");
    let ops = model.mtp_ops().expect("an MTP block");
    let n_layer = model.config.n_layer;
    let edit = |f: &dyn Fn(Op) -> Option<Op>| -> Vec<Op> { ops.iter().filter_map(|&op| f(op)).collect() };
    let mut trunk_attn = (0..n_layer).filter(|&l| matches!(model.weights.layers[l].mixer, strata::host::model::Mixer::Attention(_)));
    let trunk_attn = trunk_attn.next_back().expect("the trunk has an attention layer");
    let broken: Vec<(&str, Vec<Op>)> = vec![
        ("concat(ĥ, e)", edit(&|op| Some(match op {
            Op::Concat { a, b, out } => Op::Concat { a: b, b: a, out },
            op => op,
        }))),
        ("no output gate", edit(&|op| (!matches!(op, Op::SigmoidMul { .. })).then_some(op))),
        ("no LastRowFirst", edit(&|op| (!matches!(op, Op::LastRowFirst { .. })).then_some(op))),
        ("the trunk's last attention layer's cache", edit(&|op| Some(match op {
            Op::AttnPrep { layout, q_norm, k_norm, .. } => Op::AttnPrep { layer: trunk_attn, layout, q_norm, k_norm },
            Op::Attention { q, .. } => Op::Attention { layer: trunk_attn, q },
            Op::PrepAttention { layout, q_norm, k_norm, q, .. } => Op::PrepAttention { layer: trunk_attn, layout, q_norm, k_norm, q },
            op => op,
        }))),
    ];
    for (what, ops) in broken {
        let failures = check(&format!("mtp broken on purpose ({what})"), &model, &ops, seed, false);
        eprintln!("mtp broken on purpose ({what}): {} failures, first: {}", failures.len(), failures.first().map_or("none", String::as_str));
        assert!(!failures.is_empty(), "seed {seed}: the MTP ops with {what} passed every check");
    }
}
