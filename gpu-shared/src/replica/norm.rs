//! Replicas of `rms_norm`, `add_f32` and the fused `add_rms_norm_q8_1`.
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
//! ## `add_rms_norm_q8_1` (the residual add, `rms_norm` and `quantize_q8_1` in one launch)
//!
//! `add_rms_norm_q8_1(float *acc, const float *b, const float *w, float *out, u8 *xq, u32 rows,
//! u32 n, float eps)`: one warp per row (`NORM_WARPS` rows a block, as `rms_norm`), `n` a
//! multiple of 32 up to `NORM_MAX_N`. For row `r`:
//!
//! 1. If `b` is not null: `acc[r*n + j] = acc[r*n + j] + b[r*n + j]` for every `j` (one
//!    rounding; `acc` is written back). A null `b` leaves `acc` as it is.
//! 2. `scale` = [`rms_scale`] of the row of `acc` (after step 1), in the lane-strided order of
//!    `rms_norm` above.
//! 3. `out[r*n + j] = (acc[r*n + j] * scale) * w[j]`.
//! 4. q8_1 block `r * n / 32 + i` of `xq` = `quantize_q8_1` of
//!    `out[r*n + 32i .. r*n + 32i + 32]` ([`crate::replica::quantize_q8_1::quantize_group`]; on
//!    the device lane `l` holds value `32i + l`).
//!
//! The same bits as `add_f32` in place, then `rms_norm`, then `quantize_q8_1` (three launches);
//! [`add_rms_norm_q8_1_row`] is that composition. `out` and `xq` overlap nothing; `acc` and `b`
//! do not overlap.
use crate::formats::{q8_1, GROUP};
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

/// One row of `add_rms_norm_q8_1` (steps 1-4 above): `acc` (`n` values) gets `b` added in place
/// when given, `out` the RMSNorm of `acc` times `w`, `xq` the `n / 32` q8_1 blocks of `out`.
/// `b`, `w` and `out` as long as `acc`, `n` a multiple of 32; `xq` holds `n / 32` blocks.
pub fn add_rms_norm_q8_1_row(acc: &mut [f32], b: Option<&[f32]>, w: &[f32], eps: f32, out: &mut [f32], xq: &mut [u8]) {
    if let Some(b) = b {
        // `add` in place: `out` (overwritten below) holds the old row meanwhile.
        out.copy_from_slice(acc);
        add(out, b, acc);
    }
    rms_norm_row(acc, w, eps, out);
    crate::replica::quantize_q8_1::quantize(out, &mut xq[..acc.len() / GROUP * q8_1::BYTES]);
}
