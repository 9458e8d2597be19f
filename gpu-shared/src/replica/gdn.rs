//! Replicas of the Gated DeltaNet kernels of a qwen35moe layer (MODELS.md section 2): the causal
//! depthwise conv step (`gdn_conv`) and the gated delta rule (`gdn_recur`). This module doc is
//! their spec.
//!
//! Both keep per-layer state indexed by ABSOLUTE POSITION, like the KV cache: a token's outputs
//! depend on its inputs, its position and the state left by the positions before it, never on
//! the window around it (window invariance), and after a verify window the state of the last
//! accepted position is in place for the next window with nothing recomputed. Positions before
//! 0 read as zeros, so a sequence needs no reset.
//!
//! ## `gdn_conv` (channel `c` of `channels`, a window of `tokens` at positions `pos + t`)
//!
//! ```text
//! gdn_conv(const float *x, const float *w, float *ring, float *out, const u32 *pos,
//!          u32 tokens, u32 channels, u32 d_conv)
//! ```
//!
//! `x`: `tokens` rows of `channels` (the `attn_qkv` projection); `w`: the taps as ggml stores
//! `ssm_conv1d` `{d_conv, channels}`, tap `k` of channel `c` at `w[c * d_conv + k]`; `ring`:
//! [`gdn_conv_ring`]`(d_conv)` rows of `channels`, input of position `p` in row
//! `p % ring_rows`; `out`: `tokens` rows of `channels`. In token order, for `p = *pos + t`:
//!
//! 1. `ring[p % R][c] = x[t][c]`;
//! 2. `acc` = left-to-right sum from +0.0 over `k = 0 .. d_conv` of `w[c][k] * u_k` (product
//!    rounded, then added), `u_k` the input of position `p - (d_conv - 1) + k` from the ring,
//!    +0.0 for a position below 0;
//! 3. `out[t][c] = silu(acc)` ([`crate::moe::silu`]).
//!
//! ## `gdn_recur` (value head `h` of `n_v`, value dimension `j` of `d`)
//!
//! ```text
//! gdn_recur(const float *conv, const float *alpha, const float *beta, const float *dt_bias,
//!           const float *a, float *state, float *out, const u32 *pos, u32 tokens, u32 n_k,
//!           u32 n_v, u32 d, float eps, float scale)
//! ```
//!
//! `conv`: `tokens` rows of `2 * n_k * d + n_v * d` (the conv output: q heads, k heads, v
//! heads); `alpha`, `beta`: `tokens` rows of `n_v` (the `ssm_alpha` and `ssm_beta`
//! projections); `dt_bias`, `a`: `n_v` (`ssm_dt.bias`, and `ssm_a` = `-exp(A_log)`, never
//! positive); `state`: [`GDN_STATE_SLOTS`] slots of `n_v` heads of `d x d`, the state after
//! position `p` in slot `p % GDN_STATE_SLOTS`, `S[i][j]` of head `h` at
//! `((slot * n_v + h) * d + j) * d + i` (column `j` contiguous); `out`: `tokens` rows of
//! `n_v * d`. Value head `h` reads key head `kh = h % n_k` (the tiled order of the converter).
//!
//! `S` starts as the slot of position `*pos - 1`, or all +0.0 when `*pos == 0`. Then for each
//! token `t` in order, `p = *pos + t`:
//!
//! 1. L2 norms: `q̂[i] = q[i] * rq`, `k̂[i] = k[i] * rk` with `q`, `k` head `kh` of row `t`,
//!    `rq = 1 / max(sqrt_rn(Σ q[i]²), eps)` (the sum a [`lane_sum`]; the max taken as
//!    `if s > eps { s } else { eps }`), likewise `rk`.
//! 2. `b = sigmoid(beta[t][h])`; `g = softplus(alpha[t][h] + dt_bias[h]) * a[h]`;
//!    `decay = exp_neg(g)` ([`sigmoid`], [`softplus`], [`exp_neg`]).
//! 3. `S[i][j] = S[i][j] * decay` for every `i`.
//! 4. `kv = lane_sum(S[i][j] * k̂[i])`; `delta = (v[j] - kv) * b`, `v` head `h` of row `t`.
//! 5. `S[i][j] = S[i][j] + k̂[i] * delta` (product rounded, then added).
//! 6. `out[t][h * d + j] = lane_sum(S[i][j] * q̂[i]) * scale` (`scale` = `1 / sqrt(d)`, given).
//! 7. `S[.][j]` is written to slot `p % GDN_STATE_SLOTS`.
//!
//! [`lane_sum`] is a warp's order: lane `l` adds the terms `i = l, l + 32, ...` left to right
//! from +0.0, then the butterfly.
use crate::launch::gdn::{gdn_conv_ring, GDN_MAX_D, GDN_STATE_SLOTS};
use crate::math::{exp_neg, sigmoid, softplus};
use crate::moe::silu;
use crate::order::lane_sum;

/// The shape of one `gdn_recur` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurShape {
    pub tokens: usize,
    pub n_k: usize,
    pub n_v: usize,
    pub d: usize,
}

impl RecurShape {
    /// Values of a conv output row: q and k heads, then v heads.
    pub const fn conv_row(&self) -> usize {
        (2 * self.n_k + self.n_v) * self.d
    }

    /// Values of a layer's state, every slot.
    pub const fn state_len(&self) -> usize {
        GDN_STATE_SLOTS * self.n_v * self.d * self.d
    }
}

/// `gdn_conv` for every channel (`x`, `out`: `tokens` rows of `channels`; `ring`:
/// `gdn_conv_ring(d_conv)` rows).
pub fn gdn_conv(x: &[f32], w: &[f32], ring: &mut [f32], out: &mut [f32], pos: u32, channels: usize, d_conv: usize) {
    let rows = gdn_conv_ring(d_conv);
    for (t, (xt, ot)) in x.chunks_exact(channels).zip(out.chunks_exact_mut(channels)).enumerate() {
        let p = pos as usize + t;
        ring[(p % rows) * channels..][..channels].copy_from_slice(xt);
        for (c, o) in ot.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for k in 0..d_conv {
                let u = match (p + k).checked_sub(d_conv - 1) {
                    Some(q) => ring[(q % rows) * channels + c],
                    None => 0.0,
                };
                acc += w[c * d_conv + k] * u;
            }
            *o = silu(acc);
        }
    }
}

/// The key head that value head `h` of a layer with `n_k` key heads reads: the tiled order of the
/// GGUF converter (`h % n_k`), not the grouped one.
pub const fn key_head(h: usize, n_k: usize) -> usize {
    h % n_k
}

/// `1 / max(sqrt_rn(Σ x²), eps)` (step 1 of `gdn_recur`).
pub fn l2_scale(x: &[f32], eps: f32) -> f32 {
    let s = crate::math::sqrt_rn(lane_sum(x.len(), |i| x[i] * x[i]));
    1.0 / if s > eps { s } else { eps }
}

/// The state decay `exp_neg(softplus(alpha + dt_bias) * a)` and the write strength
/// `sigmoid(beta)` of one value head at one token (step 2).
pub fn gates(alpha: f32, beta: f32, dt_bias: f32, a: f32) -> (f32, f32) {
    (exp_neg(softplus(alpha + dt_bias) * a), sigmoid(beta))
}

/// `gdn_recur` for every value head and dimension: token by token, each column read from the
/// previous position's slot and written to this position's.
#[allow(clippy::too_many_arguments)]
pub fn gdn_recur(conv: &[f32], alpha: &[f32], beta: &[f32], dt_bias: &[f32], a: &[f32], state: &mut [f32], out: &mut [f32], pos: u32, s: RecurShape, eps: f32, scale: f32) {
    let RecurShape { tokens, n_k, n_v, d } = s;
    let column = |slot: usize, h: usize, j: usize| ((slot * n_v + h) * d + j) * d;
    let (mut col, mut qh, mut kh) = ([0.0f32; GDN_MAX_D], [0.0f32; GDN_MAX_D], [0.0f32; GDN_MAX_D]);
    let col = &mut col[..d];
    for t in 0..tokens {
        let p = pos as usize + t;
        let row = &conv[t * s.conv_row()..][..s.conv_row()];
        for h in 0..n_v {
            let g = key_head(h, n_k);
            let (q, k) = (&row[g * d..][..d], &row[(n_k + g) * d..][..d]);
            let (rq, rk) = (l2_scale(q, eps), l2_scale(k, eps));
            for i in 0..d {
                (qh[i], kh[i]) = (q[i] * rq, k[i] * rk);
            }
            let (decay, b) = gates(alpha[t * n_v + h], beta[t * n_v + h], dt_bias[h], a[h]);
            for j in 0..d {
                match p.checked_sub(1) {
                    Some(prev) => col.copy_from_slice(&state[column(prev % GDN_STATE_SLOTS, h, j)..][..d]),
                    None => col.fill(0.0),
                }
                for x in col.iter_mut() {
                    *x *= decay;
                }
                let kv = lane_sum(d, |i| col[i] * kh[i]);
                let delta = (row[(2 * n_k + h) * d + j] - kv) * b;
                for (x, &ki) in col.iter_mut().zip(&kh[..d]) {
                    *x += ki * delta;
                }
                out[t * n_v * d + h * d + j] = lane_sum(d, |i| col[i] * qh[i]) * scale;
                state[column(p % GDN_STATE_SLOTS, h, j)..][..d].copy_from_slice(col);
            }
        }
    }
}
