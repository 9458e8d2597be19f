//! `expdec_down_*`: the EXPDEC variant of `moe_down_*` for short down rows (`n_ff <= 1024`, at
//! most 32 groups: n_ff 640 and 768 are 20 and 24), same bits. A block takes `drb` rows of one
//! group's expert. `moe_down` gives each row a warp, so 8 or 12 of its 32 lanes have no group;
//! here the block's threads form `EXPDEC_THREADS / G` row slots of `G` threads, thread `g` of a
//! slot taking group `g` of `DR` rows (1, 2 or 4), against the group's q8_1 rows staged in
//! shared memory (`stage`), whose words it loads once per entry for all `DR` rows.
//!
//! The order is the mmvq spec's: with `G <= 32` lane `p`'s partial is `+0.0 + c_p` (and `+0.0`
//! for `p >= G`), then the butterfly. Threads write their partials to shared memory; then one
//! warp per (entry, row) loads them lane by lane and runs the same butterfly.
//!
//! Shared words: the stage (`36 G`), then one step's partials `P[4][step_rows][G]`:
//! `launch::expdec_down_smem`, given at launch.
use super::blocks::{self, Block};
use super::stage;
use super::mmvq::contribution_words;
use super::moe::{group_of, ld};
use crate::arch::mem::Smem;
use crate::arch::{index, mem, sync, warp};
use strata_gpu_shared::formats::q8_1;
use strata_gpu_shared::launch::{expdec_down_step_rows, EXPDEC_ENTRIES, EXPDEC_THREADS};
use strata_gpu_shared::moe;

/// The body of every `expdec_down_*` entry: `moe_down`'s contract and output, with `drb` rows
/// per block and `ff_groups <= EXPDEC_DOWN_MAX_GROUPS`.
#[inline(always)]
unsafe fn expdec_down<F: Block, const DR: usize>(
    w: *const u8,
    expert_bytes: u64,
    hq: *const u8,
    table: *const u32,
    n: u32,
    ff_groups: u32,
    n_embd: u32,
    drb: u32,
    y: *mut f32,
) {
    let row_blocks = n_embd.div_ceil(drb);
    let b = index::block_idx();
    let Some((expert, start, count)) = group_of(table, n, b / row_blocks) else { return }; // whole block
    let first_row = b % row_blocks * drb;
    let end_row = (first_row + drb).min(n_embd);
    let g_count = ff_groups;
    let w = w.add(expert as usize * expert_bytes as usize);
    let row_bytes = F::row_bytes(g_count);
    let entries = table.add(moe::entries(n as usize) + start as usize);
    let smem = Smem::dynamic();
    let p_base = stage::expdec_words(g_count);
    let slots = EXPDEC_THREADS / g_count;
    let step_rows = expdec_down_step_rows(g_count, DR as u32);
    let t = index::thread_idx();
    let (slot, g) = (t / g_count, t % g_count);
    let pow2 = f32::from_bits((127 - F::SHIFT) << 23);
    let (warp, lane) = (index::warp_in_block(), index::lane());
    // Threads past the last row slot load a slot's weights too (unused): one code path.
    let wslot = slot.min(slots - 1);
    let mut pass = 0;
    while pass < count {
        let m = (count - pass).min(EXPDEC_ENTRIES);
        let mut step = first_row;
        while step < end_row {
            // Step row `j * slots + slot` is this thread's row j; rows past the end load a valid
            // row, unused. The loads go out before the barriers below, so their latency overlaps
            // the staging.
            let row = |j: usize| step + j as u32 * slots + slot;
            let wg: [blocks::Group; DR] = core::array::from_fn(|j| {
                let r = (step + j as u32 * slots + wslot).min(end_row - 1);
                F::group_at(w.add(r as usize * row_bytes), g)
            });
            if step == first_row {
                if pass > 0 {
                    sync::sync_lds(); // the previous pass's readers are done with the stage and P
                }
                stage::rows::<EXPDEC_THREADS>(smem, |r| hq.add(ld(entries, (pass + r) as usize) as usize * g_count as usize * q8_1::BYTES), m, g_count, EXPDEC_ENTRIES);
            }
            // After the first step: the previous step's partials have been summed.
            sync::sync_lds();
            if slot < slots {
                // Each partial goes straight to shared memory, so the entries need no unrolled
                // copies: a loop keeps one entry's addresses live, not four (at 64 registers the
                // unrolled copies spilled).
                let mut r = 0;
                while r < m {
                    let (q, dx) = stage::block(smem, r, g, g_count, EXPDEC_ENTRIES);
                    crate::unroll!(j in [0, 1, 2, 3] {
                        if j < DR && row(j) < end_row {
                            let p = 0.0f32 + contribution_words::<F>(&wg[j], &q, dx, pow2);
                            smem.st_u32(p_base + (r * step_rows + row(j) - step) * g_count + g, p.to_bits());
                        }
                    });
                    r += 1;
                }
            }
            sync::sync_lds();
            // One warp per (entry, row): lane p holds partial p, then the butterfly.
            let mut i = warp;
            while i < m * step_rows {
                let (r, local) = (i / step_rows, i % step_rows);
                if step + local < end_row {
                    let p = if lane < g_count { f32::from_bits(smem.ld_u32(p_base + i * g_count + lane)) } else { 0.0 };
                    let sum = warp::warp_sum_f32(p);
                    if lane == 0 {
                        let e = ld(entries, (pass + r) as usize);
                        mem::st_f32(y.add(e as usize * n_embd as usize + (step + local) as usize), sum);
                    }
                }
                i += EXPDEC_THREADS / 32;
            }
            step += step_rows;
        }
        pass += EXPDEC_ENTRIES;
    }
}

/// One entry per format, rows per lane and minimum blocks per SM (DR=4 only at 2 blocks per
/// SM, `EXPDEC_MINB4_MAX_DR`).
macro_rules! expdec_down_entries {
    ($($name:ident => $block:ty, $dr:literal;)*) => {$(
        $crate::entry! {
            /// EXPDEC down. Launch: `n * ceil(n_embd / drb)` blocks of `EXPDEC_THREADS` threads and
            /// `launch::expdec_down_smem` bytes of shared memory.
            ///
            /// # Safety
            /// As `moe_down_*`; `ff_groups <= EXPDEC_DOWN_MAX_GROUPS`, `drb > 0`.
            pub unsafe fn $name(w: *const u8, expert_bytes: u64, hq: *const u8, table: *const u32, n: u32, ff_groups: u32, n_embd: u32, drb: u32, y: *mut f32) {
                crate::arch::sync::chain_grids();
                expdec_down::<$block, $dr>(w, expert_bytes, hq, table, n, ff_groups, n_embd, drb, y)
            }
        }
    )*};
}

expdec_down_entries! {
    expdec_down_q2_0_d1_m2 => blocks::Q2_0, 1; expdec_down_q2_0_d1_m4 => blocks::Q2_0, 1;
    expdec_down_q2_0_d2_m2 => blocks::Q2_0, 2; expdec_down_q2_0_d2_m4 => blocks::Q2_0, 2;
    expdec_down_q2_0_d4_m2 => blocks::Q2_0, 4;
    expdec_down_iq4_nl_d1_m2 => blocks::Iq4Nl, 1; expdec_down_iq4_nl_d1_m4 => blocks::Iq4Nl, 1;
    expdec_down_iq4_nl_d2_m2 => blocks::Iq4Nl, 2; expdec_down_iq4_nl_d2_m4 => blocks::Iq4Nl, 2;
    expdec_down_iq4_nl_d4_m2 => blocks::Iq4Nl, 4;
    expdec_down_iq4_nlt_d1_m2 => blocks::Iq4NlT, 1; expdec_down_iq4_nlt_d1_m4 => blocks::Iq4NlT, 1;
    expdec_down_iq4_nlt_d2_m2 => blocks::Iq4NlT, 2; expdec_down_iq4_nlt_d2_m4 => blocks::Iq4NlT, 2;
    expdec_down_iq4_nlt_d4_m2 => blocks::Iq4NlT, 4;
}

// DR <= 4: the unrolled loop lists the rows.
const _: () = assert!(strata_gpu_shared::launch::EXPDEC_DR[2] == 4);
