//! `rms_norm` (one warp per row) and `add_f32` (the residual add, in place allowed). Specs:
//! `strata_gpu_shared::replica::norm`.
//!
//! [`warp_rms_scale`] is the RMSNorm scale of one row as a warp computes it; attention's
//! per-head norm calls it too.
use crate::arch::{convert, index, mem, warp};
use strata_gpu_shared::launch::norm::{ADD_THREADS, NORM_AHEAD, NORM_WARPS};

/// `x[j]` through the coherent path: the norm helper may read rows its caller's launch wrote
/// (in an earlier phase of the same kernel), and `add_f32` reads `a` where it writes `out`.
///
/// # Safety
/// `x.add(j)` is a valid, 4-byte aligned f32 in device memory.
#[inline(always)]
unsafe fn ld(x: *const f32, j: u32) -> f32 {
    f32::from_bits(mem::ld_u32(x.add(j as usize) as *const u8))
}

/// The RMSNorm scale `1 / sqrt(mean(x^2) + eps)` of the `n` values at `x`, loading `AHEAD`
/// values per lane before adding them (a choice of the caller's: it changes no bits), in the
/// replica's order
/// (`replica::norm::rms_scale`): lane `p` sums `x[j] * x[j]` for `j = p, p + 32, ...` left to
/// right from +0.0, the warp butterfly adds the partials, then `mean = total / n` and
/// `1 / sqrt_rn(mean + eps)`. Every lane returns the same bits.
///
/// # Safety
/// The whole warp calls it, converged, with the same arguments; `x` points at `n` f32 in device
/// memory, 4-byte aligned, which no thread writes during the call.
#[inline(always)]
pub unsafe fn warp_rms_scale<const AHEAD: usize>(x: *const f32, n: u32, eps: f32) -> f32 {
    let mut partial = 0.0f32;
    // `AHEAD` loads in flight before their squares are added, in order.
    let (mut j, ahead) = (index::lane(), AHEAD as u32);
    while j + 32 * (ahead - 1) < n {
        let mut v = [0.0f32; AHEAD];
        for (i, v) in v.iter_mut().enumerate() {
            *v = ld(x, j + 32 * i as u32);
        }
        for v in v {
            partial += v * v;
        }
        j += 32 * ahead;
    }
    while j < n {
        let v = ld(x, j);
        partial += v * v;
        j += 32;
    }
    let mean = warp::warp_sum_f32(partial) / n as f32;
    1.0 / convert::sqrt_rn(mean + eps)
}

/// `out[r * n + j] = (x[r * n + j] * scale_r) * w[j]` for `rows` rows. Launch:
/// `ceil(rows / NORM_WARPS)` blocks of `32 * NORM_WARPS` threads.
///
/// # Safety
/// `x`, `out`: `rows * n` f32, not overlapping; `w`: `n` f32; all 4-byte aligned; `1 <= n`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn rms_norm(x: *const f32, w: *const f32, out: *mut f32, rows: u32, n: u32, eps: f32) {
    let row = index::block_idx() * NORM_WARPS + index::warp_in_block();
    if row < rows {
        // The norm weight is constant: towards L2 while the grid before this one runs.
        mem::prefetch_l2_warp(w as *const u8, n as usize * 4);
    }
    crate::arch::sync::chain_grids();
    if row >= rows {
        return; // whole warp
    }
    let at = row as usize * n as usize;
    let (xr, outr) = (x.add(at), out.add(at));
    let scale = warp_rms_scale::<{ NORM_AHEAD as usize }>(xr, n, eps);
    let wj = |j: u32| f32::from_bits(mem::ld_nc_u32(w.add(j as usize) as *const u8));
    let mut j = index::lane();
    while j + 32 * (NORM_AHEAD - 1) < n {
        let (mut xv, mut wv) = ([0.0f32; NORM_AHEAD as usize], [0.0f32; NORM_AHEAD as usize]);
        for i in 0..NORM_AHEAD as usize {
            (xv[i], wv[i]) = (ld(xr, j + 32 * i as u32), wj(j + 32 * i as u32));
        }
        for i in 0..NORM_AHEAD as usize {
            mem::st_f32(outr.add((j + 32 * i as u32) as usize), (xv[i] * scale) * wv[i]);
        }
        j += 32 * NORM_AHEAD;
    }
    while j < n {
        mem::st_f32(outr.add(j as usize), (ld(xr, j) * scale) * wj(j));
        j += 32;
    }
}

/// `out[i] = a[i] + b[i]`. `out` may be `a` itself (the in-place residual add): each thread reads
/// its `a[i]` coherently before it writes `out[i]`, and no other thread touches index `i`. Launch:
/// `ceil(n / ADD_THREADS)` blocks of `ADD_THREADS` threads.
///
/// # Safety
/// `a`, `b`, `out`: `n` f32, 4-byte aligned; `b` does not overlap `out`; `out` either is `a` or
/// does not overlap it.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn add_f32(a: *const f32, b: *const f32, out: *mut f32, n: u32) {
    crate::arch::sync::chain_grids();
    let i = index::block_idx() * ADD_THREADS + index::thread_idx();
    if i >= n {
        return;
    }
    let bi = f32::from_bits(mem::ld_nc_u32(b.add(i as usize) as *const u8));
    mem::st_f32(out.add(i as usize), ld(a, i) + bi);
}
