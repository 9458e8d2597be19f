//! Synthetic qwen3moe and qwen35moe models: random weights of any shape and format, written as a
//! GGUF file that Strata, llama.cpp and the `gguf` package load (`strata synth`, the built-in
//! model). What a qwen35moe file adds is [`super::synth_hybrid`]'s.
//!
//! Random weights still make a numerically sane model through 48 layers, because each tensor's
//! scale is chosen from its shape:
//! - a matrix with `k` inputs gets weights of variance `1/k`, so for inputs of unit variance
//!   each output has variance `k * E[w^2] = 1` (the outputs of q, k, v, the attention output, the
//!   experts' gate, up and down, the router's logits and the head's logits all stay near 1 while
//!   the residual stream grows by about one per sublayer). For a quantized format, a block's value
//!   is `d * L` with `L` the format's level for random bytes (sub-block scales, grids, signs
//!   included), so `d = 1 / sqrt(k * E[L^2])`, with a random sign per block (zero mean).
//!   `E[L^2]` is measured once per format by dequantizing [`LEVEL_BLOCKS`] random blocks at
//!   `d = 1` (deterministic, within about 1% of the exact moment). Float formats get values
//!   uniform in `[-sqrt(3/k), sqrt(3/k)]`.
//! - the token embedding has unit-variance elements (`k = 1`); with a tied head the logits then
//!   have variance `n_embd` (sharper, still finite).
//! - norm weights are F32, uniform in [0.8, 1.2].
//!
//! Files are written as a stream ([`GgufWriter::write_streaming`]): header first, then each
//! tensor's data generated in chunks of whole rows in parallel (rayon) and written in order. Each
//! chunk's generator is seeded from the spec's seed, the tensor's name and the chunk's index, and
//! chunks depend only on the shape, so the bytes do not depend on the thread count, and the
//! in-memory build ([`build_in_memory`]) is the same bytes as the file.
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use strata_gpu_shared::f16::f32_to_f16;
use strata_gpu_shared::formats::WeightFormat;

use super::config::ModelConfig;
use super::synth_hybrid::HybridShape;
use super::vocab;
use crate::gguf::{GgmlType, GgufWriter, TensorDecl, TensorSink, Value};
use crate::reference::dequant_row_f32;

/// Random blocks dequantized per format to measure `E[L^2]`.
pub const LEVEL_BLOCKS: usize = 2048;
/// Bytes of one generated chunk (whole rows; at least one row).
const CHUNK_BYTES: u64 = 1 << 20;
/// Chunks generated in parallel before they are written: bounds the memory in flight.
const CHUNKS_IN_FLIGHT: usize = 64;

/// The format of each kind of tensor. Norms are always F32.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthFormats {
    pub embd: GgmlType,
    pub attn: GgmlType,
    pub router: GgmlType,
    pub gu: GgmlType,
    pub down: GgmlType,
    pub head: GgmlType,
    /// No `output.weight`: the head is the token embedding.
    pub tied_head: bool,
}

/// What to synthesize.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub config: ModelConfig,
    pub formats: SynthFormats,
    pub seed: u64,
    /// Carry the synthetic vocabulary ([`vocab::synthetic`]); without it the file says
    /// `tokenizer.ggml.model = "none"` and `{arch}.vocab_size`.
    pub vocab: bool,
    /// A qwen35moe file's extra shape (its GDN and gated attention layers, shared experts and
    /// MTP block); `None` writes qwen3moe.
    pub hybrid: Option<HybridShape>,
}

const Q8_0: GgmlType = GgmlType::Quant(WeightFormat::Q8_0);

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Init {
    /// F32 uniform in [0.8, 1.2].
    Norm,
    /// Variance `1/k`: unit-variance outputs for unit-variance inputs.
    Matrix { k: u64 },
    /// Float, uniform in `[lo, hi]`.
    Uniform { lo: f32, hi: f32 },
}

pub(super) struct SynthTensor {
    pub(super) decl: TensorDecl,
    pub(super) init: Init,
}

pub(super) fn tensor(name: String, dims: &[u64], ty: GgmlType, init: Init) -> SynthTensor {
    SynthTensor { decl: TensorDecl { name, dims: dims.to_vec(), ty }, init }
}

/// An F32 norm weight of `n` values.
pub(super) fn norm(name: String, n: u64) -> SynthTensor {
    tensor(name, &[n], GgmlType::F32, Init::Norm)
}

/// A matrix (or stack of them) of `dims[0]` inputs.
pub(super) fn matrix(name: String, dims: &[u64], ty: GgmlType) -> SynthTensor {
    tensor(name, dims, ty, Init::Matrix { k: dims[0] })
}

impl SynthFormats {
    /// Formats like a real low-bit quant: IQ3_S gate/up, IQ4_NL down, Q8_0 attention, embedding
    /// and head, F32 router.
    pub fn mixed() -> SynthFormats {
        SynthFormats {
            embd: Q8_0,
            attn: Q8_0,
            router: GgmlType::F32,
            gu: GgmlType::Quant(WeightFormat::Iq3S),
            down: GgmlType::Quant(WeightFormat::Iq4Nl),
            head: Q8_0,
            tied_head: false,
        }
    }
}

impl SynthSpec {
    /// A model that decodes fast on the CPU: 4 layers, n_embd 256, 4/2 heads of 64, 8 experts
    /// top-2 of 128, mixed formats, and 1248 tokens: every token the built-in text teaches (989),
    /// the bytes and the control tokens, no filler.
    pub fn tiny() -> SynthSpec {
        SynthSpec {
            config: ModelConfig {
                n_layer: 4,
                n_embd: 256,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 64,
                n_rot: 64,
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 128,
                n_vocab: 1248,
                n_ctx_train: 4096,
                rope_freq_base: 1e6,
                rms_eps: 1e-6,
                hybrid: None,
            },
            formats: SynthFormats::mixed(),
            seed: 1,
            vocab: true,
            hybrid: None,
        }
    }

    /// Qwen3-30B-A3B's shapes: 48 layers, n_embd 2048, 32/4 heads of 128, 128 experts top-8 of
    /// 768, 151936 tokens, mixed formats: about 15 GB.
    pub fn qwen3_30b_a3b() -> SynthSpec {
        SynthSpec {
            config: ModelConfig {
                n_layer: 48,
                n_embd: 2048,
                n_head: 32,
                n_head_kv: 4,
                head_dim: 128,
                n_rot: 128,
                n_expert: 128,
                n_expert_used: 8,
                n_ff_exp: 768,
                n_vocab: 151936,
                n_ctx_train: 40960,
                rope_freq_base: 1e6,
                rms_eps: 1e-6,
                hybrid: None,
            },
            formats: SynthFormats::mixed(),
            seed: 1,
            vocab: true,
            hybrid: None,
        }
    }

    /// A qwen35moe that decodes fast on the CPU: 4 layers (GDN, attention, GDN, attention: a
    /// full-attention interval of 2) and an MTP block, n_embd 256, 4/2 attention heads of 64 with
    /// 16 rotated dimensions, GDN with 2 key and 4 value heads of 64 and 4 conv taps, 8 experts
    /// top-2 of 128 and a shared expert of 128, mixed formats, 1024 token ids and no vocabulary.
    pub fn qwen35moe_tiny() -> SynthSpec {
        let mut s = SynthSpec::tiny();
        s.config.n_vocab = 1024;
        s.config.n_rot = 16;
        s.vocab = false;
        s.hybrid = Some(HybridShape {
            n_ff_shexp: 128,
            rope_sections: [3, 3, 2, 0],
            d_conv: 4,
            d_state: 64,
            n_v_heads: 4,
            n_k_heads: 2,
            full_attention_interval: 2,
            mtp: true,
        });
        s
    }

    /// Qwen3.5-35B-A3B's shapes as its published configuration gives them (not checked against
    /// a released GGUF here): 40 layers, every 4th full attention, n_embd 2048, 16/2 attention
    /// heads of 256 with 64 rotated dimensions (sections 11, 11, 10), GDN with 16 key and 32
    /// value heads of 128 and 4 conv taps, 256 experts top-8 of 512 and a shared expert of 512,
    /// an MTP block, 248,320 token ids; mixed formats, no vocabulary.
    pub fn qwen35moe_35b_a3b() -> SynthSpec {
        SynthSpec {
            config: ModelConfig {
                n_layer: 40,
                n_embd: 2048,
                n_head: 16,
                n_head_kv: 2,
                head_dim: 256,
                n_rot: 64,
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_vocab: 248_320,
                n_ctx_train: 262_144,
                rope_freq_base: 1e7,
                rms_eps: 1e-6,
                hybrid: None,
            },
            formats: SynthFormats::mixed(),
            seed: 1,
            vocab: false,
            hybrid: Some(HybridShape {
                n_ff_shexp: 512,
                rope_sections: [11, 11, 10, 0],
                d_conv: 4,
                d_state: 128,
                n_v_heads: 32,
                n_k_heads: 16,
                full_attention_interval: 4,
                mtp: true,
            }),
        }
    }

    /// `general.architecture`: qwen3moe, or qwen35moe with a hybrid shape.
    pub fn arch(&self) -> &'static str {
        if self.hybrid.is_some() {
            "qwen35moe"
        } else {
            "qwen3moe"
        }
    }

    /// `general.name`.
    pub fn name(&self) -> String {
        let c = &self.config;
        format!("strata-synth {} {}L {}x{} d{} seed {}", self.arch(), c.n_layer, c.n_expert, c.n_expert_used, c.n_embd, self.seed)
    }

    /// Checks the shapes: every size at least 1, heads a multiple of the kv heads, an even head
    /// dimension (NEOX RoPE), 1..=n_expert experts used, every row a whole number of its format's
    /// blocks, sizes that fit the file's u32 keys, a vocabulary of at least
    /// [`vocab::MIN_VOCAB`] when it carries one.
    pub fn validate(&self) -> Result<(), String> {
        let c = &self.config;
        let sizes = [
            ("layers", c.n_layer),
            ("embedding length", c.n_embd),
            ("heads", c.n_head),
            ("kv heads", c.n_head_kv),
            ("head dimension", c.head_dim),
            ("experts", c.n_expert),
            ("experts used", c.n_expert_used),
            ("expert feed-forward length", c.n_ff_exp),
            ("vocabulary", c.n_vocab),
            ("context length", c.n_ctx_train),
        ];
        check_counts(&sizes)?;
        if !c.n_head.is_multiple_of(c.n_head_kv) {
            return Err(format!("{} heads are not a multiple of {} kv heads", c.n_head, c.n_head_kv));
        }
        if !c.head_dim.is_multiple_of(2) {
            return Err(format!("head dimension {} is odd (RoPE rotates pairs)", c.head_dim));
        }
        if c.n_expert_used > c.n_expert {
            return Err(format!("{} experts used of {}", c.n_expert_used, c.n_expert));
        }
        if self.vocab && c.n_vocab < vocab::MIN_VOCAB {
            return Err(format!(
                "a vocabulary of {} tokens is too small: the bytes and control tokens take {} (or leave the vocabulary out)",
                c.n_vocab,
                vocab::MIN_VOCAB
            ));
        }
        if !(c.rope_freq_base.is_finite() && c.rope_freq_base > 0.0 && c.rms_eps.is_finite() && c.rms_eps > 0.0) {
            return Err(format!("rope base {} and rms eps {} must be positive", c.rope_freq_base, c.rms_eps));
        }
        if let Some(h) = &self.hybrid {
            if self.vocab {
                return Err("a qwen35moe file is written without a vocabulary (token ids only): leave the vocabulary out".into());
            }
            h.validate(c)?;
        }
        for t in self.tensors() {
            t.decl.data_len()?;
        }
        Ok(())
    }

    /// The tensors, in file order, with the names and shapes of MODELS.md section 1 (section 2
    /// for qwen35moe).
    fn tensors(&self) -> Vec<SynthTensor> {
        let (c, f) = (&self.config, &self.formats);
        let [embd, vocab, head_dim] = [c.n_embd, c.n_vocab, c.head_dim].map(|n| n as u64);
        let (q_dim, kv_dim, ff, experts) = (head_dim * c.n_head as u64, head_dim * c.n_head_kv as u64, c.n_ff_exp as u64, c.n_expert as u64);
        let mut out = vec![tensor("token_embd.weight".into(), &[embd, vocab], f.embd, Init::Matrix { k: 1 })];
        if let Some(h) = &self.hybrid {
            out.extend(h.layer_tensors(c, f));
        }
        for l in (0..c.n_layer).filter(|_| self.hybrid.is_none()) {
            let name = |t: &str| format!("blk.{l}.{t}.weight");
            out.extend([
                norm(name("attn_norm"), embd),
                matrix(name("attn_q"), &[embd, q_dim], f.attn),
                matrix(name("attn_k"), &[embd, kv_dim], f.attn),
                matrix(name("attn_v"), &[embd, kv_dim], f.attn),
                matrix(name("attn_output"), &[q_dim, embd], f.attn),
                norm(name("attn_q_norm"), head_dim),
                norm(name("attn_k_norm"), head_dim),
                norm(name("ffn_norm"), embd),
                matrix(name("ffn_gate_inp"), &[embd, experts], f.router),
                matrix(name("ffn_gate_exps"), &[embd, ff, experts], f.gu),
                matrix(name("ffn_up_exps"), &[embd, ff, experts], f.gu),
                matrix(name("ffn_down_exps"), &[ff, embd, experts], f.down),
            ]);
        }
        out.push(norm("output_norm.weight".into(), embd));
        if !f.tied_head {
            out.push(matrix("output.weight".into(), &[embd, vocab], f.head));
        }
        out
    }

    /// The metadata: the architecture's keys and the vocabulary's (or `"none"` and the vocabulary
    /// size).
    fn metadata(&self) -> GgufWriter {
        let c = &self.config;
        let mut w = GgufWriter::new();
        let u32_ = |n: usize| Value::U32(n as u32);
        w.meta("general.architecture", Value::String(self.arch().into()))
            .meta("general.name", Value::String(self.name()))
            .meta("strata.synth.seed", Value::U64(self.seed));
        match &self.hybrid {
            Some(h) => h.keys(c, &mut w),
            None => self.qwen3moe_keys(&mut w),
        }
        if self.vocab {
            vocab::synthetic(c.n_vocab).write_keys(&mut w);
        } else {
            w.meta("tokenizer.ggml.model", Value::String("none".into())).meta(&format!("{}.vocab_size", self.arch()), u32_(c.n_vocab));
        }
        w
    }

    fn qwen3moe_keys(&self, w: &mut GgufWriter) {
        let c = &self.config;
        let u32_ = |n: usize| Value::U32(n as u32);
        w.meta("qwen3moe.context_length", u32_(c.n_ctx_train))
            .meta("qwen3moe.embedding_length", u32_(c.n_embd))
            .meta("qwen3moe.block_count", u32_(c.n_layer))
            .meta("qwen3moe.feed_forward_length", u32_(c.n_ff_exp * c.n_expert_used))
            .meta("qwen3moe.expert_feed_forward_length", u32_(c.n_ff_exp))
            .meta("qwen3moe.expert_count", u32_(c.n_expert))
            .meta("qwen3moe.expert_used_count", u32_(c.n_expert_used))
            .meta("qwen3moe.attention.head_count", u32_(c.n_head))
            .meta("qwen3moe.attention.head_count_kv", u32_(c.n_head_kv))
            .meta("qwen3moe.attention.key_length", u32_(c.head_dim))
            .meta("qwen3moe.attention.value_length", u32_(c.head_dim))
            .meta("qwen3moe.rope.freq_base", Value::F32(c.rope_freq_base))
            .meta("qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(c.rms_eps));
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> Result<u64, String> {
        self.validate()?;
        let decls: Vec<TensorDecl> = self.tensors().into_iter().map(|t| t.decl).collect();
        self.metadata().streaming_len(&decls)
    }
}

/// Each `(what, count)` is a count the file's u32 keys hold: 1..=`u32::MAX`.
pub(super) fn check_counts(sizes: &[(&str, usize)]) -> Result<(), String> {
    match sizes.iter().find(|(_, n)| *n == 0 || *n > u32::MAX as usize) {
        Some((what, n)) => Err(format!("{what} must be between 1 and {}, not {n}", u32::MAX)),
        None => Ok(()),
    }
}

/// splitmix64's finalizer: a well-mixed 64-bit seed from any 64-bit input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of a tensor: the spec's seed and the tensor's name (FNV-1a).
fn tensor_seed(seed: u64, name: &str) -> u64 {
    let fnv = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01B3));
    mix(mix(seed) ^ fnv)
}

/// `sqrt(E[L^2])` of `format`'s values at `d = 1` over random bytes (see the module doc).
fn level_rms(format: WeightFormat) -> f64 {
    static RMS: OnceLock<Vec<(WeightFormat, f64)>> = OnceLock::new();
    let table = RMS.get_or_init(|| {
        WeightFormat::ALL
            .iter()
            .map(|&f| {
                let mut rng = SmallRng::seed_from_u64(0x5EED ^ f as u64);
                let k = f.block_values() * LEVEL_BLOCKS;
                let mut row = vec![0u8; f.row_bytes(k)];
                rng.fill(&mut row[..]);
                for block in row.chunks_exact_mut(f.block_bytes()) {
                    block[f.off_d()..f.off_d() + 2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
                }
                let mut values = Vec::with_capacity(k);
                dequant_row_f32(f, &row, k, &mut values);
                (f, (values.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / k as f64).sqrt())
            })
            .collect()
    });
    table.iter().find(|(f, _)| *f == format).expect("every format measured").1
}

/// Data of rows `rows` of tensor `t`, from generator `rng`.
fn generate(t: &SynthTensor, rows: std::ops::Range<u64>, rng: &mut SmallRng) -> Vec<u8> {
    let n = ((rows.end - rows.start) * t.decl.dims[0]) as usize;
    let floats = |rng: &mut SmallRng| -> Vec<f32> {
        match t.init {
            Init::Norm => (0..n).map(|_| rng.random_range(0.8f32..1.2)).collect(),
            Init::Matrix { k } => {
                let a = (3.0 / k as f64).sqrt() as f32;
                (0..n).map(|_| rng.random_range(-a..a)).collect()
            }
            Init::Uniform { lo, hi } => (0..n).map(|_| rng.random_range(lo..hi)).collect(),
        }
    };
    match t.decl.ty {
        GgmlType::F32 => floats(rng).iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => floats(rng).iter().flat_map(|&v| f32_to_f16(v).to_le_bytes()).collect(),
        GgmlType::Bf16 => floats(rng).iter().flat_map(|&v| bf16(v).to_le_bytes()).collect(),
        GgmlType::Quant(f) => {
            let Init::Matrix { k: fan_in } = t.init else { unreachable!("only matrices are quantized") };
            let d = (1.0 / ((fan_in as f64).sqrt() * level_rms(f))) as f32;
            let mut data = vec![0u8; n / f.block_values() * f.block_bytes()];
            rng.fill(&mut data[..]);
            let off = f.off_d();
            for block in data.chunks_exact_mut(f.block_bytes()) {
                // The sign comes from the block's own random bytes, already drawn.
                let sign = if block[off + 1] & 0x80 != 0 { -d } else { d };
                block[off..off + 2].copy_from_slice(&f32_to_f16(sign).to_le_bytes());
            }
            data
        }
    }
}

/// f32 to bf16, rounding to nearest even (the values here are finite).
fn bf16(v: f32) -> u16 {
    let b = v.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// Writes tensor `t`'s data in chunks of whole rows, generated in parallel, calling `progress`
/// with the bytes written after each chunk.
fn write_tensor<W: Write>(t: &SynthTensor, seed: u64, sink: &mut TensorSink<'_, W>, progress: &mut dyn FnMut(u64)) -> std::io::Result<()> {
    let rows: u64 = t.decl.dims[1..].iter().product();
    let row_bytes = t.decl.data_len().map_err(std::io::Error::other)? / rows;
    let per_chunk = (CHUNK_BYTES / row_bytes).max(1);
    let chunks = rows.div_ceil(per_chunk);
    let seed = tensor_seed(seed, &t.decl.name);
    let mut next = 0;
    while next < chunks {
        let batch: Vec<u64> = (next..chunks.min(next + CHUNKS_IN_FLIGHT as u64)).collect();
        let data: Vec<Vec<u8>> = batch
            .par_iter()
            .map(|&c| generate(t, c * per_chunk..((c + 1) * per_chunk).min(rows), &mut SmallRng::seed_from_u64(mix(seed ^ mix(c)))))
            .collect();
        for d in data {
            sink.write(&d)?;
            progress(d.len() as u64);
        }
        next += batch.len() as u64;
    }
    Ok(())
}

/// Writes the model to `out` as a stream; `progress` gets the bytes of each tensor chunk as it is
/// written. Returns the bytes written.
pub fn write_to<W: Write>(spec: &SynthSpec, out: &mut W, progress: &mut dyn FnMut(u64)) -> std::io::Result<u64> {
    spec.validate().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let tensors = spec.tensors();
    let decls: Vec<TensorDecl> = tensors.iter().map(|t| t.decl.clone()).collect();
    spec.metadata().write_streaming(out, &decls, |i, sink| write_tensor(&tensors[i], spec.seed, sink, progress))
}

/// Writes the model to the file `path` (created or replaced). Returns the bytes written.
pub fn write(spec: &SynthSpec, path: &Path, progress: &mut dyn FnMut(u64)) -> std::io::Result<u64> {
    let file = std::fs::File::create(path)?;
    let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
    let n = write_to(spec, &mut out, progress)?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(n)
}

/// The model's file as bytes, for small models (the built-in one): the same bytes as
/// [`write`]. Panics if the spec does not [`validate`](SynthSpec::validate).
pub fn build_in_memory(spec: &SynthSpec) -> Vec<u8> {
    let mut out = Vec::new();
    if let Err(e) = write_to(spec, &mut out, &mut |_| {}) {
        panic!("build_in_memory: {e}");
    }
    out
}
