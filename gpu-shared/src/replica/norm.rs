//! Replicas of `rms_norm` and `add_f32`.
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
