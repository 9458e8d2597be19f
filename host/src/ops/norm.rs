//! The norm family of the decode step: the embedding rows (`embed_rows_<tag>`), RMSNorm
//! (`rms_norm`), RMSNorm with the q8_1 quantization of its output (`rms_norm_q8_1`) and the
//! residual add (`add_f32`). [`NormOps`] (host slices, what parity runs) for the CPU replica and
//! the GPU backends, the typed launchers on device buffers (`embed_rows_queue`,
//! `rms_norm_queue`, `rms_norm_q8_1_queue`, `add_into_queue`), and [`parity_cases`].
use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::backends::cpu::CpuBackend;
use crate::backends::{exact_len, shape_err};
use crate::error::Result;
use crate::gguf::GgmlType;
use crate::backends::gpu::{holds, GpuBackend};
#[cfg(feature = "sim")]
use crate::backends::sim::{Args as SimArgs, SimBackend};
use crate::parity::{compare_bits, note_unwritten, random_weights, Outcome, NMSE_MAX, POISON_F32};
use crate::reference::{nmse, rms_norm_f64};
use strata_gpu_shared::formats::{q8_1, FloatFormat, GROUP};
use strata_gpu_shared::launch::norm::{nq_parts, nq_smem, EmbedTable, ADD_THREADS, EMBED_THREADS, NORM_MAX_N, NORM_WARPS, NQ_MAX_N};
use strata_gpu_shared::replica;

const RMS: &str = "rms_norm";
const NQ: &str = "rms_norm_q8_1";
const ADD: &str = "add_f32";
/// Grid blocks one launch may take.
const MAX_BLOCKS: usize = i32::MAX as usize;

/// The family's kernels on host slices.
pub trait NormOps {
    fn name(&self) -> &'static str;

    /// `out[t * n + j]` = value `j` of row `ids[t]` of `table` (`n_rows >= 1` rows of `n` values
    /// of `ty`) widened to f32 (`replica::embed`); a row of quiet NaN for an id `>= n_rows`.
    fn embed_rows(&self, table: &[u8], ty: GgmlType, n_rows: usize, n: usize, ids: &[u32], out: &mut [f32]) -> Result<()>;

    /// RMSNorm of each row of `n` values of `x` (`n` a multiple of 32, at most `NORM_MAX_N`),
    /// times the weights `w` (`replica::norm::rms_norm_row`).
    fn rms_norm(&self, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) -> Result<()>;

    /// [`Self::rms_norm`] into `out`, then the q8_1 blocks of `out` into `xq` (`n / 32` a row):
    /// `replica::norm::rms_norm_q8_1_row`. `n` a multiple of 32, at most `NQ_MAX_N`.
    fn rms_norm_q8_1(&self, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32], xq: &mut [u8]) -> Result<()>;

    /// `out[i] = a[i] + b[i]`.
    fn add(&self, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()>;
}

/// The embedding table type of a GGUF tensor type.
pub fn embed_table(ty: GgmlType) -> EmbedTable {
    match ty {
        GgmlType::F32 => EmbedTable::Float(FloatFormat::F32),
        GgmlType::F16 => EmbedTable::Float(FloatFormat::F16),
        GgmlType::Bf16 => EmbedTable::Float(FloatFormat::Bf16),
        GgmlType::Quant(f) => EmbedTable::Quant(f),
    }
}



/// Checks an `embed_rows` shape; returns the table type and its bytes per row.
fn check_embed(ty: GgmlType, n_rows: usize, n: usize, tokens: usize) -> Result<(EmbedTable, usize)> {
    let table = embed_table(ty);
    let kernel = table.kernel();
    if n == 0 || n % table.block_values() != 0 || n > u32::MAX as usize {
        return Err(shape_err(kernel, format!("row length {n} is not a positive multiple of the {} block ({})", table.name(), table.block_values())));
    }
    if n_rows == 0 || n_rows > u32::MAX as usize {
        return Err(shape_err(kernel, format!("a table of {n_rows} rows (1..=u32::MAX)")));
    }
    if tokens > u32::MAX as usize || tokens * n.div_ceil(EMBED_THREADS as usize) > MAX_BLOCKS {
        return Err(shape_err(kernel, format!("{tokens} tokens of {n} values exceed one launch")));
    }
    Ok((table, table.row_bytes(n)))
}

/// Checks an `rms_norm` shape.
fn check_rms(rows: usize, n: usize) -> Result<()> {
    if n == 0 || n % 32 != 0 || n > NORM_MAX_N {
        return Err(shape_err(RMS, format!("row length {n} is not a multiple of 32 in 32..={NORM_MAX_N}")));
    }
    if rows.div_ceil(NORM_WARPS as usize) > MAX_BLOCKS {
        return Err(shape_err(RMS, format!("{rows} rows exceed one launch")));
    }
    Ok(())
}

/// Checks an `rms_norm_q8_1` shape: the row fits the block's shared memory (`NQ_MAX_N`).
fn check_nq(rows: usize, n: usize) -> Result<()> {
    if n == 0 || !n.is_multiple_of(GROUP) || n > NQ_MAX_N {
        return Err(shape_err(NQ, format!("row length {n} is not a multiple of {GROUP} in {GROUP}..={NQ_MAX_N} (a row is staged in 48 KiB of shared memory)")));
    }
    if rows.saturating_mul(nq_parts(n as u32) as usize) > MAX_BLOCKS {
        return Err(shape_err(NQ, format!("{rows} rows exceed one launch")));
    }
    Ok(())
}

/// Bytes of the q8_1 blocks of `rows` rows of `n` values (`n` a multiple of 32).
fn q8_1_bytes(rows: usize, n: usize) -> usize {
    q8_1::bytes_of(rows * n)
}

fn check_add(n: usize) -> Result<()> {
    if n > u32::MAX as usize {
        return Err(shape_err(ADD, format!("{n} values exceed one launch")));
    }
    Ok(())
}

/// The host-slice `embed_rows` call's sizes, exact; returns the table type and its row bytes.
fn embed_slices(table: &[u8], ty: GgmlType, n_rows: usize, n: usize, ids: &[u32], out: &[f32]) -> Result<(EmbedTable, usize)> {
    let (t, row_bytes) = check_embed(ty, n_rows, n, ids.len())?;
    exact_len(t.kernel(), "table", table.len(), n_rows.saturating_mul(row_bytes))?;
    exact_len(t.kernel(), "output", out.len(), ids.len() * n)?;
    Ok((t, row_bytes))
}

/// The host-slice `rms_norm` call's sizes, exact; returns the number of rows.
fn rms_slices(x: &[f32], w: &[f32], n: usize, out: &[f32]) -> Result<usize> {
    if n == 0 || x.len() % n != 0 {
        return Err(shape_err(RMS, format!("{} values are not whole rows of {n}", x.len())));
    }
    check_rms(x.len() / n, n)?;
    exact_len(RMS, "weights", w.len(), n)?;
    exact_len(RMS, "output", out.len(), x.len())?;
    Ok(x.len() / n)
}

/// The host-slice `rms_norm_q8_1` call's sizes, exact; returns the number of rows.
fn nq_slices(x: &[f32], w: &[f32], n: usize, out: &[f32], xq: &[u8]) -> Result<usize> {
    if n == 0 || !x.len().is_multiple_of(n) {
        return Err(shape_err(NQ, format!("{} values are not whole rows of {n}", x.len())));
    }
    let rows = x.len() / n;
    check_nq(rows, n)?;
    exact_len(NQ, "weights", w.len(), n)?;
    exact_len(NQ, "output", out.len(), x.len())?;
    exact_len(NQ, "q8_1 output", xq.len(), q8_1_bytes(rows, n))?;
    Ok(rows)
}

/// The host-slice `add` call's sizes, exact.
fn add_slices(a: &[f32], b: &[f32], out: &[f32]) -> Result<()> {
    check_add(a.len())?;
    exact_len(ADD, "b", b.len(), a.len())?;
    exact_len(ADD, "output", out.len(), a.len())
}

impl NormOps for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn embed_rows(&self, table: &[u8], ty: GgmlType, n_rows: usize, n: usize, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let (t, _) = embed_slices(table, ty, n_rows, n, ids, out)?;
        self.par_chunks(out, n, |first, chunk| replica::embed::embed_rows(t, table, n, &ids[first..first + chunk.len() / n], chunk));
        Ok(())
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) -> Result<()> {
        rms_slices(x, w, n, out)?;
        self.par_chunks(out, n, |first, chunk| {
            for (i, o) in chunk.chunks_exact_mut(n).enumerate() {
                replica::norm::rms_norm_row(&x[(first + i) * n..(first + i + 1) * n], w, eps, o);
            }
        });
        Ok(())
    }

    fn rms_norm_q8_1(&self, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32], xq: &mut [u8]) -> Result<()> {
        nq_slices(x, w, n, out, xq)?;
        // Rows in parallel (two outputs a row, so rayon's zip rather than `par_chunks`).
        out.par_chunks_mut(n).zip(xq.par_chunks_mut(q8_1_bytes(1, n))).enumerate().for_each(|(r, (o, q))| {
            replica::norm::rms_norm_q8_1_row(&x[r * n..(r + 1) * n], w, eps, o, q);
        });
        Ok(())
    }

    fn add(&self, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        add_slices(a, b, out)?;
        replica::norm::add(a, b, out);
        Ok(())
    }
}

impl GpuBackend {
    /// Queues `embed_rows_<tag>`: `out[t * n + j]` = value `j` of row `ids[t]` of `table`
    /// (`n_rows` rows of `n` values of `ty`) for `tokens` tokens, NaN rows for ids past the table.
    /// Buffers may be longer than needed.
    #[allow(clippy::too_many_arguments)]
    pub fn embed_rows_queue(
        &self,
        table: &CudaSlice<u8>,
        ty: GgmlType,
        n_rows: usize,
        n: usize,
        ids: &CudaSlice<u32>,
        tokens: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (t, row_bytes) = check_embed(ty, n_rows, n, tokens)?;
        let kernel = t.kernel();
        holds(kernel, "table", table.len(), n_rows.saturating_mul(row_bytes))?;
        holds(kernel, "ids", ids.len(), tokens)?;
        holds(kernel, "output", out.len(), tokens * n)?;
        if tokens == 0 {
            return Ok(());
        }
        let (row_bytes, n_rows, tokens, n) = (row_bytes as u64, n_rows as u32, tokens as u32, n as u32);
        let mut a = self.builder(kernel);
        a.arg(table).arg(&row_bytes).arg(&n_rows).arg(ids).arg(&tokens).arg(&n).arg(out);
        // SAFETY: the kernel's parameters in order; the table holds `n_rows` rows, `ids` and `out`
        // `tokens` ids and rows (checked above); ids past the table are never read through; blocks
        // past the last token return at once, so a padded grid is covered.
        unsafe { self.launch_async(kernel, self.padded_grid(kernel, tokens * n.div_ceil(EMBED_THREADS)), a) }
    }

    /// Queues `rms_norm` of `rows` rows of `n` values of `x` times `w` into `out` (a different
    /// buffer, which Rust's borrows guarantee). Buffers may be longer than needed.
    pub fn rms_norm_queue(&self, x: &CudaSlice<f32>, w: &CudaSlice<f32>, out: &mut CudaSlice<f32>, rows: usize, n: usize, eps: f32) -> Result<()> {
        check_rms(rows, n)?;
        holds(RMS, "input", x.len(), rows * n)?;
        holds(RMS, "weights", w.len(), n)?;
        holds(RMS, "output", out.len(), rows * n)?;
        if rows == 0 {
            return Ok(());
        }
        let (rows, n) = (rows as u32, n as u32);
        let mut a = self.builder(RMS);
        a.arg(x).arg(w).arg(out).arg(&rows).arg(&n).arg(&eps);
        // SAFETY: the kernel's parameters in order, buffers checked against the shape, `out` a
        // distinct allocation from `x`; warps past the last row return at once.
        unsafe { self.launch_async(RMS, self.padded_grid(RMS, rows.div_ceil(NORM_WARPS)), a) }
    }

    /// Queues `rms_norm_q8_1` of `rows` rows of `n` values of `x` times `w`: the normed rows
    /// into `out`, their q8_1 blocks (`n / 32` a row) into `xq`. `n` at most `NQ_MAX_N` (the
    /// row is staged in shared memory); longer rows take `rms_norm_queue` then
    /// `quantize_q8_1_queue`. Buffers may be longer than needed.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_q8_1_queue(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        xq: &mut CudaSlice<u8>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        check_nq(rows, n)?;
        holds(NQ, "input", x.len(), rows * n)?;
        holds(NQ, "weights", w.len(), n)?;
        holds(NQ, "output", out.len(), rows * n)?;
        holds(NQ, "q8_1 output", xq.len(), q8_1_bytes(rows, n))?;
        if rows == 0 {
            return Ok(());
        }
        let blocks = (rows * nq_parts(n as u32) as usize) as u32;
        let (rows, n) = (rows as u32, n as u32);
        let mut a = self.builder(NQ);
        a.arg(x).arg(w).arg(out).arg(xq).arg(&rows).arg(&n).arg(&eps);
        // SAFETY: the kernel's parameters in order; `x` and `out` checked to hold `rows * n`
        // values, `w` `n`, `xq` `rows * n / 32` q8_1 blocks, `n` a multiple of 32 up to
        // `NQ_MAX_N`, and the launch gives each block the `n * 4` bytes of shared memory its row
        // needs (within the default 48 KiB). Every buffer is a whole allocation, so `x` is
        // 16-byte aligned for the staging loads. `out` and `xq` are distinct allocations from
        // each other and from `x` and `w` (Rust does not hand out `&mut` and `&` to one buffer),
        // so `x` and `w` are unwritten during the launch and the outputs overlap nothing. Each
        // output element is written by one thread; the shared row is written before the block's
        // one barrier and only read after it. Blocks past the last row return before the
        // barrier, so a padded grid is covered.
        unsafe { self.launch_async_smem(NQ, self.padded_grid(NQ, blocks), nq_smem(n as usize), a) }
    }

    /// Queues `acc[i] += b[i]` for `i < n` (`add_f32` with `a = out = acc`). Buffers may be
    /// longer than needed.
    pub fn add_into_queue(&self, acc: &mut CudaSlice<f32>, b: &CudaSlice<f32>, n: usize) -> Result<()> {
        check_add(n)?;
        holds(ADD, "accumulator", acc.len(), n)?;
        holds(ADD, "b", b.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        // The builder cannot hold `&acc` and `&mut acc` at once, so `a` goes in as the address.
        let a_ptr = acc.device_ptr(self.stream()).0;
        let n = n as u32;
        let mut a = self.builder(ADD);
        a.arg(&a_ptr).arg(b).arg(acc).arg(&n);
        // SAFETY: the kernel's parameters in order, `acc` and `b` checked to hold `n` values.
        // Passing `acc` as both `a` and `out` is `add_f32`'s in-place contract: thread `i` alone
        // reads `a[i]` (through the coherent path, not the read-only cache) and then writes
        // `out[i]`, so no thread reads a value another thread writes. `b` is a different
        // allocation from `acc` (Rust does not hand out `&mut acc` and `&b` to one buffer), so it
        // is unwritten during the launch. Blocks past `n` return at once.
        unsafe { self.launch_async(ADD, self.padded_grid(ADD, n.div_ceil(ADD_THREADS)), a) }
    }
}

impl NormOps for GpuBackend {
    fn name(&self) -> &'static str {
        self.name_static()
    }

    fn embed_rows(&self, table: &[u8], ty: GgmlType, n_rows: usize, n: usize, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let kernel = embed_slices(table, ty, n_rows, n, ids, out)?.0.kernel();
        if ids.is_empty() {
            return Ok(());
        }
        let (dt, di) = (self.upload(kernel, table)?, self.upload(kernel, ids)?);
        let mut dout = self.upload_out(kernel, out)?;
        self.embed_rows_queue(&dt, ty, n_rows, n, &di, ids.len(), &mut dout)?;
        self.synchronize(kernel)?;
        self.download_out(kernel, &dout, out)
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) -> Result<()> {
        let rows = rms_slices(x, w, n, out)?;
        if rows == 0 {
            return Ok(());
        }
        let (dx, dw) = (self.upload(RMS, x)?, self.upload(RMS, w)?);
        let mut dout = self.upload_out(RMS, out)?;
        self.rms_norm_queue(&dx, &dw, &mut dout, rows, n, eps)?;
        self.synchronize(RMS)?;
        self.download_out(RMS, &dout, out)
    }

    fn rms_norm_q8_1(&self, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32], xq: &mut [u8]) -> Result<()> {
        let rows = nq_slices(x, w, n, out, xq)?;
        if rows == 0 {
            return Ok(());
        }
        let (dx, dw) = (self.upload(NQ, x)?, self.upload(NQ, w)?);
        let (mut dout, mut dxq) = (self.upload_out(NQ, out)?, self.upload_out(NQ, xq)?);
        self.rms_norm_q8_1_queue(&dx, &dw, &mut dout, &mut dxq, rows, n, eps)?;
        self.synchronize(NQ)?;
        self.download_out(NQ, &dout, out)?;
        self.download_out(NQ, &dxq, xq)
    }

    /// Runs the step's in-place path: `a` uploaded as the accumulator (with guard elements),
    /// `b` added into it, the result downloaded into `out`.
    fn add(&self, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        add_slices(a, b, out)?;
        if a.is_empty() {
            return Ok(());
        }
        let mut acc = self.upload_out(ADD, a)?;
        let db = self.upload(ADD, b)?;
        self.add_into_queue(&mut acc, &db, a.len())?;
        self.synchronize(ADD)?;
        self.download_out(ADD, &acc, out)
    }
}

/// The cuda backend's launches run by the simulator.
#[cfg(feature = "sim")]
impl NormOps for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn embed_rows(&self, table: &[u8], ty: GgmlType, n_rows: usize, n: usize, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let (t, row_bytes) = embed_slices(table, ty, n_rows, n, ids, out)?;
        if ids.is_empty() {
            return Ok(());
        }
        let (tokens, n) = (ids.len() as u32, n as u32);
        let mut a = SimArgs::new();
        a.input(table).u64(row_bytes as u64).u32(n_rows as u32).input(ids).u32(tokens).u32(n).output(out);
        self.run(t.kernel(), tokens * n.div_ceil(EMBED_THREADS), None, &a)
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) -> Result<()> {
        let rows = rms_slices(x, w, n, out)? as u32;
        if rows == 0 {
            return Ok(());
        }
        self.run(RMS, rows.div_ceil(NORM_WARPS), None, SimArgs::new().input(x).input(w).output(out).u32(rows).u32(n as u32).f32(eps))
    }

    fn rms_norm_q8_1(&self, x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32], xq: &mut [u8]) -> Result<()> {
        let rows = nq_slices(x, w, n, out, xq)? as u32;
        if rows == 0 {
            return Ok(());
        }
        let mut a = SimArgs::new();
        a.input(x).input(w).output(out).output(xq).u32(rows).u32(n as u32).f32(eps);
        self.run(NQ, rows * nq_parts(n as u32), Some(nq_smem(n)), &a)
    }

    /// The step's in-place path, as on the cuda backend: `a` copied into `out`, then `out`
    /// passed as both `a` and `out`.
    fn add(&self, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        add_slices(a, b, out)?;
        if a.is_empty() {
            return Ok(());
        }
        out.copy_from_slice(a);
        let (acc, n) = (out.as_ptr() as usize, a.len() as u32);
        self.run(ADD, n.div_ceil(ADD_THREADS), None, SimArgs::new().address(acc).input(b).output(out).u32(n))
    }
}

/// Random table bytes for `n_rows` rows of `n` values of `ty`: [`random_weights`] for the
/// quantized formats; random bit patterns for the float types (subnormals, infinities, every
/// exponent), NaN patterns turned into infinities, since GPUs need not keep a NaN's payload
/// through a conversion.
pub fn random_table(rng: &mut SmallRng, ty: GgmlType, n_rows: usize, n: usize) -> Vec<u8> {
    let (exp, man, bytes) = match embed_table(ty) {
        EmbedTable::Quant(f) => return random_weights(rng, f, n_rows, n),
        EmbedTable::Float(FloatFormat::F32) => (0x7f80_0000u32, 0x007f_ffffu32, 4),
        EmbedTable::Float(FloatFormat::F16) => (0x7c00, 0x03ff, 2),
        EmbedTable::Float(FloatFormat::Bf16) => (0x7f80, 0x007f, 2),
    };
    (0..n_rows * n)
        .flat_map(|_| {
            let bits: u32 = rng.random();
            let bits = if bits & exp == exp { bits & !man } else { bits };
            bits.to_le_bytes().into_iter().take(bytes)
        })
        .collect()
}

/// Runs one case's kernel on every backend into an f32 output of `len` values poisoned first;
/// returns the outputs as words and the unwritten counts.
#[allow(clippy::type_complexity)]
fn run_all(
    backends: &[&dyn NormOps],
    len: usize,
    run: impl Fn(&dyn NormOps, &mut [f32]) -> Result<()>,
) -> Result<(Vec<(String, Vec<u32>)>, Vec<(String, usize, usize)>)> {
    let (mut outs, mut unwritten) = (Vec::new(), Vec::new());
    for &b in backends {
        let mut y = vec![f32::from_bits(POISON_F32); len];
        run(b, &mut y)?;
        note_unwritten(&mut unwritten, b.name(), y.iter().map(|v| v.to_bits() == POISON_F32));
        outs.push((b.name().to_string(), y.iter().map(|v| v.to_bits()).collect()));
    }
    Ok((outs, unwritten))
}

/// The outcome of one case: the first difference (element `i` named as row `i / n`, column
/// `i % n`), the unwritten counts and the reference backend's NMSE, if measured.
fn outcome(kernel: &str, shape: String, seed: u64, n: usize, outs: Vec<(String, Vec<u32>)>, unwritten: Vec<(String, usize, usize)>, nmse: Option<f64>) -> Outcome {
    let mismatch = compare_bits(&outs, |i, v| format!("row {} value {}: {:e} ({v:#010x})", i / n, i % n, f32::from_bits(v)));
    Outcome { kernel: kernel.into(), shape, seed, backends: outs.into_iter().map(|o| o.0).collect(), mismatch, unwritten, nmse, nmse_max: NMSE_MAX }
}

fn first_output(outs: &[(String, Vec<u32>)]) -> Vec<f32> {
    outs[0].1.iter().map(|&w| f32::from_bits(w)).collect()
}

/// `embed_rows` for `ty` and rows of `n`: 1..=40 random table rows, 2..=8 tokens, one of whose
/// ids is past the table (the table's row count or `u32::MAX`).
fn embed_case(backends: &[&dyn NormOps], ty: GgmlType, n: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (n_rows, tokens) = (rng.random_range(1..=40usize), rng.random_range(2..=8usize));
    let table = random_table(&mut rng, ty, n_rows, n);
    let mut ids: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..n_rows as u32)).collect();
    ids[rng.random_range(0..tokens)] = if rng.random_bool(0.5) { n_rows as u32 } else { u32::MAX };
    let (outs, unwritten) = run_all(backends, tokens * n, |b, out| b.embed_rows(&table, ty, n_rows, n, &ids, out))?;
    Ok(outcome(embed_table(ty).kernel(), format!("{tokens} of {n_rows}x{n} ids {ids:?}"), seed, n, outs, unwritten, None))
}

/// A norm case's input from `rng`: `rows` rows of `n` values, each row at its own scale (1e-3
/// to 1e3), the second of three or more all zero (its scale is `1 / sqrt(eps)`); weights of
/// either sign; eps 1e-6 or 1e-5.
fn norm_input(rng: &mut SmallRng, rows: usize, n: usize) -> (Vec<f32>, Vec<f32>, f32) {
    let mut x = Vec::with_capacity(rows * n);
    for _ in 0..rows {
        let scale = 10f32.powf(rng.random_range(-3.0..3.0));
        x.extend((0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale));
    }
    if rows >= 3 {
        x[n..2 * n].fill(0.0);
    }
    let w: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    let eps = if rng.random_bool(0.5) { 1e-6 } else { 1e-5 };
    (x, w, eps)
}

/// `rms_norm` of `rows` rows of `n` ([`norm_input`]); the reference's NMSE against float64.
fn rms_norm_case(backends: &[&dyn NormOps], rows: usize, n: usize, seed: u64) -> Result<Outcome> {
    let (x, w, eps) = norm_input(&mut SmallRng::seed_from_u64(seed), rows, n);
    let (outs, unwritten) = run_all(backends, rows * n, |b, out| b.rms_norm(&x, &w, n, eps, out))?;
    let e = nmse(&first_output(&outs), &rms_norm_f64(&x, &w, n, eps));
    Ok(outcome(RMS, format!("{rows}x{n} eps {eps:e}"), seed, n, outs, unwritten, Some(e)))
}

/// `rms_norm_q8_1` of `rows` rows of `n` ([`norm_input`]). Each backend runs twice, `out`
/// poisoned with [`POISON_F32`] both times and `xq` filled with 0x00 and then 0xff (a byte the
/// runs disagree on was not written); `out` and the `xq` bytes are compared bit for bit as one
/// sequence; the reference's `out` against float64 (NMSE).
fn rms_norm_q8_1_case(backends: &[&dyn NormOps], rows: usize, n: usize, seed: u64) -> Result<Outcome> {
    let (x, w, eps) = norm_input(&mut SmallRng::seed_from_u64(seed), rows, n);
    let (len, qlen) = (rows * n, q8_1_bytes(rows, n));
    let (mut outs, mut unwritten) = (Vec::new(), Vec::new());
    for &b in backends {
        let mut runs = Vec::new();
        for fill in [0x00u8, 0xff] {
            let (mut o, mut q) = (vec![f32::from_bits(POISON_F32); len], vec![fill; qlen]);
            b.rms_norm_q8_1(&x, &w, n, eps, &mut o, &mut q)?;
            runs.push((o, q));
        }
        let ((o, q), (o2, q2)) = (&runs[0], &runs[1]);
        let poisoned = o.iter().zip(o2).map(|(v, v2)| v.to_bits() == POISON_F32 || v2.to_bits() == POISON_F32);
        note_unwritten(&mut unwritten, b.name(), poisoned.chain(q.iter().zip(q2).map(|(a, c)| a != c)));
        outs.push((b.name().to_string(), o.iter().map(|v| v.to_bits()).chain(q.iter().map(|&v| v as u32)).collect()));
    }
    let mismatch = compare_bits(&outs, |i, v| {
        if i < len {
            format!("out row {} value {}: {:e} ({v:#010x})", i / n, i % n, f32::from_bits(v))
        } else {
            let i = i - len;
            format!("xq block {} byte {}: {v:#04x}", i / q8_1::BYTES, i % q8_1::BYTES)
        }
    });
    let out0: Vec<f32> = outs[0].1[..len].iter().map(|&v| f32::from_bits(v)).collect();
    let e = nmse(&out0, &rms_norm_f64(&x, &w, n, eps));
    Ok(Outcome {
        kernel: NQ.into(),
        shape: format!("{rows}x{n} eps {eps:e}"),
        seed,
        backends: outs.into_iter().map(|o| o.0).collect(),
        mismatch,
        unwritten,
        nmse: Some(e),
        nmse_max: NMSE_MAX,
    })
}

/// `add` of `n` values at mixed scales; the reference's NMSE against the float64 sum. On the GPU
/// this is the in-place path (see `NormOps::add` there), so an element the kernel skipped shows
/// as `a[i]`, a mismatch, rather than as poison.
fn add_case(backends: &[&dyn NormOps], n: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut random = || -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powf(rng.random_range(-2.0..2.0))).collect() };
    let (a, b) = (random(), random());
    let (outs, unwritten) = run_all(backends, n, |be, out| be.add(&a, &b, out))?;
    let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| x as f64 + y as f64).collect();
    let e = nmse(&first_output(&outs), &want);
    Ok(outcome(ADD, format!("{n}"), seed, n, outs, unwritten, Some(e)))
}

/// The family's parity suite from `seed`: `embed_rows` for every table type at one block, 4096
/// and a random multiple of the block; `rms_norm` at n = 32, 128, 2048 and 4096 for 1..=8 rows,
/// and at `NORM_MAX_N`; `add` at 1, 255, 256, 257, 32768 and a random length; `rms_norm_q8_1`
/// at n = 32, 96 (one block a row, not all its warps used), 2048, 2560, 4096, `NQ_MAX_N` and a
/// random multiple of 32, for 1..=8 rows each. `backends[0]` is the reference.
pub fn parity_cases(backends: &[&dyn NormOps], seed: u64) -> Result<Vec<Outcome>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for ty in GgmlType::ALL {
        let bv = embed_table(ty).block_values();
        for n in [bv, 4096, bv * rng.random_range(2..=4096 / bv)] {
            out.push(embed_case(backends, ty, n, rng.random())?);
        }
    }
    for n in [32, 128, 2048, 4096] {
        for rows in 1..=8 {
            out.push(rms_norm_case(backends, rows, n, rng.random())?);
        }
    }
    out.push(rms_norm_case(backends, 3, NORM_MAX_N, rng.random())?);
    for n in [1, 255, 256, 257, 32768, rng.random_range(2..300_000)] {
        out.push(add_case(backends, n, rng.random())?);
    }
    for n in [32, 96, 2048, 2560, 4096, NQ_MAX_N, 32 * rng.random_range(1..=NQ_MAX_N / 32)] {
        for rows in 1..=8 {
            out.push(rms_norm_q8_1_case(backends, rows, n, rng.random())?);
        }
    }
    Ok(out)
}
