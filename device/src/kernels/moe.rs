//! Routed experts for a verify window: `moe_group` (selections to groups, on the device),
//! `moe_gu_*` (gate and up rows for every entry of a group, SwiGLU, and the result quantized to
//! q8_1, fused), `moe_down_*` (the down projection of every entry) and `moe_combine` (each
//! token's entries, weighted, in slot order). Each weight part is decoded once per block pass
//! and applied to every entry of the pass. Specs: `strata_gpu_shared::moe` and the mmvq order;
//! every value is a function of its own token's inputs alone, so a token's output is the same in
//! any window.
use super::blocks::{self, Block};
use super::mmvq::{row_partials, rows_partials};
use super::quantize_q8_1::quantize_group;
use crate::arch::mem::Smem;
use crate::arch::{index, mem, sync, warp};
use strata_gpu_shared::formats::{q8_1, GROUP};
use strata_gpu_shared::launch::{moe_group_parts, MMVQ_WARPS, MOE_COMBINE_AHEAD, MOE_DOWN_ROWS, MOE_ENTRY_PASS, MOE_GROUP_THREADS, MOE_GU_ROWS, MOE_GU_WARPS, MOE_MAX_SELECTIONS};
use strata_gpu_shared::moe;

#[inline(always)]
pub(super) unsafe fn ld(p: *const u32, i: usize) -> u32 {
    mem::ld_nc_u32(p.add(i) as *const u8)
}

crate::entry! {
    /// One block builds the table `moe::group` specifies. Selection `e` has `P =
    /// moe_group_parts(n)` adjacent threads (`t = e * P + part`), each scanning the ids' quads
    /// `part, part + P, ..` in shared memory (padded to a multiple of 4 with `u32::MAX`, which
    /// equals and precedes no valid id, so that every scan reads 16 bytes at a time), and their
    /// integer counts are joined by shuffles. Three phases:
    /// 1. whether `e` is its id's first selection, kept in shared memory beside the ids;
    /// 2. for a valid `id = ids[e]`: the valid selections of smaller ids (where `id`'s group starts
    ///    in `entries`), the firsts among them (the group's index: distinct valid ids below), the
    ///    earlier selections of `id` (`e`'s place in its group) and all of them (the group's count);
    /// 3. the selection's first thread writes its entry and, for a first selection, its group;
    ///    the block's totals (through a word a warp) place the unused groups and entries and the
    ///    header, as the spec fills them.
    ///
    /// Every word has one writer, and the words are those of the one-thread spec whatever the
    /// thread order. A thread's scans are `n / (4 P)` quad reads a phase: 4 in a window of 8
    /// tokens of 8 slots, where each lane of one warp read 32 (two selections of 16). The
    /// barriers are [`sync::sync_threads_split`]: the phases' branches test the same selection
    /// conditions on both sides of them.
    ///
    /// # Safety
    /// `ids`: `n <= MOE_MAX_SELECTIONS` u32; `table`: `moe::table_words(n)` u32; one block of
    /// `MOE_GROUP_THREADS` threads with `MOE_GROUP_SMEM` bytes of dynamic shared memory.
    pub unsafe fn moe_group(ids: *const u32, n: u32, n_expert: u32, table: *mut u32) {
        crate::arch::sync::chain_grids();
        if index::block_idx() != 0 {
            return; // the whole block
        }
        let (t, nu, padded) = (index::thread_idx(), n as usize, n.next_multiple_of(4));
        let parts = moe_group_parts(n);
        let (e, part) = (t / parts, t % parts);
        // Words `0..padded`: the ids; `FIRST..FIRST + padded`: the first flags (0 past `n`);
        // `COUNTS + w`: warp `w`'s packed totals.
        const FIRST: u32 = MOE_MAX_SELECTIONS as u32;
        const COUNTS: u32 = 2 * MOE_MAX_SELECTIONS as u32;
        let smem = Smem::dynamic();
        if t < padded {
            smem.st_u32(t, if t < n { ld(ids, t as usize) } else { u32::MAX });
            if t >= n {
                smem.st_u32(FIRST + t, 0);
            }
        }
        sync::sync_threads_split();
        let live = e < n;
        let id = if live { smem.ld_u32(e) } else { u32::MAX };
        // Phase 1 scans the selections before `e`.
        let (mut seen, before_e) = (0, if live { e } else { 0 });
        let mut f = 4 * part;
        while f < before_e {
            let other = smem.ld_v4(f);
            for (j, o) in other.into_iter().enumerate() {
                seen += (f + (j as u32) < e && o == id) as u32;
            }
            f += 4 * parts;
        }
        let [seen] = warp::sum_lanes_u32([seen], parts);
        if part == 0 && live {
            smem.st_u32(FIRST + e, (seen == 0) as u32);
        }
        sync::sync_threads_split();
        // Two counts a word (each at most 256): `below | same << 16`, `distinct_below | before << 16`.
        let (mut below_same, mut distinct_before) = (0u32, 0u32);
        if live && id < n_expert {
            let mut f = 4 * part;
            while f < padded {
                let (other, firsts) = (smem.ld_v4(f), smem.ld_v4(FIRST + f));
                for j in 0..4 {
                    let o = other[j];
                    if o < id {
                        below_same += 1;
                        distinct_before += firsts[j];
                    } else if o == id {
                        below_same += 1 << 16;
                        distinct_before += ((f + (j as u32) < e) as u32) << 16;
                    }
                }
                f += 4 * parts;
            }
        }
        let [below_same, distinct_before] = warp::sum_lanes_u32([below_same, distinct_before], parts);
        // Totals packed `groups | filled << 10 | errors << 20` (each at most 256).
        let mut totals = 0u32;
        if part == 0 && live {
            if id >= n_expert {
                totals = 1 << 20;
            } else {
                let (below, same) = (below_same & 0xffff, below_same >> 16);
                let (distinct_below, before) = (distinct_before & 0xffff, distinct_before >> 16);
                *table.add(moe::entries(nu) + (below + before) as usize) = e;
                totals = 1 << 10;
                if before == 0 {
                    let g = distinct_below as usize;
                    *table.add(moe::EXPERT + g) = id;
                    *table.add(moe::start(nu) + g) = below;
                    *table.add(moe::count(nu) + g) = same;
                    totals += 1;
                }
            }
        }
        let totals = warp::warp_sum_i32(totals as i32) as u32;
        if index::lane() == 0 {
            smem.st_u32(COUNTS + index::warp_in_block(), totals);
        }
        sync::sync_threads_split();
        let mut totals = 0;
        for w in 0..MOE_GROUP_THREADS / 32 {
            totals += smem.ld_u32(COUNTS + w);
        }
        let (groups, filled, errors) = (totals & 0x3ff, (totals >> 10) & 0x3ff, totals >> 20);
        let mut g = groups + t;
        while g < n {
            *table.add(moe::EXPERT + g as usize) = 0;
            *table.add(moe::start(nu) + g as usize) = filled;
            *table.add(moe::count(nu) + g as usize) = 0;
            g += MOE_GROUP_THREADS;
        }
        let mut e = filled + t;
        while e < n {
            *table.add(moe::entries(nu) + e as usize) = 0;
            e += MOE_GROUP_THREADS;
        }
        if t == 0 {
            *table.add(moe::N_GROUPS) = groups;
            *table.add(moe::ERRORS) = errors;
        }
    }
}

/// A group of the table: (expert, first entry, entry count), or `None` past the groups.
#[inline(always)]
pub(super) unsafe fn group_of(table: *const u32, n: u32, g: u32) -> Option<(u32, u32, u32)> {
    if g >= ld(table, moe::N_GROUPS) {
        return None;
    }
    let n = n as usize;
    Some((ld(table, moe::EXPERT + g as usize), ld(table, moe::start(n) + g as usize), ld(table, moe::count(n) + g as usize)))
}

/// Gate and up of one expert for every entry of its group, SwiGLU, quantized to q8_1.
/// Block `b`: group `b / (n_ff / 32)`, rows `32 * (b % (n_ff / 32)) ..` of `n_ff`.
///
/// # Safety
/// `gate`, `up`: `n_expert` matrices of `n_ff` rows x `embd_groups` groups of `F`, each
/// `expert_bytes` long; `xq`: the window's token rows, `embd_groups` q8_1 blocks each; `table`
/// from `moe_group` for `n = tokens * k` selections; `hq`: `n` rows of `n_ff / 32` q8_1 blocks.
#[inline(always)]
unsafe fn gu<F: Block>(gate: *const u8, up: *const u8, expert_bytes: u64, xq: *const u8, table: *const u32, n: u32, k: u32, embd_groups: u32, n_ff: u32, hq: *mut u8) {
    let chunks = n_ff / MOE_GU_ROWS;
    let b = index::block_idx();
    let Some((expert, start, count)) = group_of(table, n, b / chunks) else { return }; // whole block
    let chunk = b % chunks;
    let row_bytes = F::row_bytes(embd_groups);
    let (gate, up) = (gate.add(expert as usize * expert_bytes as usize), up.add(expert as usize * expert_bytes as usize));
    let entries = table.add(moe::entries(n as usize) + start as usize);
    let warp = index::warp_in_block();
    let rows_per_warp = MOE_GU_ROWS / MOE_GU_WARPS;
    let smem = Smem::dynamic();
    let mut pass = 0;
    while pass < count {
        let m = (count - pass).min(MOE_ENTRY_PASS);
        let act = |r: usize| xq.add((ld(entries, pass as usize + r) / k) as usize * embd_groups as usize * q8_1::BYTES);
        for j in 0..rows_per_warp {
            let local = warp * rows_per_warp + j;
            let row = (chunk * MOE_GU_ROWS + local) as usize;
            let g = row_partials::<F, 1>(gate.add(row * row_bytes), embd_groups, m, act);
            let u = row_partials::<F, 1>(up.add(row * row_bytes), embd_groups, m, act);
            crate::unroll!(r in [0, 1, 2, 3, 4, 5, 6, 7] {
                if (r as u32) < m {
                    let h = moe::swiglu(warp::warp_sum_f32(g[r]), warp::warp_sum_f32(u[r]));
                    if index::lane() == 0 {
                        smem.st_u32(r as u32 * MOE_GU_ROWS + local, h.to_bits());
                    }
                }
            });
        }
        sync::sync_threads();
        if warp < m {
            let e = ld(entries, (pass + warp) as usize);
            let v = f32::from_bits(smem.ld_u32(warp * MOE_GU_ROWS + index::lane()));
            quantize_group(v, hq.add((e as usize * chunks as usize + chunk as usize) * q8_1::BYTES));
        }
        sync::sync_threads();
        pass += MOE_ENTRY_PASS;
    }
}

/// Down of one expert for every entry of its group: `y[e][row]`. Block `b`: group
/// `b / ceil(n_embd / (MMVQ_WARPS * MOE_DOWN_ROWS))`, `MOE_DOWN_ROWS` consecutive rows per warp:
/// for a group of one entry, the rows side by side (`rows_partials`: each row's group asked of
/// L1, then each used in turn); else row by row, `MOE_ENTRY_PASS` entries a pass. The same
/// partials and butterflies, so the same bits, either way.
///
/// # Safety
/// `down`: `n_expert` matrices of `n_embd` rows x `ff_groups` groups of `F`, `expert_bytes`
/// each; `hq` from `moe_gu_*`; `table` from `moe_group`; `y`: `n` rows of `n_embd` f32.
#[inline(always)]
unsafe fn down<F: Block>(w: *const u8, expert_bytes: u64, hq: *const u8, table: *const u32, n: u32, ff_groups: u32, n_embd: u32, y: *mut f32) {
    const ROWS: usize = MOE_DOWN_ROWS as usize;
    let row_blocks = n_embd.div_ceil(MMVQ_WARPS * MOE_DOWN_ROWS);
    let b = index::block_idx();
    let row0 = ((b % row_blocks) * MMVQ_WARPS + index::warp_in_block()) * MOE_DOWN_ROWS;
    let Some((expert, start, count)) = group_of(table, n, b / row_blocks) else { return }; // whole block
    if row0 >= n_embd {
        return; // whole warp
    }
    crate::trace_mark!(1, "expert");
    let rows = (n_embd - row0).min(MOE_DOWN_ROWS);
    let row_bytes = F::row_bytes(ff_groups);
    // Rows past the end read the last row, unused: one code path.
    let wrow = |j: usize| w.add(expert as usize * expert_bytes as usize + (row0 + (j as u32).min(rows - 1)) as usize * row_bytes);
    let entries = table.add(moe::entries(n as usize) + start as usize);
    let entry = |i: u32| ld(entries, i as usize) as usize;
    let out = |e: usize, j: usize| y.add(e * n_embd as usize + row0 as usize + j);
    if count == 1 {
        let e = entry(0);
        let acc = rows_partials::<F, ROWS>(wrow, ff_groups, hq.add(e * ff_groups as usize * q8_1::BYTES));
        crate::trace_mark!(2, "summed");
        warp::store_row_sums(&acc, rows, false, None, |j| out(e, j));
        return;
    }
    let mut j = 0;
    while j < rows {
        let mut pass = 0;
        while pass < count {
            let m = (count - pass).min(MOE_ENTRY_PASS);
            let acc = row_partials::<F, 1>(wrow(j as usize), ff_groups, m, |r| hq.add(entry(pass + r as u32) * ff_groups as usize * q8_1::BYTES));
            warp::store_row_sums(&acc, m, false, None, |r| out(entry(pass + r as u32), j as usize));
            pass += MOE_ENTRY_PASS;
        }
        j += 1;
    }
}

crate::entry! {
    /// `out[t][i] = sum over slots s, in order, from +0.0, of weights[t * k + s] * y[t * k + s][i]`,
    /// or with `accumulate` (1) that sum added to `out[t][i]` (the residual add, fused): one thread
    /// per output value.
    ///
    /// # Safety
    /// `y`: `tokens * k` rows of `n_embd` f32; `weights`: `tokens * k`; `out`: `tokens * n_embd`,
    /// overlapping neither.
    pub unsafe fn moe_combine(y: *const f32, weights: *const f32, tokens: u32, k: u32, n_embd: u32, out: *mut f32, accumulate: u32) {
        crate::arch::sync::chain_grids();
        let i = index::block_idx() * index::block_dim() + index::thread_idx();
        if i >= tokens * n_embd {
            return;
        }
        let (t, col) = (i / n_embd, i % n_embd);
        // The value the sum is added to, loaded beside the slots rather than after them.
        let base = if accumulate != 0 { mem::ld_f32(out.add(i as usize), 0) } else { 0.0 };
        let mut acc = 0.0f32;
        // `MOE_COMBINE_AHEAD` slots' weights and values loaded before the first add, then added
        // in slot order.
        let mut s0 = 0;
        while s0 < k {
            let wv: [(f32, f32); MOE_COMBINE_AHEAD as usize] = core::array::from_fn(|u| {
                let s = s0 + u as u32;
                if s >= k {
                    return (0.0, 0.0);
                }
                let e = (t * k + s) as usize;
                let w = f32::from_bits(mem::ld_nc_u32(weights.add(e) as *const u8));
                (w, f32::from_bits(mem::ld_nc_u32(y.add(e * n_embd as usize + col as usize) as *const u8)))
            });
            for (u, (w, v)) in wv.into_iter().enumerate() {
                if s0 + (u as u32) < k {
                    acc += w * v;
                }
            }
            s0 += MOE_COMBINE_AHEAD;
        }
        mem::st_f32_acc(out.add(i as usize), acc, accumulate != 0, Some(base));
    }
}

macro_rules! moe_entries {
    ($($gu:ident, $down:ident => $block:ty),* $(,)?) => {$(
        $crate::entry! {
            /// Gate/up + SwiGLU + q8_1 for one weight format. Launch: `n * (n_ff / 32)` blocks of
            /// `32 * MOE_GU_WARPS` threads.
            ///
            /// # Safety
            /// As `gu`.
            pub unsafe fn $gu(gate: *const u8, up: *const u8, expert_bytes: u64, xq: *const u8, table: *const u32, n: u32, k: u32, embd_groups: u32, n_ff: u32, hq: *mut u8) {
                crate::arch::sync::chain_grids();
                gu::<$block>(gate, up, expert_bytes, xq, table, n, k, embd_groups, n_ff, hq)
            }
        }

        $crate::entry! {
            /// Down for one weight format. Launch: `n * ceil(n_embd / (MMVQ_WARPS * MOE_DOWN_ROWS))`
            /// blocks of `32 * MMVQ_WARPS` threads.
            ///
            /// # Safety
            /// As `down`.
            pub unsafe fn $down(w: *const u8, expert_bytes: u64, hq: *const u8, table: *const u32, n: u32, ff_groups: u32, n_embd: u32, y: *mut f32) {
                crate::arch::sync::chain_grids();
                down::<$block>(w, expert_bytes, hq, table, n, ff_groups, n_embd, y)
            }
        }
    )*};
}

moe_entries! {
    moe_gu_q8_0, moe_down_q8_0 => blocks::Q8_0,
    moe_gu_q6_k, moe_down_q6_k => blocks::Q6K,
    moe_gu_iq2_xxs, moe_down_iq2_xxs => blocks::Iq2Xxs,
    moe_gu_iq2_xs, moe_down_iq2_xs => blocks::Iq2Xs,
    moe_gu_iq2_s, moe_down_iq2_s => blocks::Iq2S,
    moe_gu_iq3_xxs, moe_down_iq3_xxs => blocks::Iq3Xxs,
    moe_gu_iq3_s, moe_down_iq3_s => blocks::Iq3S,
    moe_gu_iq3_st, moe_down_iq3_st => blocks::Iq3ST,
    moe_gu_iq4_nl, moe_down_iq4_nl => blocks::Iq4Nl,
    moe_gu_iq4_nlt, moe_down_iq4_nlt => blocks::Iq4NlT,
    moe_gu_iq4_xs, moe_down_iq4_xs => blocks::Iq4Xs,
    moe_gu_q2_0, moe_down_q2_0 => blocks::Q2_0,
}

// The SwiGLU outputs of a pass fit one q8_1 group per entry; the unrolled entry loop lists 8.
const _: () = assert!(MOE_GU_ROWS as usize == GROUP && MOE_ENTRY_PASS == 8);
