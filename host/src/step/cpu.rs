//! The step on the CPU: every op is the gpu-shared replica of its kernel (through the
//! [`CpuBackend`] host-slice traits, which split rows over the machine's threads), on buffers
//! in host memory. The weights stay where the model keeps them (the memory map).
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::{act_len, StateSizes, check_run, emitted_from, picks_greedy, qx_len, Act, Emitted, Executor, Op, Pick, Qx, Window, MAX_WINDOW};
use crate::backends::{Backend, ExpertTensor, FloatWeights, MoeOut, MoeWindow, Variant, Weights as QWeights};
use crate::backends::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::model::{float_format, WeightId};
use crate::model::Model;
use crate::ops::attention::{rope_table, AttentionOps, AttnShape};
use crate::ops::gdn::GdnOps;
use crate::ops::norm::NormOps;
use crate::ops::route::RouteOps;
use crate::ops::spec::SpecOps;
use strata_gpu_shared::formats::q8_1;

pub struct CpuExecutor {
    model: Arc<Model>,
    cpu: CpuBackend,
    n_ctx: usize,
    /// The window's ids and first position; [`Op::Accept`] moves both on.
    tokens: Vec<u32>,
    pos: u32,
    /// Queued steps' tokens, not read yet.
    queue: VecDeque<Emitted>,
    act: HashMap<Act, Vec<f32>>,
    qx: HashMap<Qx, Vec<u8>>,
    /// Per layer: K and V caches (f16 bits, `n_ctx * n_head_kv * head_dim`; empty for a
    /// Gated DeltaNet layer).
    cache: Vec<(Vec<u16>, Vec<u16>)>,
    /// Per layer: the Gated DeltaNet conv ring and recurrent states (empty for attention).
    gdn: Vec<(Vec<f32>, Vec<f32>)>,
    rope: Vec<f32>,
    ids: Vec<u32>,
    route_w: Vec<f32>,
    next: Vec<u32>,
    /// The accepted count, then the window's chosen ids (`spec_accept`).
    accept: Vec<u32>,
    /// Greedy picking's all-NaN flag per row, and whether the last pick was greedy.
    all_nan: Vec<u32>,
    greedy: bool,
}

impl CpuExecutor {
    /// Allocates the step's buffers and a KV cache of `n_ctx` positions; refuses, before
    /// allocating, a context the host memory cannot hold.
    pub fn new(model: Arc<Model>, n_ctx: usize) -> Result<CpuExecutor> {
        let c = model.config.clone();
        let sizes = StateSizes::of(&c, n_ctx);
        let need = sizes.bytes() + 4 * n_ctx * c.n_rot;
        if let Some(avail) = available_memory() {
            if need > avail {
                return Err(Error::Request(format!(
                    "a {n_ctx}-position context needs {:.2} GiB of host memory for the KV cache and recurrent state; {:.2} GiB are available (lower --ctx)",
                    need as f64 / (1u64 << 30) as f64,
                    avail as f64 / (1u64 << 30) as f64
                )));
            }
        }
        let act = Act::ALL.into_iter().map(|a| (a, vec![0.0; MAX_WINDOW * act_len(&c, a)])).collect();
        let qx = Qx::ALL.into_iter().map(|q| (q, vec![0u8; q8_1::bytes_of(MAX_WINDOW * qx_len(&c, q))])).collect();
        let cache = sizes.layers.iter().map(|l| (vec![0u16; l.kv], vec![0u16; l.kv])).collect();
        let gdn = sizes.layers.iter().map(|l| (vec![0.0f32; l.ring], vec![0.0f32; l.state])).collect();
        Ok(CpuExecutor {
            rope: rope_table(n_ctx, c.n_rot, c.rope_freq_base),
            cpu: CpuBackend::new(),
            n_ctx,
            tokens: Vec::new(),
            pos: 0,
            queue: VecDeque::new(),
            act,
            qx,
            cache,
            gdn,
            ids: vec![0; MAX_WINDOW * c.n_expert_used],
            route_w: vec![0.0; MAX_WINDOW * c.n_expert_used],
            next: vec![0; MAX_WINDOW],
            accept: vec![0; MAX_WINDOW + 1],
            all_nan: vec![0; MAX_WINDOW],
            greedy: false,
            model,
        })
    }

    /// The first `rows` rows of an activation.
    fn rows(&self, a: Act, rows: usize) -> &[f32] {
        &self.act[&a][..rows * act_len(&self.model.config, a)]
    }

    /// `out = q8_1(x)` for the first `rows` rows (the replica's `quantize_q8_1`).
    fn quantize_rows(&mut self, x: Act, out: Qx, rows: usize) -> Result<()> {
        let mut q = std::mem::take(self.qx.get_mut(&out).expect("allocated"));
        let n = act_len(&self.model.config, x);
        let r = self.cpu.quantize_q8_1(self.rows(x, rows), &mut q[..q8_1::bytes_of(rows * n)]);
        self.qx.insert(out, q);
        r
    }

    /// Takes an activation out to write it (put back with [`Self::put`]).
    fn take(&mut self, a: Act) -> Vec<f32> {
        std::mem::take(self.act.get_mut(&a).expect("every activation is allocated"))
    }

    fn put(&mut self, a: Act, v: Vec<f32>) {
        self.act.insert(a, v);
    }

    /// Runs the list for `w` (ids and position in place) and queues what it emitted.
    fn step(&mut self, ops: &[Op], w: Window) -> Result<()> {
        for op in ops {
            self.op(op, w)?;
        }
        let e = emitted_from(&self.accept, &self.all_nan, w.tokens, picks_greedy(ops));
        self.queue.push_back(e);
        Ok(())
    }

    fn attn_shape(&self, w: Window) -> AttnShape {
        let c = &self.model.config;
        AttnShape { tokens: w.tokens, n_q: c.n_head, n_kv: c.n_head_kv, hd: c.head_dim, n_rot: c.n_rot, n_ctx: self.n_ctx }
    }
}

impl Executor for CpuExecutor {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn set_tokens(&mut self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() || ids.len() > MAX_WINDOW {
            return Err(Error::Request(format!("{} tokens in one step (1..={MAX_WINDOW})", ids.len())));
        }
        self.tokens = ids.to_vec();
        Ok(())
    }

    fn op(&mut self, op: &Op, w: Window) -> Result<()> {
        super::check_window(w, self.tokens.len())?;
        let model = self.model.clone();
        let (c, weights) = (&model.config, &model.weights);
        let t = w.tokens;
        match *op {
            Op::Embed { table, out } => {
                let tw = weights.get(table);
                let mut o = self.take(out);
                let n = act_len(c, out);
                let r = self.cpu.embed_rows(weights.data(table), tw.ty, tw.rows, tw.cols, &self.tokens[..t], &mut o[..t * n]);
                self.put(out, o);
                r
            }
            Op::RmsNorm { x, w: nw, out } => {
                let mut o = self.take(out);
                let n = act_len(c, x);
                let r = self.cpu.rms_norm(self.rows(x, t), weights.f32s(nw), n, c.rms_eps, &mut o[..t * n]);
                self.put(out, o);
                r
            }
            Op::NormQuant { x, w: nw, out, q } => {
                let (mut o, mut qb) = (self.take(out), std::mem::take(self.qx.get_mut(&q).expect("allocated")));
                let n = act_len(c, x);
                let r = self.cpu.rms_norm_q8_1(self.rows(x, t), weights.f32s(nw), n, c.rms_eps, &mut o[..t * n], &mut qb[..q8_1::bytes_of(t * n)]);
                self.qx.insert(q, qb);
                self.put(out, o);
                r
            }
            Op::Quantize { x, out } => self.quantize_rows(x, out, t),
            Op::Linear { w: id, xq, x, out, accumulate } => {
                let lw = weights.get(id);
                let mut o = self.take(out);
                let y = &mut o[..t * lw.rows];
                let r = match lw.ty {
                    GgmlType::Quant(format) => {
                        let q = &self.qx[&xq][..q8_1::bytes_of(t * lw.cols)];
                        self.cpu.mmvq(&QWeights { format, m: lw.rows, k: lw.cols, data: weights.data(id) }, q, t, accumulate, y)
                    }
                    ty => {
                        let format = float_format(ty).expect("not quantized, so float");
                        self.cpu.matvec(&FloatWeights { format, m: lw.rows, k: lw.cols, data: weights.data(id) }, self.rows(x, t), t, accumulate, y)
                    }
                };
                self.put(out, o);
                r
            }
            Op::AddWeight { acc, w: id } => {
                let mut a = self.take(acc);
                let n = t * act_len(c, acc);
                let b = &weights.f32s(id)[..n];
                let prev = a[..n].to_vec();
                let r = self.cpu.add(&prev, b, &mut a[..n]);
                self.put(acc, a);
                r
            }
            Op::AddInto { acc, b } => {
                let mut a = self.take(acc);
                let n = t * act_len(c, acc);
                let prev = a[..n].to_vec();
                let r = self.cpu.add(&prev, self.rows(b, t), &mut a[..n]);
                self.put(acc, a);
                r
            }
            Op::AttnPrep { layer, layout, q_norm, k_norm } => {
                let shape = self.attn_shape(w);
                let mut q_out = self.take(Act::Qr);
                let (mut kc, mut vc) = std::mem::take(&mut self.cache[layer]);
                let qn = t * act_len(c, Act::Qr);
                let ([q, k, v], strides) = layout.views(c);
                // Each input from its first value to the end of its last token's row.
                let view = |(a, first): (Act, usize), stride: usize, row: usize| &self.act[&a][first..first + (t - 1) * stride + row];
                let (q_row, kv_row) = (act_len(c, Act::Q), act_len(c, Act::K));
                let r = self.cpu.attn_prep(
                    view(q, strides.q, q_row),
                    view(k, strides.kv, kv_row),
                    view(v, strides.kv, kv_row),
                    strides,
                    weights.f32s(q_norm),
                    weights.f32s(k_norm),
                    &self.rope,
                    shape,
                    w.pos0,
                    c.rms_eps,
                    &mut q_out[..qn],
                    &mut kc,
                    &mut vc,
                );
                self.cache[layer] = (kc, vc);
                self.put(Act::Qr, q_out);
                r
            }
            Op::Attention { layer, q } => {
                let shape = self.attn_shape(w);
                let mut o = self.take(Act::Attn);
                let n = t * act_len(c, Act::Attn);
                let (kc, vc) = &self.cache[layer];
                let r = self.cpu.attention(self.rows(Act::Qr, t), kc, vc, shape, w.pos0, super::attn_scale(c.head_dim), &mut o[..n]);
                self.put(Act::Attn, o);
                // The fused quantization: the replica's `quantize_q8_1` after the attention.
                match (r, q) {
                    (Ok(()), Some(q)) => self.quantize_rows(Act::Attn, q, t),
                    (r, _) => r,
                }
            }
            Op::PrepAttention { .. } => {
                let [prep, attention] = op.unfused().expect("a joined op");
                self.op(&prep, w).and_then(|()| self.op(&attention, w))
            }
            Op::SigmoidMul { acc, gate } => {
                let mut a = self.take(acc);
                let n = t * act_len(c, acc);
                let prev = a[..n].to_vec();
                let r = self.cpu.sigmoid_mul(&prev, self.rows(gate, t), &mut a[..n]);
                self.put(acc, a);
                r
            }
            Op::GdnConv { layer, w: taps } => {
                let h = c.hybrid.as_ref().expect("GDN ops come from a hybrid model");
                let mut o = self.take(Act::Conv);
                let n = t * h.conv_channels();
                let (ring, _) = &mut self.gdn[layer];
                let r = self.cpu.gdn_conv(&self.act[&Act::Mixed][..n], weights.f32s(taps), ring, &mut o[..n], w.pos0 as u32, h.conv_channels(), h.d_conv);
                self.put(Act::Conv, o);
                r
            }
            Op::GdnRecur { layer, dt_bias, a } => {
                let h = c.hybrid.as_ref().expect("GDN ops come from a hybrid model");
                let shape = h.recur_shape(t);
                let mut o = self.take(Act::Gdn);
                let (_, state) = &mut self.gdn[layer];
                let r = self.cpu.gdn_recur(
                    &self.act[&Act::Conv][..t * shape.conv_row()],
                    &self.act[&Act::Alpha][..t * h.n_v_heads],
                    &self.act[&Act::Beta][..t * h.n_v_heads],
                    weights.f32s(dt_bias),
                    weights.f32s(a),
                    state,
                    &mut o[..t * h.inner()],
                    w.pos0 as u32,
                    shape,
                    c.rms_eps,
                    super::attn_scale(h.d_state),
                );
                self.put(Act::Gdn, o);
                r
            }
            Op::RmsNormGated { x, w: nw, z, out, n } => {
                let mut o = self.take(out);
                let len = t * act_len(c, x);
                let r = self.cpu.rms_norm_gated(self.rows(x, t), weights.f32s(nw), self.rows(z, t), n, c.rms_eps, &mut o[..len]);
                self.put(out, o);
                r
            }
            Op::Swiglu { gate, up, out } => {
                let mut o = self.take(out);
                let n = t * act_len(c, out);
                let r = self.cpu.swiglu(self.rows(gate, t), self.rows(up, t), &mut o[..n]);
                self.put(out, o);
                r
            }
            Op::AddGated { acc, y, s } => {
                let mut a = self.take(acc);
                let n = act_len(c, acc);
                let prev = a[..t * n].to_vec();
                let r = self.cpu.add_gated(&prev, self.rows(y, t), self.rows(s, t), n, &mut a[..t * n]);
                self.put(acc, a);
                r
            }
            Op::Concat { a, b, out } => {
                let mut o = self.take(out);
                let (na, nb) = (act_len(c, a), act_len(c, b));
                let r = self.cpu.concat_rows(self.rows(a, t), self.rows(b, t), na, nb, &mut o[..t * (na + nb)]);
                self.put(out, o);
                r
            }
            Op::LastRowFirst { act } => {
                let n = act_len(c, act);
                self.act.get_mut(&act).expect("allocated").copy_within((t - 1) * n..t * n, 0);
                Ok(())
            }
            Op::RouterTopK { k } => {
                let n = t * k;
                self.cpu.router_topk(&self.act[&Act::Router][..t * c.n_expert], c.n_expert, k, &mut self.ids[..n], &mut self.route_w[..n])
            }
            Op::Experts { gate, up, down, out, accumulate } => {
                let k = c.n_expert_used;
                let tensor = |id: WeightId| {
                    let e = weights.get(id);
                    let GgmlType::Quant(format) = e.ty else { unreachable!("the loader admits quantized experts only") };
                    ExpertTensor { format, n_expert: e.n_expert, rows: e.rows, cols: e.cols, data: weights.data(id) }
                };
                let mut o = self.take(out);
                let xq = &self.qx[&Qx::X][..q8_1::bytes_of(t * c.n_embd)];
                let win = MoeWindow { tokens: t, k, ids: &self.ids[..t * k], weights: &self.route_w[..t * k], xq, gate: tensor(gate), up: tensor(up), down: tensor(down) };
                let mut hq = vec![0u8; q8_1::bytes_of(t * k * c.n_ff_exp)];
                let mut y = vec![0f32; t * k * c.n_embd];
                let r = self.cpu.moe(&win, &mut MoeOut { hq: &mut hq, y: &mut y, out: &mut o[..t * c.n_embd], accumulate });
                self.put(out, o);
                r
            }
            Op::Pick(pick) => {
                let logits = &self.act[&Act::Logits][..t * c.n_vocab];
                match pick {
                    Pick::Greedy => {
                        self.greedy = true;
                        self.cpu.argmax_rows(logits, c.n_vocab, Variant::Fast, &mut self.next[..t], &mut self.all_nan[..t])
                    }
                    Pick::Sample(p) => {
                        self.greedy = false;
                        self.cpu.sample_rows(logits, c.n_vocab, p, w.pos0, &mut self.next[..t])
                    }
                }
            }
            Op::Accept => self.cpu.spec_accept(&mut self.tokens[..t], &self.next[..t], &mut self.accept[..t + 1], &mut self.pos),
        }
    }

    fn run(&mut self, ops: &[Op], w: Window) -> Result<()> {
        check_run(w, self.tokens.len(), self.n_ctx)?;
        self.pos = w.pos0 as u32;
        self.step(ops, w)
    }

    fn run_continued(&mut self, ops: &[Op], pos0: usize) -> Result<()> {
        if self.tokens.is_empty() || self.pos as usize != pos0 {
            return Err(Error::Request(format!("a continued window at position {pos0}, but the last step left position {} (or none)", self.pos)));
        }
        self.tokens.truncate(1);
        let w = Window { tokens: 1, pos0 };
        check_run(w, 1, self.n_ctx)?;
        self.step(ops, w)
    }

    fn emitted(&mut self) -> Result<Emitted> {
        self.queue.pop_front().ok_or_else(|| Error::Request("no queued step left to read".into()))
    }

    fn drain(&mut self) -> Result<()> {
        self.queue.clear();
        Ok(())
    }

    fn next_ids(&mut self, tokens: usize) -> Result<Vec<u32>> {
        self.drain()?;
        Ok(self.next[..tokens].to_vec())
    }

    fn logits(&mut self, tokens: usize) -> Result<Vec<f32>> {
        Ok(self.rows(Act::Logits, tokens).to_vec())
    }

    fn hidden(&mut self, tokens: usize) -> Result<Vec<f32>> {
        Ok(self.rows(Act::Hidden, tokens).to_vec())
    }

    fn nan_rows(&mut self, tokens: usize) -> Result<Vec<bool>> {
        Ok(self.all_nan[..tokens].iter().map(|&f| self.greedy && f != 0).collect())
    }

    fn loaded_tokens(&self) -> usize {
        self.tokens.len()
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes (None where there is no such file).
fn available_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<usize>().ok().map(|kib| kib * 1024)
}
