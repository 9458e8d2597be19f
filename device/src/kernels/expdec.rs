//! `expdec_gu_*`: the EXPDEC variant of `moe_gu_*`, same bits. The group's q8_1 activation rows
//! are staged in shared memory, `EXPDEC_ENTRIES` entries at a time: each block's 32 quant bytes
//! as two 16-byte halves in two separate arrays (so a warp's 16-byte loads of consecutive groups
//! hit consecutive banks: conflict-free), and its fp16 scale already widened to f32 in a third.
//! Each thread pair stages one block (thread `2i + h` writes half `h`). A lane then computes `R`
//! weight rows (1 or 2) of gate and of up against the staged words, which it loads once per
//! group and entry for all `2R` rows. The first pass skips its pre-staging barrier.
//!
//! Shared words, for `G = n_embd / 32` groups: `LO[4][G][4]`, `HI[4][G][4]`, `D[4][G]`, then the
//! SwiGLU outputs `H[4][32]`: `36 G + 128` words, given at launch.
use super::blocks::{self, Block};
use super::mmvq::contribution_words;
use super::moe::{group_of, ld};
use super::quantize_q8_1::quantize_group;
use crate::arch::mem::Smem;
use crate::arch::{convert, index, mem, sync, warp};
use strata_gpu_shared::formats::q8_1;
use strata_gpu_shared::launch::{EXPDEC_ENTRIES, MOE_GU_ROWS, MOE_GU_WARPS};
use strata_gpu_shared::moe;

/// Stages entries `pass ..` (`m` of them) of the group: their q8_1 rows into LO / HI / D.
#[inline(always)]
unsafe fn stage(smem: Smem, xq: *const u8, entries: *const u32, pass: u32, m: u32, k: u32, groups: u32) {
    let items = 2 * m * groups;
    let mut i = index::thread_idx();
    while i < items {
        let (item, h) = (i / 2, i % 2);
        let (r, b) = (item / groups, item % groups);
        let token = ld(entries, (pass + r) as usize) / k;
        let block = xq.add((token as usize * groups as usize + b as usize) * q8_1::BYTES);
        let half: [u32; 4] = core::array::from_fn(|w| mem::ld_nc_u32(block.add(q8_1::OFF_Q + 16 * h as usize + 4 * w)));
        smem.st_v4(16 * h * groups + 4 * (r * groups + b), half);
        if h == 0 {
            let dx = convert::f16_to_f32(mem::ld_nc_u16(block.add(q8_1::OFF_D)));
            smem.st_u32(32 * groups + r * groups + b, dx.to_bits());
        }
        i += 32 * MOE_GU_WARPS;
    }
}

/// `R` gate rows and `R` up rows starting at `row` against the `m` staged entries: this lane's
/// partials `[row][entry]` for gate and up.
#[inline(always)]
unsafe fn staged_partials<F: Block, const R: usize>(
    smem: Smem,
    gate: *const u8,
    up: *const u8,
    row_bytes: usize,
    row: usize,
    m: u32,
    groups: u32,
) -> ([[f32; 4]; R], [[f32; 4]; R]) {
    let pow2 = f32::from_bits((127 - F::SHIFT) << 23);
    let (mut ag, mut au) = ([[0.0f32; 4]; R], [[0.0f32; 4]; R]);
    let mut b = index::lane();
    while b < groups {
        let at = |base: *const u8, j: usize| base.add((row + j) * row_bytes + (b / F::GROUPS) as usize * F::BYTES);
        let gw: [blocks::Group; R] = core::array::from_fn(|j| F::load(at(gate, j), b % F::GROUPS));
        let uw: [blocks::Group; R] = core::array::from_fn(|j| F::load(at(up, j), b % F::GROUPS));
        crate::unroll!(r in [0, 1, 2, 3] {
            if (r as u32) < m {
                let slot = r as u32 * groups + b;
                let lo = smem.ld_v4(4 * slot);
                let hi = smem.ld_v4(16 * groups + 4 * slot);
                let q = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
                let dx = f32::from_bits(smem.ld_u32(32 * groups + slot));
                crate::unroll!(j in [0, 1] {
                    if j < R {
                        ag[j][r] += contribution_words(&gw[j], &q, dx, pow2);
                        au[j][r] += contribution_words(&uw[j], &q, dx, pow2);
                    }
                });
            }
        });
        b += 32;
    }
    (ag, au)
}

/// The body of every `expdec_gu_*` entry: `moe_gu`'s contract and output, plus `R`.
#[inline(always)]
unsafe fn expdec_gu<F: Block, const R: usize>(
    gate: *const u8,
    up: *const u8,
    expert_bytes: u64,
    xq: *const u8,
    table: *const u32,
    n: u32,
    k: u32,
    groups: u32,
    n_ff: u32,
    hq: *mut u8,
) {
    let chunks = n_ff / MOE_GU_ROWS;
    let b = index::block_idx();
    let Some((expert, start, count)) = group_of(table, n, b / chunks) else { return }; // whole block
    let n = n as usize;
    let chunk = b % chunks;
    let row_bytes = (groups / F::GROUPS) as usize * F::BYTES;
    let (gate, up) = (gate.add(expert as usize * expert_bytes as usize), up.add(expert as usize * expert_bytes as usize));
    let entries = table.add(moe::entries(n) + start as usize);
    let smem = Smem::dynamic();
    let h_base = 36 * groups;
    let warp = index::warp_in_block();
    let rows_per_warp = (MOE_GU_ROWS / MOE_GU_WARPS) as usize;
    let mut pass = 0;
    while pass < count {
        if pass > 0 {
            sync::sync_lds(); // the previous pass's readers are done with the stage and H
        }
        let m = (count - pass).min(EXPDEC_ENTRIES);
        stage(smem, xq, entries, pass, m, k, groups);
        sync::sync_lds();
        let mut j0 = 0;
        while j0 < rows_per_warp {
            let local = warp as usize * rows_per_warp + j0;
            let (ag, au) = staged_partials::<F, R>(smem, gate, up, row_bytes, chunk as usize * MOE_GU_ROWS as usize + local, m, groups);
            crate::unroll!(j in [0, 1] {
                if j < R {
                    crate::unroll!(r in [0, 1, 2, 3] {
                        if (r as u32) < m {
                            let h = moe::swiglu(warp::warp_sum_f32(ag[j][r]), warp::warp_sum_f32(au[j][r]));
                            if index::lane() == 0 {
                                smem.st_u32(h_base + r as u32 * MOE_GU_ROWS + (local + j) as u32, h.to_bits());
                            }
                        }
                    });
                }
            });
            j0 += R;
        }
        sync::sync_lds();
        if warp < m {
            let e = ld(entries, (pass + warp) as usize);
            let v = f32::from_bits(smem.ld_u32(h_base + warp * MOE_GU_ROWS + index::lane()));
            quantize_group(v, hq.add((e as usize * chunks as usize + chunk as usize) * q8_1::BYTES));
        }
        pass += EXPDEC_ENTRIES;
    }
}

macro_rules! expdec_entries {
    ($($r1:ident, $r2:ident => $block:ty),* $(,)?) => {$(
        /// EXPDEC gate/up, one weight row per lane. Launch as `moe_gu_*`, with
        /// `4 * (36 * n_embd / 32 + 128)` bytes of shared memory.
        ///
        /// # Safety
        /// As `moe_gu_*`.
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $r1(gate: *const u8, up: *const u8, expert_bytes: u64, xq: *const u8, table: *const u32, n: u32, k: u32, groups: u32, n_ff: u32, hq: *mut u8) {
            expdec_gu::<$block, 1>(gate, up, expert_bytes, xq, table, n, k, groups, n_ff, hq)
        }

        /// EXPDEC gate/up, two weight rows per lane sharing the staged activation words.
        ///
        /// # Safety
        /// As `moe_gu_*`.
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $r2(gate: *const u8, up: *const u8, expert_bytes: u64, xq: *const u8, table: *const u32, n: u32, k: u32, groups: u32, n_ff: u32, hq: *mut u8) {
            expdec_gu::<$block, 2>(gate, up, expert_bytes, xq, table, n, k, groups, n_ff, hq)
        }
    )*};
}

expdec_entries! {
    expdec_gu_q8_0_r1, expdec_gu_q8_0_r2 => blocks::Q8_0,
    expdec_gu_iq2_xxs_r1, expdec_gu_iq2_xxs_r2 => blocks::Iq2Xxs,
    expdec_gu_iq2_xs_r1, expdec_gu_iq2_xs_r2 => blocks::Iq2Xs,
    expdec_gu_iq2_s_r1, expdec_gu_iq2_s_r2 => blocks::Iq2S,
    expdec_gu_iq3_xxs_r1, expdec_gu_iq3_xxs_r2 => blocks::Iq3Xxs,
    expdec_gu_iq3_s_r1, expdec_gu_iq3_s_r2 => blocks::Iq3S,
}

// Four staged entries and R <= 2 (the unrolled loops list them); rows per warp split into
// whole R steps.
const _: () = assert!(EXPDEC_ENTRIES == 4 && (MOE_GU_ROWS / MOE_GU_WARPS) % 2 == 0);
