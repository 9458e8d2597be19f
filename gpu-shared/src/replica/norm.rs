//! Replicas of `rms_norm`, `add_f32` and `rms_norm_q8_1` (`rms_norm` then `quantize_q8_1`).
//!
//! ## `rms_norm` (one row of `n` values, `x` and weights `w`)
//!
//! 1. Partial `p` (of [`LANES`]) is the left-to-right sum from +0.0 of `x[j] * x[j]` (the product
//!    rounded to f32, then added: no fma) for `j = p, p + 32, ...`.
//! 2. `total` = [`butterfly_sum`] of the 32 partials.
//! 3. `mean = total / f32(n)` (IEEE division; `n <= 16384` is exact in f32).
//! 4. `scale = 1.0 / sqrt_rn(mean + eps)` ([`sqrt_rn`]: correctly rounded, as `sqrt.rn.f32`).
//! 5. `out[j] = (x[j] * scale) * w[j]`.
//!
//! Steps 1-4 are [`rms_scale`], which the per-head norm of attention uses as well.
//!
//! ## `add_f32`
//!
//! `out[i] = a[i] + b[i]` (one rounding).
//!
//! ## `rms_norm_q8_1` (`rms_norm`, then `quantize_q8_1` of its output, in one launch)
//!
//! `rms_norm_q8_1(const float *x, const float *w, float *out, u8 *xq, u32 rows, u32 n, float
//! eps)`, `n` a multiple of 32 up to `NQ_MAX_N`, `out` and `xq` overlapping nothing. For row `r`:
//!
//! 1. `out[r*n + j]` = `rms_norm` of the row above (steps 1-5, the same order and bits);
//! 2. q8_1 block `r * n / 32 + i` of `xq` = `quantize_q8_1` of `out[r*n + 32i .. r*n + 32i + 32]`
//!    ([`crate::replica::quantize_q8_1::quantize_group`], spec in [`crate::order`]).
//!
//! Both outputs are the bits of `rms_norm` followed by `quantize_q8_1` on its output;
//! [`rms_norm_q8_1_row`] is that composition. On the device each block of a row computes the
//! scale itself (every warp, in the order of steps 1-4) and quantizes up to `NQ_WARPS` groups.
use crate::math::sqrt_rn;
use crate::order::{butterfly_sum, LANES};

/// The RMSNorm scale of `x` (steps 1-4 above).
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut partial = [0.0f32; LANES];
    for (j, &v) in x.iter().enumerate() {
        partial[j % LANES] += v * v;
    }
    let mean = butterfly_sum(partial) / x.len() as f32;
    1.0 / sqrt_rn(mean + eps)
}

/// One row of `rms_norm`: `out[j] = (x[j] * scale) * w[j]`; `w` and `out` as long as `x`.
pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &xj), &wj) in out.iter_mut().zip(x).zip(w) {
        *o = (xj * scale) * wj;
    }
}

/// `add_f32`: `out[i] = a[i] + b[i]`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// One row of `rms_norm_q8_1`: [`rms_norm_row`] into `out`, then
/// [`crate::replica::quantize_q8_1::quantize`] of `out` into `xq` (`n / 32` q8_1 blocks); `w`
/// and `out` as long as `x`, a multiple of 32.
pub fn rms_norm_q8_1_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], xq: &mut [u8]) {
    rms_norm_row(x, w, eps, out);
    crate::replica::quantize_q8_1::quantize(out, xq);
}
