//! The element-wise gates of the qwen35moe step: `rms_norm_gated` (the GDN output norm, one
//! warp per row), `sigmoid_mul` (the gated attention output, in place allowed), `swiglu_f32`
//! (the shared expert's activation), `add_gated` (the shared expert added to the routed
//! experts, in place) and `concat_rows` (the MTP block's concatenation of the normed embedding
//! and the normed hidden state). Spec: `strata_gpu_shared::replica::gate` (module doc).
use crate::arch::{index, mem};
use strata_gpu_shared::launch::gdn::GATE_THREADS;
use strata_gpu_shared::launch::norm::NORM_WARPS;
use strata_gpu_shared::math::sigmoid;
use strata_gpu_shared::moe::{silu, swiglu};

/// Values per lane `rms_norm_gated` loads before using them (a choice that changes no bits):
/// its rows are the GDN value heads (128 values in qwen35moe), so 4 make a row one memory
/// latency per pass, where `NORM_AHEAD` (16) would leave such a row to the one-at-a-time tail.
const GATED_AHEAD: usize = 4;
const _: () = assert!(GATED_AHEAD == 4, "the unroll lists of rms_norm_gated name 4 slots");

crate::entry! {
    /// `out[r * n + j] = ((x[r * n + j] * scale_r) * w[j]) * silu(z[r * n + j])` for `rows` rows,
    /// `scale_r` the row's RMSNorm scale (`norm::warp_rms_scale`). Launch: `ceil(rows /
    /// NORM_WARPS)` blocks of `32 * NORM_WARPS` threads, as `rms_norm`.
    ///
    /// # Safety
    /// `x`, `z`, `out`: `rows * n` f32, `out` overlapping neither; `w`: `n` f32; all 4-byte
    /// aligned; `1 <= n`.
    pub unsafe fn rms_norm_gated(x: *const f32, w: *const f32, z: *const f32, out: *mut f32, rows: u32, n: u32, eps: f32) {
        crate::arch::sync::chain_grids();
        let row = index::block_idx() * NORM_WARPS + index::warp_in_block();
        if row >= rows {
            return; // whole warp
        }
        let at = row as usize * n as usize;
        let (xr, zr, outr) = (x.add(at), z.add(at), out.add(at));
        let scale = super::norm::warp_rms_scale::<GATED_AHEAD>(xr, n, eps);
        // `x` read as `rms_norm` reads it (coherently: the norm helper's contract).
        let (wj, zj) = (|j: u32| mem::ld_nc_f32(w, j as usize), |j: u32| mem::ld_nc_f32(zr, j as usize));
        let ahead = GATED_AHEAD as u32;
        let mut j = index::lane();
        while j + 32 * (ahead - 1) < n {
            let (mut xv, mut wv, mut zv) = ([0.0f32; GATED_AHEAD], [0.0f32; GATED_AHEAD], [0.0f32; GATED_AHEAD]);
            // Unrolled by hand: a rolled loop around `silu` leaves the arrays in local memory.
            crate::unroll!(i in [0, 1, 2, 3] {
                let ji = j + 32 * i as u32;
                (xv[i], wv[i], zv[i]) = (mem::ld_f32(xr, ji as usize), wj(ji), zj(ji));
            });
            crate::unroll!(i in [0, 1, 2, 3] {
                mem::st_f32(outr.add((j + 32 * i as u32) as usize), ((xv[i] * scale) * wv[i]) * silu(zv[i]));
            });
            j += 32 * ahead;
        }
        while j < n {
            mem::st_f32(outr.add(j as usize), ((mem::ld_f32(xr, j as usize) * scale) * wj(j)) * silu(zj(j)));
            j += 32;
        }
    }
}

crate::entry! {
    /// `out[i] = a[i] * sigmoid(g[i])`. `out` may be `a` itself: each thread reads its `a[i]`
    /// coherently before it writes `out[i]`, and no other thread touches index `i`. Launch:
    /// `ceil(n / GATE_THREADS)` blocks of `GATE_THREADS` threads.
    ///
    /// # Safety
    /// `a`, `g`, `out`: `n` f32, 4-byte aligned; `g` does not overlap `out`; `out` either is `a`
    /// or does not overlap it.
    pub unsafe fn sigmoid_mul(a: *const f32, g: *const f32, out: *mut f32, n: u32) {
        crate::arch::sync::chain_grids();
        let i = index::block_idx() * GATE_THREADS + index::thread_idx();
        if i >= n {
            return;
        }
        let iu = i as usize;
        let gi = mem::ld_nc_f32(g, iu);
        mem::st_f32(out.add(iu), mem::ld_f32(a, iu) * sigmoid(gi));
    }
}

crate::entry! {
    /// `out[i] = silu(g[i]) * u[i]`. Launch: `ceil(n / GATE_THREADS)` blocks of `GATE_THREADS`
    /// threads.
    ///
    /// # Safety
    /// `g`, `u`, `out`: `n` f32, 4-byte aligned; `out` overlaps neither input.
    pub unsafe fn swiglu_f32(g: *const f32, u: *const f32, out: *mut f32, n: u32) {
        crate::arch::sync::chain_grids();
        let i = index::block_idx() * GATE_THREADS + index::thread_idx();
        if i >= n {
            return;
        }
        let iu = i as usize;
        mem::st_f32(out.add(iu), swiglu(mem::ld_nc_f32(g, iu), mem::ld_nc_f32(u, iu)));
    }
}

crate::entry! {
    /// `acc[r * n + i] = acc[r * n + i] + sigmoid(s[r]) * y[r * n + i]` (the product rounded, then
    /// added), in place: each thread reads its own element coherently before writing it. Launch:
    /// `ceil(rows * n / GATE_THREADS)` blocks of `GATE_THREADS` threads, one element each.
    ///
    /// # Safety
    /// `acc`, `y`: `rows * n` f32; `s`: `rows` f32; all 4-byte aligned, no two overlapping;
    /// `1 <= n`.
    pub unsafe fn add_gated(acc: *mut f32, y: *const f32, s: *const f32, rows: u32, n: u32) {
        crate::arch::sync::chain_grids();
        let i = index::block_idx() * GATE_THREADS + index::thread_idx();
        if i as u64 >= rows as u64 * n as u64 {
            return;
        }
        let iu = i as usize;
        let gate = sigmoid(mem::ld_nc_f32(s, (i / n) as usize));
        let yi = mem::ld_nc_f32(y, iu);
        mem::st_f32(acc.add(iu), mem::ld_f32(acc, iu) + gate * yi);
    }
}

crate::entry! {
    /// `out[r * (n_a + n_b) + j] = a[r * n_a + j]` for `j < n_a`, `= b[r * n_b + j - n_a]` for
    /// `n_a <= j < n_a + n_b`: row `r` of `a` then row `r` of `b`, copied (the bits are the
    /// inputs'). Launch: `ceil(rows * (n_a + n_b) / GATE_THREADS)` blocks of `GATE_THREADS`
    /// threads, one element of `out` each.
    ///
    /// # Safety
    /// `a`: `rows * n_a` f32; `b`: `rows * n_b` f32; `out`: `rows * (n_a + n_b)` f32, overlapping
    /// neither input; all 4-byte aligned.
    pub unsafe fn concat_rows(a: *const f32, b: *const f32, out: *mut f32, rows: u32, n_a: u32, n_b: u32) {
        crate::arch::sync::chain_grids();
        let i = index::block_idx() * GATE_THREADS + index::thread_idx();
        let n = n_a as u64 + n_b as u64;
        if i as u64 >= rows as u64 * n {
            return;
        }
        // `i < rows * n` and `i < 2^32`: a row longer than `u32::MAX` values is row 0, and
        // otherwise the row and column are 32-bit divisions (by `n >= 1`, which the test above
        // implies; the `max` says so to the compiler, which then drops the divide-by-zero panic).
        let (r, j) = if n > u32::MAX as u64 {
            (0, i)
        } else {
            let d = (n as u32).max(1);
            let r = i / d;
            (r, i - r * d)
        };
        let v = if j < n_a { mem::ld_nc_f32(a, r as usize * n_a as usize + j as usize) } else { mem::ld_nc_f32(b, r as usize * n_b as usize + (j - n_a) as usize) };
        mem::st_f32(out.add(i as usize), v);
    }
}
