//! Launch bounds and geometry of the embedding rows, RMSNorm (alone and fused with the q8_1
//! quantization of its output) and residual add of the decode step (the float matvec,
//! `matvec_f16` included, keeps the `mmvq` geometry in [`super::BASE`]).
use super::Bounds;
use crate::formats::{FloatFormat, WeightFormat};

/// Threads of an `embed_rows_*` block: one output value each, so a block covers 256 values of
/// one token's row and a row of `n` values takes `ceil(n / 256)` blocks.
pub const EMBED_THREADS: u32 = 256;
/// Warps (one row each) per `rms_norm` block.
pub const NORM_WARPS: u32 = 4;
/// Elements per lane an RMSNorm warp loads before using them (in order), to keep loads in
/// flight: each `32 * NORM_AHEAD` values of a row cost one memory latency per pass (2,048
/// values four). At 8 the one-warp norm of a decode step took 10 us a launch under ncu on the
/// H200.
pub const NORM_AHEAD: u32 = 16;
/// The longest row `rms_norm` takes (a multiple of 32).
pub const NORM_MAX_N: usize = 16384;
/// Warps of an `rms_norm_q8_1` block, one 32-value group of the row each: a row of `n` values
/// takes `ceil(n / 32 / NQ_WARPS)` blocks ([`nq_parts`]), every one of which stages the whole row
/// in shared memory and computes its scale.
pub const NQ_WARPS: u32 = 8;
/// The longest row `rms_norm_q8_1` takes (a multiple of 32): its `n * 4` bytes of dynamic
/// shared memory must fit the 48 KiB a launch gets without opting in to more. Longer rows keep
/// `rms_norm` then `quantize_q8_1`.
pub const NQ_MAX_N: usize = 12288;
/// 16-byte loads of the row each thread of an `rms_norm_q8_1` block issues before storing them
/// to shared memory: `4 * 32 * NQ_WARPS * NQ_AHEAD` = 4,096 values a round, so rows up to 4,096
/// are staged in one memory round trip (three at [`NQ_MAX_N`]).
pub const NQ_AHEAD: u32 = 4;
/// Threads of an `add_f32` block, one element each.
pub const ADD_THREADS: u32 = 256;
/// Blocks of `rms_norm_q8_1` per row of `n` values (`n` a multiple of 32).
pub const fn nq_parts(n: u32) -> u32 {
    (n / 32).div_ceil(NQ_WARPS)
}

/// Dynamic shared memory of an `rms_norm_q8_1` launch over rows of `n` values: the row.
pub const fn nq_smem(n: usize) -> u32 {
    (4 * n) as u32
}

// The size rule: the longest row fits the default dynamic shared memory of a launch.
const _: () = assert!(nq_smem(NQ_MAX_N) as usize <= 48 * 1024 && NQ_MAX_N.is_multiple_of(32));

/// What `embed_rows_*` writes for a token id past the table: a quiet NaN (every value of the row).
pub const EMBED_NAN: u32 = 0x7fc0_0000;

/// The element type of an embedding table: a quantized weight format or a float type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EmbedTable {
    Quant(WeightFormat),
    Float(FloatFormat),
}

impl EmbedTable {
    /// Every table type, one `embed_rows_*` entry each.
    pub const ALL: [EmbedTable; 13] = [
        EmbedTable::Quant(WeightFormat::Q8_0),
        EmbedTable::Quant(WeightFormat::Q6K),
        EmbedTable::Quant(WeightFormat::Iq2Xxs),
        EmbedTable::Quant(WeightFormat::Iq2Xs),
        EmbedTable::Quant(WeightFormat::Iq2S),
        EmbedTable::Quant(WeightFormat::Iq3Xxs),
        EmbedTable::Quant(WeightFormat::Iq3S),
        EmbedTable::Quant(WeightFormat::Iq4Nl),
        EmbedTable::Quant(WeightFormat::Iq4Xs),
        EmbedTable::Quant(WeightFormat::Q2_0),
        EmbedTable::Float(FloatFormat::F32),
        EmbedTable::Float(FloatFormat::F16),
        EmbedTable::Float(FloatFormat::Bf16),
    ];

    /// The lower-case tag in the kernel name (`q8_0`, `f16`).
    pub const fn tag(self) -> &'static str {
        match self {
            EmbedTable::Quant(f) => f.tag(),
            EmbedTable::Float(FloatFormat::F32) => "f32",
            EmbedTable::Float(FloatFormat::F16) => "f16",
            EmbedTable::Float(FloatFormat::Bf16) => "bf16",
        }
    }

    /// GGUF type name (`Q8_0`, `F16`).
    pub const fn name(self) -> &'static str {
        match self {
            EmbedTable::Quant(f) => f.name(),
            EmbedTable::Float(f) => f.name(),
        }
    }

    /// A row's length must be a multiple of this (the format's block; 1 for floats).
    pub const fn block_values(self) -> usize {
        match self {
            EmbedTable::Quant(f) => f.block_values(),
            EmbedTable::Float(_) => 1,
        }
    }

    /// Bytes of a row of `n` values (`n` a multiple of [`Self::block_values`]).
    pub const fn row_bytes(self, n: usize) -> usize {
        match self {
            EmbedTable::Quant(f) => f.row_bytes(n),
            EmbedTable::Float(f) => n * f.bytes(),
        }
    }

    /// The `embed_rows_<tag>` entry.
    pub fn kernel(self) -> &'static str {
        super::named(&["embed_rows_", self.tag()]).expect("every table type has an embed_rows entry in BOUNDS")
    }
}

const fn embed(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: EMBED_THREADS, min_blocks: 4, smem_bytes: 0 }
}

/// This family's kernels (joined into [`super::BOUNDS`]).
pub const BOUNDS: [Bounds; 16] = [
    embed("embed_rows_q8_0"),
    embed("embed_rows_q6_k"),
    embed("embed_rows_iq2_xxs"),
    embed("embed_rows_iq2_xs"),
    embed("embed_rows_iq2_s"),
    embed("embed_rows_iq3_xxs"),
    embed("embed_rows_iq3_s"),
    embed("embed_rows_iq4_nl"),
    embed("embed_rows_iq4_xs"),
    embed("embed_rows_q2_0"),
    embed("embed_rows_f32"),
    embed("embed_rows_f16"),
    embed("embed_rows_bf16"),
    // 4 blocks: room for the `2 * NORM_AHEAD` values a lane keeps in flight.
    Bounds { kernel: "rms_norm", threads: 32 * NORM_WARPS, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "add_f32", threads: ADD_THREADS, min_blocks: 4, smem_bytes: 0 },
    // The launcher passes `nq_smem(n)`; this default is the longest row's.
    Bounds { kernel: "rms_norm_q8_1", threads: 32 * NQ_WARPS, min_blocks: 4, smem_bytes: nq_smem(NQ_MAX_N) },
];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[
    ("EMBED_THREADS", EMBED_THREADS as usize),
    ("EMBED_NAN", EMBED_NAN as usize),
    ("NORM_WARPS", NORM_WARPS as usize),
    ("NORM_AHEAD", NORM_AHEAD as usize),
    ("ADD_THREADS", ADD_THREADS as usize),
    ("NQ_WARPS", NQ_WARPS as usize),
    ("NQ_AHEAD", NQ_AHEAD as usize),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_type_has_its_entry() {
        for (t, b) in EmbedTable::ALL.iter().zip(&BOUNDS) {
            assert_eq!(t.kernel(), b.kernel);
            assert_eq!(super::super::bounds(t.kernel()).unwrap().threads, EMBED_THREADS);
        }
        assert_eq!(EmbedTable::Float(FloatFormat::Bf16).kernel(), "embed_rows_bf16");
        assert_eq!(EmbedTable::Quant(WeightFormat::Iq2Xs).kernel(), "embed_rows_iq2_xs");
        assert_eq!(EmbedTable::Quant(WeightFormat::Q6K).row_bytes(512), 420);
        assert_eq!(EmbedTable::Float(FloatFormat::F16).row_bytes(3), 6);
    }
}
