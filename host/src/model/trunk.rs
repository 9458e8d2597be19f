//! What qwen3moe and qwen35moe files share: the trunk's keys and their checks, the embedding,
//! output norm and head, the attention tensors and the routed experts of a layer.
use super::config::ModelConfig;
use super::loader::{all_rows, rows_of, Kind, Loader, MATRIX};
use super::weights::{AttnWeights, Data, QkvProj, Weight, WeightId};
use crate::error::Result;
use crate::gguf::GgmlType;
use crate::step::MAX_WINDOW;
use strata_gpu_shared::launch::norm::NORM_MAX_N;
use strata_gpu_shared::launch::route::{ROUTER_MAX_EXPERTS, ROUTER_MAX_K};

/// The trunk's hyper-parameters, checked: `block_count` less `extra_blocks` (an MTP block) is
/// the layer count. `hybrid` is left `None` for the caller.
pub(super) fn config(l: &Loader, extra_blocks: usize) -> Result<ModelConfig> {
    let arch = l.arch;
    let n_embd = l.uint("embedding_length", None)?;
    let n_head = l.uint("attention.head_count", None)?;
    let n_head_kv = l.uint("attention.head_count_kv", Some(n_head as u64))?;
    if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
        return Err(l.err("attention heads", format!("{n_head} query heads are not a multiple of {n_head_kv} key/value heads")));
    }
    let head_dim = l.uint("attention.key_length", Some((n_embd / n_head) as u64))?;
    let value_dim = l.uint("attention.value_length", Some(head_dim as u64))?;
    let n_rot = l.uint("rope.dimension_count", Some(head_dim as u64))?;
    if value_dim != head_dim {
        return Err(l.err("attention", format!("key length {head_dim} and value length {value_dim} differ: supported are equal lengths")));
    }
    if head_dim == 0 || head_dim % 32 != 0 || head_dim > 256 {
        return Err(l.err("attention.key_length", format!("head dim {head_dim}: supported are multiples of 32 up to 256")));
    }
    if n_rot == 0 || n_rot % 2 != 0 || n_rot > head_dim {
        return Err(l.err(format!("key {arch}.rope.dimension_count"), format!("{n_rot}: must be even, in 2..={head_dim} (the head dimension)")));
    }
    let n_expert = l.uint("expert_count", None)?;
    let n_expert_used = l.uint("expert_used_count", None)?;
    if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
        return Err(l.err("experts", format!("{n_expert_used} used of {n_expert} experts")));
    }
    let n_ff_dense = l.uint("feed_forward_length", Some(0))?;
    let n_ff_exp = l.uint("expert_feed_forward_length", (n_ff_dense > 0).then(|| (n_ff_dense / n_expert_used) as u64))?;
    let emb = l.info("token_embd.weight").ok_or_else(|| l.err("tensor token_embd.weight", "missing"))?;
    let n_vocab = *emb.dims.get(1).ok_or_else(|| l.err("tensor token_embd.weight", "is not a matrix"))? as usize;
    let blocks = l.uint("block_count", None)?;
    let config = ModelConfig {
        n_layer: blocks.saturating_sub(extra_blocks),
        n_embd,
        n_head,
        n_head_kv,
        head_dim,
        n_rot,
        n_expert,
        n_expert_used,
        n_ff_exp,
        n_vocab,
        n_ctx_train: l.uint("context_length", Some(4096))?,
        rope_freq_base: l.float("rope.freq_base", Some(10_000.0))?,
        rms_eps: l.float("attention.layer_norm_rms_epsilon", None)?,
        hybrid: None,
    };
    if n_embd == 0 || n_embd % 32 != 0 || n_ff_exp == 0 || n_ff_exp % 32 != 0 {
        return Err(l.err("shape", format!("n_embd {n_embd} and expert n_ff {n_ff_exp} must be positive multiples of 32")));
    }
    if n_embd > NORM_MAX_N {
        return Err(l.err(format!("key {arch}.embedding_length"), format!("{n_embd}: rows longer than {NORM_MAX_N} are not supported")));
    }
    if !(config.rope_freq_base > 0.0) {
        return Err(l.err(format!("key {arch}.rope.freq_base"), format!("{} must be positive", config.rope_freq_base)));
    }
    if config.n_layer == 0 {
        return Err(l.err(format!("key {arch}.block_count"), format!("{blocks} blocks, {extra_blocks} of them MTP: no trunk layer")));
    }
    if n_expert > ROUTER_MAX_EXPERTS || n_expert_used > ROUTER_MAX_K {
        return Err(l.err("experts", format!("{n_expert} experts, {n_expert_used} used: the router supports up to {ROUTER_MAX_EXPERTS} experts and {ROUTER_MAX_K} used")));
    }
    if !(config.rms_eps > 0.0) {
        return Err(l.err(format!("key {arch}.attention.layer_norm_rms_epsilon"), format!("{} must be positive", config.rms_eps)));
    }
    Ok(config)
}

/// The embedding, the output norm and the head (`token_embd` itself when the file has no
/// `output`: tied).
pub(super) fn globals(l: &mut Loader, c: &ModelConfig) -> Result<(WeightId, WeightId, WeightId)> {
    let token_embd = l.tensor("token_embd.weight", &[c.n_embd, c.n_vocab], MATRIX)?;
    let output_norm = l.vector("output_norm.weight", c.n_embd, 1)?;
    let output = if l.info("output.weight").is_some() { l.tensor("output.weight", &[c.n_embd, c.n_vocab], MATRIX)? } else { token_embd };
    Ok((token_embd, output_norm, output))
}

/// Layer `i`'s attention tensors. `gated`: `attn_q` holds each head's query rows then its
/// output-gate rows (qwen35moe), split here into two matrices of whole rows. Where q, k and v
/// have one type (and the options fuse), they become one matrix of q's rows, then k's, then
/// v's: a fused `attn_qkv` as the file stores it, or their rows copied together.
pub(super) fn attention(l: &mut Loader, i: usize, c: &ModelConfig, gated: bool) -> Result<AttnWeights> {
    let name = |t: &str| format!("blk.{i}.{t}");
    let (n_embd, hd, n_head) = (c.n_embd, c.head_dim, c.n_head);
    let (q_dim, kv_dim) = (n_head * hd, c.n_head_kv * hd);
    let q_rows = if gated { 2 * q_dim } else { q_dim };
    // The matrices are taken out of the list: only what the step reads is pushed back.
    let (file_qkv, q_all, k, v) = if l.info(&name("attn_qkv.weight")).is_some() {
        let qkv = l.tensor(&name("attn_qkv.weight"), &[n_embd, q_rows + 2 * kv_dim], MATRIX)?;
        let qkv = l.take_last(qkv);
        let part = |t: &str, first: usize, rows: usize| rows_of(&qkv, &format!("{}[{t}]", qkv.name), first, rows);
        let (q, k, v) = (part("q", 0, q_rows), part("k", q_rows, kv_dim), part("v", q_rows + kv_dim, kv_dim));
        (Some(qkv), q, k, v)
    } else {
        let mut matrix = |t: &str, rows: usize| -> Result<Weight> {
            let id = l.tensor(&name(t), &[n_embd, rows], MATRIX)?;
            Ok(l.take_last(id))
        };
        (None, matrix("attn_q.weight", q_rows)?, matrix("attn_k.weight", kv_dim)?, matrix("attn_v.weight", kv_dim)?)
    };
    // Rows `first..first + hd` of each head's rows in `q_all`: 0 its query rows, `hd` (gated)
    // its output gate's.
    let per_head = q_rows / n_head;
    let head_rows = move |first: usize| (0..n_head).flat_map(move |h| h * per_head + first..h * per_head + first + hd);
    let gate = gated.then(|| l.gather_rows(&format!("{}[gate]", q_all.name), head_rows(hd).map(|r| (&q_all, r)), 1));
    let q_name = if gated { format!("{}[query]", q_all.name) } else { q_all.name.clone() };
    let bias = qkv_biases(l, i, q_dim, kv_dim)?;
    if gated && bias.parts.iter().any(Option::is_some) {
        return Err(l.err(name("attn_q.bias"), "attention biases with a gated query are not supported"));
    }
    let proj = if l.options.fuse_qkv && q_all.ty == k.ty && k.ty == v.ty {
        let qkv = match file_qkv {
            Some(qkv) if !gated => l.push(qkv),
            _ => l.gather_rows(&format!("{q_name}+{}+{}", k.name, v.name), head_rows(0).map(|r| (&q_all, r)).chain(all_rows(&k)).chain(all_rows(&v)), 1),
        };
        let bias = bias.parts.iter().any(Option::is_some).then(|| {
            // A missing part adds -0.0, which keeps every value's bits (+0.0 would turn -0.0
            // into +0.0), as the split path's skipped add does.
            let parts = bias.parts.iter().zip([q_dim, kv_dim, kv_dim]);
            let row: Vec<f32> = parts.flat_map(|(p, n)| p.as_ref().map_or(vec![-0.0; n], |(_, values)| values.clone())).collect();
            l.push(repeated(bias.fused_name, row))
        });
        QkvProj::Fused { qkv, bias }
    } else {
        let q = if gated { l.gather_rows(&q_name, head_rows(0).map(|r| (&q_all, r)), 1) } else { l.push(q_all) };
        let (k, v) = (l.push(k), l.push(v));
        let bias = bias.parts.map(|p| p.map(|(name, values)| l.push(repeated(name, values))));
        QkvProj::Split { q, k, v, bias }
    };
    let q_norm = l.vector(&name("attn_q_norm.weight"), hd, 1)?;
    let k_norm = l.vector(&name("attn_k_norm.weight"), hd, 1)?;
    let o = l.tensor(&name("attn_output.weight"), &[q_dim, n_embd], MATRIX)?;
    Ok(AttnWeights { proj, gate, q_norm, k_norm, o })
}

/// Layer `i`'s q, k and v biases as the file has them (each optional; a fused `attn_qkv.bias`
/// or separate ones), not repeated yet, with their names and the fused bias's name.
struct QkvBiases {
    parts: [Option<(String, Vec<f32>)>; 3],
    fused_name: String,
}

fn qkv_biases(l: &mut Loader, i: usize, q_dim: usize, kv_dim: usize) -> Result<QkvBiases> {
    let name = |t: &str| format!("blk.{i}.{t}");
    let mut parts: [Option<(String, Vec<f32>)>; 3] = Default::default();
    let sizes = [q_dim, kv_dim, kv_dim];
    if l.info(&name("attn_qkv.bias")).is_some() {
        let all = l.vector(&name("attn_qkv.bias"), q_dim + 2 * kv_dim, 1)?;
        let all = l.take_last(all);
        let mut rest = all.f32s();
        for (slot, n) in sizes.into_iter().enumerate() {
            let (part, tail) = rest.split_at(n);
            parts[slot] = Some((format!("{}[{slot}]", all.name), part.to_vec()));
            rest = tail;
        }
        return Ok(QkvBiases { parts, fused_name: all.name });
    }
    for (slot, (t, n)) in ["attn_q.bias", "attn_k.bias", "attn_v.bias"].into_iter().zip(sizes).enumerate() {
        if l.info(&name(t)).is_some() {
            let id = l.vector(&name(t), n, 1)?;
            parts[slot] = Some((name(t), l.take_last(id).f32s().to_vec()));
        }
    }
    let fused_name = parts.iter().flatten().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join("+");
    Ok(QkvBiases { parts, fused_name })
}

/// A bias of one row, repeated for every row of a window (the residual-add kernel adds it).
fn repeated(name: String, row: Vec<f32>) -> Weight {
    Weight { name, ty: GgmlType::F32, rows: MAX_WINDOW, cols: row.len(), n_expert: 1, data: Data::F32(row.repeat(MAX_WINDOW)) }
}

/// Layer `i`'s router and routed experts (`router`, `gate`, `up`, `down`).
pub(super) fn routed_experts(l: &mut Loader, i: usize, c: &ModelConfig) -> Result<[WeightId; 4]> {
    let name = |t: &str| format!("blk.{i}.{t}");
    let (n_embd, n_ff, n_expert) = (c.n_embd, c.n_ff_exp, c.n_expert);
    let router = l.tensor(&name("ffn_gate_inp.weight"), &[n_embd, n_expert], MATRIX)?;
    let (gate, up) = if l.info(&name("ffn_gate_up_exps.weight")).is_some() {
        // Each expert's gate rows then its up rows: copied apart at load (the expert kernels
        // take one matrix per expert), the fused tensor itself not kept.
        let both = l.tensor(&name("ffn_gate_up_exps.weight"), &[n_embd, 2 * n_ff, n_expert], &[Kind::Quant])?;
        let both = l.take_last(both);
        let half = |first: usize| (0..n_expert).flat_map(move |e| 2 * n_ff * e + first..2 * n_ff * e + first + n_ff);
        let gate = l.gather_rows(&format!("{}[gate]", both.name), half(0).map(|r| (&both, r)), n_expert);
        let up = l.gather_rows(&format!("{}[up]", both.name), half(n_ff).map(|r| (&both, r)), n_expert);
        (gate, up)
    } else {
        (
            l.tensor(&name("ffn_gate_exps.weight"), &[n_embd, n_ff, n_expert], &[Kind::Quant])?,
            l.tensor(&name("ffn_up_exps.weight"), &[n_embd, n_ff, n_expert], &[Kind::Quant])?,
        )
    };
    let down = l.tensor(&name("ffn_down_exps.weight"), &[n_ff, n_embd, n_expert], &[Kind::Quant])?;
    if l.list[gate.0].ty != l.list[up.0].ty {
        return Err(l.err(name("ffn_up_exps.weight"), format!("type {} differs from ffn_gate_exps ({}): one format for both is supported", l.list[up.0].ty.name(), l.list[gate.0].ty.name())));
    }
    Ok([router, gate, up, down])
}
