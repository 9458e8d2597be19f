//! The Gated DeltaNet family of the qwen35moe step: the causal conv step (`gdn_conv`), the gated
//! delta rule (`gdn_recur`) and the element-wise gates around them (`rms_norm_gated`,
//! `sigmoid_mul`, `swiglu_f32`, `add_gated`, `concat_rows`). [`GdnOps`] (host slices, what
//! parity runs) for the CPU replica and the GPU backends, the typed launchers on device buffers
//! (`gdn_conv_queue`, `gdn_recur_queue`, `rms_norm_gated_queue`, `sigmoid_mul_queue`,
//! `swiglu_queue`, `add_gated_queue`, `concat_rows_queue`), float64 references of each
//! kernel's math (none for `concat_rows`, a copy: compared bit for bit only), and
//! [`parity_cases`].
//!
//! The specs are `replica::gdn` and `replica::gate`; the geometry `launch::gdn`. `gdn_conv` and
//! `gdn_recur` read the window's first position from a device word (as the attention does) and
//! keep their state indexed by absolute position: a window takes `1..=SPEC_MAX_TOKENS` tokens,
//! which the ring and the state slots are sized for.
use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::backends::{exact_len, shape_err};
use crate::backends::cpu::CpuBackend;
use crate::error::Result;
use crate::backends::gpu::{holds, GpuBackend};
#[cfg(feature = "sim")]
use crate::backends::sim::{Args as SimArgs, SimBackend};
use crate::parity::{compare_bits, note_unwritten, Outcome, NMSE_MAX, NMSE_MIN_VALUES, POISON_F32};
use crate::reference::nmse;
use strata_gpu_shared::launch::gdn::{gdn_conv_ring, GATE_THREADS, GDN_CONV_THREADS, GDN_MAX_CONV, GDN_MAX_D, GDN_STATE_SLOTS, GDN_WARPS};
use strata_gpu_shared::launch::norm::{NORM_MAX_N, NORM_WARPS};
use strata_gpu_shared::launch::spec::SPEC_MAX_TOKENS;
use strata_gpu_shared::replica;
use strata_gpu_shared::replica::gdn::RecurShape;

const CONV: &str = "gdn_conv";
const RECUR: &str = "gdn_recur";
const NORM_GATED: &str = "rms_norm_gated";
const SIGMOID_MUL: &str = "sigmoid_mul";
const SWIGLU: &str = "swiglu_f32";
const ADD_GATED: &str = "add_gated";
const CONCAT: &str = "concat_rows";
/// Grid blocks one launch may take.
const MAX_BLOCKS: usize = i32::MAX as usize;
/// The most elements a buffer of one launch may hold (indices stay 32-bit).
const MAX_ELEMS: usize = u32::MAX as usize;

/// The family's kernels on host slices.
pub trait GdnOps {
    fn name(&self) -> &'static str;

    /// `gdn_conv` of a window of `x.len() / channels` tokens (`1..=SPEC_MAX_TOKENS`) at
    /// positions `pos ..`: each token's input written into the ring (`gdn_conv_ring(d_conv)` rows
    /// of `channels`, position `p` in row `p % rows`), then `out` = silu of the causal conv over
    /// the last `d_conv` positions (`w`: `channels x d_conv`, taps of a channel contiguous).
    #[allow(clippy::too_many_arguments)]
    fn gdn_conv(&self, x: &[f32], w: &[f32], ring: &mut [f32], out: &mut [f32], pos: u32, channels: usize, d_conv: usize) -> Result<()>;

    /// `gdn_recur` of a window of `shape.tokens` tokens at positions `pos ..`: the state read
    /// from the slot of `pos - 1` (zeros at `pos == 0`), each token's state written to its
    /// position's slot of `state` ([`RecurShape::state_len`]), `out` `tokens x n_v x d`.
    #[allow(clippy::too_many_arguments)]
    fn gdn_recur(
        &self,
        conv: &[f32],
        alpha: &[f32],
        beta: &[f32],
        dt_bias: &[f32],
        a: &[f32],
        state: &mut [f32],
        out: &mut [f32],
        pos: u32,
        shape: RecurShape,
        eps: f32,
        scale: f32,
    ) -> Result<()>;

    /// Gated RMSNorm of each row of `n` values of `x` (`n` a multiple of 32 up to `NORM_MAX_N`):
    /// `((x * scale) * w) * silu(z)`, `z` as long as `x`.
    fn rms_norm_gated(&self, x: &[f32], w: &[f32], z: &[f32], n: usize, eps: f32, out: &mut [f32]) -> Result<()>;

    /// `out[i] = a[i] * sigmoid(g[i])`.
    fn sigmoid_mul(&self, a: &[f32], g: &[f32], out: &mut [f32]) -> Result<()>;

    /// `out[i] = silu(g[i]) * u[i]` (`swiglu_f32`).
    fn swiglu(&self, g: &[f32], u: &[f32], out: &mut [f32]) -> Result<()>;

    /// `out = acc + sigmoid(s[r]) * y` for each row `r` of `n` values (`s` one logit per row).
    fn add_gated(&self, acc: &[f32], y: &[f32], s: &[f32], n: usize, out: &mut [f32]) -> Result<()>;

    /// `concat_rows`: row `r` of `out` (`n_a + n_b` values) is row `r` of `a` (`n_a` values)
    /// then row `r` of `b` (`n_b` values), copied; `n_a, n_b >= 1`, `a.len() / n_a` rows.
    fn concat_rows(&self, a: &[f32], b: &[f32], n_a: usize, n_b: usize, out: &mut [f32]) -> Result<()>;
}

/// A window of `tokens` tokens is one the position-indexed state is sized for.
fn check_window(kernel: &'static str, tokens: usize) -> Result<()> {
    if !(1..=SPEC_MAX_TOKENS).contains(&tokens) {
        return Err(shape_err(kernel, format!("a window of {tokens} tokens, 1..={SPEC_MAX_TOKENS} supported")));
    }
    Ok(())
}

/// The host-slice window at `pos` ends at a position a `u32` holds.
fn check_positions(kernel: &'static str, pos: u32, tokens: usize) -> Result<()> {
    if (pos as u64) + (tokens as u64) - 1 > u32::MAX as u64 {
        return Err(shape_err(kernel, format!("a window of {tokens} tokens at position {pos} passes position {}", u32::MAX)));
    }
    Ok(())
}

/// Checks a `gdn_conv` shape; returns the ring's length in values.
fn check_conv(tokens: usize, channels: usize, d_conv: usize) -> Result<usize> {
    check_window(CONV, tokens)?;
    if !(1..=GDN_MAX_CONV).contains(&d_conv) {
        return Err(shape_err(CONV, format!("{d_conv} conv taps, 1..={GDN_MAX_CONV} supported")));
    }
    let ring = gdn_conv_ring(d_conv).checked_mul(channels).filter(|&r| r <= MAX_ELEMS);
    match ring {
        Some(r) if channels > 0 && channels.div_ceil(GDN_CONV_THREADS as usize) <= MAX_BLOCKS => Ok(r),
        _ => Err(shape_err(CONV, format!("{channels} channels (a ring of {} rows) do not fit one launch", gdn_conv_ring(d_conv)))),
    }
}

/// Checks a `gdn_recur` shape: a supported window, whole key-head groups, `d` a multiple of 32
/// up to `GDN_MAX_D`, every buffer's length a 32-bit count and the grid one launch.
fn check_recur(s: RecurShape) -> Result<()> {
    check_window(RECUR, s.tokens)?;
    if s.d == 0 || !s.d.is_multiple_of(32) || s.d > GDN_MAX_D {
        return Err(shape_err(RECUR, format!("head size {} is not a multiple of 32 in 32..={GDN_MAX_D}", s.d)));
    }
    if s.n_k == 0 || s.n_v == 0 || !s.n_v.is_multiple_of(s.n_k) {
        return Err(shape_err(RECUR, format!("{} value heads are not whole groups of {} key heads", s.n_v, s.n_k)));
    }
    let state = s.n_v.checked_mul(s.d * s.d).and_then(|v| v.checked_mul(GDN_STATE_SLOTS));
    let conv = s.n_k.checked_mul(2).and_then(|k| k.checked_add(s.n_v)).and_then(|h| h.checked_mul(s.d * s.tokens));
    let fits = |v: Option<usize>| v.is_some_and(|v| v <= MAX_ELEMS);
    if !fits(state) || !fits(conv) || (s.n_v * s.d).div_ceil(GDN_WARPS as usize) > MAX_BLOCKS {
        return Err(shape_err(RECUR, format!("{} key and {} value heads of {} do not fit one launch", s.n_k, s.n_v, s.d)));
    }
    Ok(())
}

/// Checks an `rms_norm_gated` shape.
fn check_norm_gated(rows: usize, n: usize) -> Result<()> {
    if n == 0 || !n.is_multiple_of(32) || n > NORM_MAX_N {
        return Err(shape_err(NORM_GATED, format!("row length {n} is not a multiple of 32 in 32..={NORM_MAX_N}")));
    }
    if rows.checked_mul(n).is_none_or(|v| v > MAX_ELEMS) || rows.div_ceil(NORM_WARPS as usize) > MAX_BLOCKS {
        return Err(shape_err(NORM_GATED, format!("{rows} rows of {n} exceed one launch")));
    }
    Ok(())
}

/// Checks an element-wise launch of `n` values (one thread each).
fn check_elems(kernel: &'static str, n: usize) -> Result<()> {
    if n > MAX_ELEMS {
        return Err(shape_err(kernel, format!("{n} values exceed one launch")));
    }
    Ok(())
}

/// Checks an `add_gated` shape: rows of `n >= 1` values, `rows * n` one launch.
fn check_add_gated(rows: usize, n: usize) -> Result<()> {
    if n == 0 {
        return Err(shape_err(ADD_GATED, "rows of 0 values".into()));
    }
    if rows.checked_mul(n).is_none_or(|v| v > MAX_ELEMS) {
        return Err(shape_err(ADD_GATED, format!("{rows} rows of {n} exceed one launch")));
    }
    Ok(())
}

/// Checks a `concat_rows` shape: rows of `n_a >= 1` and `n_b >= 1` values, `rows * (n_a +
/// n_b)` one launch (which also keeps both inputs' lengths 32-bit).
fn check_concat(rows: usize, n_a: usize, n_b: usize) -> Result<()> {
    if n_a == 0 || n_b == 0 {
        return Err(shape_err(CONCAT, format!("rows of {n_a} and {n_b} values, 1 or more each needed")));
    }
    if n_a.checked_add(n_b).and_then(|n| n.checked_mul(rows)).is_none_or(|v| v > MAX_ELEMS) {
        return Err(shape_err(CONCAT, format!("{rows} rows of {n_a} + {n_b} exceed one launch")));
    }
    Ok(())
}

/// The host-slice `gdn_conv` call's sizes, exact; returns the window's tokens.
fn conv_slices(x: &[f32], w: &[f32], ring: &[f32], out: &[f32], pos: u32, channels: usize, d_conv: usize) -> Result<usize> {
    if channels == 0 || !x.len().is_multiple_of(channels) {
        return Err(shape_err(CONV, format!("{} inputs are not whole rows of {channels} channels", x.len())));
    }
    let tokens = x.len() / channels;
    let ring_len = check_conv(tokens, channels, d_conv)?;
    check_positions(CONV, pos, tokens)?;
    exact_len(CONV, "taps", w.len(), channels * d_conv)?;
    exact_len(CONV, "ring", ring.len(), ring_len)?;
    exact_len(CONV, "output", out.len(), x.len())?;
    Ok(tokens)
}

/// The host-slice `gdn_recur` call's sizes, exact.
#[allow(clippy::too_many_arguments)]
fn recur_slices(conv: &[f32], alpha: &[f32], beta: &[f32], dt_bias: &[f32], a: &[f32], state: &[f32], out: &[f32], pos: u32, s: RecurShape) -> Result<()> {
    check_recur(s)?;
    check_positions(RECUR, pos, s.tokens)?;
    exact_len(RECUR, "conv", conv.len(), s.tokens * s.conv_row())?;
    exact_len(RECUR, "alpha", alpha.len(), s.tokens * s.n_v)?;
    exact_len(RECUR, "beta", beta.len(), s.tokens * s.n_v)?;
    exact_len(RECUR, "dt_bias", dt_bias.len(), s.n_v)?;
    exact_len(RECUR, "a", a.len(), s.n_v)?;
    exact_len(RECUR, "state", state.len(), s.state_len())?;
    exact_len(RECUR, "output", out.len(), s.tokens * s.n_v * s.d)
}

/// The host-slice `rms_norm_gated` call's sizes, exact; returns the number of rows.
fn norm_gated_slices(x: &[f32], w: &[f32], z: &[f32], n: usize, out: &[f32]) -> Result<usize> {
    if n == 0 || !x.len().is_multiple_of(n) {
        return Err(shape_err(NORM_GATED, format!("{} values are not whole rows of {n}", x.len())));
    }
    check_norm_gated(x.len() / n, n)?;
    exact_len(NORM_GATED, "weights", w.len(), n)?;
    exact_len(NORM_GATED, "gate", z.len(), x.len())?;
    exact_len(NORM_GATED, "output", out.len(), x.len())?;
    Ok(x.len() / n)
}

/// The host-slice sizes of an element-wise kernel of two inputs (the second named `b_name`),
/// exact.
fn elem_slices(kernel: &'static str, b_name: &str, a: &[f32], b: &[f32], out: &[f32]) -> Result<()> {
    check_elems(kernel, a.len())?;
    exact_len(kernel, b_name, b.len(), a.len())?;
    exact_len(kernel, "output", out.len(), a.len())
}

/// The host-slice `concat_rows` call's sizes, exact; returns the number of rows.
fn concat_slices(a: &[f32], b: &[f32], n_a: usize, n_b: usize, out: &[f32]) -> Result<usize> {
    if n_a == 0 || !a.len().is_multiple_of(n_a) {
        return Err(shape_err(CONCAT, format!("{} values of a are not whole rows of {n_a}", a.len())));
    }
    let rows = a.len() / n_a;
    check_concat(rows, n_a, n_b)?;
    exact_len(CONCAT, "b", b.len(), rows * n_b)?;
    exact_len(CONCAT, "output", out.len(), rows * (n_a + n_b))?;
    Ok(rows)
}

/// The host-slice `add_gated` call's sizes, exact; returns the number of rows.
fn add_gated_slices(acc: &[f32], y: &[f32], s: &[f32], n: usize, out: &[f32]) -> Result<usize> {
    if n == 0 || !acc.len().is_multiple_of(n) {
        return Err(shape_err(ADD_GATED, format!("{} values are not whole rows of {n}", acc.len())));
    }
    let rows = acc.len() / n;
    check_add_gated(rows, n)?;
    exact_len(ADD_GATED, "y", y.len(), acc.len())?;
    exact_len(ADD_GATED, "gate logits", s.len(), rows)?;
    exact_len(ADD_GATED, "output", out.len(), acc.len())?;
    Ok(rows)
}

impl GdnOps for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    /// The replica as is: the conv is a few multiply-adds per channel and token, less than the
    /// gathering a split over channels would take (the ring is channel-interleaved).
    fn gdn_conv(&self, x: &[f32], w: &[f32], ring: &mut [f32], out: &mut [f32], pos: u32, channels: usize, d_conv: usize) -> Result<()> {
        conv_slices(x, w, ring, out, pos, channels, d_conv)?;
        replica::gdn::gdn_conv(x, w, ring, out, pos, channels, d_conv);
        Ok(())
    }

    /// Split over value heads, which share nothing: each thread runs the replica on one head at
    /// a time as a problem of one key and one value head (its q, k and v rows, gates and state
    /// slots gathered), then the heads' outputs and written slots are put back in place.
    fn gdn_recur(
        &self,
        conv: &[f32],
        alpha: &[f32],
        beta: &[f32],
        dt_bias: &[f32],
        a: &[f32],
        state: &mut [f32],
        out: &mut [f32],
        pos: u32,
        shape: RecurShape,
        eps: f32,
        scale: f32,
    ) -> Result<()> {
        recur_slices(conv, alpha, beta, dt_bias, a, state, out, pos, shape)?;
        let RecurShape { tokens, n_k, n_v, d } = shape;
        let (dd, row) = (d * d, shape.conv_row());
        // Per head: its output rows (`tokens x d`), then its state (`GDN_STATE_SLOTS` slots of
        // `d x d`), which is the layout of a one-head problem.
        let unit = tokens * d + GDN_STATE_SLOTS * dd;
        let slot = |p: usize| p % GDN_STATE_SLOTS;
        let read = (pos as usize).checked_sub(1).map(slot);
        let mut heads = vec![0f32; n_v * unit];
        let before: &[f32] = state;
        self.par_chunks(&mut heads, unit, |first, chunk| {
            let one = RecurShape { tokens, n_k: 1, n_v: 1, d };
            let mut rows = vec![0f32; tokens * one.conv_row()];
            for (i, hu) in chunk.chunks_exact_mut(unit).enumerate() {
                let h = first + i;
                let kh = replica::gdn::key_head(h, n_k);
                for (t, r) in rows.chunks_exact_mut(3 * d).enumerate() {
                    let src = &conv[t * row..(t + 1) * row];
                    r[..d].copy_from_slice(&src[kh * d..(kh + 1) * d]);
                    r[d..2 * d].copy_from_slice(&src[(n_k + kh) * d..(n_k + kh + 1) * d]);
                    r[2 * d..].copy_from_slice(&src[(2 * n_k + h) * d..(2 * n_k + h + 1) * d]);
                }
                let (al, be): (Vec<f32>, Vec<f32>) = (0..tokens).map(|t| (alpha[t * n_v + h], beta[t * n_v + h])).unzip();
                let (o, st) = hu.split_at_mut(tokens * d);
                if let Some(s) = read {
                    st[s * dd..(s + 1) * dd].copy_from_slice(&before[(s * n_v + h) * dd..(s * n_v + h + 1) * dd]);
                }
                replica::gdn::gdn_recur(&rows, &al, &be, &dt_bias[h..h + 1], &a[h..h + 1], st, o, pos, one, eps, scale);
            }
        });
        for (h, hu) in heads.chunks_exact(unit).enumerate() {
            let (o, st) = hu.split_at(tokens * d);
            for t in 0..tokens {
                out[(t * n_v + h) * d..(t * n_v + h + 1) * d].copy_from_slice(&o[t * d..(t + 1) * d]);
                let s = slot(pos as usize + t);
                state[(s * n_v + h) * dd..(s * n_v + h + 1) * dd].copy_from_slice(&st[s * dd..(s + 1) * dd]);
            }
        }
        Ok(())
    }

    fn rms_norm_gated(&self, x: &[f32], w: &[f32], z: &[f32], n: usize, eps: f32, out: &mut [f32]) -> Result<()> {
        norm_gated_slices(x, w, z, n, out)?;
        self.par_chunks(out, n, |first, chunk| {
            for (i, o) in chunk.chunks_exact_mut(n).enumerate() {
                let r = (first + i) * n..(first + i + 1) * n;
                replica::gate::rms_norm_gated_row(&x[r.clone()], w, &z[r], eps, o);
            }
        });
        Ok(())
    }

    fn sigmoid_mul(&self, a: &[f32], g: &[f32], out: &mut [f32]) -> Result<()> {
        elem_slices(SIGMOID_MUL, "gate", a, g, out)?;
        self.par_chunks(out, 1, |first, chunk| replica::gate::sigmoid_mul(&a[first..], &g[first..], chunk));
        Ok(())
    }

    fn swiglu(&self, g: &[f32], u: &[f32], out: &mut [f32]) -> Result<()> {
        elem_slices(SWIGLU, "up", g, u, out)?;
        self.par_chunks(out, 1, |first, chunk| replica::gate::swiglu_rows(&g[first..], &u[first..], chunk));
        Ok(())
    }

    fn add_gated(&self, acc: &[f32], y: &[f32], s: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        add_gated_slices(acc, y, s, n, out)?;
        out.copy_from_slice(acc);
        self.par_chunks(out, n, |first, chunk| replica::gate::add_gated(chunk, &y[first * n..], &s[first..], n));
        Ok(())
    }

    fn concat_rows(&self, a: &[f32], b: &[f32], n_a: usize, n_b: usize, out: &mut [f32]) -> Result<()> {
        concat_slices(a, b, n_a, n_b, out)?;
        self.par_chunks(out, n_a + n_b, |first, chunk| replica::gate::concat_rows(&a[first * n_a..], &b[first * n_b..], n_a, n_b, chunk));
        Ok(())
    }
}

impl GpuBackend {
    /// Queues `gdn_conv` for a window of `tokens` tokens at the position `pos[0]` holds when the
    /// kernel runs (see [`GdnOps::gdn_conv`]): `x` and `out` `tokens` rows of `channels`, `w`
    /// `channels x d_conv` taps, `ring` the layer's `gdn_conv_ring(d_conv)` rows of `channels`.
    /// One thread per channel, `ceil(channels / GDN_CONV_THREADS)` blocks. Buffers may be longer
    /// than needed.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_conv_queue(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        ring: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        pos: &CudaSlice<u32>,
        tokens: usize,
        channels: usize,
        d_conv: usize,
    ) -> Result<()> {
        let ring_len = check_conv(tokens, channels, d_conv)?;
        holds(CONV, "input", x.len(), tokens * channels)?;
        holds(CONV, "taps", w.len(), channels * d_conv)?;
        holds(CONV, "ring", ring.len(), ring_len)?;
        holds(CONV, "output", out.len(), tokens * channels)?;
        holds(CONV, "pos", pos.len(), 1)?;
        let (t, c, k) = (tokens as u32, channels as u32, d_conv as u32);
        let mut args = self.builder(CONV);
        args.arg(x).arg(w).arg(ring).arg(out).arg(pos).arg(&t).arg(&c).arg(&k);
        // SAFETY: the kernel's parameters in order over the buffers checked above (the ring holds
        // its `gdn_conv_ring(d_conv)` rows, so every `p % rows` row is inside it); `ring` and
        // `out` are distinct allocations from each other and from the inputs (Rust's borrows);
        // threads past the last channel return at once, so a padded grid is covered.
        unsafe { self.launch_async(CONV, self.padded_grid(CONV, c.div_ceil(GDN_CONV_THREADS)), args) }
    }

    /// Queues `gdn_recur` for a window of `shape.tokens` tokens at the position `pos[0]` holds
    /// when the kernel runs (see [`GdnOps::gdn_recur`]): `conv` `tokens` rows of
    /// `shape.conv_row()`, `alpha` and `beta` `tokens x n_v`, `dt_bias` and `a` `n_v`, `state`
    /// [`RecurShape::state_len`], `out` `tokens x n_v x d`. One warp per state column,
    /// `ceil(n_v * d / GDN_WARPS)` blocks. Buffers may be longer than needed.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_recur_queue(
        &self,
        conv: &CudaSlice<f32>,
        alpha: &CudaSlice<f32>,
        beta: &CudaSlice<f32>,
        dt_bias: &CudaSlice<f32>,
        a: &CudaSlice<f32>,
        state: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        pos: &CudaSlice<u32>,
        shape: RecurShape,
        eps: f32,
        scale: f32,
    ) -> Result<()> {
        check_recur(shape)?;
        let s = shape;
        holds(RECUR, "conv", conv.len(), s.tokens * s.conv_row())?;
        holds(RECUR, "alpha", alpha.len(), s.tokens * s.n_v)?;
        holds(RECUR, "beta", beta.len(), s.tokens * s.n_v)?;
        holds(RECUR, "dt_bias", dt_bias.len(), s.n_v)?;
        holds(RECUR, "a", a.len(), s.n_v)?;
        holds(RECUR, "state", state.len(), s.state_len())?;
        holds(RECUR, "output", out.len(), s.tokens * s.n_v * s.d)?;
        holds(RECUR, "pos", pos.len(), 1)?;
        let (tokens, n_k, n_v, d) = (s.tokens as u32, s.n_k as u32, s.n_v as u32, s.d as u32);
        let mut args = self.builder(RECUR);
        args.arg(conv).arg(alpha).arg(beta).arg(dt_bias).arg(a).arg(state).arg(out).arg(pos);
        args.arg(&tokens).arg(&n_k).arg(&n_v).arg(&d).arg(&eps).arg(&scale);
        // SAFETY: the kernel's parameters in order over the buffers checked above (the state
        // holds all `GDN_STATE_SLOTS` slots, so every `p % GDN_STATE_SLOTS` slot is inside it);
        // `state` and `out` are distinct allocations from each other and from the inputs;
        // warps past the last (head, column) return at once, so a padded grid is covered.
        unsafe { self.launch_async(RECUR, self.padded_grid(RECUR, (n_v * d).div_ceil(GDN_WARPS)), args) }
    }

    /// Queues `rms_norm_gated` of `rows` rows of `n` values of `x`, times `w`, times `silu(z)`
    /// into `out` (a different buffer, which Rust's borrows guarantee). One warp per row.
    /// Buffers may be longer than needed.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_gated_queue(&self, x: &CudaSlice<f32>, w: &CudaSlice<f32>, z: &CudaSlice<f32>, out: &mut CudaSlice<f32>, rows: usize, n: usize, eps: f32) -> Result<()> {
        check_norm_gated(rows, n)?;
        holds(NORM_GATED, "input", x.len(), rows * n)?;
        holds(NORM_GATED, "weights", w.len(), n)?;
        holds(NORM_GATED, "gate", z.len(), rows * n)?;
        holds(NORM_GATED, "output", out.len(), rows * n)?;
        if rows == 0 {
            return Ok(());
        }
        let (rows, n) = (rows as u32, n as u32);
        let mut args = self.builder(NORM_GATED);
        args.arg(x).arg(w).arg(z).arg(out).arg(&rows).arg(&n).arg(&eps);
        // SAFETY: the kernel's parameters in order, buffers checked against the shape, `out` a
        // distinct allocation from the inputs; warps past the last row return at once.
        unsafe { self.launch_async(NORM_GATED, self.padded_grid(NORM_GATED, rows.div_ceil(NORM_WARPS)), args) }
    }

    /// Queues `acc[i] = acc[i] * sigmoid(g[i])` for `i < n` (`sigmoid_mul` with `a = out =
    /// acc`). One thread per value. Buffers may be longer than needed.
    pub fn sigmoid_mul_queue(&self, acc: &mut CudaSlice<f32>, g: &CudaSlice<f32>, n: usize) -> Result<()> {
        check_elems(SIGMOID_MUL, n)?;
        holds(SIGMOID_MUL, "accumulator", acc.len(), n)?;
        holds(SIGMOID_MUL, "gate", g.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        // The builder cannot hold `&acc` and `&mut acc` at once, so `a` goes in as the address.
        let a_ptr = acc.device_ptr(self.stream()).0;
        let n = n as u32;
        let mut args = self.builder(SIGMOID_MUL);
        args.arg(&a_ptr).arg(g).arg(acc).arg(&n);
        // SAFETY: the kernel's parameters in order, `acc` and `g` checked to hold `n` values.
        // Passing `acc` as both `a` and `out` is `sigmoid_mul`'s in-place contract (`out` may be
        // `a`): thread `i` alone reads `a[i]` and then writes `out[i]`. `g` is a different
        // allocation from `acc` (Rust's borrows), unwritten during the launch. Blocks past `n`
        // return at once.
        unsafe { self.launch_async(SIGMOID_MUL, self.padded_grid(SIGMOID_MUL, n.div_ceil(GATE_THREADS)), args) }
    }

    /// Queues `out[i] = silu(g[i]) * u[i]` for `i < n` (`swiglu_f32`). One thread per value.
    /// Buffers may be longer than needed.
    pub fn swiglu_queue(&self, g: &CudaSlice<f32>, u: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: usize) -> Result<()> {
        check_elems(SWIGLU, n)?;
        holds(SWIGLU, "gate", g.len(), n)?;
        holds(SWIGLU, "up", u.len(), n)?;
        holds(SWIGLU, "output", out.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let n = n as u32;
        let mut args = self.builder(SWIGLU);
        args.arg(g).arg(u).arg(out).arg(&n);
        // SAFETY: the kernel's parameters in order, buffers checked to hold `n` values, `out` a
        // distinct allocation from the inputs; blocks past `n` return at once.
        unsafe { self.launch_async(SWIGLU, self.padded_grid(SWIGLU, n.div_ceil(GATE_THREADS)), args) }
    }

    /// Queues `acc[r * n + i] += sigmoid(s[r]) * y[r * n + i]` for `rows` rows of `n` values
    /// (`add_gated`, in place). One thread per value of the `rows * n`, rows one after another:
    /// `ceil(rows * n / GATE_THREADS)` blocks. Buffers may be longer than needed.
    pub fn add_gated_queue(&self, acc: &mut CudaSlice<f32>, y: &CudaSlice<f32>, s: &CudaSlice<f32>, rows: usize, n: usize) -> Result<()> {
        check_add_gated(rows, n)?;
        holds(ADD_GATED, "accumulator", acc.len(), rows * n)?;
        holds(ADD_GATED, "y", y.len(), rows * n)?;
        holds(ADD_GATED, "gate logits", s.len(), rows)?;
        if rows == 0 {
            return Ok(());
        }
        let (values, rows, n) = ((rows * n) as u32, rows as u32, n as u32);
        let mut args = self.builder(ADD_GATED);
        args.arg(acc).arg(y).arg(s).arg(&rows).arg(&n);
        // SAFETY: the kernel's parameters in order, buffers checked against the shape; `acc` is
        // the only buffer written, each value by its own thread, and `y` and `s` are different
        // allocations (Rust's borrows); blocks past the last value return at once.
        unsafe { self.launch_async(ADD_GATED, self.padded_grid(ADD_GATED, values.div_ceil(GATE_THREADS)), args) }
    }

    /// Queues `concat_rows` of `rows` rows: row `r` of `out` (`n_a + n_b` values) is row `r` of
    /// `a` (`n_a` values) then row `r` of `b` (`n_b` values). One thread per value of `out`,
    /// `ceil(rows * (n_a + n_b) / GATE_THREADS)` blocks. Buffers may be longer than needed.
    pub fn concat_rows_queue(&self, a: &CudaSlice<f32>, b: &CudaSlice<f32>, out: &mut CudaSlice<f32>, rows: usize, n_a: usize, n_b: usize) -> Result<()> {
        check_concat(rows, n_a, n_b)?;
        holds(CONCAT, "a", a.len(), rows * n_a)?;
        holds(CONCAT, "b", b.len(), rows * n_b)?;
        holds(CONCAT, "output", out.len(), rows * (n_a + n_b))?;
        if rows == 0 {
            return Ok(());
        }
        let (values, rows, n_a, n_b) = ((rows * (n_a + n_b)) as u32, rows as u32, n_a as u32, n_b as u32);
        let mut args = self.builder(CONCAT);
        args.arg(a).arg(b).arg(out).arg(&rows).arg(&n_a).arg(&n_b);
        // SAFETY: the kernel's parameters in order, buffers checked against the shape (`rows *
        // (n_a + n_b)` fits 32 bits, so the casts are exact), `out` a distinct allocation from
        // the inputs (Rust's borrows); threads past the last value return at once.
        unsafe { self.launch_async(CONCAT, self.padded_grid(CONCAT, values.div_ceil(GATE_THREADS)), args) }
    }
}

impl GdnOps for GpuBackend {
    fn name(&self) -> &'static str {
        self.name_static()
    }

    /// The ring uploaded with guard elements and downloaded after, like the output.
    fn gdn_conv(&self, x: &[f32], w: &[f32], ring: &mut [f32], out: &mut [f32], pos: u32, channels: usize, d_conv: usize) -> Result<()> {
        let tokens = conv_slices(x, w, ring, out, pos, channels, d_conv)?;
        let (dx, dw, dpos) = (self.upload(CONV, x)?, self.upload(CONV, w)?, self.upload(CONV, &[pos])?);
        let (mut dring, mut dout) = (self.upload_out(CONV, ring)?, self.upload_out(CONV, out)?);
        self.gdn_conv_queue(&dx, &dw, &mut dring, &mut dout, &dpos, tokens, channels, d_conv)?;
        self.synchronize(CONV)?;
        self.download_out(CONV, &dout, out)?;
        self.download_out(CONV, &dring, ring)
    }

    /// The state uploaded with guard elements and downloaded after, like the output.
    fn gdn_recur(
        &self,
        conv: &[f32],
        alpha: &[f32],
        beta: &[f32],
        dt_bias: &[f32],
        a: &[f32],
        state: &mut [f32],
        out: &mut [f32],
        pos: u32,
        shape: RecurShape,
        eps: f32,
        scale: f32,
    ) -> Result<()> {
        recur_slices(conv, alpha, beta, dt_bias, a, state, out, pos, shape)?;
        let up = |v: &[f32]| self.upload(RECUR, v);
        let (dconv, dalpha, dbeta, ddt, da) = (up(conv)?, up(alpha)?, up(beta)?, up(dt_bias)?, up(a)?);
        let dpos = self.upload(RECUR, &[pos])?;
        let (mut dstate, mut dout) = (self.upload_out(RECUR, state)?, self.upload_out(RECUR, out)?);
        self.gdn_recur_queue(&dconv, &dalpha, &dbeta, &ddt, &da, &mut dstate, &mut dout, &dpos, shape, eps, scale)?;
        self.synchronize(RECUR)?;
        self.download_out(RECUR, &dout, out)?;
        self.download_out(RECUR, &dstate, state)
    }

    fn rms_norm_gated(&self, x: &[f32], w: &[f32], z: &[f32], n: usize, eps: f32, out: &mut [f32]) -> Result<()> {
        let rows = norm_gated_slices(x, w, z, n, out)?;
        if rows == 0 {
            return Ok(());
        }
        let (dx, dw, dz) = (self.upload(NORM_GATED, x)?, self.upload(NORM_GATED, w)?, self.upload(NORM_GATED, z)?);
        let mut dout = self.upload_out(NORM_GATED, out)?;
        self.rms_norm_gated_queue(&dx, &dw, &dz, &mut dout, rows, n, eps)?;
        self.synchronize(NORM_GATED)?;
        self.download_out(NORM_GATED, &dout, out)
    }

    /// Runs the step's in-place path: `a` uploaded as the accumulator (with guard elements),
    /// gated by `g`, the result downloaded into `out`.
    fn sigmoid_mul(&self, a: &[f32], g: &[f32], out: &mut [f32]) -> Result<()> {
        elem_slices(SIGMOID_MUL, "gate", a, g, out)?;
        if a.is_empty() {
            return Ok(());
        }
        let mut acc = self.upload_out(SIGMOID_MUL, a)?;
        let dg = self.upload(SIGMOID_MUL, g)?;
        self.sigmoid_mul_queue(&mut acc, &dg, a.len())?;
        self.synchronize(SIGMOID_MUL)?;
        self.download_out(SIGMOID_MUL, &acc, out)
    }

    fn swiglu(&self, g: &[f32], u: &[f32], out: &mut [f32]) -> Result<()> {
        elem_slices(SWIGLU, "up", g, u, out)?;
        if g.is_empty() {
            return Ok(());
        }
        let (dg, du) = (self.upload(SWIGLU, g)?, self.upload(SWIGLU, u)?);
        let mut dout = self.upload_out(SWIGLU, out)?;
        self.swiglu_queue(&dg, &du, &mut dout, g.len())?;
        self.synchronize(SWIGLU)?;
        self.download_out(SWIGLU, &dout, out)
    }

    /// Runs the step's in-place path: `acc` uploaded as the accumulator (with guard elements),
    /// the gated `y` added into it, the result downloaded into `out`.
    fn add_gated(&self, acc: &[f32], y: &[f32], s: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let rows = add_gated_slices(acc, y, s, n, out)?;
        if rows == 0 {
            return Ok(());
        }
        let mut dacc = self.upload_out(ADD_GATED, acc)?;
        let (dy, ds) = (self.upload(ADD_GATED, y)?, self.upload(ADD_GATED, s)?);
        self.add_gated_queue(&mut dacc, &dy, &ds, rows, n)?;
        self.synchronize(ADD_GATED)?;
        self.download_out(ADD_GATED, &dacc, out)
    }

    fn concat_rows(&self, a: &[f32], b: &[f32], n_a: usize, n_b: usize, out: &mut [f32]) -> Result<()> {
        let rows = concat_slices(a, b, n_a, n_b, out)?;
        if rows == 0 {
            return Ok(());
        }
        let (da, db) = (self.upload(CONCAT, a)?, self.upload(CONCAT, b)?);
        let mut dout = self.upload_out(CONCAT, out)?;
        self.concat_rows_queue(&da, &db, &mut dout, rows, n_a, n_b)?;
        self.synchronize(CONCAT)?;
        self.download_out(CONCAT, &dout, out)
    }
}

/// The cuda backend's launches run by the simulator.
#[cfg(feature = "sim")]
impl GdnOps for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn gdn_conv(&self, x: &[f32], w: &[f32], ring: &mut [f32], out: &mut [f32], pos: u32, channels: usize, d_conv: usize) -> Result<()> {
        let tokens = conv_slices(x, w, ring, out, pos, channels, d_conv)?;
        let (p, c) = ([pos], channels as u32);
        let mut a = SimArgs::new();
        a.input(x).input(w).output(ring).output(out).input(&p).u32(tokens as u32).u32(c).u32(d_conv as u32);
        self.run(CONV, c.div_ceil(GDN_CONV_THREADS), None, &a)
    }

    fn gdn_recur(
        &self,
        conv: &[f32],
        alpha: &[f32],
        beta: &[f32],
        dt_bias: &[f32],
        a: &[f32],
        state: &mut [f32],
        out: &mut [f32],
        pos: u32,
        shape: RecurShape,
        eps: f32,
        scale: f32,
    ) -> Result<()> {
        recur_slices(conv, alpha, beta, dt_bias, a, state, out, pos, shape)?;
        let (s, p) = (shape, [pos]);
        let mut args = SimArgs::new();
        args.input(conv).input(alpha).input(beta).input(dt_bias).input(a).output(state).output(out).input(&p);
        args.u32(s.tokens as u32).u32(s.n_k as u32).u32(s.n_v as u32).u32(s.d as u32).f32(eps).f32(scale);
        self.run(RECUR, ((s.n_v * s.d) as u32).div_ceil(GDN_WARPS), None, &args)
    }

    fn rms_norm_gated(&self, x: &[f32], w: &[f32], z: &[f32], n: usize, eps: f32, out: &mut [f32]) -> Result<()> {
        let rows = norm_gated_slices(x, w, z, n, out)? as u32;
        if rows == 0 {
            return Ok(());
        }
        self.run(NORM_GATED, rows.div_ceil(NORM_WARPS), None, SimArgs::new().input(x).input(w).input(z).output(out).u32(rows).u32(n as u32).f32(eps))
    }

    /// The step's in-place path, as on the cuda backend: `a` copied into `out`, then `out`
    /// passed as both `a` and `out`.
    fn sigmoid_mul(&self, a: &[f32], g: &[f32], out: &mut [f32]) -> Result<()> {
        elem_slices(SIGMOID_MUL, "gate", a, g, out)?;
        if a.is_empty() {
            return Ok(());
        }
        out.copy_from_slice(a);
        let (acc, n) = (out.as_ptr() as usize, a.len() as u32);
        self.run(SIGMOID_MUL, n.div_ceil(GATE_THREADS), None, SimArgs::new().address(acc).input(g).output(out).u32(n))
    }

    fn swiglu(&self, g: &[f32], u: &[f32], out: &mut [f32]) -> Result<()> {
        elem_slices(SWIGLU, "up", g, u, out)?;
        if g.is_empty() {
            return Ok(());
        }
        let n = g.len() as u32;
        self.run(SWIGLU, n.div_ceil(GATE_THREADS), None, SimArgs::new().input(g).input(u).output(out).u32(n))
    }

    /// The step's in-place path: `acc` copied into `out`, the gated `y` added there.
    fn add_gated(&self, acc: &[f32], y: &[f32], s: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let rows = add_gated_slices(acc, y, s, n, out)?;
        if rows == 0 {
            return Ok(());
        }
        out.copy_from_slice(acc);
        let values = (rows * n) as u32;
        self.run(ADD_GATED, values.div_ceil(GATE_THREADS), None, SimArgs::new().output(out).input(y).input(s).u32(rows as u32).u32(n as u32))
    }

    fn concat_rows(&self, a: &[f32], b: &[f32], n_a: usize, n_b: usize, out: &mut [f32]) -> Result<()> {
        let rows = concat_slices(a, b, n_a, n_b, out)?;
        if rows == 0 {
            return Ok(());
        }
        let values = (rows * (n_a + n_b)) as u32;
        self.run(CONCAT, values.div_ceil(GATE_THREADS), None, SimArgs::new().input(a).input(b).output(out).u32(rows as u32).u32(n_a as u32).u32(n_b as u32))
    }
}


// ---------------------------------------------------------------------------------------------
// Float64 references: the math each kernel approximates, from the spec's formulas in float64
// (exact exp, log and sqrt; no lane order), for the NMSE bar.

fn sigmoid_f64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu_f64(x: f64) -> f64 {
    x * sigmoid_f64(x)
}

/// `ln(1 + e^x)` without the switch at 20 (which moves the result by under `e^-20` relative).
fn softplus_f64(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// Float64 `gdn_conv` of a window at `pos`: `out[t][c] = silu(sum_k w[c][k] * u(p - d_conv + 1 +
/// k))`, `u(q)` the window's own input for `q >= pos`, the `ring` (as it was before the call)
/// for earlier positions, 0 below position 0.
pub fn gdn_conv_f64(x: &[f32], w: &[f32], ring: &[f32], pos: u32, channels: usize, d_conv: usize) -> Vec<f64> {
    let rows = gdn_conv_ring(d_conv) as i64;
    let (pos, tokens) = (pos as i64, x.len() / channels);
    let input = |q: i64, c: usize| -> f64 {
        if q >= pos {
            x[(q - pos) as usize * channels + c] as f64
        } else if q < 0 {
            0.0
        } else {
            ring[(q % rows) as usize * channels + c] as f64
        }
    };
    let mut out = Vec::with_capacity(x.len());
    for t in 0..tokens as i64 {
        let p = pos + t;
        for c in 0..channels {
            let acc: f64 = (0..d_conv).map(|k| w[c * d_conv + k] as f64 * input(p - (d_conv as i64 - 1) + k as i64, c)).sum();
            out.push(silu_f64(acc));
        }
    }
    out
}

/// Float64 `gdn_recur` of a window at `pos` from `state` as it was before the call: returns the
/// outputs (`tokens x n_v x d`) and the state after each token (`tokens` blocks of `n_v` heads
/// of `d x d` in the slot layout, column `j` contiguous). Per token and value head: `q`, `k`
/// (key head `h % n_k`) divided by `max(|.|, eps)`; `S <- S * exp(softplus(alpha + dt_bias) * a)`;
/// `S[.][j] += k * (v[j] - S[.][j] . k) * sigmoid(beta)`; `out[j] = (S[.][j] . q) * scale`.
#[allow(clippy::too_many_arguments)]
pub fn gdn_recur_f64(
    conv: &[f32],
    alpha: &[f32],
    beta: &[f32],
    dt_bias: &[f32],
    a: &[f32],
    state: &[f32],
    pos: u32,
    shape: RecurShape,
    eps: f32,
    scale: f32,
) -> (Vec<f64>, Vec<f64>) {
    let RecurShape { tokens, n_k, n_v, d } = shape;
    let head = n_v * d * d;
    let mut s: Vec<f64> = match (pos as usize).checked_sub(1) {
        Some(prev) => {
            let at = prev % GDN_STATE_SLOTS * head;
            state[at..at + head].iter().map(|&v| v as f64).collect()
        }
        None => vec![0.0; head],
    };
    let unit = |v: &[f32]| -> Vec<f64> {
        let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        let r = 1.0 / norm.max(eps as f64);
        v.iter().map(|&x| x as f64 * r).collect()
    };
    let (mut out, mut states) = (Vec::with_capacity(tokens * n_v * d), Vec::with_capacity(tokens * head));
    for t in 0..tokens {
        let row = &conv[t * shape.conv_row()..(t + 1) * shape.conv_row()];
        for h in 0..n_v {
            let kh = h % n_k;
            let q = unit(&row[kh * d..(kh + 1) * d]);
            let k = unit(&row[(n_k + kh) * d..(n_k + kh + 1) * d]);
            let v = &row[(2 * n_k + h) * d..(2 * n_k + h + 1) * d];
            let b = sigmoid_f64(beta[t * n_v + h] as f64);
            let decay = (softplus_f64(alpha[t * n_v + h] as f64 + dt_bias[h] as f64) * a[h] as f64).exp();
            for j in 0..d {
                let col = &mut s[(h * d + j) * d..(h * d + j + 1) * d];
                col.iter_mut().for_each(|x| *x *= decay);
                let kv: f64 = col.iter().zip(&k).map(|(x, k)| x * k).sum();
                let delta = (v[j] as f64 - kv) * b;
                col.iter_mut().zip(&k).for_each(|(x, k)| *x += k * delta);
                out.push(col.iter().zip(&q).map(|(x, q)| x * q).sum::<f64>() * scale as f64);
            }
        }
        // `out` is token-major with heads in order, as pushed.
        states.extend_from_slice(&s);
    }
    (out, states)
}

/// Float64 gated RMSNorm over rows of `n`: `x / sqrt(mean(x^2) + eps) * w * silu(z)`.
pub fn rms_norm_gated_f64(x: &[f32], w: &[f32], z: &[f32], n: usize, eps: f32) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for (xr, zr) in x.chunks_exact(n).zip(z.chunks_exact(n)) {
        let mean = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
        let r = 1.0 / (mean + eps as f64).sqrt();
        out.extend(xr.iter().zip(w).zip(zr).map(|((&x, &w), &z)| x as f64 * r * w as f64 * silu_f64(z as f64)));
    }
    out
}

/// Float64 `a * sigmoid(g)`.
pub fn sigmoid_mul_f64(a: &[f32], g: &[f32]) -> Vec<f64> {
    a.iter().zip(g).map(|(&a, &g)| a as f64 * sigmoid_f64(g as f64)).collect()
}

/// Float64 `silu(g) * u`.
pub fn swiglu_f64(g: &[f32], u: &[f32]) -> Vec<f64> {
    g.iter().zip(u).map(|(&g, &u)| silu_f64(g as f64) * u as f64).collect()
}

/// Float64 `acc + sigmoid(s[r]) * y` over rows of `n`.
pub fn add_gated_f64(acc: &[f32], y: &[f32], s: &[f32], n: usize) -> Vec<f64> {
    acc.iter().zip(y).enumerate().map(|(i, (&a, &y))| a as f64 + sigmoid_f64(s[i / n] as f64) * y as f64).collect()
}

// ---------------------------------------------------------------------------------------------
// Parity cases.

type Outs = Vec<(String, Vec<u32>)>;
type Unwritten = Vec<(String, usize, usize)>;

fn poison(len: usize) -> Vec<f32> {
    vec![f32::from_bits(POISON_F32); len]
}

fn is_poison(v: &f32) -> bool {
    v.to_bits() == POISON_F32
}

fn words(v: &[f32]) -> impl Iterator<Item = u32> + '_ {
    v.iter().map(|v| v.to_bits())
}

/// Runs one case on every backend: `run` returns the words compared (outputs, then any state
/// the kernel updates in place) and, per word, whether it still holds poison it should have
/// replaced.
fn run_all(backends: &[&dyn GdnOps], run: impl Fn(&dyn GdnOps) -> Result<(Vec<u32>, Vec<bool>)>) -> Result<(Outs, Unwritten)> {
    let (mut outs, mut unwritten) = (Vec::new(), Vec::new());
    for &b in backends {
        let (w, left) = run(b)?;
        note_unwritten(&mut unwritten, b.name(), left.into_iter());
        outs.push((b.name().to_string(), w));
    }
    Ok((outs, unwritten))
}

fn outcome(kernel: &str, shape: String, seed: u64, outs: Outs, unwritten: Unwritten, nmse: Option<f64>, describe: impl Fn(usize, u32) -> String) -> Outcome {
    let mismatch = compare_bits(&outs, describe);
    Outcome { kernel: kernel.into(), shape, seed, backends: outs.into_iter().map(|o| o.0).collect(), mismatch, unwritten, nmse, nmse_max: NMSE_MAX }
}

/// The reference backend's words `range` as f32.
fn first_f32(outs: &Outs, range: std::ops::Range<usize>) -> Vec<f32> {
    outs[0].1[range].iter().map(|&w| f32::from_bits(w)).collect()
}

/// Uniform values in `(-mag, mag)`.
fn uniform(rng: &mut SmallRng, n: usize, mag: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0) * mag).collect()
}

/// Values at mixed scales: each one `U(-1, 1) * 10^U(lo, hi)`.
fn mixed(rng: &mut SmallRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powf(rng.random_range(lo..hi))).collect()
}

/// Gate logits: mostly `U(-8, 8)`, one in eight saturating (`|g|` 20 to 120, where
/// `exp_neg` underflows to 0 past 103).
fn logits(rng: &mut SmallRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            if rng.random_range(0..8) == 0 {
                sign * rng.random_range(20.0f32..120.0)
            } else {
                rng.random_range(-8.0f32..8.0)
            }
        })
        .collect()
}

/// A large position: up to a million, or past `2^31` (where a signed 32-bit position breaks).
fn large_pos(rng: &mut SmallRng) -> u32 {
    if rng.random_bool(0.5) {
        rng.random_range(1_000..1_000_000)
    } else {
        rng.random_range(1u32 << 31..u32::MAX - (1 << 16))
    }
}

/// `gdn_conv` of `tokens` tokens at `pos`: inputs at a scale per token (one row all zero, one
/// at 1e2, where silu is the identity or zero), taps of either sign, the ring filled with random
/// earlier positions (also the rows of positions below 0, which must read as zeros) and the
/// window's own rows poisoned (written before they are read). Compared: the output and the
/// whole ring; NMSE of the output against float64.
pub fn conv_case(backends: &[&dyn GdnOps], d_conv: usize, channels: usize, tokens: usize, pos: u32, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut x = Vec::with_capacity(tokens * channels);
    for t in 0..tokens {
        let scale = if t == 1 && tokens > 2 {
            0.0
        } else if rng.random_range(0..6) == 0 {
            100.0
        } else {
            10f32.powf(rng.random_range(-2.0..1.0))
        };
        x.extend(uniform(&mut rng, channels, scale));
    }
    let w = uniform(&mut rng, channels * d_conv, 1.0);
    let rows = gdn_conv_ring(d_conv);
    let earlier = uniform(&mut rng, rows * channels, 3.0);
    let mut ring = earlier.clone();
    for t in 0..tokens {
        let r = (pos as usize + t) % rows;
        ring[r * channels..(r + 1) * channels].fill(f32::from_bits(POISON_F32));
    }
    let n_out = tokens * channels;
    let (outs, unwritten) = run_all(backends, |b| {
        let (mut r, mut out) = (ring.clone(), poison(n_out));
        b.gdn_conv(&x, &w, &mut r, &mut out, pos, channels, d_conv)?;
        let left = out.iter().chain(&r).map(is_poison).collect();
        Ok((words(&out).chain(words(&r)).collect(), left))
    })?;
    let e = (n_out >= NMSE_MIN_VALUES).then(|| nmse(&first_f32(&outs, 0..n_out), &gdn_conv_f64(&x, &w, &earlier, pos, channels, d_conv)));
    let describe = |i: usize, v: u32| {
        let what = if i < n_out { format!("out token {} channel {}", i / channels, i % channels) } else { format!("ring row {} channel {}", (i - n_out) / channels, (i - n_out) % channels) };
        format!("{what}: {:e} ({v:#010x})", f32::from_bits(v))
    };
    Ok(outcome(CONV, format!("T{tokens} c{channels} k{d_conv} pos {pos}"), seed, outs, unwritten, e, describe))
}

/// One random `gdn_recur` problem: every input, and the state before the window.
#[derive(Clone, Debug)]
pub struct RecurCase {
    pub shape: RecurShape,
    pub pos: u32,
    pub eps: f32,
    pub scale: f32,
    pub conv: Vec<f32>,
    pub alpha: Vec<f32>,
    pub beta: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
    /// Random in every slot (the slot of `pos - 1` is the state the window starts from; the
    /// others must not be read), the window's slots poisoned.
    pub state: Vec<f32>,
}

impl RecurCase {
    /// Random inputs for `shape` at `pos`: q and k heads at a scale each from zero (the L2 norm
    /// of a zero row), below `eps` (the norm clamps), normal and 1e3; v heads at mixed scales;
    /// `alpha` mostly `U(-5, 5)` with some values near and past softplus's switch at 20 and
    /// some at -30; `beta` mostly `U(-6, 6)` with some at +-30; `a = -exp(U(-3, 2.5))`; the
    /// state at `U(-1, 1)`.
    pub fn random(rng: &mut SmallRng, shape: RecurShape, pos: u32) -> RecurCase {
        let RecurShape { tokens, n_k, n_v, d } = shape;
        let mut conv = Vec::with_capacity(tokens * shape.conv_row());
        for _ in 0..tokens {
            for _ in 0..2 * n_k {
                let scale = match rng.random_range(0..10) {
                    0 => 0.0,
                    1 => 1e-9,
                    2 => 1e3,
                    _ => 10f32.powf(rng.random_range(-1.0..1.0)),
                };
                conv.extend(uniform(rng, d, scale));
            }
            conv.extend(mixed(rng, n_v * d, -1.0, 0.5));
        }
        let alpha = (0..tokens * n_v)
            .map(|_| match rng.random_range(0..10) {
                0 => rng.random_range(19.0f32..21.0),
                1 => rng.random_range(25.0f32..40.0),
                2 => -30.0,
                _ => rng.random_range(-5.0f32..5.0),
            })
            .collect();
        let beta = (0..tokens * n_v).map(|_| if rng.random_range(0..8) == 0 { [-30.0, 30.0][rng.random_range(0..2)] } else { rng.random_range(-6.0f32..6.0) }).collect();
        let dt_bias = uniform(rng, n_v, 2.0);
        let a = (0..n_v).map(|_| -rng.random_range(-3.0f32..2.5).exp()).collect();
        let mut state = uniform(rng, shape.state_len(), 1.0);
        let head = n_v * d * d;
        for t in 0..tokens {
            let s = (pos as usize + t) % GDN_STATE_SLOTS;
            state[s * head..(s + 1) * head].fill(f32::from_bits(POISON_F32));
        }
        RecurCase { shape, pos, eps: 1e-6, scale: (1.0 / (d as f64).sqrt()) as f32, conv, alpha, beta, dt_bias, a, state }
    }

    /// Runs the case on `b`: the output (poisoned first) and the state after.
    pub fn run(&self, b: &dyn GdnOps) -> Result<(Vec<f32>, Vec<f32>)> {
        let s = self.shape;
        let (mut state, mut out) = (self.state.clone(), poison(s.tokens * s.n_v * s.d));
        b.gdn_recur(&self.conv, &self.alpha, &self.beta, &self.dt_bias, &self.a, &mut state, &mut out, self.pos, s, self.eps, self.scale)?;
        Ok((out, state))
    }

    /// The slots the window writes, in token order.
    pub fn written_slots(&self) -> Vec<usize> {
        (0..self.shape.tokens).map(|t| (self.pos as usize + t) % GDN_STATE_SLOTS).collect()
    }

    pub fn describe(&self) -> String {
        let s = self.shape;
        format!("T{} k{}/v{} d{} pos {}", s.tokens, s.n_k, s.n_v, s.d, self.pos)
    }
}

/// `gdn_recur` of `case` on every backend: the output and the whole state compared bit for bit
/// (the window's slots are outputs too: poisoned, so one left unwritten is counted); NMSE of the
/// reference's output and of its written slots against float64 (the larger reported).
pub fn recur_case(backends: &[&dyn GdnOps], case: &RecurCase, seed: u64) -> Result<Outcome> {
    let s = case.shape;
    let (n_out, head) = (s.tokens * s.n_v * s.d, s.n_v * s.d * s.d);
    let slots = case.written_slots();
    let (outs, unwritten) = run_all(backends, |b| {
        let (out, state) = case.run(b)?;
        let slots = &slots;
        let written = state.chunks_exact(head).enumerate().flat_map(|(k, h)| h.iter().map(move |v| slots.contains(&k) && is_poison(v)));
        let left = out.iter().map(is_poison).chain(written).collect();
        Ok((words(&out).chain(words(&state)).collect(), left))
    })?;
    let (want_out, want_states) = gdn_recur_f64(&case.conv, &case.alpha, &case.beta, &case.dt_bias, &case.a, &case.state, case.pos, s, case.eps, case.scale);
    let got_states: Vec<f32> = slots.iter().flat_map(|&k| first_f32(&outs, n_out + k * head..n_out + (k + 1) * head)).collect();
    let e = nmse(&first_f32(&outs, 0..n_out), &want_out).max(nmse(&got_states, &want_states));
    let d = s.d;
    let describe = |i: usize, v: u32| {
        let what = if i < n_out {
            format!("out token {} head {} value {}", i / (s.n_v * d), i / d % s.n_v, i % d)
        } else {
            let j = i - n_out;
            format!("state slot {} head {} column {} row {}", j / head, j / (d * d) % s.n_v, j / d % d, j % d)
        };
        format!("{what}: {:e} ({v:#010x})", f32::from_bits(v))
    };
    Ok(outcome(RECUR, case.describe(), seed, outs, unwritten, Some(e), describe))
}

/// `rms_norm_gated` of `rows` rows of `n`: rows at a scale each (1e-3 to 1e3, the second of
/// three or more all zero), weights of either sign, gates mostly `U(-8, 8)` with saturating ones.
fn norm_gated_case(backends: &[&dyn GdnOps], rows: usize, n: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut x = Vec::with_capacity(rows * n);
    for r in 0..rows {
        let scale = if r == 1 && rows >= 3 { 0.0 } else { 10f32.powf(rng.random_range(-3.0..3.0)) };
        x.extend(uniform(&mut rng, n, scale));
    }
    let w = uniform(&mut rng, n, 2.0);
    let z = logits(&mut rng, rows * n);
    let eps = [1e-6f32, 1e-5][rng.random_range(0..2)];
    let (outs, unwritten) = run_all(backends, |b| {
        let mut out = poison(rows * n);
        b.rms_norm_gated(&x, &w, &z, n, eps, &mut out)?;
        Ok((words(&out).collect(), out.iter().map(is_poison).collect()))
    })?;
    let e = (rows * n >= NMSE_MIN_VALUES).then(|| nmse(&first_f32(&outs, 0..rows * n), &rms_norm_gated_f64(&x, &w, &z, n, eps)));
    let describe = |i: usize, v: u32| format!("row {} value {}: {:e} ({v:#010x})", i / n, i % n, f32::from_bits(v));
    Ok(outcome(NORM_GATED, format!("{rows}x{n} eps {eps:e}"), seed, outs, unwritten, e, describe))
}

/// `sigmoid_mul` of `n` values at mixed scales; on the GPU the in-place path, so an element the
/// kernel skipped shows as `a[i]` (a mismatch) rather than as poison.
fn sigmoid_mul_case(backends: &[&dyn GdnOps], n: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (a, g) = (mixed(&mut rng, n, -2.0, 2.0), logits(&mut rng, n));
    let (outs, unwritten) = run_all(backends, |b| {
        let mut out = poison(n);
        b.sigmoid_mul(&a, &g, &mut out)?;
        Ok((words(&out).collect(), out.iter().map(is_poison).collect()))
    })?;
    let e = (n >= NMSE_MIN_VALUES).then(|| nmse(&first_f32(&outs, 0..n), &sigmoid_mul_f64(&a, &g)));
    let describe = |i: usize, v: u32| format!("value {i}: {:e} ({v:#010x})", f32::from_bits(v));
    Ok(outcome(SIGMOID_MUL, format!("{n}"), seed, outs, unwritten, e, describe))
}

/// `swiglu_f32` of `n` values: gates mostly `U(-8, 8)` with saturating ones, `u` mixed.
fn swiglu_case(backends: &[&dyn GdnOps], n: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (g, u) = (logits(&mut rng, n), mixed(&mut rng, n, -2.0, 2.0));
    let (outs, unwritten) = run_all(backends, |b| {
        let mut out = poison(n);
        b.swiglu(&g, &u, &mut out)?;
        Ok((words(&out).collect(), out.iter().map(is_poison).collect()))
    })?;
    let e = (n >= NMSE_MIN_VALUES).then(|| nmse(&first_f32(&outs, 0..n), &swiglu_f64(&g, &u)));
    let describe = |i: usize, v: u32| format!("value {i}: {:e} ({v:#010x})", f32::from_bits(v));
    Ok(outcome(SWIGLU, format!("{n}"), seed, outs, unwritten, e, describe))
}

/// `add_gated` of `rows` rows of `n`: `acc` and `y` at mixed scales, one logit per row (some
/// saturating); on the GPU the in-place path (a skipped element shows as `acc[i]`).
fn add_gated_case(backends: &[&dyn GdnOps], rows: usize, n: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (acc, y, s) = (mixed(&mut rng, rows * n, -2.0, 2.0), mixed(&mut rng, rows * n, -2.0, 2.0), logits(&mut rng, rows));
    let (outs, unwritten) = run_all(backends, |b| {
        let mut out = poison(rows * n);
        b.add_gated(&acc, &y, &s, n, &mut out)?;
        Ok((words(&out).collect(), out.iter().map(is_poison).collect()))
    })?;
    let e = (rows * n >= NMSE_MIN_VALUES).then(|| nmse(&first_f32(&outs, 0..rows * n), &add_gated_f64(&acc, &y, &s, n)));
    let describe = |i: usize, v: u32| format!("row {} value {}: {:e} ({v:#010x})", i / n, i % n, f32::from_bits(v));
    Ok(outcome(ADD_GATED, format!("{rows}x{n}"), seed, outs, unwritten, e, describe))
}

/// Copy inputs: mixed scales, with the values a copy must keep bit for bit sprinkled in (signed
/// zeros, infinities, subnormals, NaNs with payloads other than the poison's).
fn copy_values(rng: &mut SmallRng, n: usize) -> Vec<f32> {
    const SPECIAL: [u32; 8] = [0x8000_0000, 0x0000_0000, 0x7f80_0000, 0xff80_0000, 0x0000_0001, 0x807f_ffff, 0x7fc0_1234, 0xffa0_0042];
    let mut v = mixed(rng, n, -3.0, 3.0);
    for x in v.iter_mut() {
        if rng.random_range(0..16) == 0 {
            *x = f32::from_bits(SPECIAL[rng.random_range(0..SPECIAL.len())]);
        }
    }
    v
}

/// `concat_rows` of `rows` rows of `n_a` and `n_b` values (see [`copy_values`]), the output
/// poisoned: a copy, so compared bit for bit with every element written and no float64 bar.
pub fn concat_case(backends: &[&dyn GdnOps], rows: usize, n_a: usize, n_b: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (a, b) = (copy_values(&mut rng, rows * n_a), copy_values(&mut rng, rows * n_b));
    let n = n_a + n_b;
    let (outs, unwritten) = run_all(backends, |be| {
        let mut out = poison(rows * n);
        be.concat_rows(&a, &b, n_a, n_b, &mut out)?;
        Ok((words(&out).collect(), out.iter().map(is_poison).collect()))
    })?;
    let describe = |i: usize, v: u32| {
        let (r, j) = (i / n, i % n);
        let what = if j < n_a { format!("a value {j}") } else { format!("b value {}", j - n_a) };
        format!("row {r} {what}: {:e} ({v:#010x})", f32::from_bits(v))
    };
    Ok(outcome(CONCAT, format!("{rows}x({n_a}+{n_b})"), seed, outs, unwritten, None, describe))
}

/// Channel counts of the conv cases: one block, one past it, the model's 8192, odd ones.
const CONV_CHANNELS: [usize; 6] = [128, 129, 8192, 1, 37, 1000];

/// The family's parity suite from `seed`. `gdn_conv`: d_conv 2..=4 with windows of every length
/// `1..=SPEC_MAX_TOKENS` at position 0, small positions (some below `d_conv - 1`) and large ones,
/// plus d_conv 1 and `GDN_MAX_CONV`. `gdn_recur`: d 32, 64 and 128 with `n_v / n_k` 1, 2 and 4,
/// each at position 0 and at a later one, windows cycling through 1..=8, plus the 16/32 x 128
/// shape of the model. The gates at several lengths; `concat_rows` for 1..=8 rows of the
/// model's 2048 + 2048, of 1 + 1, of lengths around a block and odd ones. `backends[0]` is the
/// reference.
pub fn parity_cases(backends: &[&dyn GdnOps], seed: u64) -> Result<Vec<Outcome>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let later = |rng: &mut SmallRng| if rng.random_bool(0.5) { rng.random_range(1..=12) } else { large_pos(rng) };
    for d_conv in 2..=4 {
        for tokens in 1..=SPEC_MAX_TOKENS {
            let channels = CONV_CHANNELS[rng.random_range(0..CONV_CHANNELS.len())];
            let pos = match (tokens + d_conv) % 3 {
                0 => 0,
                1 => rng.random_range(1..=2 * d_conv as u32),
                _ => large_pos(&mut rng),
            };
            out.push(conv_case(backends, d_conv, channels, tokens, pos, rng.random())?);
        }
    }
    for d_conv in [1, GDN_MAX_CONV] {
        let (tokens, channels) = (rng.random_range(1..=SPEC_MAX_TOKENS), rng.random_range(1..=700));
        let pos = later(&mut rng);
        out.push(conv_case(backends, d_conv, channels, tokens, pos, rng.random())?);
    }
    // Windows cycle through 1..=8 at position 0 and, shifted, at later positions.
    let mut i = 0;
    let mut shapes = Vec::new();
    for d in [32, 64, 128] {
        for ratio in [1, 2, 4] {
            for (at_zero, shift) in [(true, 0), (false, 4)] {
                let n_k = rng.random_range(1..=2);
                shapes.push((RecurShape { tokens: 1 + (i + shift) % SPEC_MAX_TOKENS, n_k, n_v: ratio * n_k, d }, at_zero));
            }
            i += 1;
        }
    }
    shapes.push((RecurShape { tokens: rng.random_range(1..=SPEC_MAX_TOKENS), n_k: 16, n_v: 32, d: 128 }, false));
    for (shape, at_zero) in shapes {
        let pos = if at_zero { 0 } else { later(&mut rng) };
        let s = rng.random();
        let case = RecurCase::random(&mut SmallRng::seed_from_u64(s), shape, pos);
        out.push(recur_case(backends, &case, s)?);
    }
    let n = 32 * rng.random_range(1..=64);
    for (rows, n) in [(1, 32), (2, 64), (7, 128), (256, 128), (3, 256), (4, 2048), (rng.random_range(1..=40), n)] {
        out.push(norm_gated_case(backends, rows, n, rng.random())?);
    }
    for n in [1, 255, 256, 257, 4096, rng.random_range(2..100_000)] {
        out.push(sigmoid_mul_case(backends, n, rng.random())?);
        out.push(swiglu_case(backends, n, rng.random())?);
    }
    let (rows, n) = (rng.random_range(1..=SPEC_MAX_TOKENS), rng.random_range(1..=5000));
    for (rows, n) in [(1, 1), (1, 2048), (3, 257), (8, 2048), (rows, n)] {
        out.push(add_gated_case(backends, rows, n, rng.random())?);
    }
    for rows in 1..=SPEC_MAX_TOKENS {
        out.push(concat_case(backends, rows, 2048, 2048, rng.random())?);
    }
    let (rows, n_a, n_b) = (rng.random_range(1..=SPEC_MAX_TOKENS), rng.random_range(1..=5000), rng.random_range(1..=5000));
    for (rows, n_a, n_b) in [(1, 1, 1), (8, 1, 1), (1, 128, 128), (1, 128, 129), (2, 1, 255), (5, 257, 3), (7, 129, 1001), (3, 2047, 2049), (rows, n_a, n_b)] {
        out.push(concat_case(backends, rows, n_a, n_b, rng.random())?);
    }
    Ok(out)
}
