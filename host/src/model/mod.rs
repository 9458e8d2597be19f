//! Model architectures: what a GGUF file of each architecture means (`../shared/docs/MODELS.md`),
//! as a configuration, a set of weights and the op list of one decode step.
//!
//! | module | what |
//! |---|---|
//! | [`config`] | the hyper-parameters a step is sized from |
//! | [`weights`] | the weights a step reads, by layer and role |
//! | [`loader`] | keys and tensors read from a file, with errors naming the file and tensor |
//! | [`trunk`] | what the architectures share: trunk keys, embedding and head, attention, routed experts |
//! | [`qwen3moe`] | MODELS.md section 1: attention and routed experts |
//! | [`qwen35moe`] | MODELS.md section 2: Gated DeltaNet and gated attention layers, shared experts |
//! | [`synth`] | random-weight models of any shape, written as GGUF (`strata synth`, the built-in model) |
//! | [`synth_hybrid`] | what a synthetic qwen35moe file adds: GDN and gated attention layers, shared experts, MTP |
//! | [`vocab`] | the synthetic GPT-2-style byte-level vocabulary synthetic models carry |
pub mod config;
pub mod loader;
pub mod qwen35moe;
pub mod qwen3moe;
pub mod synth;
pub mod synth_hybrid;
mod trunk;
pub mod vocab;
pub mod weights;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

pub use config::{HybridConfig, ModelConfig};
pub use loader::{float_format, quant_format};
pub use weights::{AttnWeights, Data, DeltaNetWeights, LayerWeights, Mixer, QkvProj, SharedExpert, Weight, WeightId, Weights};

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};
use crate::step::{Act, Op, QkvLayout, Qx};

/// How the loader lays out weights where several layouts give the same bits.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// One q/k/v matrix (one matvec) where q, k and v have one type; `false` keeps the three
    /// matrices that files whose types differ get (the tests compare the two).
    pub fuse_qkv: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { fuse_qkv: true }
    }
}

/// A loaded model of a supported architecture.
pub struct Model {
    /// `general.architecture`: [`qwen3moe::ARCH`] or [`qwen35moe::ARCH`].
    pub arch: &'static str,
    pub config: ModelConfig,
    pub weights: Weights,
}

impl Model {
    /// Opens and checks `path`.
    pub fn open(path: &Path) -> Result<Model> {
        Self::load(Arc::new(GgufFile::open(path)?))
    }

    /// Checks a parsed file of a supported architecture and prepares its weights.
    pub fn load(file: Arc<GgufFile>) -> Result<Model> {
        Self::load_with(file, LoadOptions::default())
    }

    /// [`Self::load`] with the layout choices of `options`.
    pub fn load_with(file: Arc<GgufFile>, options: LoadOptions) -> Result<Model> {
        match file.get("general.architecture").and_then(Value::as_str) {
            Some(qwen3moe::ARCH) => qwen3moe::load(file, options),
            Some(qwen35moe::ARCH) => qwen35moe::load(file, options),
            Some(other) => Err(Error::Model {
                file: file.path.clone(),
                what: Some("architecture".into()),
                detail: format!("`{other}` is not supported (Strata decodes {} and {})", qwen3moe::ARCH, qwen35moe::ARCH),
            }),
            None => Err(Error::Model { file: file.path.clone(), what: Some("key general.architecture".into()), detail: "missing: not a model file".into() }),
        }
    }

    /// The MTP block's step (drafts for the verify windows), where the model has one: described
    /// unfused by [`qwen35moe::mtp_ops`], then fused ([`crate::step::fuse`]).
    pub fn mtp_ops(&self) -> Option<Vec<Op>> {
        qwen35moe::mtp_ops(self).map(|ops| crate::step::fuse(ops, &self.config))
    }

    /// One step over a window as an op list (the window size and position are given when it
    /// runs): every backend runs this same list. Described unfused by the architecture's
    /// module, then fused ([`crate::step::fuse`]).
    pub fn step_ops(&self, pick: Op) -> Vec<Op> {
        let ops = match self.arch {
            qwen35moe::ARCH => qwen35moe::step_ops(self, pick),
            _ => qwen3moe::step_ops(self, pick),
        };
        crate::step::fuse(ops, &self.config)
    }

    /// The architecture and shapes in one line: `qwen35moe, 4 layers (2 Gated DeltaNet), 8
    /// experts top-2, ...`.
    pub fn describe(&self) -> String {
        let c = &self.config;
        let layers = match &c.hybrid {
            Some(h) => format!(
                "{} layers ({} Gated DeltaNet: {} key / {} value heads of {}, {} conv taps; {} gated attention), shared expert {}",
                c.n_layer,
                h.recurrent.iter().filter(|&&r| r).count(),
                h.n_k_heads,
                h.n_v_heads,
                h.d_state,
                h.d_conv,
                c.attention_layers(),
                h.n_ff_shexp
            ),
            None => format!("{} layers", c.n_layer),
        };
        let rope = if c.n_rot < c.head_dim { format!(" ({} rotated)", c.n_rot) } else { String::new() };
        format!(
            "{}, {layers}, {} experts top-{}, n_embd {}, {} heads ({} kv) of {}{rope}, vocabulary {}",
            self.arch, c.n_expert, c.n_expert_used, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_vocab
        )
    }

    /// The tensor types by role, as `strata decode` prints them: `embedding Q8_0, attention
    /// Q8_0, ...` (a role whose layers differ lists each type once).
    pub fn formats_summary(&self) -> String {
        let w = &self.weights;
        let names = |ids: &mut dyn Iterator<Item = WeightId>| {
            let mut seen: Vec<&str> = Vec::new();
            for id in ids {
                let n = w.get(id).ty.name();
                if !seen.contains(&n) {
                    seen.push(n);
                }
            }
            seen.join("/")
        };
        let attn = |l: &LayerWeights| match &l.mixer {
            Mixer::Attention(a) => a.proj.matrices().into_iter().chain(a.gate).chain([a.o]).collect::<Vec<_>>(),
            Mixer::DeltaNet(_) => vec![],
        };
        let gdn = |l: &LayerWeights| match &l.mixer {
            Mixer::DeltaNet(d) => vec![d.qkv, d.z, d.beta, d.alpha, d.out],
            Mixer::Attention(_) => vec![],
        };
        let mut roles: Vec<(&str, Vec<WeightId>)> = vec![
            ("embedding", vec![w.token_embd]),
            ("attention", w.layers.iter().flat_map(attn).collect()),
            ("deltanet", w.layers.iter().flat_map(gdn).collect()),
            ("router", w.layers.iter().map(|l| l.router).collect()),
            ("gate/up", w.layers.iter().flat_map(|l| [l.gate, l.up]).collect()),
            ("down", w.layers.iter().map(|l| l.down).collect()),
            ("shared expert", w.layers.iter().filter_map(|l| l.shared.as_ref()).flat_map(|s| [s.gate, s.up, s.down]).collect()),
            (if w.output == w.token_embd { "head (tied)" } else { "head" }, vec![w.output]),
        ];
        roles.retain(|(_, ids)| !ids.is_empty());
        roles.into_iter().map(|(role, ids)| format!("{role} {}", names(&mut ids.into_iter()))).collect::<Vec<_>>().join(", ")
    }

    /// Bytes of weights a one-token trunk step reads: every weight of its op list once, one row
    /// of the embedding (unless it is also the head), and `n_expert_used` experts of each layer
    /// (the MTP block's weights are not the trunk's).
    pub fn step_weight_bytes(&self) -> usize {
        let w = &self.weights;
        let ids: HashSet<WeightId> = self.step_ops(Op::Pick(crate::step::Pick::Greedy)).iter().flat_map(Op::weights).collect();
        let experts: HashSet<WeightId> = w.layers.iter().flat_map(|l| [l.gate, l.up, l.down]).collect();
        ids.into_iter()
            .map(|id| {
                let weight = w.get(id);
                if experts.contains(&id) {
                    weight.bytes() / weight.n_expert * self.config.n_expert_used
                } else if id == w.token_embd && w.output != w.token_embd {
                    weight.bytes() / weight.rows
                } else {
                    weight.bytes()
                }
            })
            .sum()
    }
}

/// The ops of an attention mixer from `Qx::X` to its output added to `Act::X`: projections (and
/// biases), per-head norm + RoPE + cache append, attention, the output gate where the layer has
/// one, the output projection accumulating into the residual stream.
fn attention_ops(ops: &mut Vec<Op>, layer: usize, a: &AttnWeights) {
    let layout = match a.proj {
        QkvProj::Fused { qkv, bias } => {
            projection(ops, qkv, Act::Qkv, bias);
            QkvLayout::Fused
        }
        QkvProj::Split { q, k, v, bias } => {
            for ((id, out), bias) in [(q, Act::Q), (k, Act::K), (v, Act::V)].into_iter().zip(bias) {
                projection(ops, id, out, bias);
            }
            QkvLayout::Split
        }
    };
    if let Some(g) = a.gate {
        ops.push(linear(g, Qx::X, Act::Xn, Act::Gate));
    }
    ops.push(Op::AttnPrep { layer, layout, q_norm: a.q_norm, k_norm: a.k_norm });
    ops.push(Op::Attention { layer, q: None });
    if a.gate.is_some() {
        ops.push(Op::SigmoidMul { acc: Act::Attn, gate: Act::Gate });
    }
    ops.push(Op::Quantize { x: Act::Attn, out: Qx::Attn });
    ops.push(residual_linear(a.o, Qx::Attn, Act::Attn));
}

/// The ops of a layer's feed-forward half from `Act::X` back to `Act::X`: norm, router, routed
/// experts, and the gated shared expert added to them, then the residual add. Without a shared
/// expert the routed experts accumulate into `Act::X` themselves; with one, its sum with the
/// routed experts comes first (llama.cpp's order), so they go to `Act::Experts`.
fn ffn_ops(ops: &mut Vec<Op>, m: &Model, lw: &LayerWeights) {
    ops.push(Op::RmsNorm { x: Act::X, w: lw.ffn_norm, out: Act::Xn });
    ops.push(Op::Quantize { x: Act::Xn, out: Qx::X });
    ops.push(linear(lw.router, Qx::X, Act::Xn, Act::Router));
    ops.push(Op::RouterTopK { k: m.config.n_expert_used });
    let (gate, up, down) = (lw.gate, lw.up, lw.down);
    let Some(s) = &lw.shared else {
        ops.push(Op::Experts { gate, up, down, out: Act::X, accumulate: true });
        return;
    };
    ops.push(Op::Experts { gate, up, down, out: Act::Experts, accumulate: false });
    ops.push(linear(s.gate, Qx::X, Act::Xn, Act::ShGate));
    ops.push(linear(s.up, Qx::X, Act::Xn, Act::ShUp));
    ops.push(Op::Swiglu { gate: Act::ShGate, up: Act::ShUp, out: Act::ShAct });
    ops.push(Op::Quantize { x: Act::ShAct, out: Qx::Sh });
    ops.push(linear(s.down, Qx::Sh, Act::ShAct, Act::ShOut));
    ops.push(linear(s.gate_inp, Qx::X, Act::Xn, Act::ShScale));
    ops.push(Op::AddGated { acc: Act::Experts, y: Act::ShOut, s: Act::ShScale });
    ops.push(Op::AddInto { acc: Act::X, b: Act::Experts });
}

/// The output norm (into `Act::Hidden`, which the MTP block reads), the head, the pick and the
/// acceptance.
fn head_ops(ops: &mut Vec<Op>, w: &Weights, pick: Op) {
    norm_head(ops, w.output_norm, w.output);
    ops.push(pick);
    ops.push(Op::Accept);
}

/// `Act::X` normed into `Act::Hidden`, then the head's logits.
fn norm_head(ops: &mut Vec<Op>, norm: WeightId, head: WeightId) {
    ops.push(Op::RmsNorm { x: Act::X, w: norm, out: Act::Hidden });
    ops.push(Op::Quantize { x: Act::Hidden, out: Qx::X });
    ops.push(linear(head, Qx::X, Act::Hidden, Act::Logits));
}

/// `out = w * Xn` (from `Qx::X`), plus `bias` where there is one.
fn projection(ops: &mut Vec<Op>, w: WeightId, out: Act, bias: Option<WeightId>) {
    ops.push(linear(w, Qx::X, Act::Xn, out));
    if let Some(b) = bias {
        ops.push(Op::AddWeight { acc: out, w: b });
    }
}

fn linear(w: WeightId, xq: Qx, x: Act, out: Act) -> Op {
    Op::Linear { w, xq, x, out, accumulate: false }
}

/// `Act::X += w * input`: a mixer's output projection, the residual add fused into it.
fn residual_linear(w: WeightId, xq: Qx, x: Act) -> Op {
    Op::Linear { w, xq, x, out: Act::X, accumulate: true }
}
