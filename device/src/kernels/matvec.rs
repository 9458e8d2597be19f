//! `matvec_f32` / `matvec_bf16` / `matvec_f16` and their one-row entries `matvec1_*`: float
//! weights (router-sized matrices) times 1..8 f32 activation rows. One warp per weight row
//! (`MATVEC_WARPS` per block); lane `l` takes elements `l, l + 32, ...` (consecutive lanes read
//! consecutive elements, so every load is coalesced) and keeps one partial per activation row;
//! the warp butterfly sums the partials, which are stored or, with `accumulate`, added to what
//! `y` holds. Spec: `strata_gpu_shared::order` (matvec).
use crate::arch::{convert, index, mem, warp};
use strata_gpu_shared::launch::{MATVEC_AHEAD, MATVEC_AHEAD_REST, MATVEC_WARPS, MMVQ_MAX_ROWS};

/// A float element type, widened to f32 exactly (also the rows of `embed_rows_f32/f16/bf16`).
pub(super) trait FloatWeight {
    /// # Safety
    /// `row` points at a row of at least `j + 1` elements in device memory, element-aligned.
    unsafe fn get(row: *const u8, j: u32) -> f32;
    const BYTES: usize;
}

pub(super) struct F32;
impl FloatWeight for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn get(row: *const u8, j: u32) -> f32 {
        f32::from_bits(mem::ld_nc_u32(row.add(4 * j as usize)))
    }
}

pub(super) struct Bf16;
impl FloatWeight for Bf16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn get(row: *const u8, j: u32) -> f32 {
        f32::from_bits((mem::ld_nc_u16(row.add(2 * j as usize)) as u32) << 16)
    }
}

pub(super) struct F16;
impl FloatWeight for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn get(row: *const u8, j: u32) -> f32 {
        convert::f16_to_f32(mem::ld_nc_u16(row.add(2 * j as usize)))
    }
}

/// The warp's weight row, brought towards L2 before the grid waits for the one before it
/// (weights are constant; as `mmvq::prefetch_row`).
#[inline(always)]
fn prefetch_row<W: FloatWeight>(w: *const u8, m: u32, k: u32) {
    let row = index::block_idx() * MATVEC_WARPS + index::warp_in_block();
    if row < m {
        let bytes = k as usize * W::BYTES;
        mem::prefetch_l2_warp(w.wrapping_add(row as usize * bytes), bytes);
    }
}

/// # Safety
/// `w`: `m * k` elements of `W`; `x`: `rows * k` f32, 4-byte aligned; `y`: `rows * m` f32, not
/// overlapping the inputs; `1 <= rows <= MMVQ_MAX_ROWS`. `accumulate`: 0 stores the sums, 1 adds
/// them to `y`'s values.
#[inline(always)]
unsafe fn matvec<W: FloatWeight>(w: *const u8, x: *const f32, y: *mut f32, m: u32, k: u32, rows: u32, accumulate: u32) {
    let row = index::block_idx() * MATVEC_WARPS + index::warp_in_block();
    if row >= m {
        return; // whole warp
    }
    let lane = index::lane();
    let wrow = w.add(row as usize * k as usize * W::BYTES);
    let out = |r: usize| y.add(r * m as usize + row as usize);
    let base = warp::row_sums_base(rows, accumulate != 0, out);
    let mut acc = [0.0f32; MMVQ_MAX_ROWS];
    // A lane's elements j = lane, lane + 32, ... are added in that order, `N` loaded before any
    // is added so that `32 * N` elements of the row cost one memory latency: chunks of
    // `MATVEC_AHEAD` (a 2,048-wide router row is one), then of `MATVEC_AHEAD_REST`, then one by
    // one. The chunking does not change the order of the sum.
    let mut j = lane;
    j = chunks::<W, { MATVEC_AHEAD as usize }>(wrow, x, &mut acc, j, k, rows);
    j = chunks::<W, { MATVEC_AHEAD_REST as usize }>(wrow, x, &mut acc, j, k, rows);
    chunks::<W, 1>(wrow, x, &mut acc, j, k, rows);
    warp::store_row_sums(&acc, rows, accumulate != 0, Some(base), out);
}

/// Adds a lane's products `w[j] * x[r][j]` for `j, j + 32, ...` to `acc[r]` in that order, `N`
/// elements a step (all `N` weights and a row's `N` activations loaded before they are added)
/// while a whole step fits below `k`; returns the first `j` not added.
///
/// # Safety
/// As `matvec`.
#[inline(always)]
unsafe fn chunks<W: FloatWeight, const N: usize>(wrow: *const u8, x: *const f32, acc: &mut [f32; MMVQ_MAX_ROWS], mut j: u32, k: u32, rows: u32) -> u32 {
    while j + 32 * (N as u32 - 1) < k {
        // Element `j + 32 i` from one base pointer and a constant offset per `i` (so LLVM's
        // unrolling sees a cheap body and unrolls all `N`: a partly unrolled loop puts `wj` in
        // local memory).
        let (wr, mut wj) = (wrow.add(j as usize * W::BYTES), [0.0f32; N]);
        for (i, v) in wj.iter_mut().enumerate() {
            *v = W::get(wr, 32 * i as u32);
        }
        crate::unroll!(r in [0, 1, 2, 3, 4, 5, 6, 7] {
            if (r as u32) < rows {
                let xr = x.add(r * k as usize + j as usize);
                let mut xj = [0.0f32; N];
                for (i, v) in xj.iter_mut().enumerate() {
                    *v = f32::from_bits(mem::ld_nc_u32(xr.add(32 * i) as *const u8));
                }
                for i in 0..N {
                    acc[r] += wj[i] * xj[i];
                }
            }
        });
        j += 32 * N as u32;
    }
    j
}

/// Declares, per weight type, the `extern "ptx-kernel"` entry for 1..8 activation rows and the
/// one for a single row (`matvec1_*`: the row count a constant, so the code of the other seven
/// row slots is not in it, as `mmvq1_*` is to `mmvq_*`).
macro_rules! matvec_entries {
    ($($name:ident, $one:ident => $w:ty),* $(,)?) => {$(
        $crate::entry! {
            /// `matvec` for one weight type. Launch: `ceil(m / MATVEC_WARPS)` blocks of
            /// `32 * MATVEC_WARPS` threads.
            ///
            /// # Safety
            /// As `matvec`.
            pub unsafe fn $name(w: *const u8, x: *const f32, y: *mut f32, m: u32, k: u32, rows: u32, accumulate: u32) {
                prefetch_row::<$w>(w, m, k);
                crate::arch::sync::chain_grids();
                matvec::<$w>(w, x, y, m, k, rows, accumulate)
            }
        }

        $crate::entry! {
            /// `matvec` of one activation row (`rows` must be 1; the parameter keeps the signature
            /// of the entry above). Launch as that entry.
            ///
            /// # Safety
            /// As `matvec` with `rows == 1`.
            pub unsafe fn $one(w: *const u8, x: *const f32, y: *mut f32, m: u32, k: u32, _rows: u32, accumulate: u32) {
                prefetch_row::<$w>(w, m, k);
                crate::arch::sync::chain_grids();
                matvec::<$w>(w, x, y, m, k, 1, accumulate)
            }
        }
    )*};
}

matvec_entries! {
    matvec_f32, matvec1_f32 => F32,
    matvec_bf16, matvec1_bf16 => Bf16,
    matvec_f16, matvec1_f16 => F16,
}
