//! Launch geometry and launch bounds of every kernel: the one table both the PTX post-processing
//! in build.rs (`.maxntid`, `.minnctapersm`) and the HIP header (`__launch_bounds__` on NVIDIA,
//! work-group size and waves per EU on AMD) are generated from, and that the host launches by.

/// Threads per block and the minimum resident blocks per SM the compiler must allow, and the
/// dynamic shared memory a launch gives the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub kernel: &'static str,
    pub threads: u32,
    pub min_blocks: u32,
    pub smem_bytes: u32,
}

/// Warps (one output row each) per `mmvq` block.
pub const MMVQ_WARPS: u32 = 4;
/// q8_1 groups (one warp each) per `quantize_q8_1` block.
pub const QUANTIZE_WARPS: u32 = 4;
/// Elements per block of the split head kernels (`argmax_rows`, `row_top_prob`): a 151,936
/// vocabulary is 38 blocks per row.
pub const HEAD_CHUNK: usize = 4096;
/// Warps of a `moe_gu_*` block; each computes 4 of the block's 32 `n_ff` rows.
pub const MOE_GU_WARPS: u32 = 8;
/// `n_ff` rows per `moe_gu_*` block: one q8_1 group of the SwiGLU output.
pub const MOE_GU_ROWS: u32 = 32;
/// Entries of a group one pass of the expert kernels takes (its activation rows per weight
/// decode); larger groups take several passes.
pub const MOE_ENTRY_PASS: u32 = MMVQ_MAX_ROWS as u32;

/// Entries an EXPDEC pass stages in shared memory.
pub const EXPDEC_ENTRIES: u32 = 4;

/// Dynamic shared memory of an `expdec_gu_*` launch for rows of `n_embd` values, in bytes:
/// `EXPDEC_ENTRIES` staged q8_1 rows (9 words per 32-value group) and their SwiGLU outputs
/// (`MOE_GU_ROWS` words each).
pub const fn expdec_gu_smem(n_embd: usize) -> u32 {
    (4 * EXPDEC_ENTRIES as usize * (9 * (n_embd / 32) + MOE_GU_ROWS as usize)) as u32
}

/// Bytes of one segment each block of `copy_from_mapped_multi` copies: one 16-byte move per
/// thread of a 256-thread block. (64 KiB per block was measured 6x slower than one copy per
/// segment at 64 KiB segments: one block's serial reads across PCIe are latency-bound.)
pub const COPY_CHUNK: usize = 4096;
/// u64 words per segment in `copy_from_mapped_multi`'s table: source, destination, length,
/// first block.
pub const COPY_SEGMENT_WORDS: usize = 4;
/// Activation rows one `mmvq` launch multiplies.
pub const MMVQ_MAX_ROWS: usize = 8;

/// The matvec geometry: one warp per weight row, `MMVQ_WARPS` rows per block.
const fn mmvq(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MMVQ_WARPS, min_blocks: 8, smem_bytes: 0 }
}

pub const BOUNDS: &[Bounds] = &[
    Bounds { kernel: "quantize_q8_1", threads: 32 * QUANTIZE_WARPS, min_blocks: 8, smem_bytes: 0 },
    mmvq("mmvq_q8_0"),
    mmvq("mmvq_q6_k"),
    mmvq("mmvq_iq2_xxs"),
    mmvq("mmvq_iq2_xs"),
    mmvq("mmvq_iq2_s"),
    mmvq("mmvq_iq3_xxs"),
    mmvq("mmvq_iq3_s"),
    mmvq("mmvq_iq4_nl"),
    mmvq("mmvq_iq4_xs"),
    mmvq("mmvq_q2_0"),
    mmvq("matvec_f32"),
    mmvq("matvec_bf16"),
    head("argmax_rows_ref"),
    head("argmax_rows_split"),
    head("argmax_rows_final"),
    head("row_top_prob_ref"),
    head("row_top_prob_max"),
    head("row_top_prob_sum"),
    head("row_top_prob_final"),
    Bounds { kernel: "copy_from_mapped_multi", threads: 256, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "moe_group", threads: 32, min_blocks: 1, smem_bytes: 0 },
    Bounds { kernel: "moe_combine", threads: 256, min_blocks: 4, smem_bytes: 0 },
    moe_gu("moe_gu_q8_0"),
    moe_gu("moe_gu_q6_k"),
    moe_gu("moe_gu_iq2_xxs"),
    moe_gu("moe_gu_iq2_xs"),
    moe_gu("moe_gu_iq2_s"),
    moe_gu("moe_gu_iq3_xxs"),
    moe_gu("moe_gu_iq3_s"),
    moe_gu("moe_gu_iq4_nl"),
    moe_gu("moe_gu_iq4_xs"),
    moe_gu("moe_gu_q2_0"),
    expdec("expdec_gu_q8_0_r1"),
    expdec("expdec_gu_q8_0_r2"),
    expdec("expdec_gu_iq2_xxs_r1"),
    expdec("expdec_gu_iq2_xxs_r2"),
    expdec("expdec_gu_iq2_xs_r1"),
    expdec("expdec_gu_iq2_xs_r2"),
    expdec("expdec_gu_iq2_s_r1"),
    expdec("expdec_gu_iq2_s_r2"),
    expdec("expdec_gu_iq3_xxs_r1"),
    expdec("expdec_gu_iq3_xxs_r2"),
    expdec("expdec_gu_iq3_s_r1"),
    expdec("expdec_gu_iq3_s_r2"),
    mmvq("moe_down_q8_0"),
    mmvq("moe_down_q6_k"),
    mmvq("moe_down_iq2_xxs"),
    mmvq("moe_down_iq2_xs"),
    mmvq("moe_down_iq2_s"),
    mmvq("moe_down_iq3_xxs"),
    mmvq("moe_down_iq3_s"),
    mmvq("moe_down_iq4_nl"),
    mmvq("moe_down_iq4_xs"),
    mmvq("moe_down_q2_0"),
    Bounds { kernel: "quantize_q8_0_scaled", threads: 32 * QUANTIZE_WARPS, min_blocks: 8, smem_bytes: 0 },
    Bounds { kernel: "quantize_q8_0_scaled_ref", threads: 32 * QUANTIZE_WARPS, min_blocks: 8, smem_bytes: 0 },
];

/// The gate/up geometry: `MOE_GU_WARPS` warps, shared words for one pass's SwiGLU outputs.
const fn moe_gu(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MOE_GU_WARPS, min_blocks: 2, smem_bytes: 4 * MOE_ENTRY_PASS * MOE_GU_ROWS }
}

/// EXPDEC gate/up: the `moe_gu` geometry; shared memory depends on `n_embd` and is given at
/// launch ([`expdec_gu_smem`]).
const fn expdec(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MOE_GU_WARPS, min_blocks: 2, smem_bytes: 0 }
}

/// The head geometry: 256 threads (`order::HEAD_THREADS`), one block per row or per chunk, and
/// [`HEAD_SMEM_WORDS`] words of shared memory for the block reductions.
const fn head(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: crate::order::HEAD_THREADS as u32, min_blocks: 4, smem_bytes: 4 * HEAD_SMEM_WORDS }
}

/// Shared words of a head block: a value and an index per warp, and one broadcast word.
pub const HEAD_SMEM_WORDS: u32 = 2 * (crate::order::HEAD_THREADS as u32 / 32) + 1;

/// The bounds of `kernel`, if it is in the table.
pub fn bounds(kernel: &str) -> Option<Bounds> {
    BOUNDS.iter().copied().find(|b| b.kernel == kernel)
}

/// AMD waves per EU (SIMD) for `(threads, min_blocks)` on wave32 parts with 4 SIMDs per WGP:
/// a block of `threads / 32` waves spreads over the 4 SIMDs, so `min_blocks` resident blocks
/// need `ceil(threads / 128) * min_blocks` waves per SIMD (256 threads: `2 x MINB`).
pub const fn amd_waves_per_eu(threads: u32, min_blocks: u32) -> u32 {
    threads.div_ceil(128) * min_blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_per_eu_rule() {
        assert_eq!(amd_waves_per_eu(256, 4), 8);
        assert_eq!(amd_waves_per_eu(256, 2), 4);
        assert_eq!(amd_waves_per_eu(128, 8), 8);
        assert_eq!(amd_waves_per_eu(32, 3), 3);
    }

    #[test]
    fn every_weight_format_has_an_mmvq_kernel() {
        for f in crate::formats::WeightFormat::ALL {
            assert!(bounds(f.mmvq_kernel()).is_some(), "{}", f.mmvq_kernel());
        }
    }

    #[test]
    fn table_names_are_unique_and_threads_whole_warps() {
        for (i, a) in BOUNDS.iter().enumerate() {
            assert_eq!(a.threads % 32, 0, "{}", a.kernel);
            assert!(BOUNDS[i + 1..].iter().all(|b| b.kernel != a.kernel), "{}", a.kernel);
        }
    }
}
