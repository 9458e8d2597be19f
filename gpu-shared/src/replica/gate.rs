//! Replicas of the element-wise gates of the qwen35moe step. This module doc is their spec.
//!
//! - `rms_norm_gated(x, w, z, out, rows, n, eps)` (the GDN output norm, one warp a row):
//!   `out[j] = ((x[j] * scale) * w[j]) * silu(z[j])`, `scale` the RMSNorm scale of the row
//!   ([`rms_scale`]) and [`silu`] the experts' one.
//! - `sigmoid_mul(a, g, out, n)` (the gated attention output): `out[i] = a[i] * sigmoid(g[i])`
//!   ([`sigmoid`]); `out` may be `a`.
//! - `swiglu_f32(g, u, out, n)` (the shared expert's activation): `out[i] = silu(g[i]) * u[i]`.
//! - `add_gated(acc, y, s, rows, n)` (the shared expert added to the routed experts):
//!   `acc[r * n + i] = acc[r * n + i] + sigmoid(s[r]) * y[r * n + i]` (the product rounded,
//!   then added), `s` one gate logit per row.
//! - `concat_rows(a, b, out, rows, n_a, n_b)` (the MTP block's concatenation of the normed
//!   embedding and the normed hidden state): `out[r * (n_a + n_b) + j] = a[r * n_a + j]` for
//!   `j < n_a`, `= b[r * n_b + j - n_a]` for `n_a <= j < n_a + n_b` (a copy: the bits are the
//!   inputs').
use super::norm::rms_scale;
use crate::math::sigmoid;
use crate::moe::{silu, swiglu};

/// One row of `rms_norm_gated`.
pub fn rms_norm_gated_row(x: &[f32], w: &[f32], z: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for (j, o) in out.iter_mut().enumerate() {
        *o = ((x[j] * scale) * w[j]) * silu(z[j]);
    }
}

/// `sigmoid_mul` over `a` and `g` (as long as `out`).
pub fn sigmoid_mul(a: &[f32], g: &[f32], out: &mut [f32]) {
    for ((o, &x), &gx) in out.iter_mut().zip(a).zip(g) {
        *o = x * sigmoid(gx);
    }
}

/// `swiglu_f32` over `g` and `u` (as long as `out`).
pub fn swiglu_rows(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &gx), &ux) in out.iter_mut().zip(g).zip(u) {
        *o = swiglu(gx, ux);
    }
}

/// `add_gated` of rows of `n`: `acc`, `y` one row per entry of `s`.
pub fn add_gated(acc: &mut [f32], y: &[f32], s: &[f32], n: usize) {
    for ((ar, yr), &sr) in acc.chunks_exact_mut(n).zip(y.chunks_exact(n)).zip(s) {
        let g = sigmoid(sr);
        for (a, &yv) in ar.iter_mut().zip(yr) {
            *a += g * yv;
        }
    }
}

/// `concat_rows` of the `out.len() / (n_a + n_b)` rows of `out`: row `r` is row `r` of `a`
/// (`n_a` values) then row `r` of `b` (`n_b` values), copied.
pub fn concat_rows(a: &[f32], b: &[f32], n_a: usize, n_b: usize, out: &mut [f32]) {
    let n = n_a + n_b;
    if n == 0 {
        return;
    }
    for (r, o) in out.chunks_exact_mut(n).enumerate() {
        let (oa, ob) = o.split_at_mut(n_a);
        oa.copy_from_slice(&a[r * n_a..(r + 1) * n_a]);
        ob.copy_from_slice(&b[r * n_b..(r + 1) * n_b]);
    }
}
