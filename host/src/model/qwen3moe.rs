//! `qwen3moe` (MODELS.md section 1): reads the hyper-parameters and finds, checks and prepares
//! every tensor of a file, then describes one decode step as an op list ([`Qwen3Moe::step_ops`]).
//!
//! Everything a step reads is in [`Weights`]: matrices stay as the file stores them (borrowed
//! from the memory map), norm weights are widened to f32 (exact), a fused `attn_qkv` is split
//! into its q, k and v rows, and biases are repeated for every row of a window so the step adds
//! them with the plain residual kernel.
use std::path::Path;
use std::sync::Arc;

use super::config::Qwen3MoeConfig;
use crate::error::{Error, Result};
use crate::gguf::{GgmlType, GgufFile, TensorInfo, Value};
use crate::step::{Act, Op, Qx, MAX_WINDOW};
use strata_gpu_shared::formats::{FloatFormat, WeightFormat};

pub const ARCH: &str = "qwen3moe";

/// Where a weight's bytes are.
#[derive(Clone, Debug)]
pub enum Data {
    /// A byte range of the model file, as stored.
    File { offset: usize, len: usize },
    /// A vector prepared at load time (norms widened to f32, repeated biases).
    F32(Vec<f32>),
}

/// One weight of the step: `rows` x `cols` values of `ty` (ggml's ne1 x ne0; experts stack
/// `n_expert` such matrices).
#[derive(Clone, Debug)]
pub struct Weight {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub n_expert: usize,
    pub data: Data,
}

impl Weight {
    pub fn bytes(&self) -> usize {
        match &self.data {
            Data::File { len, .. } => *len,
            Data::F32(v) => 4 * v.len(),
        }
    }
}

/// Index of a weight in [`Weights::list`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightId(pub usize);

/// The weights of one layer.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: WeightId,
    pub q: WeightId,
    pub k: WeightId,
    pub v: WeightId,
    /// Biases of q, k, v (optional in the file), each repeated [`MAX_WINDOW`] times.
    pub qkv_bias: [Option<WeightId>; 3],
    pub q_norm: WeightId,
    pub k_norm: WeightId,
    pub o: WeightId,
    pub ffn_norm: WeightId,
    pub router: WeightId,
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
}

/// Every weight a step reads, with the file they come from.
pub struct Weights {
    pub file: Arc<GgufFile>,
    pub list: Vec<Weight>,
    pub token_embd: WeightId,
    pub output_norm: WeightId,
    /// `output`, or `token_embd` when the file has no head (tied).
    pub output: WeightId,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    pub fn get(&self, id: WeightId) -> &Weight {
        &self.list[id.0]
    }

    /// The bytes of a matrix, as the file stores them.
    pub fn data(&self, id: WeightId) -> &[u8] {
        match &self.list[id.0].data {
            Data::File { offset, len } => &self.file.bytes()[*offset..*offset + *len],
            Data::F32(_) => unreachable!("{} is a prepared vector, not a matrix", self.list[id.0].name),
        }
    }

    /// A prepared vector (a norm or a repeated bias).
    pub fn f32s(&self, id: WeightId) -> &[f32] {
        match &self.list[id.0].data {
            Data::F32(v) => v,
            Data::File { .. } => unreachable!("{} is a matrix, not a prepared vector", self.list[id.0].name),
        }
    }

    /// Bytes of all weights.
    pub fn total_bytes(&self) -> usize {
        self.list.iter().map(Weight::bytes).sum()
    }
}

/// A loaded qwen3moe model.
pub struct Qwen3Moe {
    pub config: Qwen3MoeConfig,
    pub weights: Weights,
}

/// Reads keys and tensors, with errors that name the file and what is wrong.
struct Loader<'a> {
    file: &'a GgufFile,
    /// The file's tensors by name (one lookup per tensor, whatever the file's tensor count).
    by_name: std::collections::HashMap<&'a str, &'a TensorInfo>,
    list: Vec<Weight>,
}

impl Loader<'_> {
    fn err(&self, what: impl Into<String>, detail: impl Into<String>) -> Error {
        Error::Model { file: self.file.path.clone(), what: Some(what.into()), detail: detail.into() }
    }

    fn key(&self, name: &str) -> Option<&Value> {
        self.file.get(&format!("{ARCH}.{name}"))
    }

    /// An integer key; scalar, or an array whose elements are all equal (per-layer keys).
    fn uint(&self, name: &str, default: Option<u64>) -> Result<usize> {
        let full = format!("{ARCH}.{name}");
        let v = match self.key(name) {
            None => return default.map(|d| d as usize).ok_or_else(|| self.err(format!("key {full}"), "missing")),
            Some(Value::Array(items)) => {
                let vals: Vec<Option<u64>> = items.iter().map(Value::as_u64).collect();
                match vals.first() {
                    Some(Some(first)) if vals.iter().all(|v| *v == Some(*first)) => Some(*first),
                    _ => return Err(self.err(format!("key {full}"), "per-layer values that differ are not supported")),
                }
            }
            Some(v) => v.as_u64(),
        };
        let v = v.ok_or_else(|| self.err(format!("key {full}"), "not a non-negative integer"))?;
        usize::try_from(v).ok().filter(|&v| v <= u32::MAX as usize).ok_or_else(|| self.err(format!("key {full}"), format!("{v} is out of range")))
    }

    fn float(&self, name: &str, default: Option<f32>) -> Result<f32> {
        let full = format!("{ARCH}.{name}");
        match self.key(name) {
            None => default.ok_or_else(|| self.err(format!("key {full}"), "missing")),
            Some(Value::F32(v)) if v.is_finite() => Ok(*v),
            Some(Value::F64(v)) if v.is_finite() => Ok(*v as f32),
            Some(v) => Err(self.err(format!("key {full}"), format!("expected a finite float, found {v}"))),
        }
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).copied()
    }

    /// Tensor `name` with dims `want` (ggml order), as stored.
    fn tensor(&mut self, name: &str, want: &[usize], allowed: &[Kind]) -> Result<WeightId> {
        let t = self.info(name).ok_or_else(|| self.err(format!("tensor {name}"), "missing"))?.clone();
        let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        if dims != want {
            return Err(self.err(format!("tensor {name}"), format!("shape {dims:?}, expected {want:?}")));
        }
        if !allowed.iter().any(|k| k.admits(t.ty)) {
            let names: Vec<&str> = allowed.iter().map(|k| k.describe()).collect();
            return Err(self.err(format!("tensor {name}"), format!("type {} is not supported here (supported: {})", t.ty.name(), names.join(", "))));
        }
        let (rows, n_expert) = match dims.len() {
            1 => (1, 1),
            2 => (dims[1], 1),
            _ => (dims[1], dims[2]),
        };
        Ok(self.push(Weight { name: name.into(), ty: t.ty, rows, cols: dims[0], n_expert, data: Data::File { offset: t.offset as usize, len: t.bytes as usize } }))
    }

    fn push(&mut self, w: Weight) -> WeightId {
        self.list.push(w);
        WeightId(self.list.len() - 1)
    }

    /// A norm (or bias) vector of `n` values, widened to f32 and repeated `repeat` times.
    fn vector(&mut self, name: &str, n: usize, repeat: usize) -> Result<WeightId> {
        let id = self.tensor(name, &[n], &[Kind::Float])?;
        let w = self.take_last(id);
        let Data::File { offset, len } = w.data else { unreachable!("tensors come from the file") };
        let bytes = &self.file.bytes()[offset..offset + len];
        let format = float_format(w.ty).expect("Kind::Float admits float types only");
        let values: Vec<f32> = (0..n).map(|j| format.get(bytes, j)).collect();
        if values.iter().any(|v| !v.is_finite()) {
            return Err(self.err(format!("tensor {name}"), "holds a non-finite value"));
        }
        Ok(self.push(Weight { name: name.into(), ty: GgmlType::F32, rows: repeat, cols: n, n_expert: 1, data: Data::F32(values.repeat(repeat)) }))
    }

    /// Removes the weight just pushed (a fused tensor only its slices are kept of).
    fn take_last(&mut self, id: WeightId) -> Weight {
        debug_assert_eq!(id.0 + 1, self.list.len());
        self.list.pop().expect("just pushed")
    }

    /// Rows `first..first + rows` of a checked matrix, as a weight of its own.
    fn row_slice(&mut self, w: &Weight, name: &str, first: usize, rows: usize) -> WeightId {
        let w = w.clone();
        let row_bytes = w.bytes() / w.rows;
        let Data::File { offset, .. } = w.data else { unreachable!("matrices come from the file") };
        self.push(Weight { name: name.into(), rows, data: Data::File { offset: offset + first * row_bytes, len: rows * row_bytes }, ..w })
    }
}

/// What a tensor's role accepts.
#[derive(Clone, Copy)]
enum Kind {
    /// F32, F16, BF16.
    Float,
    /// Any quantized weight format.
    Quant,
}

impl Kind {
    fn admits(self, ty: GgmlType) -> bool {
        match self {
            Kind::Float => matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16),
            Kind::Quant => matches!(ty, GgmlType::Quant(_)),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Kind::Float => "F32, F16, BF16",
            Kind::Quant => "Q8_0, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, Q2_0",
        }
    }
}

/// The float format of the float matvec for a float tensor type.
pub fn float_format(ty: GgmlType) -> Option<FloatFormat> {
    match ty {
        GgmlType::F32 => Some(FloatFormat::F32),
        GgmlType::F16 => Some(FloatFormat::F16),
        GgmlType::Bf16 => Some(FloatFormat::Bf16),
        GgmlType::Quant(_) => None,
    }
}

/// Matrices: quantized or float.
const MATRIX: &[Kind] = &[Kind::Quant, Kind::Float];

impl Qwen3Moe {
    /// Opens and checks `path`.
    pub fn open(path: &Path) -> Result<Qwen3Moe> {
        Self::load(Arc::new(GgufFile::open(path)?))
    }

    /// Checks a parsed file and prepares its weights.
    pub fn load(file: Arc<GgufFile>) -> Result<Qwen3Moe> {
        let mut l = Loader { file: &file, by_name: file.tensors.iter().map(|t| (t.name.as_str(), t)).collect(), list: Vec::new() };
        match file.get("general.architecture").and_then(Value::as_str) {
            Some(ARCH) => {}
            Some(other) => return Err(l.err("architecture", format!("`{other}` is not supported (Strata decodes {ARCH})"))),
            None => return Err(l.err("key general.architecture", "missing: not a model file")),
        }
        let n_embd = l.uint("embedding_length", None)?;
        let n_head = l.uint("attention.head_count", None)?;
        let n_head_kv = l.uint("attention.head_count_kv", Some(n_head as u64))?;
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(l.err("attention heads", format!("{n_head} query heads are not a multiple of {n_head_kv} key/value heads")));
        }
        let head_dim = l.uint("attention.key_length", Some((n_embd / n_head) as u64))?;
        let value_dim = l.uint("attention.value_length", Some(head_dim as u64))?;
        let n_rot = l.uint("rope.dimension_count", Some(head_dim as u64))?;
        if value_dim != head_dim || n_rot != head_dim {
            return Err(l.err("attention", format!("key length {head_dim}, value length {value_dim}, rope dims {n_rot}: qwen3moe needs all three equal")));
        }
        if head_dim == 0 || head_dim % 32 != 0 || head_dim > 256 {
            return Err(l.err("attention.key_length", format!("head dim {head_dim}: supported are multiples of 32 up to 256")));
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
        let config = Qwen3MoeConfig {
            n_layer: l.uint("block_count", None)?,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_vocab,
            n_ctx_train: l.uint("context_length", Some(4096))?,
            rope_freq_base: l.float("rope.freq_base", Some(10_000.0))?,
            rms_eps: l.float("attention.layer_norm_rms_epsilon", None)?,
        };
        if n_embd == 0 || n_embd % 32 != 0 || n_ff_exp == 0 || n_ff_exp % 32 != 0 {
            return Err(l.err("shape", format!("n_embd {n_embd} and expert n_ff {n_ff_exp} must be positive multiples of 32")));
        }
        if n_embd > strata_gpu_shared::launch::norm::NORM_MAX_N {
            return Err(l.err(format!("key {ARCH}.embedding_length"), format!("{n_embd}: rows longer than {} are not supported", strata_gpu_shared::launch::norm::NORM_MAX_N)));
        }
        if !(config.rope_freq_base > 0.0) {
            return Err(l.err(format!("key {ARCH}.rope.freq_base"), format!("{} must be positive", config.rope_freq_base)));
        }
        if config.n_layer == 0 {
            return Err(l.err(format!("key {ARCH}.block_count"), "0 layers"));
        }
        if n_expert > strata_gpu_shared::launch::route::ROUTER_MAX_EXPERTS || n_expert_used > strata_gpu_shared::launch::route::ROUTER_MAX_K {
            return Err(l.err("experts", format!(
                "{n_expert} experts, {n_expert_used} used: the router supports up to {} experts and {} used",
                strata_gpu_shared::launch::route::ROUTER_MAX_EXPERTS,
                strata_gpu_shared::launch::route::ROUTER_MAX_K
            )));
        }
        if !(config.rms_eps > 0.0) {
            return Err(l.err(format!("key {ARCH}.attention.layer_norm_rms_epsilon"), format!("{} must be positive", config.rms_eps)));
        }

        let token_embd = l.tensor("token_embd.weight", &[n_embd, n_vocab], MATRIX)?;
        let output_norm = l.vector("output_norm.weight", n_embd, 1)?;
        let output = if l.info("output.weight").is_some() { l.tensor("output.weight", &[n_embd, n_vocab], MATRIX)? } else { token_embd };
        let (q_dim, kv_dim) = (n_head * head_dim, n_head_kv * head_dim);
        let mut layers = Vec::new(); // not sized from the file: a hostile block_count fails at its first missing tensor
        for i in 0..config.n_layer {
            let name = |t: &str| format!("blk.{i}.{t}");
            let attn_norm = l.vector(&name("attn_norm.weight"), n_embd, 1)?;
            let (q, k, v) = if l.info(&name("attn_qkv.weight")).is_some() {
                // Only the three slices stay in the list: the fused matrix itself is not read.
                let qkv = l.tensor(&name("attn_qkv.weight"), &[n_embd, q_dim + 2 * kv_dim], MATRIX)?;
                let qkv = l.take_last(qkv);
                (
                    l.row_slice(&qkv, &name("attn_qkv.weight[q]"), 0, q_dim),
                    l.row_slice(&qkv, &name("attn_qkv.weight[k]"), q_dim, kv_dim),
                    l.row_slice(&qkv, &name("attn_qkv.weight[v]"), q_dim + kv_dim, kv_dim),
                )
            } else {
                (
                    l.tensor(&name("attn_q.weight"), &[n_embd, q_dim], MATRIX)?,
                    l.tensor(&name("attn_k.weight"), &[n_embd, kv_dim], MATRIX)?,
                    l.tensor(&name("attn_v.weight"), &[n_embd, kv_dim], MATRIX)?,
                )
            };
            let mut qkv_bias = [None; 3];
            if l.info(&name("attn_qkv.bias")).is_some() {
                let all = l.vector(&name("attn_qkv.bias"), q_dim + 2 * kv_dim, 1)?;
                let all = l.take_last(all);
                let Data::F32(values) = all.data else { unreachable!("vectors are prepared") };
                for (slot, (first, n)) in [(0, q_dim), (q_dim, kv_dim), (q_dim + kv_dim, kv_dim)].into_iter().enumerate() {
                    let part = &values[first..first + n];
                    let data = part.repeat(MAX_WINDOW);
                    qkv_bias[slot] = Some(l.push(Weight { name: format!("{}[{slot}]", all.name), ty: GgmlType::F32, rows: MAX_WINDOW, cols: n, n_expert: 1, data: Data::F32(data) }));
                }
            } else {
                for (slot, (t, n)) in [("attn_q.bias", q_dim), ("attn_k.bias", kv_dim), ("attn_v.bias", kv_dim)].into_iter().enumerate() {
                    if l.info(&name(t)).is_some() {
                        qkv_bias[slot] = Some(l.vector(&name(t), n, MAX_WINDOW)?);
                    }
                }
            }
            let q_norm = l.vector(&name("attn_q_norm.weight"), head_dim, 1)?;
            let k_norm = l.vector(&name("attn_k_norm.weight"), head_dim, 1)?;
            let o = l.tensor(&name("attn_output.weight"), &[q_dim, n_embd], MATRIX)?;
            let ffn_norm = l.vector(&name("ffn_norm.weight"), n_embd, 1)?;
            let router = l.tensor(&name("ffn_gate_inp.weight"), &[n_embd, n_expert], MATRIX)?;
            let gate = l.tensor(&name("ffn_gate_exps.weight"), &[n_embd, n_ff_exp, n_expert], &[Kind::Quant])?;
            let up = l.tensor(&name("ffn_up_exps.weight"), &[n_embd, n_ff_exp, n_expert], &[Kind::Quant])?;
            let down = l.tensor(&name("ffn_down_exps.weight"), &[n_ff_exp, n_embd, n_expert], &[Kind::Quant])?;
            if l.list[gate.0].ty != l.list[up.0].ty {
                return Err(l.err(name("ffn_up_exps.weight"), format!("type {} differs from ffn_gate_exps ({}): one format for both is supported", l.list[up.0].ty.name(), l.list[gate.0].ty.name())));
            }
            layers.push(LayerWeights { attn_norm, q, k, v, qkv_bias, q_norm, k_norm, o, ffn_norm, router, gate, up, down });
        }
        let list = std::mem::take(&mut l.list);
        drop(l);
        let weights = Weights { file, list, token_embd, output_norm, output, layers };
        Ok(Qwen3Moe { config, weights })
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
        let roles: [(&str, Vec<WeightId>); 6] = [
            ("embedding", vec![w.token_embd]),
            ("attention", w.layers.iter().flat_map(|l| [l.q, l.k, l.v, l.o]).collect()),
            ("router", w.layers.iter().map(|l| l.router).collect()),
            ("gate/up", w.layers.iter().flat_map(|l| [l.gate, l.up]).collect()),
            ("down", w.layers.iter().map(|l| l.down).collect()),
            (if w.output == w.token_embd { "head (tied)" } else { "head" }, vec![w.output]),
        ];
        roles.into_iter().map(|(role, ids)| format!("{role} {}", names(&mut ids.into_iter()))).collect::<Vec<_>>().join(", ")
    }

    /// Bytes of weights a one-token step reads: every matrix and vector once, one row of the
    /// embedding (unless it is also the head), and `n_expert_used` experts of each layer.
    pub fn step_weight_bytes(&self) -> usize {
        let w = &self.weights;
        let experts: Vec<WeightId> = w.layers.iter().flat_map(|l| [l.gate, l.up, l.down]).collect();
        let mut total = 0;
        for (i, weight) in w.list.iter().enumerate() {
            let id = WeightId(i);
            total += if experts.contains(&id) {
                weight.bytes() / weight.n_expert * self.config.n_expert_used
            } else if id == w.token_embd && w.output != w.token_embd {
                weight.bytes() / weight.rows
            } else {
                weight.bytes()
            };
        }
        total
    }

    /// One step over a window as an op list (the window size and position are given when it
    /// runs): every backend runs this same list.
    pub fn step_ops(&self, pick: Op) -> Vec<Op> {
        let c = &self.config;
        let w = &self.weights;
        let linear = |id: WeightId, xq: Qx, x: Act, out: Act| Op::Linear { w: id, xq, x, out };
        let mut ops = vec![Op::Embed { table: w.token_embd, out: Act::X }];
        for (layer, lw) in w.layers.iter().enumerate() {
            ops.push(Op::RmsNorm { x: Act::X, w: lw.attn_norm, out: Act::Xn });
            ops.push(Op::Quantize { x: Act::Xn, out: Qx::X });
            for ((id, out), bias) in [(lw.q, Act::Q), (lw.k, Act::K), (lw.v, Act::V)].into_iter().zip(lw.qkv_bias) {
                ops.push(linear(id, Qx::X, Act::Xn, out));
                if let Some(b) = bias {
                    ops.push(Op::AddWeight { acc: out, w: b });
                }
            }
            ops.push(Op::AttnPrep { layer, q_norm: lw.q_norm, k_norm: lw.k_norm });
            ops.push(Op::Attention { layer });
            ops.push(Op::Quantize { x: Act::Attn, out: Qx::Attn });
            ops.push(linear(lw.o, Qx::Attn, Act::Attn, Act::Proj));
            ops.push(Op::AddInto { acc: Act::X, b: Act::Proj });
            ops.push(Op::RmsNorm { x: Act::X, w: lw.ffn_norm, out: Act::Xn });
            ops.push(Op::Quantize { x: Act::Xn, out: Qx::X });
            ops.push(linear(lw.router, Qx::X, Act::Xn, Act::Router));
            ops.push(Op::RouterTopK { k: c.n_expert_used });
            ops.push(Op::Experts { gate: lw.gate, up: lw.up, down: lw.down });
            ops.push(Op::AddInto { acc: Act::X, b: Act::Experts });
        }
        ops.push(Op::RmsNorm { x: Act::X, w: w.output_norm, out: Act::Xn });
        ops.push(Op::Quantize { x: Act::Xn, out: Qx::X });
        ops.push(linear(w.output, Qx::X, Act::Xn, Act::Logits));
        ops.push(pick);
        ops.push(Op::Accept);
        ops
    }
}

/// The quantized format of a weight, when it has one.
pub fn quant_format(ty: GgmlType) -> Option<WeightFormat> {
    match ty {
        GgmlType::Quant(f) => Some(f),
        _ => None,
    }
}
