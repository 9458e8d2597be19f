//! `rms_norm` (one warp per row), `add_f32` (the residual add, in place allowed) and
//! `rms_norm_q8_1` (`rms_norm` then `quantize_q8_1` of its output, a row spread over several
//! blocks). Specs: `strata_gpu_shared::replica::norm`.
//!
//! [`warp_rms_scale`] is the RMSNorm scale of one row as a warp computes it from global memory;
//! [`warp_rms_scale_of`] is its order over any loader (`rms_norm_q8_1` reads the row from shared
//! memory), [`warp_rms_scale_from`] its end from a lane's partial (attention's per-head norm
//! holds its row in registers).
use crate::arch::{convert, index, mem, sync, warp};
use crate::kernels::quantize_q8_1::quantize_group;
use strata_gpu_shared::formats::{q8_1, GROUP};
use strata_gpu_shared::launch::norm::{nq_parts, ADD_THREADS, NORM_AHEAD, NORM_WARPS, NQ_AHEAD, NQ_WARPS};

/// `x[j]` through the coherent path: the norm helper may read rows its caller's launch wrote
/// (in an earlier phase of the same kernel), and `add_f32` reads `a` where it writes `out`.
///
/// # Safety
/// `x.add(j)` is a valid, 4-byte aligned f32 in device memory.
#[inline(always)]
unsafe fn ld(x: *const f32, j: u32) -> f32 {
    f32::from_bits(mem::ld_u32(x.add(j as usize) as *const u8))
}

/// The RMSNorm scale `1 / sqrt(mean(x^2) + eps)` of the `n` values `x(0)`, ..., `x(n - 1)`,
/// loading `AHEAD` values per lane before adding them (a choice of the caller's: it changes no
/// bits), in the replica's order (`replica::norm::rms_scale`): lane `p` sums `x(j) * x(j)` for
/// `j = p, p + 32, ...` left to right from +0.0, the warp butterfly adds the partials, then
/// `mean = total / n` and `1 / sqrt_rn(mean + eps)`. The whole warp calls it, converged, with
/// the same `n`, `eps` and values; every lane returns the same bits. `x` is called with `j < n`
/// only.
#[inline(always)]
pub fn warp_rms_scale_of<const AHEAD: usize>(x: impl Fn(u32) -> f32, n: u32, eps: f32) -> f32 {
    let mut partial = 0.0f32;
    // `AHEAD` loads in flight before their squares are added, in order.
    let (mut j, ahead) = (index::lane(), AHEAD as u32);
    while j + 32 * (ahead - 1) < n {
        let mut v = [0.0f32; AHEAD];
        for (i, v) in v.iter_mut().enumerate() {
            *v = x(j + 32 * i as u32);
        }
        for v in v {
            partial += v * v;
        }
        j += 32 * ahead;
    }
    while j < n {
        let v = x(j);
        partial += v * v;
        j += 32;
    }
    warp_rms_scale_from(partial, n, eps)
}

/// The end of [`warp_rms_scale_of`] for a caller that summed its lane's squares itself (in that
/// order): the warp butterfly over the lanes' `partial`s, `mean = total / n`, then
/// `1 / sqrt_rn(mean + eps)`. The whole warp calls it, converged, with the same `n` and `eps`.
#[inline(always)]
pub fn warp_rms_scale_from(partial: f32, n: u32, eps: f32) -> f32 {
    let mean = warp::warp_sum_f32(partial) / n as f32;
    1.0 / convert::sqrt_rn(mean + eps)
}

/// [`warp_rms_scale_of`] the `n` values at `x` in device memory, read through coherent loads.
///
/// # Safety
/// The whole warp calls it, converged, with the same arguments; `x` points at `n` f32 in device
/// memory, 4-byte aligned, which no thread writes during the call.
#[inline(always)]
pub unsafe fn warp_rms_scale<const AHEAD: usize>(x: *const f32, n: u32, eps: f32) -> f32 {
    warp_rms_scale_of::<AHEAD>(|j| ld(x, j), n, eps)
}

crate::entry! {
    /// `out[r * n + j] = (x[r * n + j] * scale_r) * w[j]` for `rows` rows. Launch:
    /// `ceil(rows / NORM_WARPS)` blocks of `32 * NORM_WARPS` threads.
    ///
    /// # Safety
    /// `x`, `out`: `rows * n` f32, not overlapping; `w`: `n` f32; all 4-byte aligned; `1 <= n`.
    pub unsafe fn rms_norm(x: *const f32, w: *const f32, out: *mut f32, rows: u32, n: u32, eps: f32) {
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
}

crate::entry! {
    /// `out[i] = a[i] + b[i]`. `out` may be `a` itself (the in-place residual add): each thread reads
    /// its `a[i]` coherently before it writes `out[i]`, and no other thread touches index `i`. Launch:
    /// `ceil(n / ADD_THREADS)` blocks of `ADD_THREADS` threads.
    ///
    /// # Safety
    /// `a`, `b`, `out`: `n` f32, 4-byte aligned; `b` does not overlap `out`; `out` either is `a` or
    /// does not overlap it.
    pub unsafe fn add_f32(a: *const f32, b: *const f32, out: *mut f32, n: u32) {
        crate::arch::sync::chain_grids();
        let i = index::block_idx() * ADD_THREADS + index::thread_idx();
        if i >= n {
            return;
        }
        let bi = f32::from_bits(mem::ld_nc_u32(b.add(i as usize) as *const u8));
        mem::st_f32(out.add(i as usize), ld(a, i) + bi);
    }
}

crate::entry! {
    /// `rms_norm` then `quantize_q8_1` of its output in one launch (spec: `replica::norm`,
    /// `rms_norm_q8_1`): `out[r * n + j] = (x[r * n + j] * scale_r) * w[j]` for `rows` rows, and q8_1
    /// block `r * n / 32 + g` of `xq` the quantized group `g` of row `r` of `out`. Launch:
    /// `rows * nq_parts(n)` blocks of `32 * NQ_WARPS` threads, `n * 4` bytes of dynamic shared
    /// memory.
    ///
    /// Block `b` takes row `b / parts`, part `b % parts`; its warp `w` the group
    /// `g = part * NQ_WARPS + w` (none where `g >= n / 32`). The block stages the whole row in
    /// shared memory (16-byte coherent loads over all its threads, `NQ_AHEAD` in flight each), and
    /// after one barrier every warp computes the row's scale from there itself
    /// ([`warp_rms_scale_of`], the spec's one-warp order: the same bits in every warp and block, so
    /// no second barrier), then lane `l` normalizes value `32 g + l`, stores it to `out` and
    /// quantizes the group with its warp ([`quantize_group`]).
    ///
    /// # Safety
    /// `x`, `out`: `rows * n` f32; `w`: `n` f32; `xq`: `rows * n / 32` q8_1 blocks; `x` 16-byte
    /// aligned, `w`, `out` and `xq` 4-byte aligned; `n` a positive multiple of 32; `out` and `xq`
    /// overlap nothing, and nothing writes `x` or `w` during the launch. The launch gives each
    /// block `n * 4` bytes of dynamic shared memory.
    pub unsafe fn rms_norm_q8_1(x: *const f32, w: *const f32, out: *mut f32, xq: *mut u8, rows: u32, n: u32, eps: f32) {
        let (groups, parts) = (n / GROUP as u32, nq_parts(n));
        let (row, part) = (index::block_idx() / parts, index::block_idx() % parts);
        let g = part * NQ_WARPS + index::warp_in_block();
        let j = g * GROUP as u32 + index::lane();
        // The lane's norm weight (constant) is loaded while the grid before this one runs, so no
        // memory latency for it remains after the wait.
        let wj = if row < rows && g < groups { mem::ld_nc_f32(w, j as usize) } else { 0.0 };
        crate::arch::sync::chain_grids();
        if row >= rows {
            return; // the whole block (a padded grid's), before the barrier
        }
        let at = row as usize * n as usize;
        let smem = mem::Smem::dynamic();
        // The row into shared memory: 16-byte chunk `c` (values `4c .. 4c + 4`) by thread
        // `c % threads`, `NQ_AHEAD` loads in flight before their stores.
        let (xr, threads, chunks) = (x.add(at), 32 * NQ_WARPS, n / 4);
        let mut c0 = index::thread_idx();
        while c0 < chunks {
            let mut v = [[0u32; 4]; NQ_AHEAD as usize];
            for (i, v) in v.iter_mut().enumerate() {
                let c = c0 + threads * i as u32;
                if c < chunks {
                    *v = mem::ld_v4(xr.add(4 * c as usize) as *const u8);
                }
            }
            for (i, v) in v.into_iter().enumerate() {
                let c = c0 + threads * i as u32;
                if c < chunks {
                    smem.st_v4(4 * c, v);
                }
            }
            c0 += threads * NQ_AHEAD;
        }
        sync::sync_threads();
        crate::trace_mark!(1, "staged");
        if g >= groups {
            return; // the whole warp, after the block's only barrier
        }
        // 32-bit shared addresses: `row + 4 * (j + 32 i)` folds to one address and immediate
        // offsets, where a 64-bit one widened every index (three instructions a load).
        let row = smem.addr(0);
        let xs = |j: u32| f32::from_bits(mem::Smem::ld_u32_at(row + 4 * j));
        let scale = warp_rms_scale_of::<{ NORM_AHEAD as usize }>(xs, n, eps);
        crate::trace_mark!(2, "scaled");
        let v = (xs(j) * scale) * wj;
        mem::st_f32(out.add(at + j as usize), v);
        quantize_group(v, xq.add((at / GROUP + g as usize) * q8_1::BYTES));
    }
}
