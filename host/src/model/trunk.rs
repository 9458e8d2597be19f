//! What qwen3moe and qwen35moe files share: the trunk's keys and their checks, the embedding,
//! output norm and head, the attention tensors and the routed experts of a layer.
use super::config::ModelConfig;
use super::loader::{rows_of, Kind, Loader, MATRIX};
use super::weights::{AttnWeights, Data, Weight, WeightId};
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
/// output-gate rows (qwen35moe), split here into two matrices of whole rows.
pub(super) fn attention(l: &mut Loader, i: usize, c: &ModelConfig, gated: bool) -> Result<AttnWeights> {
    let name = |t: &str| format!("blk.{i}.{t}");
    let (n_embd, hd) = (c.n_embd, c.head_dim);
    let (q_dim, kv_dim) = (c.n_head * hd, c.n_head_kv * hd);
    let q_rows = if gated { 2 * q_dim } else { q_dim };
    // The query rows are kept out of the list until they are split (gated) or pushed as they are.
    let (q_all, k, v) = if l.info(&name("attn_qkv.weight")).is_some() {
        // Only the slices stay in the list: the fused matrix itself is not read.
        let qkv = l.tensor(&name("attn_qkv.weight"), &[n_embd, q_rows + 2 * kv_dim], MATRIX)?;
        let qkv = l.take_last(qkv);
        (
            rows_of(&qkv, &name("attn_qkv.weight[q]"), 0, q_rows),
            l.row_slice(&qkv, &name("attn_qkv.weight[k]"), q_rows, kv_dim),
            l.row_slice(&qkv, &name("attn_qkv.weight[v]"), q_rows + kv_dim, kv_dim),
        )
    } else {
        let q = l.tensor(&name("attn_q.weight"), &[n_embd, q_rows], MATRIX)?;
        let q = l.take_last(q);
        (q, l.tensor(&name("attn_k.weight"), &[n_embd, kv_dim], MATRIX)?, l.tensor(&name("attn_v.weight"), &[n_embd, kv_dim], MATRIX)?)
    };
    let (q, gate) = if gated {
        let only = |first: usize| (0..c.n_head).flat_map(move |h| 2 * h * hd + first..2 * h * hd + first + hd);
        let q = l.gather_rows(&q_all, &format!("{}[query]", q_all.name), only(0), 1);
        let gate = l.gather_rows(&q_all, &format!("{}[gate]", q_all.name), only(hd), 1);
        (q, Some(gate))
    } else {
        (l.push(q_all), None)
    };
    let mut qkv_bias = [None; 3];
    if l.info(&name("attn_qkv.bias")).is_some() {
        let all = l.vector(&name("attn_qkv.bias"), q_dim + 2 * kv_dim, 1)?;
        let all = l.take_last(all);
        let Data::F32(values) = all.data else { unreachable!("vectors are prepared") };
        for (slot, (first, n)) in [(0, q_dim), (q_dim, kv_dim), (q_dim + kv_dim, kv_dim)].into_iter().enumerate() {
            let data = values[first..first + n].repeat(MAX_WINDOW);
            qkv_bias[slot] = Some(l.push(Weight { name: format!("{}[{slot}]", all.name), ty: GgmlType::F32, rows: MAX_WINDOW, cols: n, n_expert: 1, data: Data::F32(data) }));
        }
    } else {
        for (slot, (t, n)) in [("attn_q.bias", q_dim), ("attn_k.bias", kv_dim), ("attn_v.bias", kv_dim)].into_iter().enumerate() {
            if l.info(&name(t)).is_some() {
                qkv_bias[slot] = Some(l.vector(&name(t), n, MAX_WINDOW)?);
            }
        }
    }
    if gated && qkv_bias.iter().any(Option::is_some) {
        return Err(l.err(name("attn_q.bias"), "attention biases with a gated query are not supported"));
    }
    let q_norm = l.vector(&name("attn_q_norm.weight"), hd, 1)?;
    let k_norm = l.vector(&name("attn_k_norm.weight"), hd, 1)?;
    let o = l.tensor(&name("attn_output.weight"), &[q_dim, n_embd], MATRIX)?;
    Ok(AttnWeights { q, gate, k, v, qkv_bias, q_norm, k_norm, o })
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
        let gate = l.gather_rows(&both, &format!("{}[gate]", both.name), half(0), n_expert);
        let up = l.gather_rows(&both, &format!("{}[up]", both.name), half(n_ff), n_expert);
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
