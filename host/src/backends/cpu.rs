//! The `cpu` backend: the gpu-shared replicas, split over the machine's threads (rayon's pool).
use crate::backends::{
    check_head, check_matvec, check_mmvq, check_moe, check_quantize, check_quantize_q8_0, Backend, FloatWeights, MoeOut, MoeWindow, Variant,
    Weights,
};
use strata_gpu_shared::moe::swiglu;
use crate::error::Result;
use strata_gpu_shared::formats::q8_1;
use strata_gpu_shared::order::stored;
use strata_gpu_shared::replica;
use rayon::prelude::*;

pub struct CpuBackend {
    threads: usize,
}

impl CpuBackend {
    pub fn new() -> Self {
        let threads = rayon::current_num_threads();
        CpuBackend { threads }
    }

    /// Runs `f(chunk_index, chunk)` over `out` split into contiguous chunks of whole `unit`s,
    /// one chunk per thread.
    pub(crate) fn par_chunks<T: Send>(&self, out: &mut [T], unit: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        let units = out.len() / unit;
        let per = units.div_ceil(self.threads).max(1) * unit;
        out.par_chunks_mut(per).enumerate().for_each(|(i, chunk)| f(i * per / unit, chunk));
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn quantize_q8_1(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        check_quantize(x, out)?;
        self.par_chunks(out, q8_1::BYTES, |first, chunk| {
            let groups = chunk.len() / q8_1::BYTES;
            replica::quantize_q8_1::quantize(&x[first * 32..(first + groups) * 32], chunk);
        });
        Ok(())
    }

    fn mmvq(&self, w: &Weights, xq: &[u8], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()> {
        let groups = check_mmvq(w, xq, rows, y)?;
        let row_bytes = w.format.row_bytes(w.k);
        let xrow_bytes = groups * q8_1::BYTES;
        for (r, yr) in y.chunks_exact_mut(w.m).enumerate() {
            let xrow = &xq[r * xrow_bytes..(r + 1) * xrow_bytes];
            self.par_chunks(yr, 1, |first, chunk| {
                for (i, v) in chunk.iter_mut().enumerate() {
                    let wrow = &w.data[(first + i) * row_bytes..(first + i + 1) * row_bytes];
                    *v = stored(*v, replica::mmvq::row_dot(w.format, wrow, xrow), accumulate);
                }
            });
        }
        Ok(())
    }

    fn matvec(&self, w: &FloatWeights, x: &[f32], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()> {
        check_matvec(w, x, rows, y)?;
        let row_bytes = w.k * w.format.bytes();
        for (r, yr) in y.chunks_exact_mut(w.m).enumerate() {
            let xr = &x[r * w.k..(r + 1) * w.k];
            self.par_chunks(yr, 1, |first, chunk| {
                for (i, v) in chunk.iter_mut().enumerate() {
                    let sum = replica::matvec::row_dot(w.format, &w.data[(first + i) * row_bytes..(first + i + 1) * row_bytes], xr);
                    *v = stored(*v, sum, accumulate);
                }
            });
        }
        Ok(())
    }

    fn argmax_rows(&self, x: &[f32], n: usize, _variant: Variant, idx: &mut [u32], all_nan: &mut [u32]) -> Result<()> {
        check_head("argmax_rows", x, n, &[idx.len(), all_nan.len()])?;
        for ((row, i), f) in x.chunks_exact(n).zip(idx.iter_mut()).zip(all_nan.iter_mut()) {
            let (best, nan) = replica::head::argmax_row(row);
            (*i, *f) = (best, nan as u32);
        }
        Ok(())
    }

    fn row_top_prob(&self, x: &[f32], n: usize, _variant: Variant, p: &mut [f32]) -> Result<()> {
        check_head("row_top_prob", x, n, &[p.len()])?;
        self.par_chunks(p, 1, |first, chunk| {
            for (i, v) in chunk.iter_mut().enumerate() {
                *v = replica::head::row_top_prob(&x[(first + i) * n..(first + i + 1) * n]);
            }
        });
        Ok(())
    }

    fn quantize_q8_0_scaled(&self, x: &[f32], k: usize, scales: &[f32], per_column: bool, _variant: Variant, out: &mut [u8]) -> Result<()> {
        check_quantize_q8_0(x, k, scales, per_column, out)?;
        replica::quantize_q8_0::quantize_scaled(x, k, scales, per_column, out);
        Ok(())
    }

    fn moe(&self, w: &MoeWindow, o: &mut MoeOut) -> Result<()> {
        let (n_embd, n_ff) = check_moe(w, o)?;
        let xrow = q8_1::bytes_of(n_embd);
        let hrow = q8_1::bytes_of(n_ff);
        // Per selection: gate and up rows, SwiGLU, q8_1 (each a function of its own token only).
        self.par_chunks(o.hq, hrow, |first, chunk| {
            let mut h = vec![0f32; n_ff];
            for (i, hq) in chunk.chunks_exact_mut(hrow).enumerate() {
                let e = first + i;
                let (expert, x) = (w.ids[e] as usize, &w.xq[e / w.k * xrow..(e / w.k + 1) * xrow]);
                for (r, v) in h.iter_mut().enumerate() {
                    let g = replica::mmvq::row_dot(w.gate.format, w.gate.row(expert, r), x);
                    let u = replica::mmvq::row_dot(w.up.format, w.up.row(expert, r), x);
                    *v = swiglu(g, u);
                }
                replica::quantize_q8_1::quantize(&h, hq);
            }
        });
        let hq: &[u8] = o.hq;
        self.par_chunks(o.y, n_embd, |first, chunk| {
            for (i, y) in chunk.chunks_exact_mut(n_embd).enumerate() {
                let e = first + i;
                let h = &hq[e * hrow..(e + 1) * hrow];
                for (r, v) in y.iter_mut().enumerate() {
                    *v = replica::mmvq::row_dot(w.down.format, w.down.row(w.ids[e] as usize, r), h);
                }
            }
        });
        for (t, out) in o.out.chunks_exact_mut(n_embd).enumerate() {
            for (col, v) in out.iter_mut().enumerate() {
                let sum = (0..w.k).fold(0.0f32, |acc, s| acc + w.weights[t * w.k + s] * o.y[(t * w.k + s) * n_embd + col]);
                *v = stored(*v, sum, o.accumulate);
            }
        }
        Ok(())
    }
}
