//! One decode step, described once and run by every backend.
//!
//! A model builds the step as a list of [`Op`]s over named activation buffers ([`Act`], [`Qx`])
//! and its weights ([`WeightId`]); an [`Executor`] (one per backend: [`cpu`] runs the gpu-shared
//! replicas on host memory, [`gpu`] enqueues the Rust or HIP kernels on one stream, with every
//! tensor resident on the device) runs the list for a window of `tokens` consecutive positions
//! starting at `pos0`. The window size and position are arguments of the run, not of the list.
//!
//! Buffers hold [`MAX_WINDOW`] rows; a window of T tokens uses the first T.
pub mod cpu;
pub mod gpu;

use crate::error::Result;
use crate::model::qwen3moe::{WeightId, Weights};
use crate::model::Qwen3MoeConfig;
use crate::ops::route::SampleParams;

/// The most tokens one step takes (a verify window).
pub const MAX_WINDOW: usize = 8;

/// The f32 activation buffers of a step, each `tokens` rows.
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
    /// The queries after the per-head norm and RoPE (`n_head * head_dim`).
    Qr,
    /// Attention output, heads concatenated (`n_head * head_dim`).
    Attn,
    /// The attention output projection (`n_embd`).
    Proj,
    /// Router logits (`n_expert`).
    Router,
    /// The routed experts' combined output (`n_embd`).
    Experts,
    /// Head logits (`n_vocab`).
    Logits,
}

impl Act {
    pub const ALL: [Act; 11] = [Act::X, Act::Xn, Act::Q, Act::K, Act::V, Act::Qr, Act::Attn, Act::Proj, Act::Router, Act::Experts, Act::Logits];
}

/// The q8_1 activation buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Qx {
    /// `Xn` quantized (`n_embd` values a row): the input of Q/K/V, the router, the experts, the head.
    X,
    /// `Attn` quantized: the input of the output projection.
    Attn,
}

/// Values per token row of an activation.
pub fn act_len(c: &Qwen3MoeConfig, a: Act) -> usize {
    match a {
        Act::X | Act::Xn | Act::Proj | Act::Experts => c.n_embd,
        Act::Q | Act::Qr | Act::Attn => c.n_head * c.head_dim,
        Act::K | Act::V => c.n_head_kv * c.head_dim,
        Act::Router => c.n_expert,
        Act::Logits => c.n_vocab,
    }
}

/// Values per token row of a q8_1 buffer (before quantization).
pub fn qx_len(c: &Qwen3MoeConfig, q: Qx) -> usize {
    match q {
        Qx::X => c.n_embd,
        Qx::Attn => c.n_head * c.head_dim,
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
    /// `out = w * input` per row: quantized weights read `xq`, float weights read `x`.
    Linear { w: WeightId, xq: Qx, x: Act, out: Act },
    /// `acc += w` (a weight of [`MAX_WINDOW`] repeated rows: a bias).
    AddWeight { acc: Act, w: WeightId },
    /// `acc += b`.
    AddInto { acc: Act, b: Act },
    /// Per-head RMSNorm of Q and K, RoPE, K and V appended to the layer's cache.
    AttnPrep { layer: usize, q_norm: WeightId, k_norm: WeightId },
    /// Causal GQA attention of each window token over the layer's cache: `Qr` to `Attn`.
    Attention { layer: usize },
    /// Softmax over the router logits, top-k, renormalised: the window's expert selections.
    RouterTopK { k: usize },
    /// The routed experts of the window (`Qx::X` in, `Act::Experts` out).
    Experts { gate: WeightId, up: WeightId, down: WeightId },
    /// The next token of each row, from `Logits`.
    Pick(Pick),
    /// Verify-window acceptance: how many of the window's drafts (rows 1..) the model's own
    /// choices confirm, and the tokens the window emits.
    Accept,
}

/// Where a step runs in the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub tokens: usize,
    pub pos0: usize,
}

/// A backend that runs op lists over its own buffers. The token ids go in with
/// [`Executor::set_tokens`]; after a step, the chosen next ids (and, when asked, the logits)
/// come back.
pub trait Executor {
    /// `cpu`, `cuda` or `hip`.
    fn name(&self) -> &'static str;
    /// Positions the KV cache holds.
    fn n_ctx(&self) -> usize;
    /// The window's input token ids (`1..=MAX_WINDOW` of them).
    fn set_tokens(&mut self, ids: &[u32]) -> Result<()>;
    /// Runs (or enqueues) one op for `w`.
    fn op(&mut self, op: &Op, w: Window) -> Result<()>;
    /// Waits for the step and returns the chosen next id of each of the `tokens` rows.
    fn next_ids(&mut self, tokens: usize) -> Result<Vec<u32>>;
    /// The logits of the `tokens` rows (`n_vocab` each), after [`Self::next_ids`].
    fn logits(&mut self, tokens: usize) -> Result<Vec<f32>>;
    /// Waits for the step and returns the tokens a verify window of `tokens` rows emits: the
    /// model's choices for the accepted rows ([`Op::Accept`]).
    fn accepted(&mut self, tokens: usize) -> Result<Vec<u32>>;
    /// Per row of the last step: whether greedy picking found its logits all NaN (false for
    /// every row when the step sampled).
    fn nan_rows(&mut self, tokens: usize) -> Result<Vec<bool>>;
    /// How many token ids the last [`Self::set_tokens`] gave.
    fn loaded_tokens(&self) -> usize;
    /// The timing of the last step by op kind, where the backend can measure it.
    fn phase_times(&mut self) -> Option<Vec<(&'static str, f64)>> {
        None
    }

    /// Runs the whole list for window `w`.
    fn run(&mut self, ops: &[Op], w: Window) -> Result<()> {
        check_window(w, self.loaded_tokens())?;
        if w.pos0.checked_add(w.tokens).is_none_or(|end| end > self.n_ctx()) {
            return Err(crate::Error::Request(format!(
                "positions {}..{} do not fit the {}-position context (raise --ctx)",
                w.pos0,
                w.pos0 + w.tokens,
                self.n_ctx()
            )));
        }
        for op in ops {
            self.op(op, w)?;
        }
        Ok(())
    }
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
pub const PHASES: [&str; 6] = ["attention", "router", "experts", "head", "sampling", "other"];

/// The phase an op belongs to: attention (its projections included), router (its matvec
/// included), experts, head (the output matvec), sampling, or other (embedding, norms,
/// quantization, residual adds).
pub fn phase_of(op: &Op, weights: &Weights) -> &'static str {
    match op {
        Op::AttnPrep { .. } | Op::Attention { .. } => "attention",
        Op::RouterTopK { .. } => "router",
        Op::Experts { .. } => "experts",
        Op::Pick(_) | Op::Accept => "sampling",
        Op::Linear { w, .. } if *w == weights.output => "head",
        Op::Linear { w, .. } if weights.get(*w).name.contains("ffn_gate_inp") => "router",
        Op::Linear { .. } => "attention",
        _ => "other",
    }
}
