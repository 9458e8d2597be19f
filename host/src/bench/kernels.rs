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
use crate::backends::gpu::GpuBackend;
use crate::parity::random_weights;
use strata_gpu_shared::formats::{q8_1, WeightFormat, GROUP};
use strata_gpu_shared::launch::{mmvq_launch, MmvqLaunch, MMVQ_MAX_ROWS, MMVQ_WARPS, QUANTIZE_WARPS};
use strata_gpu_shared::replica::quantize_q8_1::quantize;

/// One measured configuration.
#[derive(Clone, Debug)]
pub struct MmvqRow {
    pub backend: &'static str,
    /// The entry measured: at one row both the one-row entry and the 1..8-row one.
    pub kernel: &'static str,
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
    // Each row count on the entry the step launches for it, and on the 1..8-row entry where
    // that is another (one row; rows staged in shared memory).
    let runs: Vec<(usize, MmvqLaunch)> = rows_list
        .iter()
        .flat_map(|&r| {
            let step = mmvq_launch(format, m, r, k / GROUP);
            let plain = MmvqLaunch { kernel, rows_per_block: MMVQ_WARPS, smem: 0 };
            std::iter::once((r, step)).chain((step != plain).then_some((r, plain)))
        })
        .collect();
    let pool_min = 4 * g.info().l2_bytes.max(1) as usize;
    let slots = pool_min.div_ceil(wbytes).max(2);
    let host_w = random_weights(&mut rng, format, m, k);
    let base = g.upload(kernel, &host_w)?;
    let mut pool: CudaSlice<u8> = s.alloc_zeros(slots * wbytes).map_err(drv(g, "allocating the weight pool"))?;
    for i in 0..slots {
        s.memcpy_dtod(&base, &mut pool.slice_mut(i * wbytes..(i + 1) * wbytes)).map_err(drv(g, "filling the pool"))?;
    }
    let x: Vec<f32> = (0..MMVQ_MAX_ROWS * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut xq = vec![0u8; q8_1::bytes_of(MMVQ_MAX_ROWS * k)];
    quantize(&x, &mut xq);
    let dx = g.upload(kernel, &xq)?;
    let mut dy: CudaSlice<f32> = s.alloc_zeros(MMVQ_MAX_ROWS * m).map_err(drv(g, "allocating the output"))?;
    let (m32, groups, accumulate) = (m as u32, (k / GROUP) as u32, 0u32);
    let calls = slots * 64usize.div_ceil(slots);
    // Capture needs a stream of its own: the legacy default stream cannot be captured.
    s.synchronize().map_err(drv(g, "preparing the pool"))?;
    let s = &s.context().new_stream().map_err(drv(g, "creating the capture stream"))?;
    let mut out = Vec::new();
    for (rows, launch) in runs {
        let kernel = launch.kernel;
        let rows32 = rows as u32;
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(drv(g, "graph capture"))?;
        for c in 0..calls {
            let w = pool.slice((c % slots) * wbytes..(c % slots + 1) * wbytes);
            let mut args = g.builder_on(s, kernel);
            args.arg(&w).arg(&dx).arg(&mut dy).arg(&m32).arg(&groups).arg(&rows32).arg(&accumulate);
            // SAFETY: the parameters are the kernel's, in order: a whole weight matrix, 8 q8_1
            // rows of k values (rows <= 8), an output of 8 x m floats, stored (not added to).
            unsafe { g.launch_async_smem(kernel, m32.div_ceil(launch.rows_per_block), launch.smem, args) }?;
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
        let bytes = wbytes + q8_1::bytes_of(rows * k);
        out.push(MmvqRow { backend: g.name_static(), kernel, format, m, k, rows, us, gbps: bytes as f64 / (us * 1e-6) / 1e9, slots });
    }
    Ok(out)
}

/// Median microseconds of one run of `work` (which only queues device work): warm-up, then
/// rounds of enough repetitions for a few milliseconds each, timed by device events.
fn median_us(g: &GpuBackend, rounds: usize, mut work: impl FnMut() -> Result<()>) -> Result<f64> {
    let s = g.stream();
    work()?;
    let one = time_ms(g, s, &mut work)?.max(1e-3);
    let reps = ((3.0 / one).ceil() as usize).clamp(1, 2000);
    let mut us = Vec::new();
    for _ in 0..rounds {
        us.push(time_ms(g, s, || (0..reps).try_for_each(|_| work()))? * 1e3 / reps as f64);
    }
    Ok(median(us))
}

/// One line of `strata bench head`.
#[derive(Clone, Debug)]
pub struct HeadRow {
    pub backend: &'static str,
    pub what: String,
    pub shape: String,
    /// Microseconds of the reference (or baseline) and of the fast variant.
    pub reference_us: f64,
    pub fast_us: f64,
}

/// Queues one launch of a kernel over `blocks` blocks with the listed parameters.
macro_rules! queue {
    ($g:expr, $kernel:expr, $blocks:expr, [$($arg:expr),* $(,)?]) => {{
        let mut args = $g.builder($kernel);
        $( args.arg($arg); )*
        // SAFETY: every use below lists the kernel's parameters in order, over buffers
        // allocated for exactly the shape it launches.
        unsafe { $g.launch_async($kernel, $blocks, args) }
    }};
}

/// `argmax_rows` and `row_top_prob`: one block per row against the split kernels.
pub fn head(g: &GpuBackend, vocab: usize, rows: usize, rounds: usize, seed: u64) -> Result<Vec<HeadRow>> {
    use strata_gpu_shared::launch::HEAD_CHUNK;
    let mut rng = SmallRng::seed_from_u64(seed);
    let x = crate::parity::random_logits(&mut rng, rows, vocab);
    let s = g.stream();
    let dx = g.upload("argmax_rows", &x)?;
    let (n, r, chunks) = (vocab as u32, rows as u32, vocab.div_ceil(HEAD_CHUNK) as u32);
    let parts = rows * chunks as usize;
    let alloc = |what| -> Result<CudaSlice<u32>> { s.alloc_zeros(rows.max(parts)).map_err(drv(g, what)) };
    let (mut idx, mut flag, mut pi) = (alloc("outputs")?, alloc("outputs")?, alloc("scratch")?);
    let allocf = |what| -> Result<CudaSlice<f32>> { s.alloc_zeros(rows.max(parts)).map_err(drv(g, what)) };
    let (mut pv, mut pm, mut ps, mut p) = (allocf("scratch")?, allocf("scratch")?, allocf("scratch")?, allocf("outputs")?);
    let shape = format!("{rows}x{vocab}");
    let argmax_ref = median_us(g, rounds, || queue!(g, "argmax_rows_ref", r, [&dx, &n, &r, &mut idx, &mut flag]))?;
    let argmax_split = median_us(g, rounds, || {
        queue!(g, "argmax_rows_split", r * chunks, [&dx, &n, &r, &chunks, &mut pv, &mut pi])?;
        queue!(g, "argmax_rows_final", r, [&pv, &pi, &r, &chunks, &mut idx, &mut flag])
    })?;
    let prob_ref = median_us(g, rounds, || queue!(g, "row_top_prob_ref", r, [&dx, &n, &r, &mut p]))?;
    let prob_split = median_us(g, rounds, || {
        queue!(g, "row_top_prob_max", r * chunks, [&dx, &n, &r, &chunks, &mut pm])?;
        queue!(g, "row_top_prob_sum", r * chunks, [&dx, &n, &r, &chunks, &pm, &mut ps])?;
        queue!(g, "row_top_prob_final", r, [&ps, &r, &chunks, &mut p])
    })?;
    s.synchronize().map_err(drv(g, "head bench"))?;
    let row = |what: &str, reference_us, fast_us| HeadRow { backend: g.name_static(), what: what.into(), shape: shape.clone(), reference_us, fast_us };
    Ok(vec![row("argmax_rows", argmax_ref, argmax_split), row("row_top_prob", prob_ref, prob_split)])
}

/// The quantizers: `quantize_q8_0_scaled` one thread per block against one warp per block, and
/// `quantize_q8_1` (its `reference_us` is 0: it has one variant).
pub fn quantizers(g: &GpuBackend, rows: usize, k: usize, rounds: usize, seed: u64) -> Result<Vec<HeadRow>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let x: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    let scales: Vec<f32> = (0..k).map(|_| rng.random_range(0.5f32..2.0)).collect();
    let s = g.stream();
    let dx = g.upload("quantize", &x)?;
    let ds = g.upload("quantize", &scales)?;
    let groups = (rows * k / GROUP) as u32;
    let mut out: CudaSlice<u8> = s.alloc_zeros(groups as usize * q8_1::BYTES).map_err(drv(g, "outputs"))?;
    let (k32, col) = (k as u32, 1u32);
    let q0 = |kernel: &'static str, blocks| median_us(g, rounds, || queue!(g, kernel, blocks, [&dx, &k32, &ds, &col, &groups, &out]));
    let q0_ref = q0("quantize_q8_0_scaled_ref", groups.div_ceil(32 * QUANTIZE_WARPS))?;
    let q0_warp = q0("quantize_q8_0_scaled", groups.div_ceil(QUANTIZE_WARPS))?;
    let q1 = median_us(g, rounds, || queue!(g, "quantize_q8_1", groups.div_ceil(QUANTIZE_WARPS), [&dx, &mut out, &groups]))?;
    s.synchronize().map_err(drv(g, "quantizer bench"))?;
    let shape = format!("{rows}x{k}");
    Ok(vec![
        HeadRow { backend: g.name_static(), what: "quantize_q8_0_scaled".into(), shape: shape.clone(), reference_us: q0_ref, fast_us: q0_warp },
        HeadRow { backend: g.name_static(), what: "quantize_q8_1".into(), shape, reference_us: 0.0, fast_us: q1 },
    ])
}

/// `copy_from_mapped_multi` (one launch) against one `cuMemcpyAsync` per segment, for `n`
/// segments of `len` bytes each from pinned mapped host memory.
pub fn mapped_copy(g: &GpuBackend, n: usize, len: usize, rounds: usize) -> Result<HeadRow> {
    use crate::backends::mapped::Segment;
    let s = g.stream();
    let mut host = g.alloc_mapped(n * len)?;
    host.as_mut_slice()?.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    let mut dst: CudaSlice<u8> = s.alloc_zeros(n * len).map_err(drv(g, "destination"))?;
    let segs: Vec<Segment> = (0..n).map(|i| Segment { src: i * len, dst: i * len, len }).collect();
    let (table, total) = g.copy_table(&host, &segs, &mut dst)?;
    let dtable = g.upload("copy_from_mapped_multi", &table)?;
    let n32 = n as u32;
    let multi = median_us(g, rounds, || queue!(g, "copy_from_mapped_multi", total, [&dtable, &n32, &total]))?;
    let pinned = host.as_slice()?;
    let each = median_us(g, rounds, || {
        for sg in &segs {
            s.memcpy_htod(&pinned[sg.src..sg.src + sg.len], &mut dst.slice_mut(sg.dst..sg.dst + sg.len)).map_err(drv(g, "copy"))?;
        }
        Ok(())
    })?;
    s.synchronize().map_err(drv(g, "copy bench"))?;
    Ok(HeadRow { backend: g.name_static(), what: "copy_from_mapped_multi".into(), shape: format!("{n}x{}KiB", len / 1024), reference_us: each, fast_us: multi })
}


/// One line of `strata bench experts`.
#[derive(Clone, Debug)]
pub struct ExpertRow {
    pub backend: &'static str,
    pub variant: String,
    /// The kernels and rows per block the variant's knobs chose for this window size.
    pub plan: crate::backends::knobs::ExpertPlan,
    pub tokens: usize,
    /// Median microseconds: the whole layer (group, gate/up, down, combine), gate/up alone and
    /// down alone.
    pub all_us: f64,
    pub gu_us: f64,
    pub down_us: f64,
    /// Expert weight bytes a window reads (its distinct experts' gate, up and down), averaged
    /// over the windows, over `all_us`: GB/s.
    pub gbps: f64,
    /// Whether this variant's outputs equal the first variant's, byte for byte.
    pub identical: bool,
}

/// How the bench's windows select experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// The window's tokens share a pool of `k` to `k + 3` experts (few distinct experts: the
    /// most weight reuse a window can have).
    Shared,
    /// Each token selects `k` distinct experts uniformly from all of them, independently (up to
    /// `T x k` distinct experts a window).
    Uniform,
}

impl Routing {
    pub fn name(self) -> &'static str {
        match self {
            Routing::Shared => "shared",
            Routing::Uniform => "uniform",
        }
    }
}

/// The routed experts of one layer shape on `g`: for each token count and each variant of
/// `variants`, 12 random windows routed as `routing` says (different experts each, so the
/// weights are read cold; the layer is sized so that all its experts exceed the L2) cycled
/// through; median of `rounds`.
#[allow(clippy::too_many_arguments)]
pub fn experts(
    g: &mut GpuBackend,
    formats: (WeightFormat, WeightFormat),
    (n_embd, n_ff, n_expert, k): (usize, usize, usize, usize),
    token_counts: &[usize],
    variants: &[(String, crate::backends::knobs::KernelKnobs)],
    routing: Routing,
    rounds: usize,
    seed: u64,
) -> Result<Vec<ExpertRow>> {
    use crate::backends::gpu::{MoeBuffers, MoeStages};
    use crate::parity::MoeCase;
    const WINDOWS: usize = 12;
    let mut rng = SmallRng::seed_from_u64(seed);
    let layer = MoeCase::random(&mut rng, formats, n_expert, n_embd, n_ff, 1, k);
    let dl = g.upload_layer(layer.window(&[]).gate, layer.window(&[]).up, layer.window(&[]).down)?;
    let saved = g.kernel_knobs();
    let mut rows = Vec::new();
    for &t in token_counts {
        let (mut wins, mut outs) = (Vec::new(), Vec::new());
        let mut bytes = 0.0;
        for _ in 0..WINDOWS {
            let (ids, weights, x) = match routing {
                Routing::Shared => MoeCase::random_window(&mut rng, n_expert, n_embd, t, k),
                Routing::Uniform => MoeCase::uniform_window(&mut rng, n_expert, n_embd, t, k),
            };
            let mut xq = vec![0u8; q8_1::bytes_of(t * n_embd)];
            quantize(&x, &mut xq);
            let mut distinct = ids.clone();
            distinct.sort_unstable();
            distinct.dedup();
            bytes += (distinct.len() * (2 * n_ff * formats.0.row_bytes(n_embd) + n_embd * formats.1.row_bytes(n_ff))) as f64 / WINDOWS as f64;
            let n = t * k;
            let s = g.stream();
            wins.push(MoeBuffers {
                tokens: t,
                k,
                ids: g.upload("bench", &ids)?,
                weights: g.upload("bench", &weights)?,
                xq: g.upload("bench", &xq)?,
                table: s.alloc_zeros(strata_gpu_shared::moe::table_words(n)).map_err(drv(g, "scratch"))?,
                grouped: false,
                hq: s.alloc_zeros(q8_1::bytes_of(n * n_ff)).map_err(drv(g, "scratch"))?,
                y: s.alloc_zeros(n * n_embd).map_err(drv(g, "scratch"))?,
            });
            outs.push(s.alloc_zeros::<f32>(t * n_embd).map_err(drv(g, "scratch"))?);
        }
        let mut first: Option<Vec<f32>> = None;
        for (name, knobs) in variants {
            g.set_kernel_knobs(*knobs);
            let mut time = |stages: MoeStages| -> Result<f64> {
                let mut i = 0;
                median_us(g, rounds, || {
                    i += 1;
                    g.moe_queue(&dl, &mut wins[i % WINDOWS], &mut outs[i % WINDOWS], false, stages)
                })
            };
            let all = time(MoeStages::ALL)?;
            let gu = time(MoeStages { group: false, gate_up: true, down: false, combine: false })?;
            let down = time(MoeStages { group: false, gate_up: false, down: true, combine: false })?;
            // The outputs of every window, for the identical column.
            let mut result = Vec::new();
            for (w, o) in wins.iter_mut().zip(outs.iter_mut()) {
                g.moe_queue(&dl, w, o, false, MoeStages::ALL)?;
                let mut out = vec![0f32; t * n_embd];
                g.download("bench", o, &mut out)?;
                result.extend(out);
            }
            let identical = *first.get_or_insert_with(|| result.clone()) == result;
            rows.push(ExpertRow {
                backend: g.name_static(),
                variant: name.clone(),
                plan: knobs.plan(formats, n_embd, n_ff, t * k, g.info().sms(), g.sm90_entries()).map_err(Error::Request)?,
                tokens: t,
                all_us: all,
                gu_us: gu,
                down_us: down,
                gbps: bytes / (all * 1e-6) / 1e9,
                identical,
            });
        }
    }
    g.set_kernel_knobs(saved);
    Ok(rows)
}

/// One line of `strata bench attention`.
#[derive(Clone, Debug)]
pub struct AttnRow {
    pub backend: &'static str,
    pub depth: usize,
    pub tokens: usize,
    /// Query heads per `attn_chunk` block (the step's rule's, or the one asked for).
    pub band: usize,
    /// Whether `band` is the one the step's rule picks for this window and depth.
    pub rule: bool,
    /// Microseconds of one layer's attention (`attn_chunk` + `attn_merge`) for the window.
    pub us: f64,
    /// The f16 keys and values the window attends to (positions `0..depth + tokens` of the
    /// layer's `n_kv` heads), read once, over `us`: GB/s.
    pub gbps: f64,
}

/// A layer's attention (`attention_queue`, as the decode step launches it) for windows of
/// `tokens` at `depth`, heads `(n_q, n_kv, hd)`, over random f16 caches of `depth + tokens`
/// positions; two layers' caches alternate, so that the keys and values are read cold once they
/// exceed half the L2; median of `rounds`. `bands`: query heads per `attn_chunk` block to
/// measure (0: the step's rule; bands that do not divide the group are skipped).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    g: &GpuBackend,
    (n_q, n_kv, hd): (usize, usize, usize),
    depths: &[usize],
    token_counts: &[usize],
    bands: &[usize],
    rounds: usize,
    seed: u64,
) -> Result<Vec<AttnRow>> {
    use crate::ops::attention::{attn_part_len, AttnShape};
    use strata_gpu_shared::f16::f32_to_f16;
    use strata_gpu_shared::launch::attention::attn_band_fits;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut rows = Vec::new();
    for &depth in depths {
        let max_t = token_counts.iter().copied().max().unwrap_or(1);
        let n_ctx = depth + max_t;
        let mut cache = || -> Result<CudaSlice<u16>> {
            let v: Vec<u16> = (0..n_ctx * n_kv * hd).map(|_| f32_to_f16(rng.random_range(-1.0f32..1.0))).collect();
            g.upload("bench attention", &v)
        };
        let layers = [(cache()?, cache()?), (cache()?, cache()?)];
        for &t in token_counts {
            let shape = AttnShape { tokens: t, n_q, n_kv, hd, n_rot: hd, n_ctx };
            let q: Vec<f32> = (0..shape.q_len()).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let q = g.upload("bench attention", &q)?;
            let pos = g.upload("bench attention", &[depth as u32])?;
            let mut part = g.scratch::<f32>("bench attention", attn_part_len(shape))?;
            let mut out = g.scratch::<f32>("bench attention", shape.q_len())?;
            let scale = (1.0 / (hd as f64).sqrt()) as f32;
            let rule = g.attn_band(shape, depth + t);
            let mut seen = Vec::new();
            for band in bands.iter().map(|&b| if b == 0 { rule } else { b }) {
                if seen.contains(&band) || !attn_band_fits(n_q, n_kv, hd, band) {
                    continue;
                }
                seen.push(band);
                let mut i = 0;
                let us = median_us(g, rounds, || {
                    i += 1;
                    let (k, v) = &layers[i % 2];
                    g.attention_queue(&q, k, v, shape, &pos, depth + t, true, scale, Some(band), &mut part, &mut out, None)
                })?;
                let bytes = ((depth + t) * n_kv * hd * 2 * 2) as f64;
                rows.push(AttnRow { backend: g.name_static(), depth, tokens: t, band, rule: band == rule, us, gbps: bytes / (us * 1e-6) / 1e9 });
            }
        }
    }
    Ok(rows)
}
