//! `matvec_f32` / `matvec_bf16` / `matvec_f16`: float weights (router-sized matrices) times 1..8
//! f32 activation rows. One warp per weight row and activation row (`MATVEC_WARPS` weight rows
//! of one activation row a block); lane `l` takes elements `l, l + 32, ...` (consecutive lanes
//! read consecutive elements, so every load is coalesced) and keeps one partial; the warp
//! butterfly sums the partials, which are stored or, with `accumulate`, added to what `y` holds.
//! Spec: `strata_gpu_shared::order` (matvec).
use crate::arch::{convert, index, mem, warp};
use strata_gpu_shared::launch::{MATVEC_AHEAD, MATVEC_AHEAD_REST, MATVEC_WARPS};

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

/// The warp's task: its weight row and its activation row. A block holds `MATVEC_WARPS` weight
/// rows of one activation row; the blocks of one weight block come one after another (block
/// `b` takes activation row `b % rows` of weight block `b / rows`), so the `rows` blocks that
/// read the same weights run at about the same time and all but one find them in L2. `None`
/// for a warp past `m` (a padded grid's).
#[inline(always)]
fn warp_task(m: u32, rows: u32) -> Option<(u32, u32)> {
    let b = index::block_idx();
    let row = (b / rows) * MATVEC_WARPS + index::warp_in_block();
    (row < m).then_some((row, b % rows))
}

/// The warp's weight row, brought towards L2 before the grid waits for the one before it
/// (weights are constant; as `mmvq::prefetch_row`).
#[inline(always)]
fn prefetch_row<W: FloatWeight>(w: *const u8, m: u32, k: u32, rows: u32) {
    if let Some((row, _)) = warp_task(m, rows) {
        let bytes = k as usize * W::BYTES;
        mem::prefetch_l2_warp(w.wrapping_add(row as usize * bytes), bytes);
    }
}

/// One warp's dot product of a weight row and an activation row.
///
/// # Safety
/// `w`: `m * k` elements of `W`; `x`: `rows * k` f32, 4-byte aligned; `y`: `rows * m` f32, not
/// overlapping the inputs; `rows >= 1`. `accumulate`: 0 stores the sums, 1 adds them to `y`'s
/// values.
#[inline(always)]
unsafe fn matvec<W: FloatWeight>(w: *const u8, x: *const f32, y: *mut f32, m: u32, k: u32, rows: u32, accumulate: u32) {
    let Some((row, r)) = warp_task(m, rows) else {
        return; // whole warp
    };
    let wrow = w.add(row as usize * k as usize * W::BYTES);
    let xr = x.add(r as usize * k as usize);
    let out = |_| y.add(r as usize * m as usize + row as usize);
    let base = warp::row_sums_base(1, accumulate != 0, out);
    let mut acc = [0.0f32; 1];
    // A lane's elements j = lane, lane + 32, ... are added in that order, `N` loaded before any
    // is added so that `32 * N` elements of the row cost one memory latency: chunks of
    // `MATVEC_AHEAD` (a 2,048-wide router row is one), then of `MATVEC_AHEAD_REST`, then one by
    // one. The chunking does not change the order of the sum.
    let mut j = index::lane();
    j = chunks::<W, { MATVEC_AHEAD as usize }>(wrow, xr, &mut acc[0], j, k);
    j = chunks::<W, { MATVEC_AHEAD_REST as usize }>(wrow, xr, &mut acc[0], j, k);
    chunks::<W, 1>(wrow, xr, &mut acc[0], j, k);
    warp::store_row_sums(&acc, 1, accumulate != 0, Some(base), out);
}

/// Adds a lane's products `w[j] * x[j]` for `j, j + 32, ...` to `acc` in that order, `N`
/// elements a step (all `N` weights and activations loaded before they are added) while a whole
/// step fits below `k`; returns the first `j` not added.
///
/// # Safety
/// `wrow` and `x` hold `k` elements.
#[inline(always)]
unsafe fn chunks<W: FloatWeight, const N: usize>(wrow: *const u8, x: *const f32, acc: &mut f32, mut j: u32, k: u32) -> u32 {
    while j + 32 * (N as u32 - 1) < k {
        // Element `j + 32 i` from one base pointer and a constant offset per `i` (so LLVM's
        // unrolling sees a cheap body and unrolls all `N`: a partly unrolled loop puts `wj` in
        // local memory).
        let (wr, xr) = (wrow.add(j as usize * W::BYTES), x.add(j as usize));
        let (mut wj, mut xj) = ([0.0f32; N], [0.0f32; N]);
        for (i, v) in wj.iter_mut().enumerate() {
            *v = W::get(wr, 32 * i as u32);
        }
        for (i, v) in xj.iter_mut().enumerate() {
            *v = f32::from_bits(mem::ld_nc_u32(xr.add(32 * i) as *const u8));
        }
        for i in 0..N {
            *acc += wj[i] * xj[i];
        }
        j += 32 * N as u32;
    }
    j
}

/// Declares, per weight type, the `extern "ptx-kernel"` entry.
macro_rules! matvec_entries {
    ($($name:ident => $w:ty),* $(,)?) => {$(
        $crate::entry! {
            /// `matvec` for one weight type. Launch: `ceil(m / MATVEC_WARPS) * rows` blocks of
            /// `32 * MATVEC_WARPS` threads.
            ///
            /// # Safety
            /// As `matvec`.
            pub unsafe fn $name(w: *const u8, x: *const f32, y: *mut f32, m: u32, k: u32, rows: u32, accumulate: u32) {
                prefetch_row::<$w>(w, m, k, rows);
                crate::arch::sync::chain_grids();
                matvec::<$w>(w, x, y, m, k, rows, accumulate)
            }
        }
    )*};
}

matvec_entries! {
    matvec_f32 => F32,
    matvec_bf16 => Bf16,
    matvec_f16 => F16,
}
