//! Attention of the decode step: [`AttentionOps`] (host slices, what parity runs) for the CPU
//! replica and the GPU backends, the typed launchers on device buffers (`attn_prep_queue`,
//! `attention_queue`), the RoPE table, and the parity cases ([`parity_cases`], and
//! [`window_case`] for window invariance).
use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::backends::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::backends::gpu::GpuBackend;
#[cfg(feature = "sim")]
use crate::backends::sim::{Args as SimArgs, SimBackend};
use crate::parity::{compare_bits, note_unwritten, Mismatch, Outcome, NMSE_MAX, POISON_F32};
use crate::reference::nmse;
use strata_gpu_shared::f16::{f16_to_f32, f32_to_f16};
use strata_gpu_shared::formats::q8_1;
use strata_gpu_shared::launch::attention::{attn_band, attn_band_fits, attn_chunks, attn_lean_wanted, attn_prep_chunk_kernel, attn_split, attn_max_band, attn_band_min_blocks, ATTN_CHUNK, ATTN_MAX_HD, ATTN_PREP_WARPS};
use strata_gpu_shared::replica::attention::{attend, norm_rope, prep_key, prep_value, rope_at, KvHead};

const PREP: &str = "attn_prep";
const CHUNK: &str = "attn_chunk";
const MERGE: &str = "attn_merge";
/// The fused `attn_prep` and one-chunk attention (`attn_prep_chunk_*`).
const FUSED: &str = "attn_prep_chunk";
/// Grid blocks one launch may take.
const MAX_BLOCKS: usize = i32::MAX as usize / 2;

/// fp16 poison for cache positions a test expects written: a signalling NaN, which no fp16
/// rounding produces (a NaN input rounds to a quiet one).
pub const POISON_F16: u16 = 0x7d5e;

/// The RoPE table of `n_ctx` positions: for each position `pos` and `i < n_rot / 2`, the pair
/// `cos(theta), sin(theta)` with `theta = pos * freq_base^(-2i / n_rot)`, computed in f64 and
/// rounded to f32 once. (llama.cpp computes theta in f32, so this table is the more precise
/// one; every backend reads this same table, so their bits agree by construction.)
pub fn rope_table(n_ctx: usize, n_rot: usize, freq_base: f32) -> Vec<f32> {
    let half = n_rot / 2;
    let mut table = Vec::with_capacity(n_ctx * 2 * half);
    for pos in 0..n_ctx {
        for i in 0..half {
            let theta = pos as f64 * (freq_base as f64).powf(-2.0 * i as f64 / n_rot as f64);
            table.push(theta.cos() as f32);
            table.push(theta.sin() as f32);
        }
    }
    table
}

/// The shape of a window's attention: `tokens` tokens, `n_q` query and `n_kv` key/value heads
/// of `hd` values (the first `n_rot` roped), over a cache of `n_ctx` positions.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub tokens: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub n_rot: usize,
    pub n_ctx: usize,
}

impl AttnShape {
    /// Values of the window's queries (`q`, `q_out`, the attention output).
    pub fn q_len(&self) -> usize {
        self.tokens * self.n_q * self.hd
    }

    /// Values of the window's keys or values (`k`, `v`).
    pub fn kv_len(&self) -> usize {
        self.tokens * self.n_kv * self.hd
    }

    /// `attn_prep`'s inputs packed: each of q, k and v rows of its own, back to back.
    pub fn dense(&self) -> QkvStrides {
        QkvStrides { q: self.n_q * self.hd, kv: self.n_kv * self.hd }
    }

    /// `attn_prep`'s inputs as views into one fused projection: a token's q, k and v values in
    /// one row.
    pub fn fused(&self) -> QkvStrides {
        let row = (self.n_q + 2 * self.n_kv) * self.hd;
        QkvStrides { q: row, kv: row }
    }

    /// Values a strided input of the window spans: `tokens` rows of `row` values, `stride`
    /// apart (at least one token).
    fn span(&self, stride: usize, row: usize) -> usize {
        (self.tokens - 1).saturating_mul(stride).saturating_add(row)
    }

    /// Values of one cache (keys or values) of `n_ctx` positions.
    pub fn cache_len(&self) -> usize {
        self.n_ctx * self.n_kv * self.hd
    }

    /// Values of the RoPE table ([`rope_table`] of `n_ctx` positions).
    pub fn rope_len(&self) -> usize {
        self.n_ctx * self.n_rot
    }

    /// The window at `pos0` is one the kernels take: at least one token, whole GQA groups, `hd`
    /// a multiple of 32 up to `ATTN_MAX_HD`, `n_rot` even and at most `hd`, the window inside
    /// the cache, grids within the launch limits.
    fn check(&self, kernel: &'static str, pos0: usize) -> Result<()> {
        let bad = |detail: String| Err(Error::Shape { kernel, detail });
        let s = self;
        if s.tokens == 0 {
            return bad("a window of 0 tokens".into());
        }
        if s.n_q == 0 || s.n_kv == 0 || s.n_q % s.n_kv != 0 {
            return bad(format!("{} query heads are not whole groups of {} key/value heads", s.n_q, s.n_kv));
        }
        if s.hd == 0 || s.hd % 32 != 0 || s.hd > ATTN_MAX_HD {
            return bad(format!("head size {} is not a multiple of 32 in 32..={ATTN_MAX_HD}", s.hd));
        }
        if s.n_rot % 2 != 0 || s.n_rot > s.hd {
            return bad(format!("n_rot {} is not even and at most the head size {}", s.n_rot, s.hd));
        }
        if pos0.checked_add(s.tokens).is_none_or(|end| end > s.n_ctx) {
            return bad(format!("window {pos0}..{pos0}+{} does not fit a cache of {} positions", s.tokens, s.n_ctx));
        }
        // `attn_chunk` computes a chunk's first cache row in 32 bits.
        if s.n_ctx.checked_mul(s.n_kv * s.hd).is_none_or(|values| values > u32::MAX as usize) {
            return bad(format!("caches of {} positions of {} x {} values exceed 2^32 - 1 values", s.n_ctx, s.n_kv, s.hd));
        }
        let rows = s.tokens * (s.n_q + 2 * s.n_kv);
        if s.n_ctx > MAX_BLOCKS || rows > MAX_BLOCKS || s.tokens * s.n_q * attn_chunks(s.n_ctx) > MAX_BLOCKS {
            return bad(format!("{rows} head rows over {} positions exceed one launch", s.n_ctx));
        }
        Ok(())
    }
}

/// Values between consecutive tokens' rows in `attn_prep`'s inputs: in `q`, and in `k` and `v`
/// (at least a row of each; wider where they are views into one fused projection row, see
/// [`AttnShape::fused`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvStrides {
    pub q: usize,
    pub kv: usize,
}

/// Values of the `attention_queue` scratch for `shape` (every window of up to `shape.tokens`
/// tokens in a cache of `shape.n_ctx` positions): `hd + 2` per (token, query head, chunk).
pub fn attn_part_len(shape: AttnShape) -> usize {
    shape.tokens * shape.n_q * attn_chunks(shape.n_ctx) * (shape.hd + 2)
}

/// Each `(buffer, elements it holds, elements the shape needs)`: exactly that many for host
/// slices, at least that many for device buffers (sized for the largest window).
fn check_lens(kernel: &'static str, bufs: &[(&str, usize, usize)], exact: bool) -> Result<()> {
    for &(what, have, want) in bufs {
        if have < want || (exact && have != want) {
            let detail = format!("{what} holds {have} elements, {} {want}", if exact { "expected" } else { "needed at least" });
            return Err(Error::Shape { kernel, detail });
        }
    }
    Ok(())
}

/// The strides between tokens' q rows and k and v rows: at least a row, within the kernels' u32.
fn check_strides(kernel: &'static str, s: AttnShape, strides: QkvStrides) -> Result<()> {
    let (q_row, kv_row) = (s.n_q * s.hd, s.n_kv * s.hd);
    for (what, stride, row) in [("q", strides.q, q_row), ("k and v", strides.kv, kv_row)] {
        if stride < row || stride > u32::MAX as usize {
            return Err(Error::Shape { kernel, detail: format!("{what} rows {stride} values apart: rows of {row} values need {row}..={}", u32::MAX) });
        }
    }
    Ok(())
}

/// `attn_prep`'s shape, strides (at least a row, within the kernel's u32) and buffer lengths:
/// `q, k, v, q_norm, k_norm, rope, q_out, k_cache, v_cache` (the inputs span their strided rows).
fn check_prep(s: AttnShape, strides: QkvStrides, pos0: usize, lens: [usize; 9], exact: bool) -> Result<()> {
    s.check(PREP, pos0)?;
    check_strides(PREP, s, strides)?;
    let [q, k, v, q_norm, k_norm, rope] = prep_input_lens(s, strides);
    let want = [q, k, v, q_norm, k_norm, rope, s.q_len(), s.cache_len(), s.cache_len()];
    check_named_lens(PREP, ["q", "k", "v", "q_norm", "k_norm", "rope", "q_out", "k_cache", "v_cache"], lens, want, exact)
}

/// The fused prep and attention's shape, strides and buffer lengths: `q, k, v, q_norm, k_norm,
/// rope, k_cache, v_cache, out` (the inputs span their strided rows, as `attn_prep`'s).
fn check_prep_attention(s: AttnShape, strides: QkvStrides, pos0: usize, lens: [usize; 9], exact: bool) -> Result<()> {
    check_strides(FUSED, s, strides)?;
    s.check(FUSED, pos0)?;
    let [q, k, v, q_norm, k_norm, rope] = prep_input_lens(s, strides);
    let want = [q, k, v, q_norm, k_norm, rope, s.cache_len(), s.cache_len(), s.q_len()];
    check_named_lens(FUSED, ["q", "k", "v", "q_norm", "k_norm", "rope", "k_cache", "v_cache", "out"], lens, want, exact)
}

/// The lengths `attn_prep`'s six inputs need (the fused launch's too): `q, k, v` spanning their
/// strided rows, `q_norm` and `k_norm` a head's values, the RoPE table.
fn prep_input_lens(s: AttnShape, strides: QkvStrides) -> [usize; 6] {
    let kv_span = s.span(strides.kv, s.n_kv * s.hd);
    [s.span(strides.q, s.n_q * s.hd), kv_span, kv_span, s.hd, s.hd, s.rope_len()]
}

/// [`check_lens`] of buffers given as parallel arrays of names, lengths held and lengths needed.
fn check_named_lens<const N: usize>(kernel: &'static str, names: [&str; N], have: [usize; N], want: [usize; N], exact: bool) -> Result<()> {
    let bufs: Vec<_> = names.iter().zip(have).zip(want).map(|((&n, h), w)| (n, h, w)).collect();
    check_lens(kernel, &bufs, exact)
}

/// The fused entry for a window of `shape` whose contexts are at most `ctx_bound` keys, in
/// bands of `band` heads ([`attn_prep_chunk_kernel`]); an error where it takes no such launch:
/// a context past one chunk, a band or head size without an entry.
fn prep_chunk_entry(s: AttnShape, ctx_bound: usize, band: usize) -> Result<&'static str> {
    match attn_prep_chunk_kernel(band, s.hd) {
        Some(kernel) if ctx_bound <= ATTN_CHUNK => Ok(kernel),
        _ => Err(Error::Shape {
            kernel: FUSED,
            detail: format!(
                "contexts up to {ctx_bound} keys in bands of {band} heads of {} values: the fused launch takes contexts of one chunk ({ATTN_CHUNK} keys) and bands of 2 heads of 128 values",
                s.hd
            ),
        }),
    }
}

/// The attention's shape and buffer lengths: `q, k_cache, v_cache, out`.
fn check_attention(s: AttnShape, pos0: usize, lens: [usize; 4], exact: bool) -> Result<()> {
    s.check(CHUNK, pos0)?;
    let want = [s.q_len(), s.cache_len(), s.cache_len(), s.q_len()];
    check_named_lens(CHUNK, ["q", "k_cache", "v_cache", "out"], lens, want, exact)
}

/// The attention kernels on host slices.
pub trait AttentionOps {
    fn name(&self) -> &'static str;

    /// `attn_prep` for the window at `pos0`: token `t`'s q row (`n_q x hd` values at
    /// `t * strides.q`) normed and roped into `q_out` (`tokens x n_q x hd`); its k row (normed,
    /// roped) and v row (`n_kv x hd` values at `t * strides.kv`) rounded to fp16 into the caches
    /// (`n_ctx x n_kv x hd`) at positions `pos0 ..`; the caches' other positions are left as
    /// they are. `q`, `k`, `v` end at their last token's row; `rope` is [`rope_table`] of
    /// `n_ctx` positions.
    #[allow(clippy::too_many_arguments)]
    fn attn_prep(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        strides: QkvStrides,
        q_norm: &[f32],
        k_norm: &[f32],
        rope: &[f32],
        shape: AttnShape,
        pos0: usize,
        eps: f32,
        q_out: &mut [f32],
        k_cache: &mut [u16],
        v_cache: &mut [u16],
    ) -> Result<()>;

    /// Causal GQA attention of the window at `pos0` (`attn_chunk` then `attn_merge`): token
    /// `t`'s query heads (`q`, `tokens x n_q x hd`) over cache positions `0 ..= pos0 + t`, into
    /// `out` (`tokens x n_q x hd`).
    #[allow(clippy::too_many_arguments)]
    fn attention(&self, q: &[f32], k_cache: &[u16], v_cache: &[u16], shape: AttnShape, pos0: usize, scale: f32, out: &mut [f32]) -> Result<()>;

    /// [`Self::attn_prep`] then [`Self::attention`] of a window at `pos0` whose contexts are one
    /// chunk (`q`, `k`, `v`: the tokens' rows, packed): the caches' rows at `pos0 ..` and the
    /// attention output (the prepared queries are not kept). The CPU runs the two; the GPU
    /// backends launch them as one kernel ([`attn_prep_chunk_kernel`] for the band the step
    /// would launch), an error where there is none for the shape.
    #[allow(clippy::too_many_arguments)]
    fn prep_attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        q_norm: &[f32],
        k_norm: &[f32],
        rope: &[f32],
        shape: AttnShape,
        pos0: usize,
        eps: f32,
        scale: f32,
        k_cache: &mut [u16],
        v_cache: &mut [u16],
        out: &mut [f32],
    ) -> Result<()> {
        let lens = [q.len(), k.len(), v.len(), q_norm.len(), k_norm.len(), rope.len(), k_cache.len(), v_cache.len(), out.len()];
        check_prep_attention(shape, shape.dense(), pos0, lens, true)?;
        let mut q_out = vec![0.0f32; shape.q_len()];
        self.attn_prep(q, k, v, shape.dense(), q_norm, k_norm, rope, shape, pos0, eps, &mut q_out, k_cache, v_cache)?;
        self.attention(&q_out, k_cache, v_cache, shape, pos0, scale, out)
    }
}

impl AttentionOps for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn attn_prep(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        strides: QkvStrides,
        q_norm: &[f32],
        k_norm: &[f32],
        rope: &[f32],
        shape: AttnShape,
        pos0: usize,
        eps: f32,
        q_out: &mut [f32],
        k_cache: &mut [u16],
        v_cache: &mut [u16],
    ) -> Result<()> {
        let lens = [q.len(), k.len(), v.len(), q_norm.len(), k_norm.len(), rope.len(), q_out.len(), k_cache.len(), v_cache.len()];
        check_prep(shape, strides, pos0, lens, true)?;
        let AttnShape { n_q, n_kv, hd, n_rot, .. } = shape;
        let (q_row, kv_row) = (n_q * hd, n_kv * hd);
        for (t, ot) in q_out.chunks_exact_mut(q_row).enumerate() {
            let rope = rope_at(rope, pos0 + t, n_rot);
            for (x, out) in q[t * strides.q..][..q_row].chunks_exact(hd).zip(ot.chunks_exact_mut(hd)) {
                norm_rope(x, q_norm, eps, rope, out);
            }
            let (rows, at) = (t * strides.kv..t * strides.kv + kv_row, (pos0 + t) * kv_row);
            let cache = at..at + kv_row;
            for (x, out) in k[rows.clone()].chunks_exact(hd).zip(k_cache[cache.clone()].chunks_exact_mut(hd)) {
                prep_key(x, k_norm, eps, rope, out);
            }
            for (x, out) in v[rows].chunks_exact(hd).zip(v_cache[cache].chunks_exact_mut(hd)) {
                prep_value(x, out);
            }
        }
        Ok(())
    }

    fn attention(&self, q: &[f32], k_cache: &[u16], v_cache: &[u16], shape: AttnShape, pos0: usize, scale: f32, out: &mut [f32]) -> Result<()> {
        check_attention(shape, pos0, [q.len(), k_cache.len(), v_cache.len(), out.len()], true)?;
        let AttnShape { tokens, n_q, n_kv, hd, .. } = shape;
        let group = n_q / n_kv;
        self.par_chunks(out, hd, |first, chunk| {
            let mut part = vec![0f32; attn_chunks(pos0 + tokens) * (hd + 2)];
            for (i, o) in chunk.chunks_exact_mut(hd).enumerate() {
                let (row, t) = (first + i, (first + i) / n_q);
                let kv = KvHead { k: k_cache, v: v_cache, n_kv, g: row % n_q / group, hd };
                attend(&q[row * hd..(row + 1) * hd], kv, pos0 + t + 1, scale, &mut part, o);
            }
        });
        Ok(())
    }
}


impl GpuBackend {
    /// Queues `attn_prep` for the window at the position `pos[0]` holds when the kernel runs
    /// (see [`AttentionOps::attn_prep`]; rows past the cache write nothing); buffers may be
    /// longer than the shape needs. `q`, `k` and `v` are views: into one fused projection
    /// buffer at each part's offset, with [`AttnShape::fused`] strides, or whole buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_prep_queue(
        &self,
        q: &CudaView<f32>,
        k: &CudaView<f32>,
        v: &CudaView<f32>,
        strides: QkvStrides,
        q_norm: &CudaSlice<f32>,
        k_norm: &CudaSlice<f32>,
        rope: &CudaSlice<f32>,
        shape: AttnShape,
        pos: &CudaSlice<u32>,
        eps: f32,
        q_out: &mut CudaSlice<f32>,
        k_cache: &mut CudaSlice<u16>,
        v_cache: &mut CudaSlice<u16>,
    ) -> Result<()> {
        let lens = [q.len(), k.len(), v.len(), q_norm.len(), k_norm.len(), rope.len(), q_out.len(), k_cache.len(), v_cache.len()];
        check_prep(shape, strides, 0, lens, false)?;
        check_lens(PREP, &[("pos", pos.len(), 1)], false)?;
        let s = shape;
        let (tokens, n_q, n_kv, hd, n_rot, n_ctx) = (s.tokens as u32, s.n_q as u32, s.n_kv as u32, s.hd as u32, s.n_rot as u32, s.n_ctx as u32);
        let (q_stride, kv_stride) = (strides.q as u32, strides.kv as u32);
        let rows = s.tokens * (s.n_q + 2 * s.n_kv);
        let mut a = self.builder(PREP);
        a.arg(q).arg(k).arg(v).arg(q_norm).arg(k_norm).arg(rope);
        a.arg(&tokens).arg(&n_q).arg(&n_kv).arg(&hd).arg(&n_rot).arg(&q_stride).arg(&kv_stride).arg(pos).arg(&n_ctx).arg(&eps);
        a.arg(q_out).arg(k_cache).arg(v_cache);
        // SAFETY: the kernel's parameters in order over the buffers checked above (the inputs
        // span their strided rows, the strides fit u32; the rope table and caches hold `n_ctx`
        // positions, and rows at or past `n_ctx` return); warps past the window's head rows
        // return at once, so a padded grid is covered. The inputs may be views of one buffer:
        // the kernel only reads them.
        unsafe { self.launch_async(PREP, self.padded_grid(PREP, rows.div_ceil(ATTN_PREP_WARPS as usize) as u32), a) }
    }

    /// The query heads per `attn_chunk` block the step launches for `shape` and `ctx_bound`:
    /// [`attn_band`] at [`attn_band_min_blocks`] of the device's SMs.
    pub fn attn_band(&self, shape: AttnShape, ctx_bound: usize) -> usize {
        let split = attn_split(ctx_bound.min(shape.n_ctx));
        attn_band(shape.n_q, shape.n_kv, shape.hd, shape.tokens, split, attn_band_min_blocks(self.info().sms() as usize))
    }

    /// Queues the window's attention at the position `pos[0]` holds when the kernels run (see
    /// [`AttentionOps::attention`]): `attn_chunk` into `part` (at least [`attn_part_len`] of the
    /// shape), then `attn_merge` into `out`; buffers may be longer than the shape needs. The grid
    /// is sized for contexts of up to `ctx_bound` keys ([`attn_split`]): every position gives
    /// the same bits whatever `ctx_bound` is, a shorter bound only makes each block walk more
    /// chunks. Each `attn_chunk` block computes a band of `band` query heads (a divisor of the
    /// group's `n_q / n_kv`, at most [`attn_max_band`]; benches and tests compare them), or
    /// [`Self::attn_band`]'s when `band` is `None` (what the step launches). A band of
    /// `attn_chunk_128` runs its lean twin (4 blocks a SM) where the lean rule
    /// ([`attn_lean_wanted`]) or the `ATTN_MINB` knob says so.
    ///
    /// With `bound_holds` the caller promises that no token's context is longer than
    /// `ctx_bound` (the decode step's window end is such a bound): where that is one chunk,
    /// `attn_chunk` writes `out` itself (the merge's bits for one part) and `attn_merge` is not
    /// launched. With `xq`, the kernel that writes `out` also writes its q8_1 blocks
    /// (`quantize_q8_1`'s bits: the output projection's input).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_queue(
        &self,
        q: &CudaSlice<f32>,
        k_cache: &CudaSlice<u16>,
        v_cache: &CudaSlice<u16>,
        shape: AttnShape,
        pos: &CudaSlice<u32>,
        ctx_bound: usize,
        bound_holds: bool,
        scale: f32,
        band: Option<usize>,
        part: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        mut xq: Option<&mut CudaSlice<u8>>,
    ) -> Result<()> {
        check_attention(shape, 0, [q.len(), k_cache.len(), v_cache.len(), out.len()], false)?;
        let s = shape;
        check_lens(CHUNK, &[("part", part.len(), attn_part_len(s)), ("pos", pos.len(), 1)], false)?;
        if let Some(xq) = &xq {
            check_lens(CHUNK, &[("q8_1 output", xq.len(), q8_1::bytes_of(s.q_len()))], false)?;
        }
        let band = band.unwrap_or_else(|| self.attn_band(s, ctx_bound));
        if !attn_band_fits(s.n_q, s.n_kv, s.hd, band) {
            let detail = format!("a band of {band} query heads does not divide a group of {} (at most {} for {}-value heads)", s.n_q / s.n_kv, attn_max_band(s.hd), s.hd);
            return Err(Error::Shape { kernel: CHUNK, detail });
        }
        let split = attn_split(ctx_bound.min(s.n_ctx));
        let direct = bound_holds && ctx_bound <= ATTN_CHUNK;
        let (tokens, n_q, n_kv, hd, n_ctx, split_u, band_u) = (s.tokens as u32, s.n_q as u32, s.n_kv as u32, s.hd as u32, s.n_ctx as u32, split as u32, band as u32);
        let null = 0u64;
        let wanted = attn_lean_wanted(s.tokens, s.n_q, band, split, self.info().sms() as usize);
        let kernel = self.kernel_knobs().attn_chunk_entry(band, s.hd, self.sm90_entries(), wanted).map_err(|e| Error::Request(format!("{}: {CHUNK}: kernel knobs: {e}", self.name_static())))?;
        let mut a = self.builder(kernel);
        a.arg(q).arg(k_cache).arg(v_cache).arg(&tokens).arg(&n_q).arg(&n_kv).arg(&hd).arg(pos).arg(&scale).arg(&n_ctx).arg(&split_u).arg(&band_u);
        a.arg(&mut *part);
        // Null pointers (u64 0) where the chunk kernel writes parts, or no q8_1 blocks.
        match (direct, xq.as_deref_mut()) {
            (true, Some(xq)) => a.arg(&mut *out).arg(xq),
            (true, None) => a.arg(&mut *out).arg(&null),
            (false, _) => a.arg(&null).arg(&null),
        };
        // SAFETY (both): each kernel's parameters in order over the buffers checked above, the
        // chunk kernel's shared memory from BOUNDS, a band dividing the group; contexts are
        // clamped to the caches' `n_ctx` positions; blocks past the window's (token, band,
        // split) triples or (token, head) pairs return at once, so padded grids are covered.
        // The chunk kernel writes `out` (and `xq`) only when the caller's bound holds and is
        // one chunk: then every context is one chunk (the kernel traps on a longer one rather
        // than write a partial result).
        unsafe { self.launch_async(kernel, self.padded_grid(kernel, (s.tokens * (s.n_q / band) * split) as u32), a) }?;
        if direct {
            return Ok(());
        }
        let mut a = self.builder(MERGE);
        a.arg(&*part).arg(&tokens).arg(&n_q).arg(&hd).arg(pos).arg(&n_ctx).arg(out);
        match xq {
            Some(xq) => a.arg(xq),
            None => a.arg(&null),
        };
        unsafe { self.launch_async(MERGE, self.padded_grid(MERGE, (s.tokens * s.n_q) as u32), a) }
    }
}

impl GpuBackend {
    /// The fused `attn_prep` + attention entry the step launches for `shape` and `ctx_bound` (a
    /// bound that holds: the window's end), or `None` where it launches the two: a window whose
    /// contexts are one chunk, in a band ([`Self::attn_band`]) and head size with an entry
    /// ([`attn_prep_chunk_kernel`]), unless the `ATTN_FUSE` knob is off.
    pub fn prep_attention_kernel(&self, shape: AttnShape, ctx_bound: usize) -> Option<&'static str> {
        if !self.kernel_knobs().attn_fuse {
            return None;
        }
        prep_chunk_entry(shape, ctx_bound, self.attn_band(shape, ctx_bound)).ok()
    }

    /// Queues `attn_prep` and the attention of a window in one launch (see
    /// [`AttentionOps::prep_attention`]) at the position `pos[0]` holds when it runs, whose
    /// contexts the caller promises are at most `ctx_bound` keys, one chunk; an error where
    /// [`Self::prep_attention_kernel`]'s entry does not exist for the shape. `q`, `k` and `v` are
    /// views as `attn_prep_queue`'s (`strides` apart: into the fused projection's rows, or
    /// packed); with `xq` the output's q8_1 blocks too. Buffers may be longer than the shape
    /// needs.
    #[allow(clippy::too_many_arguments)]
    pub fn prep_attention_queue(
        &self,
        q: &CudaView<f32>,
        k: &CudaView<f32>,
        v: &CudaView<f32>,
        strides: QkvStrides,
        q_norm: &CudaSlice<f32>,
        k_norm: &CudaSlice<f32>,
        rope: &CudaSlice<f32>,
        shape: AttnShape,
        pos: &CudaSlice<u32>,
        ctx_bound: usize,
        eps: f32,
        scale: f32,
        k_cache: &mut CudaSlice<u16>,
        v_cache: &mut CudaSlice<u16>,
        out: &mut CudaSlice<f32>,
        xq: Option<&mut CudaSlice<u8>>,
    ) -> Result<()> {
        let lens = [q.len(), k.len(), v.len(), q_norm.len(), k_norm.len(), rope.len(), k_cache.len(), v_cache.len(), out.len()];
        check_prep_attention(shape, strides, 0, lens, false)?;
        check_lens(FUSED, &[("pos", pos.len(), 1)], false)?;
        if let Some(xq) = &xq {
            check_lens(FUSED, &[("q8_1 output", xq.len(), q8_1::bytes_of(shape.q_len()))], false)?;
        }
        let band = self.attn_band(shape, ctx_bound);
        let kernel = prep_chunk_entry(shape, ctx_bound, band)?;
        let s = shape;
        let (tokens, n_q, n_kv, hd, n_rot, n_ctx) = (s.tokens as u32, s.n_q as u32, s.n_kv as u32, s.hd as u32, s.n_rot as u32, s.n_ctx as u32);
        let (q_stride, kv_stride) = (strides.q as u32, strides.kv as u32);
        let null = 0u64;
        let mut a = self.builder(kernel);
        a.arg(q).arg(k).arg(v).arg(q_norm).arg(k_norm).arg(rope);
        a.arg(&tokens).arg(&n_q).arg(&n_kv).arg(&hd).arg(&n_rot).arg(&q_stride).arg(&kv_stride).arg(pos).arg(&n_ctx).arg(&eps).arg(&scale);
        a.arg(k_cache).arg(v_cache).arg(out);
        match xq {
            Some(xq) => a.arg(xq),
            None => a.arg(&null),
        };
        // SAFETY: the entry's parameters in order over the buffers checked above (the views
        // span the tokens' strided rows, the strides fit u32, the rope table and caches hold
        // `n_ctx` positions), its shared memory
        // from BOUNDS, bands of the entry's width dividing the group (`prep_chunk_entry` took
        // the band and head size the entry is compiled for); the caller's bound keeps the
        // contexts to one chunk (the kernel traps on a longer one, or a window past the cache,
        // rather than write a wrong result); blocks past the (token, band) pairs return, so a
        // padded grid is covered. The inputs may be views of one buffer: the kernel only reads
        // them.
        unsafe { self.launch_async(kernel, self.padded_grid(kernel, (s.tokens * (s.n_q / band)) as u32), a) }
    }
}

impl AttentionOps for GpuBackend {
    fn name(&self) -> &'static str {
        self.name_static()
    }

    fn attn_prep(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        strides: QkvStrides,
        q_norm: &[f32],
        k_norm: &[f32],
        rope: &[f32],
        shape: AttnShape,
        pos0: usize,
        eps: f32,
        q_out: &mut [f32],
        k_cache: &mut [u16],
        v_cache: &mut [u16],
    ) -> Result<()> {
        let lens = [q.len(), k.len(), v.len(), q_norm.len(), k_norm.len(), rope.len(), q_out.len(), k_cache.len(), v_cache.len()];
        check_prep(shape, strides, pos0, lens, true)?;
        let up = |x: &[f32]| self.upload(PREP, x);
        let (dq, dk, dv, dqn, dkn, drope) = (up(q)?, up(k)?, up(v)?, up(q_norm)?, up(k_norm)?, up(rope)?);
        let mut dq_out = self.upload_out(PREP, q_out)?;
        let (mut dkc, mut dvc) = (self.upload_out(PREP, k_cache)?, self.upload_out(PREP, v_cache)?);
        let dpos = self.upload(PREP, &[pos0 as u32])?;
        self.attn_prep_queue(&dq.as_view(), &dk.as_view(), &dv.as_view(), strides, &dqn, &dkn, &drope, shape, &dpos, eps, &mut dq_out, &mut dkc, &mut dvc)?;
        self.synchronize(PREP)?;
        self.download_out(PREP, &dq_out, q_out)?;
        self.download_out(PREP, &dkc, k_cache)?;
        self.download_out(PREP, &dvc, v_cache)
    }

    fn attention(&self, q: &[f32], k_cache: &[u16], v_cache: &[u16], shape: AttnShape, pos0: usize, scale: f32, out: &mut [f32]) -> Result<()> {
        check_attention(shape, pos0, [q.len(), k_cache.len(), v_cache.len(), out.len()], true)?;
        let (dq, dkc, dvc) = (self.upload(CHUNK, q)?, self.upload(CHUNK, k_cache)?, self.upload(CHUNK, v_cache)?);
        // Poisoned, so that a part `attn_merge` reads but `attn_chunk` never wrote shows.
        let mut part = self.upload(CHUNK, &vec![f32::from_bits(POISON_F32); attn_part_len(shape)])?;
        let mut dout = self.upload_out(MERGE, out)?;
        let dpos = self.upload(CHUNK, &[pos0 as u32])?;
        self.attention_queue(&dq, &dkc, &dvc, shape, &dpos, pos0 + shape.tokens, true, scale, None, &mut part, &mut dout, None)?;
        self.synchronize(MERGE)?;
        self.download_out(MERGE, &dout, out)
    }

    fn prep_attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        q_norm: &[f32],
        k_norm: &[f32],
        rope: &[f32],
        shape: AttnShape,
        pos0: usize,
        eps: f32,
        scale: f32,
        k_cache: &mut [u16],
        v_cache: &mut [u16],
        out: &mut [f32],
    ) -> Result<()> {
        let lens = [q.len(), k.len(), v.len(), q_norm.len(), k_norm.len(), rope.len(), k_cache.len(), v_cache.len(), out.len()];
        check_prep_attention(shape, shape.dense(), pos0, lens, true)?;
        let bound = pos0 + shape.tokens;
        prep_chunk_entry(shape, bound, self.attn_band(shape, bound))?;
        let up = |x: &[f32]| self.upload(FUSED, x);
        let (dq, dk, dv, dqn, dkn, drope) = (up(q)?, up(k)?, up(v)?, up(q_norm)?, up(k_norm)?, up(rope)?);
        let (mut dkc, mut dvc, mut dout) = (self.upload_out(FUSED, k_cache)?, self.upload_out(FUSED, v_cache)?, self.upload_out(FUSED, out)?);
        let dpos = self.upload(FUSED, &[pos0 as u32])?;
        self.prep_attention_queue(&dq.as_view(), &dk.as_view(), &dv.as_view(), shape.dense(), &dqn, &dkn, &drope, shape, &dpos, bound, eps, scale, &mut dkc, &mut dvc, &mut dout, None)?;
        self.synchronize(FUSED)?;
        self.download_out(FUSED, &dkc, k_cache)?;
        self.download_out(FUSED, &dvc, v_cache)?;
        self.download_out(FUSED, &dout, out)
    }
}

/// The cuda backend's launches (`attn_prep_queue`, `attention_queue` with the bound the host
/// slices' window gives) run by the simulator.
#[cfg(feature = "sim")]
impl AttentionOps for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn attn_prep(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        strides: QkvStrides,
        q_norm: &[f32],
        k_norm: &[f32],
        rope: &[f32],
        shape: AttnShape,
        pos0: usize,
        eps: f32,
        q_out: &mut [f32],
        k_cache: &mut [u16],
        v_cache: &mut [u16],
    ) -> Result<()> {
        let lens = [q.len(), k.len(), v.len(), q_norm.len(), k_norm.len(), rope.len(), q_out.len(), k_cache.len(), v_cache.len()];
        check_prep(shape, strides, pos0, lens, true)?;
        let s = shape;
        let pos = [pos0 as u32];
        let mut a = SimArgs::new();
        a.input(q).input(k).input(v).input(q_norm).input(k_norm).input(rope);
        a.u32(s.tokens as u32).u32(s.n_q as u32).u32(s.n_kv as u32).u32(s.hd as u32).u32(s.n_rot as u32).u32(strides.q as u32).u32(strides.kv as u32).input(&pos).u32(s.n_ctx as u32).f32(eps);
        a.output(q_out).output(k_cache).output(v_cache);
        let rows = s.tokens * (s.n_q + 2 * s.n_kv);
        self.run(PREP, rows.div_ceil(ATTN_PREP_WARPS as usize) as u32, None, &a)
    }

    fn attention(&self, q: &[f32], k_cache: &[u16], v_cache: &[u16], shape: AttnShape, pos0: usize, scale: f32, out: &mut [f32]) -> Result<()> {
        check_attention(shape, pos0, [q.len(), k_cache.len(), v_cache.len(), out.len()], true)?;
        let s = shape;
        let ctx_bound = pos0 + s.tokens;
        let split = attn_split(ctx_bound.min(s.n_ctx));
        let band = self.attn_band.unwrap_or_else(|| attn_band(s.n_q, s.n_kv, s.hd, s.tokens, split, attn_band_min_blocks(self.sms)));
        if !attn_band_fits(s.n_q, s.n_kv, s.hd, band) {
            return Err(Error::Shape { kernel: CHUNK, detail: format!("a band of {band} query heads does not fit {} heads of {} values over {} groups", s.n_q, s.hd, s.n_kv) });
        }
        let wanted = attn_lean_wanted(s.tokens, s.n_q, band, split, self.sms);
        // The simulator compiles the lean entry, as the cuda backend's sm_90 image has it.
        let kernel = self.knobs.attn_chunk_entry(band, s.hd, true, wanted).map_err(|e| Error::Request(format!("sim: {CHUNK}: kernel knobs: {e}")))?;
        let direct = ctx_bound <= ATTN_CHUNK;
        // Poisoned, as on the cuda backend: a part the merge reads but no block wrote shows.
        let mut part = vec![f32::from_bits(POISON_F32); attn_part_len(s)];
        let pos = [pos0 as u32];
        let (tokens, n_q, n_kv, hd, n_ctx) = (s.tokens as u32, s.n_q as u32, s.n_kv as u32, s.hd as u32, s.n_ctx as u32);
        let blocks = (s.tokens * (s.n_q / band) * split) as u32;
        let mut a = SimArgs::new();
        a.input(q).input(k_cache).input(v_cache).u32(tokens).u32(n_q).u32(n_kv).u32(hd).input(&pos).f32(scale).u32(n_ctx).u32(split as u32).u32(band as u32);
        if direct {
            a.output(&mut part).output(out).null();
            return self.run(kernel, blocks, None, &a);
        }
        a.output(&mut part).null().null();
        self.run(kernel, blocks, None, &a)?;
        let mut a = SimArgs::new();
        a.input(&part).u32(tokens).u32(n_q).u32(hd).input(&pos).u32(n_ctx).output(out).null();
        self.run(MERGE, tokens * n_q, None, &a)
    }

    fn prep_attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        q_norm: &[f32],
        k_norm: &[f32],
        rope: &[f32],
        shape: AttnShape,
        pos0: usize,
        eps: f32,
        scale: f32,
        k_cache: &mut [u16],
        v_cache: &mut [u16],
        out: &mut [f32],
    ) -> Result<()> {
        let lens = [q.len(), k.len(), v.len(), q_norm.len(), k_norm.len(), rope.len(), k_cache.len(), v_cache.len(), out.len()];
        let (s, strides) = (shape, shape.dense());
        check_prep_attention(s, strides, pos0, lens, true)?;
        // The band the step would launch: the rule's for a one-chunk context (split 1).
        let band = self.attn_band.unwrap_or_else(|| attn_band(s.n_q, s.n_kv, s.hd, s.tokens, 1, attn_band_min_blocks(self.sms)));
        let kernel = prep_chunk_entry(s, pos0 + s.tokens, band)?;
        let pos = [pos0 as u32];
        let mut a = SimArgs::new();
        a.input(q).input(k).input(v).input(q_norm).input(k_norm).input(rope);
        a.u32(s.tokens as u32).u32(s.n_q as u32).u32(s.n_kv as u32).u32(s.hd as u32).u32(s.n_rot as u32).u32(strides.q as u32).u32(strides.kv as u32);
        a.input(&pos).u32(s.n_ctx as u32).f32(eps).f32(scale);
        a.output(k_cache).output(v_cache).output(out).null();
        self.run(kernel, (s.tokens * (s.n_q / band)) as u32, None, &a)
    }
}

/// One random window and every input of its two launches.
#[derive(Clone, Debug)]
pub struct AttnCase {
    pub shape: AttnShape,
    pub pos0: usize,
    pub eps: f32,
    pub scale: f32,
    pub freq_base: f32,
    /// The projections (`attn_prep`'s inputs); `q` is also `attention`'s query.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub rope: Vec<f32>,
    /// Random fp16 at positions up to the window's last, NaN after it (a kernel that reads past
    /// a token's context gets NaN values into its output).
    pub k_cache: Vec<u16>,
    pub v_cache: Vec<u16>,
    /// `attn_prep` reads `q`, `k` and `v` as views into one buffer of fused projection rows
    /// ([`AttnShape::fused`] strides) instead of packed ([`AttnShape::dense`]).
    pub fused: bool,
}

/// Windows `(tokens, pos0)` at the chunk boundaries: a context of 1, exactly 256, 257 and 512
/// keys, and windows whose contexts cross or end on a boundary.
pub const BOUNDARY_WINDOWS: [(usize, usize); 6] = [(1, 0), (1, 255), (1, 256), (1, 511), (8, 250), (8, 504)];

/// Windows whose contexts pass 16 and 32 chunks (the GPU's grids double there), one key past
/// the boundary and a window crossing it.
pub const LONG_WINDOWS: [(usize, usize); 2] = [(1, 16 * ATTN_CHUNK), (8, 32 * ATTN_CHUNK - 3)];

impl AttnCase {
    /// A random case of `tokens` tokens at `pos0`; the head counts, head size and `n_rot` drawn
    /// from the shapes that matter (hd 64 and 128; 4/2, 8/1 and 16/4 heads; full and partial
    /// RoPE).
    pub fn random(rng: &mut SmallRng, tokens: usize, pos0: usize) -> AttnCase {
        let hd = [64, 128][rng.random_range(0..2)];
        let (n_q, n_kv) = [(4, 2), (8, 1), (16, 4)][rng.random_range(0..3)];
        AttnCase::random_heads(rng, tokens, pos0, (n_q, n_kv, hd))
    }

    /// As [`Self::random`] with the heads `(n_q, n_kv, hd)` given.
    pub fn random_heads(rng: &mut SmallRng, tokens: usize, pos0: usize, (n_q, n_kv, hd): (usize, usize, usize)) -> AttnCase {
        let n_rot = [hd, hd, hd / 2, 32][rng.random_range(0..4)];
        let n_ctx = pos0 + tokens + rng.random_range(0..300);
        let shape = AttnShape { tokens, n_q, n_kv, hd, n_rot, n_ctx };
        let freq_base = [10_000.0, 1_000_000.0][rng.random_range(0..2)];
        // Query magnitudes from flat to sharply peaked softmaxes (scores spread up to ~10).
        let q_mag = 10f32.powf(rng.random_range(-0.5..1.5));
        let mut uniform = |n: usize, mag: f32| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0) * mag).collect() };
        let (q, k, v) = (uniform(shape.q_len(), q_mag), uniform(shape.kv_len(), 3.0), uniform(shape.kv_len(), 2.0));
        let (q_norm, k_norm) = (uniform(hd, 2.0), uniform(hd, 2.0));
        let filled = (pos0 + tokens) * n_kv * hd;
        let mut cache = |mag: f32| -> Vec<u16> {
            (0..shape.cache_len()).map(|i| if i < filled { f32_to_f16(rng.random_range(-1.0f32..1.0) * mag) } else { 0x7e00 }).collect()
        };
        let (k_cache, v_cache) = (cache(1.0), cache(2.0));
        AttnCase {
            shape,
            pos0,
            eps: 1e-6,
            scale: (1.0 / (hd as f64).sqrt()) as f32,
            freq_base,
            q,
            k,
            v,
            q_norm,
            k_norm,
            rope: rope_table(n_ctx, n_rot, freq_base),
            k_cache,
            v_cache,
            fused: false,
        }
    }

    /// The case with `attn_prep`'s inputs fused ([`AttnCase::fused`]).
    pub fn as_fused(&self) -> AttnCase {
        AttnCase { fused: true, ..self.clone() }
    }

    /// The cache range of the window's positions.
    fn window_range(&self) -> std::ops::Range<usize> {
        let row = self.shape.n_kv * self.shape.hd;
        self.pos0 * row..(self.pos0 + self.shape.tokens) * row
    }

    /// The caches `attn_prep` gets: the window's positions poisoned.
    fn prep_caches(&self) -> (Vec<u16>, Vec<u16>) {
        let (mut k, mut v) = (self.k_cache.clone(), self.v_cache.clone());
        k[self.window_range()].fill(POISON_F16);
        v[self.window_range()].fill(POISON_F16);
        (k, v)
    }

    /// One backend's results of a run that writes an f32 output (`out`: `attn_prep`'s queries
    /// or the attention's output) and the window's cache rows into [`Self::prep_caches`]: notes
    /// in `unwritten` the output values and the window's cache values left poisoned, in `stray`
    /// (the first backend to do so) a cache value changed outside the window, and returns the
    /// words the backends are compared on (the output's, then both whole caches'; described by
    /// [`describe_cache_run_word`]).
    fn cache_run_words(&self, backend: &str, out: &[f32], kc: &[u16], vc: &[u16], unwritten: &mut Vec<(String, usize, usize)>, stray: &mut Option<Mismatch>) -> Vec<u32> {
        let window = self.window_range();
        let (before_k, before_v) = self.prep_caches();
        let left = out.iter().map(|v| v.to_bits() == POISON_F32).chain(kc[window.clone()].iter().chain(&vc[window.clone()]).map(|&h| h == POISON_F16));
        note_unwritten(unwritten, backend, left);
        let outside = |c: &[u16], before: &[u16]| (0..c.len()).find(|i| !window.contains(i) && c[*i] != before[*i]);
        if let Some((i, c, before)) = outside(kc, &before_k).map(|i| (i, kc, &before_k)).or(outside(vc, &before_v).map(|i| (i, vc, &before_v))) {
            let got = format!("{:#06x} at cache index {i} outside the window", c[i]);
            stray.get_or_insert(Mismatch { backend: backend.into(), index: i, got, want: format!("{:#06x} (untouched)", before[i]) });
        }
        out.iter().map(|v| v.to_bits()).chain(kc.iter().chain(vc).map(|&h| h as u32)).collect()
    }

    /// `attn_prep` on `b` for tokens `first .. first + tokens` of the window alone (at their
    /// own positions), into poisoned outputs: `q_out` and both caches.
    fn run_prep(&self, b: &dyn AttentionOps, first: usize, tokens: usize) -> Result<(Vec<f32>, Vec<u16>, Vec<u16>)> {
        let s = AttnShape { tokens, ..self.shape };
        let mut q_out = vec![f32::from_bits(POISON_F32); s.q_len()];
        let (mut kc, mut vc) = self.prep_caches();
        let (buf, [q, k, v], strides) = self.prep_inputs(s, first);
        b.attn_prep(&buf[q], &buf[k], &buf[v], strides, &self.q_norm, &self.k_norm, &self.rope, s, self.pos0 + first, self.eps, &mut q_out, &mut kc, &mut vc)?;
        Ok((q_out, kc, vc))
    }

    /// `attn_prep`'s inputs for the `s.tokens` tokens from `first`, in one buffer: q's rows,
    /// then k's, then v's; or (fused) each token's q, k and v values in one row. With the range
    /// of the buffer each of q, k, v spans and their strides.
    fn prep_inputs(&self, s: AttnShape, first: usize) -> (Vec<f32>, [std::ops::Range<usize>; 3], QkvStrides) {
        let (q_row, kv_row) = (s.n_q * s.hd, s.n_kv * s.hd);
        let (q, k, v) = (&self.q[first * q_row..][..s.q_len()], &self.k[first * kv_row..][..s.kv_len()], &self.v[first * kv_row..][..s.kv_len()]);
        if !self.fused {
            return ([q, k, v].concat(), [0..q.len(), q.len()..q.len() + k.len(), q.len() + k.len()..q.len() + 2 * k.len()], s.dense());
        }
        let row = |x: &[f32], n: usize, t: usize| x[t * n..(t + 1) * n].to_vec();
        let buf: Vec<f32> = (0..s.tokens).flat_map(|t| [row(q, q_row, t), row(k, kv_row, t), row(v, kv_row, t)].concat()).collect();
        let strides = s.fused();
        let kv_span = s.span(strides.kv, kv_row);
        (buf, [0..s.span(strides.q, q_row), q_row..q_row + kv_span, q_row + kv_row..q_row + kv_row + kv_span], strides)
    }

    /// The attention on `b` for tokens `first .. first + tokens` alone, into a poisoned output.
    fn run_attention(&self, b: &dyn AttentionOps, first: usize, tokens: usize) -> Result<Vec<f32>> {
        let s = AttnShape { tokens, ..self.shape };
        let mut out = vec![f32::from_bits(POISON_F32); s.q_len()];
        let q = &self.q[first * s.n_q * s.hd..(first + tokens) * s.n_q * s.hd];
        b.attention(q, &self.k_cache, &self.v_cache, s, self.pos0 + first, self.scale, &mut out)?;
        Ok(out)
    }

    fn describe(&self) -> String {
        let s = self.shape;
        let layout = if self.fused { " fused q/k/v" } else { "" };
        format!("T{} q{}/kv{} hd{} rot{} pos0 {} ctx {}{layout}", s.tokens, s.n_q, s.n_kv, s.hd, s.n_rot, self.pos0, s.n_ctx)
    }

    /// Float64 RMSNorm and RoPE (cos and sin of the exact angle) of one head row at `pos`.
    fn norm_rope_f64(&self, x: &[f32], w: &[f32], pos: usize) -> Vec<f64> {
        let mean = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (mean + self.eps as f64).sqrt();
        let mut y: Vec<f64> = x.iter().zip(w).map(|(&x, &w)| x as f64 * r * w as f64).collect();
        let n_rot = self.shape.n_rot;
        for i in 0..n_rot / 2 {
            let theta = pos as f64 * (self.freq_base as f64).powf(-2.0 * i as f64 / n_rot as f64);
            let (x0, x1) = (y[i], y[i + n_rot / 2]);
            y[i] = x0 * theta.cos() - x1 * theta.sin();
            y[i + n_rot / 2] = x0 * theta.sin() + x1 * theta.cos();
        }
        y
    }

    /// Float64 `attn_prep`: `q_out`, then the window's key rows, then its value rows.
    fn prep_f64(&self) -> Vec<f64> {
        let hd = self.shape.hd;
        let mut out = Vec::new();
        for (r, x) in self.q.chunks_exact(hd).enumerate() {
            out.extend(self.norm_rope_f64(x, &self.q_norm, self.pos0 + r / self.shape.n_q));
        }
        for (r, x) in self.k.chunks_exact(hd).enumerate() {
            out.extend(self.norm_rope_f64(x, &self.k_norm, self.pos0 + r / self.shape.n_kv));
        }
        out.extend(self.v.iter().map(|&v| v as f64));
        out
    }

    /// Float64 attention over the fp16 cache values: softmax of the scaled dot products, then
    /// the weighted sum of the values, per (token, query head).
    fn attention_f64(&self) -> Vec<f64> {
        let AttnShape { n_q, n_kv, hd, .. } = self.shape;
        let at = |c: &[u16], pos: usize, g: usize| -> Vec<f64> { c[(pos * n_kv + g) * hd..][..hd].iter().map(|&h| f16_to_f32(h) as f64).collect() };
        let mut out = Vec::new();
        for (row, q) in self.q.chunks_exact(hd).enumerate() {
            let (t, g) = (row / n_q, row % n_q / (n_q / n_kv));
            let len = self.pos0 + t + 1;
            let s: Vec<f64> = (0..len).map(|j| self.scale as f64 * at(&self.k_cache, j, g).iter().zip(q).map(|(k, &q)| k * q as f64).sum::<f64>()).collect();
            let m = s.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            let p: Vec<f64> = s.iter().map(|&v| (v - m).exp()).collect();
            let total: f64 = p.iter().sum();
            let mut o = vec![0.0f64; hd];
            for (j, &pj) in p.iter().enumerate() {
                for (o, v) in o.iter_mut().zip(at(&self.v_cache, j, g)) {
                    *o += pj * v;
                }
            }
            out.extend(o.into_iter().map(|o| o / total));
        }
        out
    }
}

/// `attn_prep` of `case` on every backend: `q_out` and both whole caches identical, the
/// window's values all written, the other cache positions untouched, and the first backend's
/// `q_out`, keys and values against float64.
pub fn prep_case(backends: &[&dyn AttentionOps], case: &AttnCase, seed: u64) -> Result<Outcome> {
    let window = case.window_range();
    let (mut outs, mut unwritten, mut stray, mut first) = (Vec::new(), Vec::new(), None, Vec::new());
    for &b in backends {
        let (q_out, kc, vc) = case.run_prep(b, 0, case.shape.tokens)?;
        if first.is_empty() {
            first = q_out.iter().copied().chain(kc[window.clone()].iter().chain(&vc[window.clone()]).map(|&h| f16_to_f32(h))).collect();
        }
        outs.push((b.name().to_string(), case.cache_run_words(b.name(), &q_out, &kc, &vc, &mut unwritten, &mut stray)));
    }
    let mismatch = compare_bits(&outs, |i, v| describe_cache_run_word(case.shape, i, v, |i, v| format!("q_out {:e} ({v:#010x}) at {i}", f32::from_bits(v))));
    Ok(Outcome {
        kernel: PREP.into(),
        shape: case.describe(),
        seed,
        backends: outs.into_iter().map(|o| o.0).collect(),
        mismatch: mismatch.or(stray),
        unwritten,
        nmse: Some(nmse(&first, &case.prep_f64())),
        nmse_max: NMSE_MAX,
    })
}

/// Word `i` (`v`) of the words [`AttnCase::cache_run_words`] returns for `shape`: `output`
/// describes the f32 output's; the caches' are named with their index.
fn describe_cache_run_word(shape: AttnShape, i: usize, v: u32, output: impl Fn(usize, u32) -> String) -> String {
    let (nq, nc) = (shape.q_len(), shape.cache_len());
    match i {
        i if i < nq => output(i, v),
        i if i < nq + nc => format!("k_cache {v:#06x} at {}", i - nq),
        i => format!("v_cache {v:#06x} at {}", i - nq - nc),
    }
}

/// The attention of `case` on every backend: outputs identical and all written, the first
/// backend's against float64.
pub fn attention_case(backends: &[&dyn AttentionOps], case: &AttnCase, seed: u64) -> Result<Outcome> {
    let (mut outs, mut unwritten, mut first) = (Vec::new(), Vec::new(), Vec::new());
    for &b in backends {
        let out = case.run_attention(b, 0, case.shape.tokens)?;
        note_unwritten(&mut unwritten, b.name(), out.iter().map(|v| v.to_bits() == POISON_F32));
        if first.is_empty() {
            first = out.clone();
        }
        outs.push((b.name().to_string(), out.iter().map(|v| v.to_bits()).collect()));
    }
    let row = case.shape.n_q * case.shape.hd;
    let mismatch = compare_bits(&outs, |i, v| {
        format!("{:e} ({v:#010x}) (token {}, head {}, value {})", f32::from_bits(v), i / row, i % row / case.shape.hd, i % case.shape.hd)
    });
    Ok(Outcome {
        kernel: "attention".into(),
        shape: case.describe(),
        seed,
        backends: outs.into_iter().map(|o| o.0).collect(),
        mismatch,
        unwritten,
        nmse: Some(nmse(&first, &case.attention_f64())),
        nmse_max: NMSE_MAX,
    })
}

/// `prep_attention` (the fused prep and one-chunk attention of a window) of `case` on every
/// backend: the attention output and both whole caches identical, the output and the window's
/// cache rows all written, the other cache positions untouched. (The first backend, the CPU,
/// runs `attn_prep` and the attention, which [`prep_case`] and [`attention_case`] hold to
/// float64.)
pub fn prep_attention_case(backends: &[&dyn AttentionOps], case: &AttnCase, seed: u64) -> Result<Outcome> {
    let s = case.shape;
    let (mut outs, mut unwritten, mut stray) = (Vec::new(), Vec::new(), None);
    for &b in backends {
        let mut out = vec![f32::from_bits(POISON_F32); s.q_len()];
        let (mut kc, mut vc) = case.prep_caches();
        b.prep_attention(&case.q, &case.k, &case.v, &case.q_norm, &case.k_norm, &case.rope, s, case.pos0, case.eps, case.scale, &mut kc, &mut vc, &mut out)?;
        outs.push((b.name().to_string(), case.cache_run_words(b.name(), &out, &kc, &vc, &mut unwritten, &mut stray)));
    }
    let output = |i: usize, v: u32| format!("output {:e} ({v:#010x}) at {i} (head {}, value {})", f32::from_bits(v), i / s.hd, i % s.hd);
    let mismatch = compare_bits(&outs, |i, v| describe_cache_run_word(s, i, v, output));
    Ok(Outcome {
        kernel: FUSED.into(),
        shape: case.describe(),
        seed,
        backends: outs.into_iter().map(|o| o.0).collect(),
        mismatch: mismatch.or(stray),
        unwritten,
        nmse: None,
        nmse_max: NMSE_MAX,
    })
}

/// [`prep_attention_case`] from `seed` for the shapes the fused launch takes (contexts of one
/// chunk, heads of 128 values in groups the band of two divides: 4/2, 16/1 and 32/4, the
/// qwen3moe 30B-A3B's): one token at the chunk's first and last positions, windows of 8 from
/// the first position and ending on the last, and random windows of 1..=8 tokens.
pub fn prep_attention_cases(backends: &[&dyn AttentionOps], seed: u64) -> Result<Vec<Outcome>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let heads = [(4, 2, 128), (16, 1, 128), (32, 4, 128)];
    let mut windows = vec![(1, 0), (1, ATTN_CHUNK - 1), (8, 0), (8, ATTN_CHUNK - 8)];
    windows.extend((0..4).map(|_| {
        let tokens = rng.random_range(1..=8);
        (tokens, rng.random_range(0..=ATTN_CHUNK - tokens))
    }));
    for (i, (tokens, pos0)) in windows.into_iter().enumerate() {
        let case_seed = rng.random();
        let case = AttnCase::random_heads(&mut SmallRng::seed_from_u64(case_seed), tokens, pos0, heads[i % heads.len()]);
        out.push(prep_attention_case(backends, &case, case_seed)?);
    }
    Ok(out)
}

/// WINDOW INVARIANCE on `b` for a random window of 2..=8 tokens: each token's `q_out` row, its
/// key and value cache rows and its attention output, computed in the window, against the same
/// computed with the token alone at its position (same inputs, same cache), bit for bit.
pub fn window_case(b: &dyn AttentionOps, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (tokens, pos0) = (rng.random_range(2..=8), rng.random_range(0..1500));
    let case = AttnCase { fused: rng.random(), ..AttnCase::random(&mut rng, tokens, pos0) };
    let AttnShape { n_q, n_kv, hd, .. } = case.shape;
    let (q_row, kv_row) = (n_q * hd, n_kv * hd);
    // One token's words: q_out row, key row, value row, attention row.
    let words = |q_out: &[f32], kc: &[u16], vc: &[u16], out: &[f32], t: usize, pos: usize| -> Vec<u32> {
        let q = q_out[t * q_row..(t + 1) * q_row].iter().map(|v| v.to_bits());
        let cache = kc[pos * kv_row..(pos + 1) * kv_row].iter().chain(&vc[pos * kv_row..(pos + 1) * kv_row]).map(|&h| h as u32);
        q.chain(cache).chain(out[t * q_row..(t + 1) * q_row].iter().map(|v| v.to_bits())).collect()
    };
    let (q_out, kc, vc) = case.run_prep(b, 0, tokens)?;
    let out = case.run_attention(b, 0, tokens)?;
    let (mut window, mut alone) = (Vec::new(), Vec::new());
    for t in 0..tokens {
        window.extend(words(&q_out, &kc, &vc, &out, t, case.pos0 + t));
        let (q1, kc1, vc1) = case.run_prep(b, t, 1)?;
        alone.extend(words(&q1, &kc1, &vc1, &case.run_attention(b, t, 1)?, 0, case.pos0 + t));
    }
    let per_token = 2 * q_row + 2 * kv_row;
    let mismatch = compare_bits(&[("window".into(), window), ("alone".into(), alone)], |i, v| {
        let (t, j) = (i / per_token, i % per_token);
        let what = match j {
            j if j < q_row => "q_out",
            j if j < q_row + kv_row => "k_cache",
            j if j < q_row + 2 * kv_row => "v_cache",
            _ => "attention",
        };
        format!("{what} {v:#010x} (token {t}, word {j})")
    });
    Ok(Outcome {
        kernel: "attention window invariance".into(),
        shape: case.describe(),
        seed,
        backends: vec![format!("{}/window", b.name()), format!("{}/alone", b.name())],
        mismatch,
        unwritten: Vec::new(),
        nmse: None,
        nmse_max: NMSE_MAX,
    })
}

/// The family's parity suite from `seed`: `attn_prep` (its inputs packed and fused) and the
/// attention on every backend for the [`BOUNDARY_WINDOWS`] and random windows of 1..=8 tokens
/// at positions up to 1500 (so contexts span up to six chunks), random head shapes.
/// `backends[0]` is the reference.
pub fn parity_cases(backends: &[&dyn AttentionOps], seed: u64) -> Result<Vec<Outcome>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut windows = [BOUNDARY_WINDOWS.as_slice(), LONG_WINDOWS.as_slice()].concat();
    windows.extend((0..8).map(|_| (rng.random_range(1..=8), rng.random_range(0..=1500))));
    let mut out = Vec::new();
    for (tokens, pos0) in windows {
        let case_seed = rng.random();
        let case = AttnCase::random(&mut SmallRng::seed_from_u64(case_seed), tokens, pos0);
        out.push(prep_case(backends, &case, case_seed)?);
        out.push(prep_case(backends, &case.as_fused(), case_seed)?);
        out.push(attention_case(backends, &case, case_seed)?);
    }
    Ok(out)
}
