//! Staging q8_1 activation rows and codebooks in shared memory: what the EXPDEC kernels
//! (`expdec_gu_*`, `expdec_down_*`) and the staged matvec (`mmvqs_*`) share.
//!
//! A staged pass holds up to `cap` q8_1 rows (`EXPDEC_ENTRIES` for the EXPDEC kernels, the
//! launch's rows for `mmvqs`) of `groups` blocks at word 0 of the block's dynamic shared memory:
//! each block's 32 quant bytes as two 16-byte halves in two arrays, `LO[cap][groups][4]` and
//! `HI[cap][groups][4]` (so a warp's 16-byte loads of consecutive groups hit consecutive banks:
//! conflict-free), and its fp16 scale already widened to f32 in `D[cap][groups]`: `9 * cap *
//! groups` words ([`expdec_words`] for the EXPDEC kernels' `cap`). Each thread pair stages one
//! block (thread `2i + h` writes half `h`): no division by 9, no divergent branch.
use super::blocks::{self, Block};
use crate::arch::mem::Smem;
use crate::arch::{convert, index, mem};
use strata_gpu_shared::formats::q8_1;
use strata_gpu_shared::lane_grids::GRID_LANES;
use strata_gpu_shared::launch::EXPDEC_ENTRIES;

/// Shared words of one EXPDEC staged pass (`EXPDEC_ENTRIES` rows) of rows of `groups` q8_1 blocks.
#[inline(always)]
pub fn expdec_words(groups: u32) -> u32 {
    9 * EXPDEC_ENTRIES * groups
}

/// Stages `m` q8_1 rows (`row(r)` for `r < m`, `groups` blocks each) into LO / HI / D sized for
/// `cap` rows, with the block's `THREADS` threads.
///
/// # Safety
/// Every thread of the block calls it, a block of `THREADS`; each `row(r)` holds `groups` q8_1
/// blocks, 4-byte aligned; the launch gave at least `9 * cap * groups` words; `m <= cap`.
#[inline(always)]
pub unsafe fn rows<const THREADS: u32>(smem: Smem, row: impl Fn(u32) -> *const u8, m: u32, groups: u32, cap: u32) {
    let items = 2 * m * groups;
    let mut i = index::thread_idx();
    while i < items {
        let (item, h) = (i / 2, i % 2);
        let (r, b) = (item / groups, item % groups);
        let block = row(r).add(b as usize * q8_1::BYTES);
        // Four 4-byte loads: q8_1 blocks are 36 bytes, so a half is only 4-byte aligned.
        let half: [u32; 4] = core::array::from_fn(|w| mem::ld_nc_u32(block.add(q8_1::OFF_Q + 16 * h as usize + 4 * w)));
        smem.st_v4(4 * cap * h * groups + 4 * (r * groups + b), half);
        if h == 0 {
            let dx = convert::f16_to_f32(mem::ld_nc_u16(block.add(q8_1::OFF_D)));
            smem.st_u32(8 * cap * groups + r * groups + b, dx.to_bits());
        }
        i += THREADS;
    }
}

/// The staged block `b` of row `r`: its 8 quant words and its scale.
///
/// # Safety
/// `r < m` and `b < groups` of the last [`rows`] (of the same `cap`), which a barrier separates
/// from this read.
#[inline(always)]
pub unsafe fn block(smem: Smem, r: u32, b: u32, groups: u32, cap: u32) -> ([u32; 8], f32) {
    let slot = r * groups + b;
    let lo = smem.ld_v4(4 * slot);
    let hi = smem.ld_v4(4 * cap * groups + 4 * slot);
    let dx = f32::from_bits(smem.ld_u32(8 * cap * groups + slot));
    ([lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]], dx)
}

/// Words of what `F` stages of its codebook, a multiple of 4 (so what follows it keeps the
/// 16-byte alignment of the stage's loads).
#[inline(always)]
pub fn grid_words<F: Block>() -> u32 {
    let n = F::staged_grid().len() as u32;
    n.next_multiple_of(4)
}

/// Copies what `F` stages of its codebook ([`Block::staged_grid`]: none for formats without
/// one) to words `base ..` of shared memory with the block's `THREADS` threads and returns it as
/// the [`blocks::Grid`] the loaders read: of a repeated copy, this lane's where `SPREAD`, else
/// the first (the same words with the plain codebook's bank conflicts, and no register for the
/// lane's offset); a barrier must pass before use. It reads module constants only, so a kernel
/// may stage before it waits for the previous grid.
///
/// # Safety
/// Every thread of the block calls it, a block of `THREADS`; the launch gave
/// `base + F::staged_grid().len()` words; `base` is a multiple of 4 where `F::LANE_GRID`.
#[inline(always)]
pub unsafe fn grid<F: Block, const THREADS: u32, const SPREAD: bool>(smem: Smem, base: u32) -> blocks::Staged {
    let words = F::staged_grid();
    let mut i = index::thread_idx() as usize;
    if F::LANE_GRID {
        // The copies are 16-byte aligned (`lane_grids::LaneGrid`), 16 words a codebook word:
        // whole 16-byte loads.
        while 4 * i < words.len() {
            smem.st_v4(base + 4 * i as u32, mem::ld_nc_v4(words.as_ptr().add(4 * i) as *const u8));
            i += THREADS as usize;
        }
        let copy = if SPREAD { index::lane() % GRID_LANES as u32 } else { 0 };
        blocks::Staged { smem, base: base + copy, stride: GRID_LANES as u32 }
    } else {
        while i < words.len() {
            smem.st_u32(base + i as u32, mem::ld_nc_u32(words.as_ptr().add(i) as *const u8));
            i += THREADS as usize;
        }
        blocks::Staged { smem, base, stride: 1 }
    }
}
