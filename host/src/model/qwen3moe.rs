//! `qwen3moe` (MODELS.md section 1): reads the hyper-parameters and finds, checks and prepares
//! every tensor of a file, then describes one decode step as an op list ([`step_ops`]).
//!
//! Matrices stay as the file stores them (borrowed from the memory map), but for q, k and v of
//! one type, which become one matrix (a fused `attn_qkv` as stored, or their rows copied
//! together); norm weights are widened to f32 (exact), and biases are repeated for every row of
//! a window so the step adds them with the plain residual kernel.
use super::loader::Loader;
use super::weights::{LayerWeights, Mixer, Weights};
use super::{trunk, LoadOptions, Model};
use crate::error::Result;
use crate::step::{Act, Op, Qx};

pub const ARCH: &str = "qwen3moe";

/// Checks a parsed qwen3moe file and prepares its weights.
pub fn load(file: std::sync::Arc<crate::gguf::GgufFile>, options: LoadOptions) -> Result<Model> {
    let mut l = Loader::new(&file, ARCH, options)?;
    let config = trunk::config(&l, 0)?;
    if config.n_rot != config.head_dim {
        return Err(l.err("attention", format!("rope dims {} and head dim {}: qwen3moe rotates whole heads", config.n_rot, config.head_dim)));
    }
    let (token_embd, output_norm, output) = trunk::globals(&mut l, &config)?;
    let mut layers = Vec::new(); // not sized from the file: a hostile block_count fails at its first missing tensor
    for i in 0..config.n_layer {
        let attn_norm = l.vector(&format!("blk.{i}.attn_norm.weight"), config.n_embd, 1)?;
        let attn = trunk::attention(&mut l, i, &config, false)?;
        let ffn_norm = l.vector(&format!("blk.{i}.ffn_norm.weight"), config.n_embd, 1)?;
        let [router, gate, up, down] = trunk::routed_experts(&mut l, i, &config)?;
        layers.push(LayerWeights { attn_norm, mixer: Mixer::Attention(attn), ffn_norm, router, gate, up, down, shared: None });
    }
    let list = std::mem::take(&mut l.list);
    drop(l);
    Ok(Model { arch: ARCH, config, weights: Weights { file, list, token_embd, output_norm, output, layers, mtp: None } })
}

/// One step over a window as an op list (the window size and position are given when it runs):
/// every backend runs this same list.
pub fn step_ops(m: &Model, pick: Op) -> Vec<Op> {
    let w = &m.weights;
    let mut ops = vec![Op::Embed { table: w.token_embd, out: Act::X }];
    for (layer, lw) in w.layers.iter().enumerate() {
        let Mixer::Attention(a) = &lw.mixer else { unreachable!("qwen3moe layers are attention layers") };
        ops.push(Op::RmsNorm { x: Act::X, w: lw.attn_norm, out: Act::Xn });
        ops.push(Op::Quantize { x: Act::Xn, out: Qx::X });
        super::attention_ops(&mut ops, layer, a);
        super::ffn_ops(&mut ops, m, lw);
    }
    super::head_ops(&mut ops, w, pick);
    ops
}
