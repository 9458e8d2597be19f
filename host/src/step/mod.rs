//! One decode step, described once and run by every backend.
//!
//! A model builds the step as a list of [`Op`]s over named activation buffers ([`Act`], [`Qx`])
//! and its weights ([`WeightId`]); an [`Executor`] (one per backend: [`cpu`] runs the gpu-shared
//! replicas on host memory, [`gpu`] enqueues the Rust or HIP kernels on one stream, with every
//! tensor resident on the device, and replays it as one CUDA graph per window size) runs the
//! list for a window of `tokens` consecutive positions starting at `pos0`. The window size and
//! position are arguments of the run, not of the list; the kernels read the position and ids
//! from device memory, so a captured step serves every position.
//!
//! Buffers hold [`MAX_WINDOW`] rows; a window of T tokens uses the first T.
pub mod cpu;
pub mod gpu;

use crate::error::Result;
use crate::model::{Mixer, ModelConfig, WeightId, Weights};
use crate::ops::attention::QkvStrides;
use crate::ops::route::SampleParams;
use strata_gpu_shared::launch::gdn::gdn_conv_ring;
use strata_gpu_shared::launch::norm::NQ_MAX_N;

/// The most tokens one step takes (a verify window).
pub const MAX_WINDOW: usize = 8;

/// The f32 activation buffers of a step, each `tokens` rows. An architecture uses some of them
/// (those it lacks have [`act_len`] 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// The residual stream (`n_embd`).
    X,
    /// The normed residual (`n_embd`).
    Xn,
    /// Q, K, V projections (`n_head * head_dim`, `n_head_kv * head_dim`).
    Q,
    K,
    V,
    /// The fused projection (`(n_head + 2 * n_head_kv) * head_dim`): each row q's values, then
    /// k's, then v's.
    Qkv,
    /// The gated attention's output gate (`n_head * head_dim`).
    Gate,
    /// The queries after the per-head norm and RoPE (`n_head * head_dim`).
    Qr,
    /// Attention output, heads concatenated (`n_head * head_dim`).
    Attn,
    /// Gated DeltaNet: the conv input (`attn_qkv`) and output (q, k, v heads), the output gate
    /// `z` and the recurrence's output before and after its gated norm (`n_v * d_state`), the
    /// beta and alpha projections (`n_v`).
    Mixed,
    Conv,
    Z,
    Gdn,
    GdnNormed,
    Beta,
    Alpha,
    /// A scratch row of `n_embd`: the MTP block's normed hidden state, before it is concatenated
    /// (the mixers' output projections add into `X` themselves).
    Proj,
    /// Router logits (`n_expert`).
    Router,
    /// The routed experts' combined output (`n_embd`), the shared expert's added in.
    Experts,
    /// The shared expert: gate and up projections and their SwiGLU (`n_ff_shexp`), its output
    /// (`n_embd`) and its gate logit (1).
    ShGate,
    ShUp,
    ShAct,
    ShOut,
    ShScale,
    /// The output-normed hidden state (`n_embd`): the head's input, and what the MTP block
    /// reads (the trunk's) and writes (its own, for the next draft).
    Hidden,
    /// The MTP block's input, `[enorm(embedding); hnorm(hidden)]` (`2 * n_embd`).
    Eh,
    /// Head logits (`n_vocab`).
    Logits,
}

impl Act {
    pub const ALL: [Act; 27] = [
        Act::X,
        Act::Xn,
        Act::Q,
        Act::K,
        Act::V,
        Act::Qkv,
        Act::Gate,
        Act::Qr,
        Act::Attn,
        Act::Mixed,
        Act::Conv,
        Act::Z,
        Act::Gdn,
        Act::GdnNormed,
        Act::Beta,
        Act::Alpha,
        Act::Proj,
        Act::Router,
        Act::Experts,
        Act::ShGate,
        Act::ShUp,
        Act::ShAct,
        Act::ShOut,
        Act::ShScale,
        Act::Hidden,
        Act::Eh,
        Act::Logits,
    ];
}

/// The q8_1 activation buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Qx {
    /// `Xn` quantized (`n_embd` values a row): the input of Q/K/V, the router, the experts, the head.
    X,
    /// `Attn` or `GdnNormed` quantized: the input of the mixer's output projection.
    Attn,
    /// `ShAct` quantized: the input of the shared expert's down projection.
    Sh,
    /// `Eh` quantized: the input of the MTP block's `eh_proj`.
    Eh,
}

impl Qx {
    pub const ALL: [Qx; 4] = [Qx::X, Qx::Attn, Qx::Sh, Qx::Eh];
}

/// Values per token row of an activation (0: the architecture has no such buffer).
pub fn act_len(c: &ModelConfig, a: Act) -> usize {
    let h = c.hybrid.as_ref();
    let gated = if h.is_some() { c.n_head * c.head_dim } else { 0 };
    match a {
        Act::X | Act::Xn | Act::Proj | Act::Experts | Act::Hidden => c.n_embd,
        Act::Eh => h.filter(|h| h.mtp).map_or(0, |_| 2 * c.n_embd),
        Act::Q | Act::Qr | Act::Attn => c.n_head * c.head_dim,
        Act::Gate => gated,
        Act::K | Act::V => c.n_head_kv * c.head_dim,
        Act::Qkv => (c.n_head + 2 * c.n_head_kv) * c.head_dim,
        Act::Mixed | Act::Conv => h.map_or(0, |h| h.conv_channels()),
        Act::Z | Act::Gdn | Act::GdnNormed => h.map_or(0, |h| h.inner()),
        Act::Beta | Act::Alpha => h.map_or(0, |h| h.n_v_heads),
        Act::Router => c.n_expert,
        Act::ShGate | Act::ShUp | Act::ShAct => h.map_or(0, |h| h.n_ff_shexp),
        Act::ShOut => h.map_or(0, |_| c.n_embd),
        Act::ShScale => h.map_or(0, |_| 1),
        Act::Logits => c.n_vocab,
    }
}

/// Values per token row of a q8_1 buffer (before quantization; 0: not used).
pub fn qx_len(c: &ModelConfig, q: Qx) -> usize {
    match q {
        Qx::X => c.n_embd,
        Qx::Attn => (c.n_head * c.head_dim).max(act_len(c, Act::GdnNormed)),
        Qx::Sh => act_len(c, Act::ShAct),
        Qx::Eh => act_len(c, Act::Eh),
    }
}

/// What a layer keeps from step to step, in elements: its K and V caches (`kv` f16 values
/// each), or its Gated DeltaNet conv ring and recurrent states (`ring`, `state` f32 values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerState {
    pub kv: usize,
    pub ring: usize,
    pub state: usize,
}

/// Every cache layer's [`LayerState`] for a context of `n_ctx` positions (the MTP block's
/// attention last).
pub struct StateSizes {
    pub layers: Vec<LayerState>,
}

impl StateSizes {
    pub fn of(c: &ModelConfig, n_ctx: usize) -> StateSizes {
        let kv = n_ctx * c.n_head_kv * c.head_dim;
        let layers = (0..c.cache_layers())
            .map(|i| match &c.hybrid {
                Some(h) if h.recurrent.get(i) == Some(&true) => {
                    let shape = h.recur_shape(0);
                    LayerState { kv: 0, ring: gdn_conv_ring(h.d_conv) * h.conv_channels(), state: shape.state_len() }
                }
                _ => LayerState { kv, ring: 0, state: 0 },
            })
            .collect();
        StateSizes { layers }
    }

    /// Bytes of all of it.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| 2 * 2 * l.kv + 4 * (l.ring + l.state)).sum()
    }
}

/// How the next token of each row is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pick {
    Greedy,
    Sample(SampleParams),
}

/// One operation of the step. Each names one kernel family's launch (the experts: the four
/// launches of the routed-expert window).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// `out[t]` = row `tokens[t]` of `table`, dequantized.
    Embed { table: WeightId, out: Act },
    /// `out = rms_norm(x) * w` per row (eps from the config).
    RmsNorm { x: Act, w: WeightId, out: Act },
    /// `out = q8_1(x)` per row.
    Quantize { x: Act, out: Qx },
    /// `out = rms_norm(x) * w` and `q = q8_1(out)` per row: [`Op::RmsNorm`] then
    /// [`Op::Quantize`] of its output in one kernel (`rms_norm_q8_1`, the same bits), which
    /// [`fuse`] makes of the two where the row fits its shared memory.
    NormQuant { x: Act, w: WeightId, out: Act, q: Qx },
    /// `out = w * input` per row, or with `accumulate` `out += w * input` (the residual add
    /// fused into the matvec: the bits of `Linear` then `AddInto`): quantized weights read `xq`,
    /// float weights read `x`.
    Linear { w: WeightId, xq: Qx, x: Act, out: Act, accumulate: bool },
    /// `acc += w` (a weight of [`MAX_WINDOW`] repeated rows: a bias).
    AddWeight { acc: Act, w: WeightId },
    /// `acc += b`.
    AddInto { acc: Act, b: Act },
    /// Per-head RMSNorm of Q and K, RoPE (into `Qr`), K and V appended to the layer's cache.
    AttnPrep { layer: usize, layout: QkvLayout, q_norm: WeightId, k_norm: WeightId },
    /// Causal GQA attention of each window token over the layer's cache: `Qr` to `Attn`, and
    /// with `q` the q8_1 rows of `Attn` as well (what a following [`Op::Quantize`] of `Attn`
    /// would write: [`fuse`] makes it so, and the kernel that writes `Attn` writes them).
    Attention { layer: usize, q: Option<Qx> },
    /// [`Op::AttnPrep`] then [`Op::Attention`] of its layer, which [`fuse`] joins: the CPU runs
    /// the two; the GPU launches them as one kernel where the window's contexts are one chunk
    /// (`GpuBackend::prep_attention_kernel`), else as the two. The prepared queries (`Qr`) are
    /// written only by the two.
    PrepAttention { layer: usize, layout: QkvLayout, q_norm: WeightId, k_norm: WeightId, q: Option<Qx> },
    /// `acc = acc * sigmoid(gate)` (the gated attention's output gate).
    SigmoidMul { acc: Act, gate: Act },
    /// Gated DeltaNet conv step over the window (`Mixed` to `Conv`), the layer's conv ring kept.
    GdnConv { layer: usize, w: WeightId },
    /// Gated DeltaNet delta rule over the window (`Conv`, `Alpha`, `Beta` to `Gdn`), the
    /// layer's recurrent state kept per position.
    GdnRecur { layer: usize, dt_bias: WeightId, a: WeightId },
    /// `out = rms_norm(x) * w * silu(z)` per row of `n` values (the GDN output norm per head).
    RmsNormGated { x: Act, w: WeightId, z: Act, out: Act, n: usize },
    /// `out = silu(gate) * up`.
    Swiglu { gate: Act, up: Act, out: Act },
    /// `acc += sigmoid(s) * y`, `s` one value per row (the shared expert's gate).
    AddGated { acc: Act, y: Act, s: Act },
    /// `out = [a | b]` per row (the MTP block's input).
    Concat { a: Act, b: Act, out: Act },
    /// Row `tokens - 1` of `act` copied to row 0: the MTP block's last hidden state, where the
    /// next one-token draft step reads it.
    LastRowFirst { act: Act },
    /// Softmax over the router logits, top-k, renormalised: the window's expert selections.
    RouterTopK { k: usize },
    /// The routed experts of the window (`Qx::X` in): their combined rows into `out`, or with
    /// `accumulate` added to it (as [`Op::Linear`]).
    Experts { gate: WeightId, up: WeightId, down: WeightId, out: Act, accumulate: bool },
    /// The next token of each row, from `Logits`.
    Pick(Pick),
    /// Verify-window acceptance: how many of the window's drafts (rows 1..) the model's own
    /// choices confirm, and the tokens the window emits.
    Accept,
}

/// Where [`Op::AttnPrep`] reads each token's q, k and v.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvLayout {
    /// One `Act::Qkv` row: q's values, then k's, then v's.
    Fused,
    /// `Act::Q`, `Act::K` and `Act::V`.
    Split,
}

impl QkvLayout {
    /// The buffer and first value of q's, k's and v's rows, and the strides between tokens'
    /// rows (each buffer's row length).
    pub fn views(self, c: &ModelConfig) -> ([(Act, usize); 3], QkvStrides) {
        let (q_dim, kv_dim) = (act_len(c, Act::Q), act_len(c, Act::K));
        match self {
            QkvLayout::Fused => {
                let row = act_len(c, Act::Qkv);
                ([(Act::Qkv, 0), (Act::Qkv, q_dim), (Act::Qkv, q_dim + kv_dim)], QkvStrides { q: row, kv: row })
            }
            QkvLayout::Split => ([(Act::Q, 0), (Act::K, 0), (Act::V, 0)], QkvStrides { q: q_dim, kv: kv_dim }),
        }
    }
}

impl Op {
    /// The weights the op reads.
    pub fn weights(&self) -> Vec<WeightId> {
        match *self {
            Op::Embed { table, .. } => vec![table],
            Op::RmsNorm { w, .. }
            | Op::NormQuant { w, .. }
            | Op::Linear { w, .. }
            | Op::AddWeight { w, .. }
            | Op::GdnConv { w, .. }
            | Op::RmsNormGated { w, .. } => vec![w],
            Op::AttnPrep { q_norm, k_norm, .. } | Op::PrepAttention { q_norm, k_norm, .. } => vec![q_norm, k_norm],
            Op::GdnRecur { dt_bias, a, .. } => vec![dt_bias, a],
            Op::Experts { gate, up, down, .. } => vec![gate, up, down],
            _ => vec![],
        }
    }

    /// The two ops an [`Op::PrepAttention`] joins (`None` for every other op).
    pub fn unfused(&self) -> Option<[Op; 2]> {
        match *self {
            Op::PrepAttention { layer, layout, q_norm, k_norm, q } => Some([Op::AttnPrep { layer, layout, q_norm, k_norm }, Op::Attention { layer, q }]),
            _ => None,
        }
    }
}

/// The op list with each quantization folded into the op before it where that op's kernel can
/// write the q8_1 rows itself (one launch fewer each, the same bits):
/// - an [`Op::RmsNorm`] immediately followed by the [`Op::Quantize`] of its output becomes one
///   [`Op::NormQuant`], where the row (`act_len(c, x)` values) fits `rms_norm_q8_1`'s shared
///   memory (`NQ_MAX_N`);
/// - an [`Op::Attention`] immediately followed by the quantization of `Attn` quantizes its own
///   output;
/// - an [`Op::AttnPrep`] immediately followed by the [`Op::Attention`] of its layer becomes one
///   [`Op::PrepAttention`] (which the quantization of `Attn` after it then joins as well).
///
/// Other ops, and pairs with longer rows, stay as they are.
pub fn fuse(ops: Vec<Op>, c: &ModelConfig) -> Vec<Op> {
    let mut out: Vec<Op> = Vec::with_capacity(ops.len());
    for op in ops {
        match (out.last(), op) {
            (Some(&Op::RmsNorm { x, w, out: n }), Op::Quantize { x: qx, out: q }) if qx == n && act_len(c, x) <= NQ_MAX_N => {
                *out.last_mut().expect("matched above") = Op::NormQuant { x, w, out: n, q };
            }
            (Some(&Op::Attention { layer, q: None }), Op::Quantize { x: Act::Attn, out: q }) => {
                *out.last_mut().expect("matched above") = Op::Attention { layer, q: Some(q) };
            }
            (Some(&Op::PrepAttention { layer, layout, q_norm, k_norm, q: None }), Op::Quantize { x: Act::Attn, out: q }) => {
                *out.last_mut().expect("matched above") = Op::PrepAttention { layer, layout, q_norm, k_norm, q: Some(q) };
            }
            (Some(&Op::AttnPrep { layer, layout, q_norm, k_norm }), Op::Attention { layer: a, q }) if a == layer => {
                *out.last_mut().expect("matched above") = Op::PrepAttention { layer, layout, q_norm, k_norm, q };
            }
            (_, op) => out.push(op),
        }
    }
    out
}

/// Where a step runs in the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub tokens: usize,
    pub pos0: usize,
}

/// What one step emitted, as the host learns it: the model's choices for the window's accepted
/// rows ([`Op::Accept`]), and per such row whether greedy picking found its logits all NaN
/// (false for every row when the step sampled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emitted {
    pub ids: Vec<u32>,
    pub all_nan: Vec<bool>,
}

/// A backend that runs op lists over its own buffers.
///
/// A step's window is either given by the host ([`Executor::set_tokens`], then
/// [`Executor::run`] at a position) or continued on the device ([`Executor::run_continued`]:
/// the previous step's [`Op::Accept`] wrote the next window's token and position where the
/// kernels read them). Steps are queued; [`Executor::emitted`] hands back each queued step's
/// tokens in order, waiting only for that step, so the host can queue the next step before it
/// reads the last one's tokens.
pub trait Executor {
    /// `cpu`, `cuda` or `hip`.
    fn name(&self) -> &'static str;
    /// Positions the KV cache holds.
    fn n_ctx(&self) -> usize;
    /// The next window's input token ids (`1..=MAX_WINDOW` of them), for [`Self::run`].
    fn set_tokens(&mut self, ids: &[u32]) -> Result<()>;
    /// Runs (or enqueues) one op for `w`, its position and ids already in place: the eager
    /// form of a step, for backends and tests that go op by op.
    fn op(&mut self, op: &Op, w: Window) -> Result<()>;
    /// Queues the whole list for window `w`, whose ids the last [`Self::set_tokens`] gave.
    fn run(&mut self, ops: &[Op], w: Window) -> Result<()>;
    /// Queues the list for a one-token window continuing the previous step: its token and
    /// position are the ones that step's [`Op::Accept`] wrote. `pos0` is where the host expects
    /// that window (checked against the context; on the CPU also against the position kept), and
    /// must be it: a GPU backend cannot check it without waiting, and sizes the attention for a
    /// context of `pos0 + 1` keys as a bound that holds (a graph for one-chunk contexts, replayed
    /// with a longer one, traps rather than compute a wrong step).
    fn run_continued(&mut self, ops: &[Op], pos0: usize) -> Result<()>;
    /// The tokens of the oldest queued step whose tokens were not read yet (waits for it).
    fn emitted(&mut self) -> Result<Emitted>;
    /// Waits for every queued step and forgets the tokens not read.
    fn drain(&mut self) -> Result<()>;
    /// Waits for every queued step (forgetting the tokens not read, as [`Self::drain`]) and
    /// returns the last one's chosen next id of each of its `tokens` rows.
    fn next_ids(&mut self, tokens: usize) -> Result<Vec<u32>>;
    /// The logits of the last step's `tokens` rows (`n_vocab` each), after [`Self::next_ids`]
    /// or [`Self::emitted`] of that step.
    fn logits(&mut self, tokens: usize) -> Result<Vec<f32>>;
    /// The output-normed hidden states (`Act::Hidden`, `n_embd` each) of the last step's
    /// `tokens` rows, after [`Self::next_ids`] or [`Self::emitted`] of that step (an MTP step
    /// leaves its last row's in row 0 as well).
    fn hidden(&mut self, tokens: usize) -> Result<Vec<f32>>;
    /// Per row of the last step: whether greedy picking found its logits all NaN (false for
    /// every row when the step sampled).
    fn nan_rows(&mut self, tokens: usize) -> Result<Vec<bool>>;
    /// How many token ids the last [`Self::set_tokens`] gave.
    fn loaded_tokens(&self) -> usize;
    /// Whether the steps are being timed by phase ([`Self::phase_times`]).
    fn times_phases(&self) -> bool {
        false
    }
    /// The timing of the last step by op kind, where the backend can measure it.
    fn phase_times(&mut self) -> Option<Vec<(&'static str, f64)>> {
        None
    }
}

/// The checks of [`Executor::run`]: the window's size is the ids loaded and its positions fit
/// the context.
pub fn check_run(w: Window, loaded: usize, n_ctx: usize) -> Result<()> {
    check_window(w, loaded)?;
    if w.pos0.checked_add(w.tokens).is_none_or(|end| end > n_ctx) {
        return Err(crate::Error::Request(format!(
            "positions {}..{} do not fit the {n_ctx}-position context (raise --ctx)",
            w.pos0,
            w.pos0 + w.tokens
        )));
    }
    Ok(())
}

/// Whether `ops` picks greedily (then the all-NaN flags of its rows are meaningful).
pub fn picks_greedy(ops: &[Op]) -> bool {
    ops.iter().any(|o| matches!(o, Op::Pick(Pick::Greedy)))
}

/// What a step wrote with [`Op::Accept`] (`accept`: the count, then the rows' choices) and the
/// greedy pick's all-NaN flags, for a window of `tokens` rows.
pub fn emitted_from(accept: &[u32], all_nan: &[u32], tokens: usize, greedy: bool) -> Emitted {
    let a = (accept[0] as usize).clamp(1, tokens);
    Emitted { ids: accept[1..1 + a].to_vec(), all_nan: all_nan[..a].iter().map(|&f| greedy && f != 0).collect() }
}

/// The attention scale `1 / sqrt(head_dim)`, computed once in f64 and rounded.
pub fn attn_scale(head_dim: usize) -> f32 {
    (1.0 / (head_dim as f64).sqrt()) as f32
}

/// A window's size must be what was loaded with `set_tokens`, 1..=[`MAX_WINDOW`] (every
/// buffer holds that many rows).
pub fn check_window(w: Window, loaded: usize) -> Result<()> {
    if w.tokens == 0 || w.tokens > MAX_WINDOW || w.tokens != loaded {
        return Err(crate::Error::Request(format!("a window of {} tokens with {loaded} token ids loaded (1..={MAX_WINDOW}, equal)", w.tokens)));
    }
    Ok(())
}

/// The phases of the time split (`strata decode --profile`), in step order.
pub const PHASES: [&str; 9] = ["attention", "deltanet", "router", "experts", "shared expert", "head", "mtp", "sampling", "other"];

/// Adds `ms` to `phase`'s sum in `sums` (appending the phase the first time).
pub fn add_phase_time(sums: &mut Vec<(&'static str, f64)>, phase: &'static str, ms: f64) {
    match sums.iter_mut().find(|(p, _)| *p == phase) {
        Some((_, t)) => *t += ms,
        None => sums.push((phase, ms)),
    }
}

/// The phase an op belongs to: attention or deltanet (the mixer, its projections and gates
/// included), router (its matvec included), experts, shared expert (its matvecs, activation and
/// gate), head (the output matvec), sampling, or other (embedding, norms, quantization, residual
/// adds).
pub fn phase_of(op: &Op, weights: &Weights) -> &'static str {
    let deltanet = |w: WeightId| {
        weights.all_layers().any(|l| matches!(&l.mixer, Mixer::DeltaNet(d) if [d.qkv, d.z, d.beta, d.alpha, d.out].contains(&w)))
    };
    let shared = |w: WeightId| weights.all_layers().filter_map(|l| l.shared.as_ref()).any(|s| [s.gate_inp, s.gate, s.up, s.down].contains(&w));
    match op {
        Op::AttnPrep { .. } | Op::Attention { .. } | Op::PrepAttention { .. } | Op::SigmoidMul { .. } => "attention",
        Op::GdnConv { .. } | Op::GdnRecur { .. } | Op::RmsNormGated { .. } => "deltanet",
        Op::RouterTopK { .. } => "router",
        Op::Experts { .. } => "experts",
        Op::Swiglu { .. } | Op::AddGated { .. } => "shared expert",
        Op::Concat { .. } | Op::LastRowFirst { .. } => "mtp",
        Op::Pick(_) | Op::Accept => "sampling",
        Op::Linear { w, .. } if *w == weights.output => "head",
        Op::Linear { w, .. } if shared(*w) => "shared expert",
        Op::Linear { w, .. } if deltanet(*w) => "deltanet",
        Op::Linear { w, .. } if weights.get(*w).name.contains("ffn_gate_inp") => "router",
        Op::Linear { .. } => "attention",
        _ => "other",
    }
}
