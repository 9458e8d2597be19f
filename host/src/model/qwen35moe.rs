//! `qwen35moe` (MODELS.md section 2), the Qwen3.5-MoE hybrids: Gated DeltaNet layers and gated
//! attention layers (every `full_attention_interval`-th, or as `attention.recurrent_layers`
//! says), each followed by routed experts plus a shared expert with a sigmoid gate. Reads and
//! checks the file, then describes one decode step as an op list ([`step_ops`]).
//!
//! The converter's `+1` is already in the stored norm weights, so they are used as stored. The
//! MTP block (`blk.{n_layer}`, counted in `block_count`) is a step of its own ([`mtp_ops`]),
//! which drafts tokens for the verify windows.
use super::config::{HybridConfig, ModelConfig};
use super::loader::{Loader, MATRIX};
use super::weights::{DeltaNetWeights, LayerWeights, Mixer, MtpWeights, SharedExpert, WeightId, Weights};
use super::{trunk, LoadOptions, Model};
use crate::error::Result;
use crate::gguf::{GgufFile, Value};
use crate::step::{Act, Op, Pick, Qx};
use strata_gpu_shared::launch::gdn::{GDN_MAX_CONV, GDN_MAX_D};

pub const ARCH: &str = "qwen35moe";

/// Checks a parsed qwen35moe file and prepares its weights.
pub fn load(file: std::sync::Arc<GgufFile>, options: LoadOptions) -> Result<Model> {
    let mut l = Loader::new(&file, ARCH, options)?;
    let mtp_blocks = l.uint("nextn_predict_layers", Some(0))?;
    if mtp_blocks > 1 {
        return Err(l.err(format!("key {ARCH}.nextn_predict_layers"), format!("{mtp_blocks} MTP blocks: one is supported (as in llama.cpp)")));
    }
    let mut config = trunk::config(&l, mtp_blocks)?;
    let mut hybrid = hybrid_config(&l, &config)?;
    hybrid.mtp = mtp_blocks == 1;
    let (token_embd, output_norm, output) = trunk::globals(&mut l, &config)?;
    let mut layers = Vec::new(); // not sized from the file: a hostile block_count fails at its first missing tensor
    for (i, &recurrent) in hybrid.recurrent.iter().enumerate() {
        layers.push(layer(&mut l, i, recurrent, &config, &hybrid)?);
    }
    let mtp = if hybrid.mtp { Some(mtp_block(&mut l, &config, &hybrid, (token_embd, output_norm, output))?) } else { None };
    config.hybrid = Some(hybrid);
    let list = std::mem::take(&mut l.list);
    drop(l);
    Ok(Model { arch: ARCH, config, weights: Weights { file, list, token_embd, output_norm, output, layers, mtp } })
}

/// Layer `i` (the MTP block's is `n_layer`): its mixer, routed experts and shared expert.
fn layer(l: &mut Loader, i: usize, recurrent: bool, c: &ModelConfig, h: &HybridConfig) -> Result<LayerWeights> {
    let name = |t: &str| format!("blk.{i}.{t}");
    let attn_norm = l.vector(&name("attn_norm.weight"), c.n_embd, 1)?;
    let mixer = if recurrent { Mixer::DeltaNet(deltanet(l, i, c, h)?) } else { Mixer::Attention(trunk::attention(l, i, c, true)?) };
    let ffn_norm = l.vector(&name("post_attention_norm.weight"), c.n_embd, 1)?;
    let [router, gate, up, down] = trunk::routed_experts(l, i, c)?;
    let (n_embd, n_ff) = (c.n_embd, h.n_ff_shexp);
    let shared = SharedExpert {
        gate_inp: l.tensor(&name("ffn_gate_inp_shexp.weight"), &[n_embd], MATRIX)?,
        gate: l.tensor(&name("ffn_gate_shexp.weight"), &[n_embd, n_ff], MATRIX)?,
        up: l.tensor(&name("ffn_up_shexp.weight"), &[n_embd, n_ff], MATRIX)?,
        down: l.tensor(&name("ffn_down_shexp.weight"), &[n_ff, n_embd], MATRIX)?,
    };
    Ok(LayerWeights { attn_norm, mixer, ffn_norm, router, gate, up, down, shared: Some(shared) })
}

/// The MTP block `blk.{n_layer}`: a gated attention layer and its `nextn.*` tensors, with the
/// trunk's embedding, output norm and head (`trunk`) where it has none of its own.
fn mtp_block(l: &mut Loader, c: &ModelConfig, h: &HybridConfig, trunk: (WeightId, WeightId, WeightId)) -> Result<MtpWeights> {
    let i = c.n_layer;
    let name = |t: &str| format!("blk.{i}.nextn.{t}.weight");
    let layer = layer(l, i, false, c, h)?;
    let n_embd = c.n_embd;
    let optional = |l: &mut Loader, t: &str, dims: &[usize], fallback: WeightId, vector: bool| -> Result<WeightId> {
        match l.info(&name(t)) {
            None => Ok(fallback),
            Some(_) if vector => l.vector(&name(t), n_embd, 1),
            Some(_) => l.tensor(&name(t), dims, MATRIX),
        }
    };
    Ok(MtpWeights {
        eh_proj: l.tensor(&name("eh_proj"), &[2 * n_embd, n_embd], MATRIX)?,
        enorm: l.vector(&name("enorm"), n_embd, 1)?,
        hnorm: l.vector(&name("hnorm"), n_embd, 1)?,
        embed: optional(l, "embed_tokens", &[n_embd, c.n_vocab], trunk.0, false)?,
        head_norm: optional(l, "shared_head_norm", &[n_embd], trunk.1, true)?,
        head: optional(l, "shared_head_head", &[n_embd, c.n_vocab], trunk.2, false)?,
        layer,
    })
}

/// The GDN and shared-expert keys, checked against what the kernels take.
fn hybrid_config(l: &Loader, c: &ModelConfig) -> Result<HybridConfig> {
    let d_conv = l.uint("ssm.conv_kernel", None)?;
    let d_inner = l.uint("ssm.inner_size", None)?;
    let d_state = l.uint("ssm.state_size", None)?;
    let n_v_heads = l.uint("ssm.time_step_rank", None)?;
    let n_k_heads = l.uint("ssm.group_count", None)?;
    let n_ff = l.uint("feed_forward_length", Some(0))?;
    let n_ff_shexp = l.uint("expert_shared_feed_forward_length", Some(n_ff as u64))?;
    let key = |k: &str| format!("key {ARCH}.{k}");
    if d_conv == 0 || d_conv > GDN_MAX_CONV {
        return Err(l.err(key("ssm.conv_kernel"), format!("{d_conv} taps: supported are 1..={GDN_MAX_CONV}")));
    }
    if d_state == 0 || d_state % 32 != 0 || d_state > GDN_MAX_D {
        return Err(l.err(key("ssm.state_size"), format!("{d_state}: supported are multiples of 32 up to {GDN_MAX_D}")));
    }
    if n_k_heads == 0 || n_v_heads == 0 || n_v_heads % n_k_heads != 0 {
        return Err(l.err("ssm heads", format!("{n_v_heads} value heads are not a multiple of {n_k_heads} key heads")));
    }
    if d_inner != d_state * n_v_heads {
        return Err(l.err(key("ssm.inner_size"), format!("{d_inner} is not state size {d_state} x {n_v_heads} value heads")));
    }
    if n_ff_shexp == 0 || n_ff_shexp % 32 != 0 {
        return Err(l.err(key("expert_shared_feed_forward_length"), format!("{n_ff_shexp}: must be a positive multiple of 32")));
    }
    let recurrent: Vec<bool> = match l.key("attention.recurrent_layers") {
        Some(Value::Array(items)) => {
            let flags: Option<Vec<bool>> = items.iter().map(|v| if let Value::Bool(b) = v { Some(*b) } else { None }).collect();
            let flags = flags.ok_or_else(|| l.err(key("attention.recurrent_layers"), "not an array of booleans"))?;
            if flags.len() < c.n_layer {
                return Err(l.err(key("attention.recurrent_layers"), format!("{} flags for {} layers", flags.len(), c.n_layer)));
            }
            flags[..c.n_layer].to_vec()
        }
        Some(_) => return Err(l.err(key("attention.recurrent_layers"), "not an array of booleans")),
        None => {
            let interval = l.uint("full_attention_interval", Some(4))?;
            if interval == 0 {
                return Err(l.err(key("full_attention_interval"), "0"));
            }
            (0..c.n_layer).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    Ok(HybridConfig { recurrent, d_conv, d_state, n_v_heads, n_k_heads, n_ff_shexp, mtp: false })
}

/// Layer `i`'s Gated DeltaNet tensors.
fn deltanet(l: &mut Loader, i: usize, c: &ModelConfig, h: &HybridConfig) -> Result<DeltaNetWeights> {
    let name = |t: &str| format!("blk.{i}.{t}");
    let (n_embd, n_v, cd, vd) = (c.n_embd, h.n_v_heads, h.conv_channels(), h.inner());
    let a = l.vector(&name("ssm_a"), n_v, 1)?;
    if let Some(bad) = l.list[a.0].f32s().iter().find(|&&v| v > 0.0) {
        return Err(l.err(format!("tensor {}", name("ssm_a")), format!("holds {bad}: the decay's A (-exp(A_log)) must not be positive")));
    }
    Ok(DeltaNetWeights {
        qkv: l.tensor(&name("attn_qkv.weight"), &[n_embd, cd], MATRIX)?,
        z: l.tensor(&name("attn_gate.weight"), &[n_embd, vd], MATRIX)?,
        beta: l.tensor(&name("ssm_beta.weight"), &[n_embd, n_v], MATRIX)?,
        alpha: l.tensor(&name("ssm_alpha.weight"), &[n_embd, n_v], MATRIX)?,
        conv: l.floats(&name("ssm_conv1d.weight"), &[h.d_conv, cd], 1)?,
        dt_bias: l.vector(&name("ssm_dt.bias"), n_v, 1)?,
        a,
        norm: l.vector(&name("ssm_norm.weight"), h.d_state, 1)?,
        out: l.tensor(&name("ssm_out.weight"), &[vd, n_embd], MATRIX)?,
    })
}

/// One step over a window as an op list (the window size and position are given when it runs):
/// every backend runs this same list.
pub fn step_ops(m: &Model, pick: Op) -> Vec<Op> {
    let w = &m.weights;
    let h = m.config.hybrid.as_ref().expect("a qwen35moe model has its hybrid config");
    let mut ops = vec![Op::Embed { table: w.token_embd, out: Act::X }];
    for (layer, lw) in w.layers.iter().enumerate() {
        ops.push(Op::RmsNorm { x: Act::X, w: lw.attn_norm, out: Act::Xn });
        ops.push(Op::Quantize { x: Act::Xn, out: Qx::X });
        match &lw.mixer {
            Mixer::Attention(a) => super::attention_ops(&mut ops, layer, a),
            Mixer::DeltaNet(d) => {
                for (id, out) in [(d.qkv, Act::Mixed), (d.z, Act::Z), (d.beta, Act::Beta), (d.alpha, Act::Alpha)] {
                    ops.push(super::linear(id, Qx::X, Act::Xn, out));
                }
                ops.push(Op::GdnConv { layer, w: d.conv });
                ops.push(Op::GdnRecur { layer, dt_bias: d.dt_bias, a: d.a });
                ops.push(Op::RmsNormGated { x: Act::Gdn, w: d.norm, z: Act::Z, out: Act::GdnNormed, n: h.d_state });
                ops.push(Op::Quantize { x: Act::GdnNormed, out: Qx::Attn });
                ops.push(super::residual_linear(d.out, Qx::Attn, Act::GdnNormed));
            }
        }
        super::ffn_ops(&mut ops, m, lw);
    }
    super::head_ops(&mut ops, w, pick);
    ops
}

/// The MTP block's step over a window of `T` positions `p` (the model's MTP, MODELS.md section
/// 2): row `t` reads the token at `p + 1` (the window's ids) and the hidden state at `p`
/// (`Act::Hidden`, as the trunk's step or the previous MTP step left it) and chooses greedily
/// a draft for position `p + 2`. Its attention is cache layer `n_layer`. It leaves its own
/// hidden state of the last row in row 0 of `Act::Hidden`, where a following one-token MTP step
/// reads it: so drafts chain.
pub fn mtp_ops(m: &Model) -> Option<Vec<Op>> {
    let t = m.weights.mtp.as_ref()?;
    let Mixer::Attention(a) = &t.layer.mixer else { unreachable!("the MTP block attends") };
    let mut ops = vec![
        Op::Embed { table: t.embed, out: Act::X },
        Op::RmsNorm { x: Act::X, w: t.enorm, out: Act::Xn },
        Op::RmsNorm { x: Act::Hidden, w: t.hnorm, out: Act::Proj },
        Op::Concat { a: Act::Xn, b: Act::Proj, out: Act::Eh },
        Op::Quantize { x: Act::Eh, out: Qx::Eh },
        super::linear(t.eh_proj, Qx::Eh, Act::Eh, Act::X),
        Op::RmsNorm { x: Act::X, w: t.layer.attn_norm, out: Act::Xn },
        Op::Quantize { x: Act::Xn, out: Qx::X },
    ];
    super::attention_ops(&mut ops, m.config.n_layer, a);
    super::ffn_ops(&mut ops, m, &t.layer);
    super::norm_head(&mut ops, t.head_norm, t.head);
    ops.push(Op::Pick(Pick::Greedy));
    ops.push(Op::LastRowFirst { act: Act::Hidden });
    Some(ops)
}
