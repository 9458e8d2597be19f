//! `mmvq`: one quantized weight matrix (M rows of K values) times 1..8 q8_1 activation rows.
//!
//! Geometry: a block holds `MMVQ_WARPS` warps, one weight row each. Lane `l` takes groups
//! `l, l + 32, ...` of its row, decodes each weight group once and dots it with every activation
//! row (exact `dp4a` sums), accumulating `(dw * dx) * (S * 2^-k)` into one partial per row; the
//! warp butterfly then sums the 32 partials. That is the `mmvq` spec of
//! `strata_gpu_shared::order` exactly: partial `p` = groups `p (mod 32)`, left to right. With
//! `accumulate` the sums are added to what `y` holds (the residual add, fused).
use super::blocks::{self, Block};
use super::stage;
use crate::arch::mem::Smem;
use crate::arch::{convert, index, int, mem, sync, warp};
use strata_gpu_shared::formats::q8_1;
use strata_gpu_shared::launch::{self, MMVQ1_AHEAD, MMVQS_WARPS, MMVQ_MAX_ROWS, MMVQ_WARPS};

// The unrolled row loop below lists the slots 0..8.
const _: () = assert!(MMVQ_MAX_ROWS == 8);

/// The q8_1 block at `xb` in global memory: its 8 quant words and its scale widened to f32.
///
/// # Safety
/// `xb` points at one q8_1 block in device memory, 4-byte aligned.
#[inline(always)]
unsafe fn global_block(xb: *const u8) -> ([u32; 8], f32) {
    let dx = convert::f16_to_f32(mem::ld_nc_u16(xb.add(q8_1::OFF_D)));
    let q: [u32; 8] = core::array::from_fn(|i| mem::ld_nc_u32(xb.add(q8_1::OFF_Q + 4 * i)));
    (q, dx)
}

/// `c_b = (dw * dx) * (S * 2^-k)` of one decoded weight group of `F` and one q8_1 block given
/// as its 8 quant words and its scale widened to f32 (from global memory, [`global_block`], or
/// staged in shared memory): `S = f[0] * dot(values 0..16) + f[1] * dot(values 16..32)`, exact.
/// With an `F::OFFSET` the dot of a half is that of the unsigned bytes less the offset times the
/// q8_1 half's sum: the same integer.
#[inline(always)]
pub fn contribution_words<F: Block>(g: &blocks::Group, q: &[u32; 8], dx: f32, pow2: f32) -> f32 {
    let half = |h: usize| {
        if F::OFFSET == 0 {
            (4 * h..4 * h + 4).fold(0, |s, i| int::dp4a(g.w[i], q[i], s))
        } else {
            // -OFFSET in every byte: the signed dp4a adds -OFFSET times the word's q8_1 bytes.
            let minus = (-F::OFFSET) as u8 as u32 * 0x0101_0101;
            (4 * h..4 * h + 4).fold(0, |s, i| int::dp4a(minus, q[i], int::dp4a_us(g.w[i], q[i], s)))
        }
    };
    let exact = g.f[0] * half(0) + g.f[1] * half(1);
    (g.d * dx) * (exact as f32 * pow2)
}

/// This lane's partials of one weight row (`groups` groups of `F` at `wrow`) against up to 8
/// q8_1 activation rows, row `r` starting at `act(r)`: partial `r` sums, left to right from +0.0,
/// the contributions of groups `lane, lane + 32, ...`. The mmvq spec before its butterfly; every
/// kernel that multiplies quantized weights by q8_1 rows is built on it. `AHEAD` groups are
/// loaded before the first of them is used (a choice of the caller's, trading registers for
/// loads in flight: it changes no bits).
///
/// # Safety
/// `wrow` holds the row's whole blocks; each `act(r)` for `r < rows` holds `groups` q8_1
/// blocks, 4-byte aligned; `rows <= MMVQ_MAX_ROWS`.
#[inline(always)]
pub unsafe fn row_partials<F: Block, const AHEAD: usize>(wrow: *const u8, groups: u32, rows: u32, act: impl Fn(usize) -> *const u8) -> [f32; MMVQ_MAX_ROWS] {
    row_partials_from::<F, AHEAD>(wrow, groups, rows, |r, b| global_block(act(r).add(b as usize * q8_1::BYTES)))
}

/// [`row_partials`] with activation block `b` of row `r` given by `xb(r, b)` (its quant words
/// and scale): from global memory, or from rows staged in shared memory ([`mmvqs`]).
///
/// # Safety
/// As [`row_partials`]; `xb(r, b)` is safe to call for `r < rows`, `b < groups`.
#[inline(always)]
pub unsafe fn row_partials_from<F: Block, const AHEAD: usize>(wrow: *const u8, groups: u32, rows: u32, xb: impl Fn(usize, u32) -> ([u32; 8], f32)) -> [f32; MMVQ_MAX_ROWS] {
    row_partials_after::<F, AHEAD>(lane_groups::<F, AHEAD>(wrow, groups, index::lane()), wrow, groups, rows, xb)
}

/// Groups `b, b + 32, ...` of a weight row (`AHEAD` of them, [`blocks::Group::ZERO`] past
/// `groups`), decoded: one step of [`row_partials_from`]'s loop. Unrolled (`AHEAD <= 4`) so the
/// groups stay in registers.
///
/// # Safety
/// `wrow` holds the row's whole blocks (`groups` groups of `F`).
#[inline(always)]
pub unsafe fn lane_groups<F: Block, const AHEAD: usize>(wrow: *const u8, groups: u32, b: u32) -> [blocks::Group; AHEAD] {
    const { assert!(1 <= AHEAD && AHEAD <= 4) };
    let mut g = [blocks::Group::ZERO; AHEAD];
    crate::unroll!(i in [0, 1, 2, 3] {
        let at = b + 32 * i as u32;
        if i < AHEAD && at < groups {
            g[i] = F::group_at(wrow, at);
        }
    });
    g
}

/// [`row_partials_from`] given the lane's first step of groups, `first` = [`lane_groups`] of
/// `lane` (the entries load it before their grid wait: weights are constant).
///
/// # Safety
/// As [`row_partials_from`].
#[inline(always)]
pub unsafe fn row_partials_after<F: Block, const AHEAD: usize>(first: [blocks::Group; AHEAD], wrow: *const u8, groups: u32, rows: u32, xb: impl Fn(usize, u32) -> ([u32; 8], f32)) -> [f32; MMVQ_MAX_ROWS] {
    // 2^-k, exact: the group's integer dot times it is the exact rational S / 2^k.
    let pow2 = f32::from_bits((127 - F::SHIFT) << 23);
    let mut acc = [0.0f32; MMVQ_MAX_ROWS];
    let (mut b, mut g) = (index::lane(), first);
    while b < groups {
        let at = |i: usize| b + 32 * i as u32;
        crate::unroll!(i in [0, 1, 2, 3] {
            if i < AHEAD && at(i) < groups {
                // One unrolled copy per row slot so `acc` stays in registers; slots past `rows` skip.
                crate::unroll!(r in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if (r as u32) < rows {
                        let (q, dx) = xb(r, at(i));
                        acc[r] += contribution_words::<F>(&g[i], &q, dx, pow2);
                    }
                });
            }
        });
        b += 32 * AHEAD as u32;
        g = lane_groups::<F, AHEAD>(wrow, groups, b);
    }
    acc
}

/// [`row_partials_after`] of one activation row and one group a step, each step's weight group
/// and activation block asked for before the step before is added (`first`: the lane's group
/// `lane`, loaded before the grid wait; its activation block is asked for with the second
/// group's). The same contributions in the same order (groups `lane, lane + 32, ...` from +0.0),
/// so the same bits. After the wait the first two groups are one memory latency and each later
/// step one more (its loads go out as the step before begins): `n - 1` latencies for `n` groups
/// a lane, where [`row_partials_after`] waits `n`.
///
/// # Safety
/// As [`row_partials_from`] with one row: `xb(b)` is activation block `b`, safe for `b < groups`.
#[inline(always)]
unsafe fn row_partial_ahead<F: Block>(first: blocks::Group, wrow: *const u8, groups: u32, xb: impl Fn(u32) -> ([u32; 8], f32)) -> f32 {
    let pow2 = f32::from_bits((127 - F::SHIFT) << 23);
    let mut acc = 0.0f32;
    let mut b = index::lane();
    if b >= groups {
        return acc;
    }
    let (mut g, mut a) = (first, xb(b));
    loop {
        let next = b + 32;
        let ahead = (next < groups).then(|| (F::group_at(wrow, next), xb(next)));
        acc += contribution_words::<F>(&g, &a.0, a.1, pow2);
        match ahead {
            Some((gn, an)) => (g, a, b) = (gn, an, next),
            None => return acc,
        }
    }
}

/// The warp's first step of weight groups ([`lane_groups`] of `lane`; `WARPS` rows a block, one
/// a warp; zero for a warp past `m`), for an entry to load before its grid wait.
///
/// # Safety
/// `w`: `m` rows of `groups` groups of `F` (whole blocks).
#[inline(always)]
unsafe fn warp_first_groups<F: Block, const WARPS: u32, const AHEAD: usize>(w: *const u8, m: u32, groups: u32) -> [blocks::Group; AHEAD] {
    match warp_row::<F, WARPS>(w, m, groups) {
        Some((_, wrow)) => lane_groups::<F, AHEAD>(wrow, groups, index::lane()),
        None => [blocks::Group::ZERO; AHEAD],
    }
}

/// The warp's weight row (`WARPS` rows a block, one a warp) and the address of its first block,
/// or `None` for a warp past `m`. `w` holds `m` rows of `groups` groups of `F`.
#[inline(always)]
fn warp_row<F: Block, const WARPS: u32>(w: *const u8, m: u32, groups: u32) -> Option<(u32, *const u8)> {
    warp_row_of::<F, WARPS, 1>(w, m, groups)
}

/// The first of the warp's `PER` adjacent weight rows (`WARPS * PER` rows a block) and the
/// address of its first block, or `None` past `m`.
#[inline(always)]
fn warp_row_of<F: Block, const WARPS: u32, const PER: u32>(w: *const u8, m: u32, groups: u32) -> Option<(u32, *const u8)> {
    let row = (index::block_idx() * WARPS + index::warp_in_block()) * PER;
    (row < m).then(|| (row, w.wrapping_add(row as usize * F::row_bytes(groups))))
}

/// This lane's partials of `N` weight rows (row `j` at `wrow(j)`, `groups` groups of `F`) against
/// one q8_1 activation row at `x`: for each row, [`row_partials`]'s partial of one activation row
/// (groups `lane, lane + 32, ...`, left to right from +0.0), every row's group asked of L1
/// before the first is loaded.
///
/// # Safety
/// Each `wrow(j)` holds a row's whole blocks; `x` holds `groups` q8_1 blocks, 4-byte aligned.
#[inline(always)]
pub unsafe fn rows_partials<F: Block, const N: usize>(wrow: impl Fn(usize) -> *const u8, groups: u32, x: *const u8) -> [f32; N] {
    const { assert!(N <= 8) };
    let pow2 = f32::from_bits((127 - F::SHIFT) << 23);
    let mut acc = [0.0f32; N];
    let mut b = index::lane();
    while b < groups {
        // The activation first: every row waits on it. Unrolled (`N <= 8`) so the groups and
        // partials stay in registers.
        let (q, dx) = global_block(x.add(b as usize * q8_1::BYTES));
        let fresh = int::zero_in(b) as usize;
        // Every row's group asked of L1 first, then each loaded, decoded and used in turn: the
        // decoded groups of all rows at once spilled at 64 registers.
        crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            if j < N {
                mem::prefetch_l1(wrow(j + fresh).add(F::block_offset(b)));
            }
        });
        crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            if j < N {
                let g = F::group_at(wrow(j + fresh), b);
                acc[j] += contribution_words::<F>(&g, &q, dx, pow2);
            }
        });
        b += 32;
    }
    acc
}

/// The warp's weight row (`WARPS` rows a block, one a warp), brought towards L2 before the grid
/// waits for the one before it: weights are constant, so this may overlap that grid.
#[inline(always)]
pub fn prefetch_row<F: Block, const WARPS: u32>(w: *const u8, m: u32, groups: u32) {
    if let Some((_, wrow)) = warp_row::<F, WARPS>(w, m, groups) {
        mem::prefetch_l2_warp(wrow, F::row_bytes(groups));
    }
}

/// The shared body of every `mmvq_*` entry, `AHEAD` weight groups a lane in flight; `first` is
/// [`warp_first_groups`] (loaded by the entry before its grid wait).
///
/// # Safety
/// `w`: `m` rows of `groups` 32-value groups of `F` (whole blocks); `x`: `rows * groups` q8_1
/// blocks, row-major, 4-byte aligned; `y`: `rows * m` f32 (row-major, `y[r * m + i]`), not
/// overlapping the inputs; `1 <= rows <= MMVQ_MAX_ROWS`. `accumulate`: 0 stores the sums, 1 adds
/// them to `y`'s values.
#[inline(always)]
unsafe fn mmvq<F: Block, const AHEAD: usize>(first: [blocks::Group; AHEAD], w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, rows: u32, accumulate: u32) {
    let Some((row, wrow)) = warp_row::<F, MMVQ_WARPS>(w, m, groups) else {
        return; // whole warp: the butterfly below needs every lane, and gets it
    };
    let out = |r: usize| y.add(r * m as usize + row as usize);
    // The one-row entries' `MMVQ1_AHEAD` groups a lane leave no register at 64 to hold the base
    // through the row (sm_80 and the timeline build spilled): their lanes load it at the store.
    let base = (AHEAD == 1).then(|| warp::row_sums_base(rows, accumulate != 0, out));
    let acc = row_partials_after::<F, AHEAD>(first, wrow, groups, rows, |r, b| global_block(x.add((r * groups as usize + b as usize) * q8_1::BYTES)));
    warp::store_row_sums(&acc, rows, accumulate != 0, base, out);
}

/// The body of the `mmvq1a_*` entries: `mmvq` of one activation row, one group a lane in flight
/// before the grid wait (`first`, [`warp_first_groups`]) and each later step's loads issued a
/// step ahead ([`row_partial_ahead`]). Same partial, same butterfly, same bits as `mmvq`.
///
/// # Safety
/// As `mmvq` with `rows == 1`.
#[inline(always)]
unsafe fn mmvq1a<F: Block>(first: blocks::Group, w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, accumulate: u32) {
    let Some((row, wrow)) = warp_row::<F, MMVQ_WARPS>(w, m, groups) else {
        return; // whole warp: the butterfly below needs every lane
    };
    let out = |_: usize| y.add(row as usize);
    let base = warp::row_sums_base(1, accumulate != 0, out);
    let acc = row_partial_ahead::<F>(first, wrow, groups, |b| global_block(x.add(b as usize * q8_1::BYTES)));
    warp::store_row_sums(&[acc], 1, accumulate != 0, Some(base), out);
}

/// The body of the `mmvqs_*` entries: `mmvq` of 2..8 activation rows with the rows staged in
/// shared memory first (`stage`'s layout, `rows` rows), so a lane reads a group's
/// activation with two 16-byte shared loads a row instead of nine 4-byte global loads at a
/// 36-byte stride; `MMVQS_WARPS` weight rows a block share the staged rows. Same partials, same
/// order, same bits as `mmvq`. `first` as `mmvq`'s.
///
/// # Safety
/// As `mmvq`; the launch gave `launch::mmvq_launch`'s shared memory for `rows` and `groups`
/// (36 bytes a staged q8_1 block).
#[inline(always)]
unsafe fn mmvqs<F: Block>(first: [blocks::Group; 1], w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, rows: u32, accumulate: u32) {
    let smem = Smem::dynamic();
    stage::rows::<{ 32 * MMVQS_WARPS }>(smem, |r| x.add(r as usize * groups as usize * q8_1::BYTES), rows, groups, rows);
    sync::sync_lds();
    let Some((row, wrow)) = warp_row::<F, MMVQS_WARPS>(w, m, groups) else {
        return; // whole warp, after the block's only barrier
    };
    let out = |r: usize| y.add(r * m as usize + row as usize);
    let base = warp::row_sums_base(rows, accumulate != 0, out);
    let acc = row_partials_after::<F, 1>(first, wrow, groups, rows, |r, b| stage::block(smem, r as u32, b, groups, rows));
    warp::store_row_sums(&acc, rows, accumulate != 0, Some(base), out);
}

/// `mmvq` of one activation row with two adjacent weight rows a warp (`launch::mmvq1_pairs`:
/// rows of 32 or 64 groups). The pair is one row of twice the groups in memory, so lane `l`'s
/// groups `l, l + 32, ...` of it are its groups of row A, then of row B, and `first` (loaded by
/// the entry before its grid wait: [`pair_first_groups`]) is its whole share of both. Each row's
/// partial adds its groups left to right from +0.0 and gets the warp butterfly: the one-row
/// warp's partials, so the bits of `mmvq1`.
///
/// # Safety
/// As `mmvq` with `rows == 1` and `groups` 32 or 64.
#[inline(always)]
unsafe fn mmvq1_pair<F: Block>(first: [blocks::Group; 4], w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, accumulate: u32) {
    let Some((row, _)) = warp_row_of::<F, MMVQ_WARPS, 2>(w, m, groups) else {
        return; // whole warp: the butterflies below need every lane
    };
    let pow2 = f32::from_bits((127 - F::SHIFT) << 23);
    // Slot i's activation block: `at` for row A, `at - groups` for row B; with groups 64 or 32
    // (a multiple of 32) that is block lane + 32 (i % 2) mod groups, so two loads serve all.
    let act: [([u32; 8], f32); 2] = core::array::from_fn(|i| global_block(x.add(((index::lane() + 32 * i as u32) & (groups - 1)) as usize * q8_1::BYTES)));
    let mut acc = [0.0f32; MMVQ_MAX_ROWS];
    crate::unroll!(i in [0, 1, 2, 3] {
        let at = index::lane() + 32 * i as u32;
        if at < 2 * groups {
            let (q, dx) = &act[i % 2];
            let c = contribution_words::<F>(&first[i], q, *dx, pow2);
            if at < groups {
                acc[0] += c;
            } else {
                acc[1] += c;
            }
        }
    });
    let rows = if row + 1 < m { 2 } else { 1 };
    // The base loaded at the store, as in the four-group entry ([`mmvq`]).
    warp::store_row_sums(&acc, rows, accumulate != 0, None, |r| y.add(row as usize + r));
}

/// The lane's groups of the warp's two rows in [`mmvq1_pair`] (row B's zero past `m`), for the
/// entry to load before its grid wait: the warp's loads cover both rows, so no L2 prefetch.
///
/// # Safety
/// `w`: `m` rows of `groups` (32 or 64) groups of `F` (whole blocks).
#[inline(always)]
unsafe fn pair_first_groups<F: Block>(w: *const u8, m: u32, groups: u32) -> [blocks::Group; 4] {
    match warp_row_of::<F, MMVQ_WARPS, 2>(w, m, groups) {
        Some((row, wrow)) => lane_groups::<F, 4>(wrow, if row + 1 < m { 2 * groups } else { groups }, index::lane()),
        None => [blocks::Group::ZERO; 4],
    }
}

/// Declares, per format, the `extern "ptx-kernel"` entry for 1..8 activation rows, the two
/// for a single row (`mmvq1_*`: the row count a constant, which frees the registers of seven
/// row slots for `MMVQ1_AHEAD` weight groups in flight; `mmvq1a_*`: each step's loads a step
/// ahead) and the staged one for 2..8 rows (`mmvqs_*`) over the shared bodies.
macro_rules! mmvq_entries {
    ($($name:ident, $one:ident, $ahead:ident, $staged:ident => $block:ty),* $(,)?) => {$(
        $crate::entry! {
            /// `mmvq` for one weight format. Launch: `ceil(m / MMVQ_WARPS)` blocks of
            /// `32 * MMVQ_WARPS` threads.
            ///
            /// # Safety
            /// As `mmvq`: buffers of the documented sizes, `1 <= rows <= 8`, `accumulate` 0 or 1.
            pub unsafe fn $name(w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, rows: u32, accumulate: u32) {
                let first = warp_first_groups::<$block, MMVQ_WARPS, 1>(w, m, groups);
                prefetch_row::<$block, MMVQ_WARPS>(w, m, groups);
                crate::arch::sync::chain_grids();
                mmvq::<$block, 1>(first, w, x, y, m, groups, rows, accumulate)
            }
        }

        $crate::entry! {
            /// `mmvq` of one activation row (`rows` must be 1; the parameter keeps the signature
            /// of the entry above). Launch as that entry, with `2 * MMVQ_WARPS` rows a block where
            /// `launch::mmvq1_pairs` ([`mmvq1_pair`]).
            ///
            /// # Safety
            /// As `mmvq` with `rows == 1`.
            pub unsafe fn $one(w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, _rows: u32, accumulate: u32) {
                if launch::mmvq1_pairs(m as usize, groups as usize) {
                    let first = pair_first_groups::<$block>(w, m, groups);
                    crate::arch::sync::chain_grids();
                    return mmvq1_pair::<$block>(first, w, x, y, m, groups, accumulate);
                }
                let first = warp_first_groups::<$block, MMVQ_WARPS, { MMVQ1_AHEAD as usize }>(w, m, groups);
                prefetch_row::<$block, MMVQ_WARPS>(w, m, groups);
                crate::arch::sync::chain_grids();
                mmvq::<$block, { MMVQ1_AHEAD as usize }>(first, w, x, y, m, groups, 1, accumulate)
            }
        }

        $crate::entry! {
            /// `mmvq` of one activation row (`rows` must be 1), each step's weight group and
            /// activation block loaded a step ahead ([`mmvq1a`]). Launch as the 1..8-row entry.
            ///
            /// # Safety
            /// As `mmvq` with `rows == 1`.
            pub unsafe fn $ahead(w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, _rows: u32, accumulate: u32) {
                let [first] = warp_first_groups::<$block, MMVQ_WARPS, 1>(w, m, groups);
                prefetch_row::<$block, MMVQ_WARPS>(w, m, groups);
                crate::arch::sync::chain_grids();
                mmvq1a::<$block>(first, w, x, y, m, groups, accumulate)
            }
        }

        $crate::entry! {
            /// `mmvq` of 2..8 activation rows staged in shared memory. Launch: `ceil(m /
            /// MMVQS_WARPS)` blocks of `32 * MMVQS_WARPS` threads and `launch::mmvq_launch`'s shared
            /// memory.
            ///
            /// # Safety
            /// As `mmvq`, and the shared memory above.
            pub unsafe fn $staged(w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, rows: u32, accumulate: u32) {
                let first = warp_first_groups::<$block, MMVQS_WARPS, 1>(w, m, groups);
                prefetch_row::<$block, MMVQS_WARPS>(w, m, groups);
                crate::arch::sync::chain_grids();
                mmvqs::<$block>(first, w, x, y, m, groups, rows, accumulate)
            }
        }
    )*};
}

mmvq_entries! {
    mmvq_q8_0, mmvq1_q8_0, mmvq1a_q8_0, mmvqs_q8_0 => blocks::Q8_0,
    mmvq_q8_0t, mmvq1_q8_0t, mmvq1a_q8_0t, mmvqs_q8_0t => blocks::Q8_0T,
    mmvq_iq4_nlt, mmvq1_iq4_nlt, mmvq1a_iq4_nlt, mmvqs_iq4_nlt => blocks::Iq4NlT,
    mmvq_q6_k, mmvq1_q6_k, mmvq1a_q6_k, mmvqs_q6_k => blocks::Q6K,
    mmvq_q6_kt, mmvq1_q6_kt, mmvq1a_q6_kt, mmvqs_q6_kt => blocks::Q6KT,
    mmvq_iq2_xxs, mmvq1_iq2_xxs, mmvq1a_iq2_xxs, mmvqs_iq2_xxs => blocks::Iq2Xxs,
    mmvq_iq2_xs, mmvq1_iq2_xs, mmvq1a_iq2_xs, mmvqs_iq2_xs => blocks::Iq2Xs,
    mmvq_iq2_s, mmvq1_iq2_s, mmvq1a_iq2_s, mmvqs_iq2_s => blocks::Iq2S,
    mmvq_iq3_xxs, mmvq1_iq3_xxs, mmvq1a_iq3_xxs, mmvqs_iq3_xxs => blocks::Iq3Xxs,
    mmvq_iq3_s, mmvq1_iq3_s, mmvq1a_iq3_s, mmvqs_iq3_s => blocks::Iq3S,
    mmvq_iq3_st, mmvq1_iq3_st, mmvq1a_iq3_st, mmvqs_iq3_st => blocks::Iq3ST,
    mmvq_iq4_nl, mmvq1_iq4_nl, mmvq1a_iq4_nl, mmvqs_iq4_nl => blocks::Iq4Nl,
    mmvq_iq4_xs, mmvq1_iq4_xs, mmvq1a_iq4_xs, mmvqs_iq4_xs => blocks::Iq4Xs,
    mmvq_q2_0, mmvq1_q2_0, mmvq1a_q2_0, mmvqs_q2_0 => blocks::Q2_0,
}
