//! `strata bench mmvq`: the matvec kernels against the device's own copy bandwidth.
//!
//! Method: each weight matrix is copied into a pool at least 4 times the GPU's L2, and
//! consecutive calls read consecutive copies, so every call reads its weights cold from HBM.
//! The calls are captured once into a CUDA graph (one call per pool slot, enough passes for 64
//! calls at least) so launch overhead does not hide small kernels; a round replays the graph
//! until it has run for a few milliseconds, timed by device events; the result is the median of
//! the rounds' time per call. Achieved bandwidth counts the weight and activation bytes one
//! call must read; the reference is a device-to-device copy measured in the same run (bytes read
//! plus bytes written).
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream, DriverError, PushKernelArg};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};
use crate::gpu::GpuBackend;
use crate::parity::random_weights;
use strata_gpu_shared::formats::{q8_1, WeightFormat, GROUP};
use strata_gpu_shared::launch::{MMVQ_MAX_ROWS, MMVQ_WARPS};
use strata_gpu_shared::replica::quantize_q8_1::quantize;

/// One measured configuration.
#[derive(Clone, Debug)]
pub struct MmvqRow {
    pub backend: &'static str,
    pub format: WeightFormat,
    pub m: usize,
    pub k: usize,
    pub rows: usize,
    /// Median time per call, microseconds.
    pub us: f64,
    /// Weight + activation bytes per call over `us`, GB/s (1e9 bytes).
    pub gbps: f64,
    /// Cold pool slots the calls cycled through.
    pub slots: usize,
}

fn drv<'a>(g: &'a GpuBackend, what: &'static str) -> impl Fn(DriverError) -> Error + 'a {
    g.driver_err("bench", what)
}

/// Times `work` (which queues device work on `stream`) by device events, in milliseconds.
fn time_ms(g: &GpuBackend, stream: &Arc<CudaStream>, mut work: impl FnMut() -> Result<()>) -> Result<f64> {
    let ctx = stream.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv(g, "event"))?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv(g, "event"))?;
    start.record(stream).map_err(drv(g, "event record"))?;
    work()?;
    end.record(stream).map_err(drv(g, "event record"))?;
    Ok(start.elapsed_ms(&end).map_err(drv(g, "event timing"))? as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Device-to-device copy bandwidth, GB/s counting bytes read plus bytes written: the median
/// of `rounds` copies of `bytes`.
pub fn copy_bandwidth(g: &GpuBackend, bytes: usize, rounds: usize) -> Result<f64> {
    let s = g.stream();
    let src: CudaSlice<u8> = s.alloc_zeros(bytes).map_err(drv(g, "allocating the copy buffers"))?;
    let mut dst: CudaSlice<u8> = s.alloc_zeros(bytes).map_err(drv(g, "allocating the copy buffers"))?;
    s.memcpy_dtod(&src, &mut dst).map_err(drv(g, "copy"))?;
    let mut ms = Vec::new();
    for _ in 0..rounds {
        ms.push(time_ms(g, s, || s.memcpy_dtod(&src, &mut dst).map_err(drv(g, "copy")))?);
    }
    Ok(2.0 * bytes as f64 / (median(ms) * 1e-3) / 1e9)
}

/// Benchmarks `mmvq` for `format` at `m` x `k` for each of `rows_list` on `g`.
pub fn mmvq(
    g: &GpuBackend,
    format: WeightFormat,
    m: usize,
    k: usize,
    rows_list: &[usize],
    rounds: usize,
    seed: u64,
) -> Result<Vec<MmvqRow>> {
    let kernel = format.mmvq_kernel();
    let s = g.stream();
    let mut rng = SmallRng::seed_from_u64(seed);
    let wbytes = m * format.row_bytes(k);
    let pool_min = 4 * g.info().l2_bytes.max(1) as usize;
    let slots = pool_min.div_ceil(wbytes).max(2);
    let host_w = random_weights(&mut rng, format, m, k);
    let base = g.upload(kernel, &host_w)?;
    let mut pool: CudaSlice<u8> = s.alloc_zeros(slots * wbytes).map_err(drv(g, "allocating the weight pool"))?;
    for i in 0..slots {
        s.memcpy_dtod(&base, &mut pool.slice_mut(i * wbytes..(i + 1) * wbytes)).map_err(drv(g, "filling the pool"))?;
    }
    let x: Vec<f32> = (0..MMVQ_MAX_ROWS * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut xq = vec![0u8; MMVQ_MAX_ROWS * k / GROUP * q8_1::BYTES];
    quantize(&x, &mut xq);
    let dx = g.upload(kernel, &xq)?;
    let mut dy: CudaSlice<f32> = s.alloc_zeros(MMVQ_MAX_ROWS * m).map_err(drv(g, "allocating the output"))?;
    let (m32, groups) = (m as u32, (k / GROUP) as u32);
    let calls = slots * 64usize.div_ceil(slots);
    // Capture needs a stream of its own: the legacy default stream cannot be captured.
    s.synchronize().map_err(drv(g, "preparing the pool"))?;
    let s = &s.context().new_stream().map_err(drv(g, "creating the capture stream"))?;
    let mut out = Vec::new();
    for &rows in rows_list {
        let rows32 = rows as u32;
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(drv(g, "graph capture"))?;
        for c in 0..calls {
            let w = pool.slice((c % slots) * wbytes..(c % slots + 1) * wbytes);
            let mut args = g.builder_on(s, kernel);
            args.arg(&w).arg(&dx).arg(&mut dy).arg(&m32).arg(&groups).arg(&rows32);
            // SAFETY: the parameters are the kernel's, in order: a whole weight matrix, 8 q8_1
            // rows of k values (rows <= 8), an output of 8 x m floats.
            unsafe { g.launch_async(kernel, m32.div_ceil(MMVQ_WARPS), args) }?;
        }
        let graph = s
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(drv(g, "graph capture"))?
            .ok_or_else(|| Error::Setup { backend: g.name_static(), what: "bench graph".into(), detail: "capture was empty".into() })?;
        let replay = |n: usize| -> Result<()> {
            for _ in 0..n {
                graph.launch().map_err(drv(g, "graph launch"))?;
            }
            Ok(())
        };
        replay(1)?; // warm-up: first replay uploads the graph
        let one = time_ms(g, s, || replay(1))?;
        let reps = ((5.0 / one).ceil() as usize).clamp(1, 1000);
        let mut us = Vec::new();
        for _ in 0..rounds {
            us.push(time_ms(g, s, || replay(reps))? * 1e3 / (reps * calls) as f64);
        }
        let us = median(us);
        let bytes = wbytes + rows * (k / GROUP) * q8_1::BYTES;
        out.push(MmvqRow { backend: g.name_static(), format, m, k, rows, us, gbps: bytes as f64 / (us * 1e-6) / 1e9, slots });
    }
    Ok(out)
}
