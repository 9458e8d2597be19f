//! Replica of the attention kernels of the decode step: `attn_prep` (per-head RMSNorm, RoPE, KV
//! append), `attn_chunk` (softmax statistics and weighted values over one chunk of key
//! positions) and `attn_merge` (the chunks combined). This module doc is their spec.
//!
//! A window of `T` tokens sits at absolute positions `pos0 .. pos0 + T`. WINDOW INVARIANCE: a
//! token's outputs are a function of its own inputs, its absolute position and the cache at
//! positions `<= pos`, never of the window around it. Every reduction over key positions
//! therefore has an order fixed by absolute position alone: chunks start at multiples of
//! [`ATTN_CHUNK`], and every sum runs in increasing position.
//!
//! ## `attn_prep` (one head row of one token at position `pos`)
//!
//! Token `t`'s query head `h` is `q[t * q_stride + h * hd ..][..hd]`, its key and value heads
//! `g` are `k[t * kv_stride + g * hd ..]` and `v[t * kv_stride + g * hd ..]`: packed rows
//! (`q_stride = n_q * hd`, `kv_stride = n_kv * hd`), or views into one buffer of fused
//! projection rows (both strides `(n_q + 2 n_kv) * hd`). Its `out` is
//! `q_out[(t * n_q + h) * hd ..]`, packed.
//!
//! RMSNorm with weight `w` (the norm family's `rms_norm`): partial `p` (of [`LANES`](crate::order::LANES)) is the
//! left-to-right sum from +0.0 of `x[j] * x[j]` for `j = p, p + 32, ...`; `total` =
//! [`butterfly_sum`](crate::order::butterfly_sum) of the partials; `mean = total / hd`; `scale = 1 / sqrt_rn(mean + eps)`;
//! `y[j] = (x[j] * scale) * w[j]`.
//!
//! RoPE, NEOX pairing (llama.cpp rope type 2), `half = n_rot / 2`: for `i < half`,
//! `c = rope[(pos * half + i) * 2]`, `s = rope[(pos * half + i) * 2 + 1]`, `x0 = y[i]`,
//! `x1 = y[i + half]`; `out[i] = x0 * c - x1 * s`, `out[i + half] = x0 * s + x1 * c` (each
//! product rounded, then the subtraction or addition). `out[j] = y[j]` for `n_rot <= j < hd`.
//!
//! A query head's `out` is the result; a key head's is rounded to fp16 (nearest even) into the
//! cache at `((pos * n_kv + g) * hd + d)`; a value head is not normed: `v` rounded to fp16 into
//! the value cache at the same index.
//!
//! ## `attn_chunk` (query head `h` of token `t`, kv head `g = h / (n_q / n_kv)`, chunk `c`)
//!
//! Keys `j` in `[c * ATTN_CHUNK, min((c + 1) * ATTN_CHUNK, L))`, `L = pos + 1`.
//! `s_j = scale * dot_j`, where `dot_j` is the [`butterfly_sum`](crate::order::butterfly_sum) of 32 partials, partial `p`
//! starting at +0.0 and taking `acc = fma(q[d], f32(k_j[d]), acc)` for `d = p, p + 32, ... < hd`
//! in turn ([`lane_dot`]). `m` = maxNum of the `s_j` (exact in any order); `p_j = exp_neg(s_j -
//! m)` ([`crate::math::exp_neg`]); `l` = left-to-right sum from +0.0 of `p_j` in increasing `j`;
//! `o[d]` starts at +0.0 and takes `o[d] = fma(p_j, f32(v_j[d]), o[d])` in increasing `j`. The
//! chunk's part is `[m, l, o[0], ..., o[hd - 1]]`.
//!
//! The products are fused with their sums ([`crate::math::fma`], one rounding where a multiply
//! then an add round twice): at depth the chunk kernels are bound by instruction issue, and a
//! fused multiply-add is one instruction where the two are two (docs/kernels/attention.md).
//!
//! ## `attn_merge` (query head `h` of token `t`, its `nc = ceil(L / ATTN_CHUNK)` parts)
//!
//! `M` = maxNum of the `m_c`; `f_c = exp_neg(m_c - M)`; `L` = left-to-right sum from +0.0 of
//! `l_c * f_c` in increasing `c`; `O[d]` likewise of `o_c[d] * f_c`; `out[d] = O[d] / L`.
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::launch::attention::{attn_chunks, ATTN_CHUNK, ATTN_MAX_HD};
use crate::math::exp_neg;
use crate::math::fma;
use crate::order::lane_dot;

/// One key/value head of a layer's cache: `k` and `v` hold `n_kv` heads of `hd` fp16 values per
/// position, position-major.
#[derive(Clone, Copy, Debug)]
pub struct KvHead<'a> {
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub n_kv: usize,
    pub g: usize,
    pub hd: usize,
}

impl KvHead<'_> {
    fn at(&self, pos: usize) -> usize {
        (pos * self.n_kv + self.g) * self.hd
    }

    fn key(&self, pos: usize) -> &[u16] {
        &self.k[self.at(pos)..self.at(pos) + self.hd]
    }

    fn value(&self, pos: usize) -> &[u16] {
        &self.v[self.at(pos)..self.at(pos) + self.hd]
    }
}



/// The `n_rot` table entries of position `pos` (cos, sin pairs) in a table of `n_rot` floats
/// per position.
pub fn rope_at(rope: &[f32], pos: usize, n_rot: usize) -> &[f32] {
    &rope[pos * n_rot..(pos + 1) * n_rot]
}

/// RMSNorm then RoPE of one head row `x` into `out`; `rope` is [`rope_at`] of the token's
/// position, `n_rot = rope.len()`.
pub fn norm_rope(x: &[f32], w: &[f32], eps: f32, rope: &[f32], out: &mut [f32]) {
    super::norm::rms_norm_row(x, w, eps, out);
    let half = rope.len() / 2;
    for i in 0..half {
        let (c, s) = (rope[2 * i], rope[2 * i + 1]);
        let (x0, x1) = (out[i], out[i + half]);
        out[i] = x0 * c - x1 * s;
        out[i + half] = x0 * s + x1 * c;
    }
}

/// A key head row: [`norm_rope`], rounded to fp16 into `out` (the cache row).
pub fn prep_key(x: &[f32], w: &[f32], eps: f32, rope: &[f32], out: &mut [u16]) {
    let mut y = [0.0f32; ATTN_MAX_HD];
    norm_rope(x, w, eps, rope, &mut y[..x.len()]);
    prep_value(&y[..x.len()], out);
}

/// A value head row: `x` rounded to fp16 into `out` (the cache row).
pub fn prep_value(x: &[f32], out: &mut [u16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f32_to_f16(v);
    }
}

/// One `attn_chunk` block: query `q` against positions `start..end` of `kv`, its part
/// `[m, l, o[0..hd]]` into `part` (`hd + 2` values).
pub fn chunk_part(q: &[f32], kv: KvHead, start: usize, end: usize, scale: f32, part: &mut [f32]) {
    let mut p = [0.0f32; ATTN_CHUNK];
    let p = &mut p[..end - start];
    for (j, s) in p.iter_mut().enumerate() {
        let key = kv.key(start + j);
        *s = scale * lane_dot(kv.hd, |d| q[d], |d| f16_to_f32(key[d]));
    }
    let m = p.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in p.iter_mut() {
        *s = exp_neg(*s - m);
    }
    let (head, o) = part.split_at_mut(2);
    o.fill(0.0);
    let mut l = 0.0f32;
    for (j, &pj) in p.iter().enumerate() {
        l += pj;
        for (o, &v) in o.iter_mut().zip(kv.value(start + j)) {
            *o = fma(pj, f16_to_f32(v), *o);
        }
    }
    head[0] = m;
    head[1] = l;
}

/// One `attn_merge` block: the parts of one (token, head), `hd + 2` values each, into `out`
/// (`hd` values).
pub fn merge(parts: &[f32], out: &mut [f32]) {
    let stride = out.len() + 2;
    let big_m = parts.chunks_exact(stride).fold(f32::NEG_INFINITY, |m, part| m.max(part[0]));
    out.fill(0.0);
    let mut big_l = 0.0f32;
    for part in parts.chunks_exact(stride) {
        let f = exp_neg(part[0] - big_m);
        big_l += part[1] * f;
        for (o, &v) in out.iter_mut().zip(&part[2..]) {
            *o += v * f;
        }
    }
    for o in out.iter_mut() {
        *o /= big_l;
    }
}

/// Attention of query `q` over the first `len` positions of `kv`: every chunk's part into
/// `part` (at least `attn_chunks(len) * (hd + 2)` values), then their merge into `out`.
pub fn attend(q: &[f32], kv: KvHead, len: usize, scale: f32, part: &mut [f32], out: &mut [f32]) {
    let stride = kv.hd + 2;
    let nc = attn_chunks(len);
    for (c, p) in part[..nc * stride].chunks_exact_mut(stride).enumerate() {
        let start = c * ATTN_CHUNK;
        chunk_part(q, kv, start, (start + ATTN_CHUNK).min(len), scale, p);
    }
    merge(&part[..nc * stride], out);
}
