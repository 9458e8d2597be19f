//! The router and the sampler of the decode step: [`RouteOps`] (host slices, what parity runs)
//! for the CPU replica and the GPU backends, the typed launchers on device buffers
//! (`router_topk_queue`, `sample_rows_queue`, and `argmax_rows_queue` for the existing split
//! argmax, the greedy sampler), and [`parity_cases`].
use cudarc::driver::{CudaSlice, PushKernelArg};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::backends::cpu::CpuBackend;
use crate::backends::{exact_len, shape_err};
use crate::error::{Error, Result};
use crate::backends::gpu::holds;
#[cfg(feature = "sim")]
use crate::backends::sim::{Args as SimArgs, SimBackend};
use crate::backends::gpu::GpuBackend;
use crate::parity::{compare_bits, note_unwritten, random_logits, Outcome, NMSE_MAX, POISON_F32};
use crate::reference::nmse;
use strata_gpu_shared::launch::route::{ROUTER_MAX_EXPERTS, ROUTER_MAX_K, SAMPLE_MAX_K};
use strata_gpu_shared::launch::HEAD_CHUNK;
use strata_gpu_shared::{moe, replica};

/// The sampler's settings. Temperature 0 (greedy) is not among them: that is `argmax_rows`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl SampleParams {
    /// Temperature positive and finite, `top_k` in `1..=SAMPLE_MAX_K`, `top_p` in `(0, 1]`.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature {} is not positive and finite", self.temperature));
        }
        if !(1..=SAMPLE_MAX_K).contains(&self.top_k) {
            return Err(format!("top_k {} is not in 1..={SAMPLE_MAX_K}", self.top_k));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p {} is not in (0, 1]", self.top_p));
        }
        Ok(())
    }

    /// The factor the kernel multiplies logit differences by: `1 / temperature`, rounded once.
    pub fn inv_temp(&self) -> f32 {
        1.0 / self.temperature
    }
}

/// The router and sampler on host slices.
pub trait RouteOps {
    fn name(&self) -> &'static str;

    /// Per token (row of `n_expert` logits): the `k` selected experts in order and their
    /// renormalised weights (`replica::route`); `ids` and `weights` hold `k` per token.
    fn router_topk(&self, logits: &[f32], n_expert: usize, k: usize, ids: &mut [u32], weights: &mut [f32]) -> Result<()>;

    /// Per row of `n` logits: the token drawn at position `pos0 + row` (`replica::sample`).
    fn sample_rows(&self, logits: &[f32], n: usize, p: SampleParams, pos0: usize, ids: &mut [u32]) -> Result<()>;
}

const ROUTER: &str = "router_topk";
const SAMPLE: &str = "sample_rows";
const ARGMAX: &str = "argmax_rows";
/// Rows (tokens, grid blocks) one launch may take.
const MAX_ROWS: usize = i32::MAX as usize / 2;




/// The rows in `len` values of rows of `n` (at least one, whole rows).
fn whole_rows(kernel: &'static str, len: usize, n: usize) -> Result<usize> {
    if n == 0 || len == 0 || len % n != 0 {
        return Err(shape_err(kernel, format!("{len} logits are not whole rows of {n}")));
    }
    Ok(len / n)
}

fn check_router(tokens: usize, n_expert: usize, k: usize) -> Result<()> {
    if !(1..=ROUTER_MAX_EXPERTS).contains(&n_expert) {
        return Err(shape_err(ROUTER, format!("{n_expert} experts, 1..={ROUTER_MAX_EXPERTS} supported")));
    }
    if !(1..=ROUTER_MAX_K.min(n_expert)).contains(&k) {
        return Err(shape_err(ROUTER, format!("k {k} is not in 1..={} for {n_expert} experts", ROUTER_MAX_K.min(n_expert))));
    }
    if !(1..=MAX_ROWS).contains(&tokens) {
        return Err(shape_err(ROUTER, format!("{tokens} tokens, 1..={MAX_ROWS} per launch")));
    }
    Ok(())
}

fn check_sample(rows: usize, n: usize, p: SampleParams, pos0: usize) -> Result<()> {
    p.check().map_err(|d| shape_err(SAMPLE, d))?;
    if !(1..=u32::MAX as usize / 2).contains(&n) || !(1..=MAX_ROWS).contains(&rows) {
        return Err(shape_err(SAMPLE, format!("{rows} rows of {n} logits exceed one launch")));
    }
    if pos0 > u32::MAX as usize {
        return Err(shape_err(SAMPLE, format!("position {pos0} exceeds u32")));
    }
    Ok(())
}

/// `argmax_rows`'s chunks per row.
fn check_argmax(rows: usize, n: usize) -> Result<usize> {
    let chunks = n.div_ceil(HEAD_CHUNK);
    if n == 0 || n > u32::MAX as usize / 2 || rows == 0 || rows * chunks > MAX_ROWS {
        return Err(shape_err(ARGMAX, format!("{rows} rows of {n} logits exceed one launch")));
    }
    Ok(chunks)
}

/// The tokens of a host-slice router call, its sizes checked.
fn router_tokens(logits: &[f32], n_expert: usize, k: usize, ids: &[u32], weights: &[f32]) -> Result<usize> {
    let tokens = whole_rows(ROUTER, logits.len(), n_expert)?;
    check_router(tokens, n_expert, k)?;
    exact_len(ROUTER, "ids", ids.len(), tokens * k)?;
    exact_len(ROUTER, "weights", weights.len(), tokens * k)?;
    Ok(tokens)
}

/// The rows of a host-slice sampler call, its sizes and parameters checked.
fn sample_count(logits: &[f32], n: usize, p: SampleParams, pos0: usize, ids: &[u32]) -> Result<usize> {
    let rows = whole_rows(SAMPLE, logits.len(), n)?;
    check_sample(rows, n, p, pos0)?;
    exact_len(SAMPLE, "ids", ids.len(), rows)?;
    Ok(rows)
}

impl RouteOps for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn router_topk(&self, logits: &[f32], n_expert: usize, k: usize, ids: &mut [u32], weights: &mut [f32]) -> Result<()> {
        router_tokens(logits, n_expert, k, ids, weights)?;
        replica::route::router_topk(logits, n_expert, k, ids, weights);
        Ok(())
    }

    fn sample_rows(&self, logits: &[f32], n: usize, p: SampleParams, pos0: usize, ids: &mut [u32]) -> Result<()> {
        sample_count(logits, n, p, pos0, ids)?;
        let inv_temp = p.inv_temp();
        self.par_chunks(ids, 1, |first, chunk| {
            let x = &logits[first * n..(first + chunk.len()) * n];
            replica::sample::sample_rows(x, n, p.top_k, p.top_p, inv_temp, p.seed, (pos0 + first) as u64, chunk);
        });
        Ok(())
    }
}

/// Device scratch of the split argmax: a value and an index per (row, chunk).
pub struct ArgmaxScratch {
    pv: CudaSlice<f32>,
    pi: CudaSlice<u32>,
}

impl GpuBackend {

    /// Queues `router_topk` over `tokens` rows of `n_expert` logits into `k` ids and weights
    /// per token (buffers may be longer than needed). With `table` (one token only) the kernel
    /// also writes the window's expert group table (`moe::group` of the ids), so the window's
    /// experts need no `moe_group` launch.
    #[allow(clippy::too_many_arguments)]
    pub fn router_topk_queue(
        &self,
        logits: &CudaSlice<f32>,
        tokens: usize,
        n_expert: usize,
        k: usize,
        ids: &mut CudaSlice<u32>,
        weights: &mut CudaSlice<f32>,
        table: Option<&mut CudaSlice<u32>>,
    ) -> Result<()> {
        check_router(tokens, n_expert, k)?;
        holds(ROUTER, "logits", logits.len(), tokens * n_expert)?;
        holds(ROUTER, "ids", ids.len(), tokens * k)?;
        holds(ROUTER, "weights", weights.len(), tokens * k)?;
        if let Some(table) = &table {
            if tokens != 1 {
                return Err(Error::Shape { kernel: ROUTER, detail: format!("a group table for {tokens} tokens (one token only)") });
            }
            holds(ROUTER, "table", table.len(), moe::table_words(k))?;
        }
        let (t, e, k, null) = (tokens as u32, n_expert as u32, k as u32, 0u64);
        let mut a = self.builder(ROUTER);
        a.arg(logits).arg(&t).arg(&e).arg(&k).arg(ids).arg(weights);
        match table {
            Some(table) => a.arg(table),
            None => a.arg(&null),
        };
        // SAFETY: the kernel's parameters in order, buffers checked above, its shared memory from
        // its bounds; blocks past `tokens` return at once, so a padded grid is covered.
        unsafe { self.launch_async(ROUTER, self.padded_grid(ROUTER, t), a) }
    }

    /// Queues `sample_rows` over `rows` rows of `n` logits, row `t` at position `pos[0] + t`
    /// (read on the device when the kernel runs).
    pub fn sample_rows_queue(&self, logits: &CudaSlice<f32>, rows: usize, n: usize, p: SampleParams, pos: &CudaSlice<u32>, ids: &mut CudaSlice<u32>) -> Result<()> {
        check_sample(rows, n, p, 0)?;
        holds(SAMPLE, "logits", logits.len(), rows * n)?;
        holds(SAMPLE, "ids", ids.len(), rows)?;
        holds(SAMPLE, "pos", pos.len(), 1)?;
        let (r, n, top_k, inv_temp) = (rows as u32, n as u32, p.top_k as u32, p.inv_temp());
        let (seed_lo, seed_hi) = (p.seed as u32, (p.seed >> 32) as u32);
        let mut a = self.builder(SAMPLE);
        a.arg(logits).arg(&r).arg(&n).arg(&top_k).arg(&p.top_p).arg(&inv_temp).arg(&seed_lo).arg(&seed_hi).arg(pos).arg(ids);
        // SAFETY: the kernel's parameters in order, buffers and `top_k` checked above, its
        // shared memory from BOUNDS; blocks past `rows` return at once.
        unsafe { self.launch_async(SAMPLE, self.padded_grid(SAMPLE, r), a) }
    }

    /// Scratch for [`Self::argmax_rows_queue`] over `rows` rows of `n`.
    pub fn argmax_scratch(&self, rows: usize, n: usize) -> Result<ArgmaxScratch> {
        let len = rows * check_argmax(rows, n)?;
        Ok(ArgmaxScratch { pv: self.scratch("argmax_rows_split", len)?, pi: self.scratch("argmax_rows_split", len)? })
    }

    /// Queues the split `argmax_rows` (`argmax_rows_split`, then `argmax_rows_final`) over
    /// `rows` rows of `n` logits: each row's index and all-NaN flag.
    pub fn argmax_rows_queue(
        &self,
        x: &CudaSlice<f32>,
        rows: usize,
        n: usize,
        scratch: &mut ArgmaxScratch,
        idx: &mut CudaSlice<u32>,
        all_nan: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let chunks = check_argmax(rows, n)?;
        holds(ARGMAX, "logits", x.len(), rows * n)?;
        holds(ARGMAX, "indices", idx.len(), rows)?;
        holds(ARGMAX, "flags", all_nan.len(), rows)?;
        holds(ARGMAX, "scratch", scratch.pv.len().min(scratch.pi.len()), rows * chunks)?;
        let (r, n, chunks) = (rows as u32, n as u32, chunks as u32);
        let mut a = self.builder("argmax_rows_split");
        a.arg(x).arg(&n).arg(&r).arg(&chunks).arg(&mut scratch.pv).arg(&mut scratch.pi);
        // SAFETY (both): each kernel's parameters in order over the buffers checked above;
        // blocks past the real (row, chunk) pairs or rows return at once.
        unsafe { self.launch_async("argmax_rows_split", self.padded_grid("argmax_rows_split", r * chunks), a) }?;
        let mut a = self.builder("argmax_rows_final");
        a.arg(&scratch.pv).arg(&scratch.pi).arg(&r).arg(&chunks).arg(idx).arg(all_nan);
        unsafe { self.launch_async("argmax_rows_final", self.padded_grid("argmax_rows_final", r), a) }
    }

}

impl RouteOps for GpuBackend {
    fn name(&self) -> &'static str {
        self.name_static()
    }

    fn router_topk(&self, logits: &[f32], n_expert: usize, k: usize, ids: &mut [u32], weights: &mut [f32]) -> Result<()> {
        let tokens = router_tokens(logits, n_expert, k, ids, weights)?;
        let dl = self.upload(ROUTER, logits)?;
        let (mut di, mut dw) = (self.upload_out(ROUTER, ids)?, self.upload_out(ROUTER, weights)?);
        self.router_topk_queue(&dl, tokens, n_expert, k, &mut di, &mut dw, None)?;
        self.synchronize(ROUTER)?;
        self.download_out(ROUTER, &di, ids)?;
        self.download_out(ROUTER, &dw, weights)
    }

    fn sample_rows(&self, logits: &[f32], n: usize, p: SampleParams, pos0: usize, ids: &mut [u32]) -> Result<()> {
        let rows = sample_count(logits, n, p, pos0, ids)?;
        let (dl, dpos) = (self.upload(SAMPLE, logits)?, self.upload(SAMPLE, &[pos0 as u32])?);
        let mut di = self.upload_out(SAMPLE, ids)?;
        self.sample_rows_queue(&dl, rows, n, p, &dpos, &mut di)?;
        self.synchronize(SAMPLE)?;
        self.download_out(SAMPLE, &di, ids)
    }
}

/// The cuda backend's launches run by the simulator.
#[cfg(feature = "sim")]
impl RouteOps for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn router_topk(&self, logits: &[f32], n_expert: usize, k: usize, ids: &mut [u32], weights: &mut [f32]) -> Result<()> {
        let tokens = router_tokens(logits, n_expert, k, ids, weights)? as u32;
        let mut a = SimArgs::new();
        a.input(logits).u32(tokens).u32(n_expert as u32).u32(k as u32).output(ids).output(weights).null();
        self.run(ROUTER, tokens, None, &a)
    }

    fn sample_rows(&self, logits: &[f32], n: usize, p: SampleParams, pos0: usize, ids: &mut [u32]) -> Result<()> {
        let rows = sample_count(logits, n, p, pos0, ids)? as u32;
        let pos = [pos0 as u32];
        let mut a = SimArgs::new();
        a.input(logits).u32(rows).u32(n as u32).u32(p.top_k as u32).f32(p.top_p).f32(p.inv_temp()).u32(p.seed as u32).u32((p.seed >> 32) as u32).input(&pos).output(ids);
        self.run(SAMPLE, rows, None, &a)
    }
}

/// The float64 router: softmax (NaN logits 0, the maximum's term 1, as the spec's limits),
/// top-k by probability (ties to the lower id), renormalised. Returns the ids and weights.
pub fn router_f64(logits: &[f32], n_expert: usize, k: usize) -> (Vec<u32>, Vec<f64>) {
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for row in logits.chunks_exact(n_expert) {
        let m = row.iter().filter(|v| !v.is_nan()).fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let e: Vec<f64> = row.iter().map(|&v| if v.is_nan() { 0.0 } else if v as f64 == m { 1.0 } else { (v as f64 - m).exp() }).collect();
        let total: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|&x| if total == 0.0 { 0.0 } else { x / total }).collect();
        let mut order: Vec<usize> = (0..n_expert).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let sum: f64 = order[..k].iter().map(|&i| p[i]).sum();
        for &i in &order[..k] {
            ids.push(i as u32);
            weights.push(if sum == 0.0 { 0.0 } else { p[i] / sum });
        }
    }
    (ids, weights)
}

/// Router logits: per row, plain values, exact ties (a few levels, the maximum shared), NaNs
/// among numbers, `-inf`s, all NaN, or a `+inf`.
pub fn router_logits(rng: &mut SmallRng, tokens: usize, n_expert: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..tokens * n_expert).map(|_| rng.random_range(-4.0f32..4.0)).collect();
    for row in x.chunks_mut(n_expert) {
        match rng.random_range(0..8) {
            0 | 1 => row.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 4.0), // ties
            2 => (0..n_expert / 4 + 1).for_each(|_| row[rng.random_range(0..n_expert)] = f32::NAN),
            3 => (0..n_expert / 4 + 1).for_each(|_| row[rng.random_range(0..n_expert)] = f32::NEG_INFINITY),
            4 => row.iter_mut().for_each(|v| *v = f32::NAN),
            5 => row[rng.random_range(0..n_expert)] = f32::INFINITY,
            _ => {}
        }
    }
    x
}

/// Sampler logits: [`random_logits`]'s rows (ties at the maximum, NaNs, all NaN, all `-inf`,
/// `+inf`, signed zeros), some rounded to whole numbers so the candidates tie in runs.
pub fn sample_logits(rng: &mut SmallRng, rows: usize, n: usize) -> Vec<f32> {
    let mut x = random_logits(rng, rows, n);
    for row in x.chunks_mut(n) {
        if rng.random_bool(0.3) {
            row.iter_mut().for_each(|v| *v = v.round());
        }
    }
    x
}

/// The router on every backend for one shape: ids and weights identical (poisoned first),
/// every element written, the first backend's weights against [`router_f64`].
fn router_case(backends: &[&dyn RouteOps], tokens: usize, n_expert: usize, k: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let logits = router_logits(&mut rng, tokens, n_expert);
    let (mut outs, mut unwritten, mut first) = (Vec::new(), Vec::new(), Vec::new());
    for &b in backends {
        let (mut ids, mut weights) = (vec![POISON_F32; tokens * k], vec![f32::from_bits(POISON_F32); tokens * k]);
        b.router_topk(&logits, n_expert, k, &mut ids, &mut weights)?;
        let words: Vec<u32> = ids.iter().copied().chain(weights.iter().map(|w| w.to_bits())).collect();
        note_unwritten(&mut unwritten, b.name(), words.iter().map(|&w| w == POISON_F32));
        if first.is_empty() {
            first = weights;
        }
        outs.push((b.name().to_string(), words));
    }
    let tk = tokens * k;
    let mismatch = compare_bits(&outs, |i, v| match i < tk {
        true => format!("id {v} (token {}, slot {})", i / k, i % k),
        false => format!("weight {:e} ({v:#010x}) (token {}, slot {})", f32::from_bits(v), (i - tk) / k, (i - tk) % k),
    });
    Ok(Outcome {
        kernel: ROUTER.into(),
        shape: format!("{tokens}x{n_expert} k{k}"),
        seed,
        backends: outs.into_iter().map(|o| o.0).collect(),
        mismatch,
        unwritten,
        nmse: Some(nmse(&first, &router_f64(&logits, n_expert, k).1)),
        nmse_max: NMSE_MAX,
    })
}

/// The sampler on every backend for one shape and setting: the drawn ids identical (poisoned
/// first) and every row written.
fn sample_case(backends: &[&dyn RouteOps], rows: usize, n: usize, p: SampleParams, pos0: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let logits = sample_logits(&mut rng, rows, n);
    let (mut outs, mut unwritten) = (Vec::new(), Vec::new());
    for &b in backends {
        let mut ids = vec![POISON_F32; rows];
        b.sample_rows(&logits, n, p, pos0, &mut ids)?;
        note_unwritten(&mut unwritten, b.name(), ids.iter().map(|&w| w == POISON_F32));
        outs.push((b.name().to_string(), ids));
    }
    Ok(Outcome {
        kernel: SAMPLE.into(),
        shape: format!("{rows}x{n} T{} top_k {} top_p {} pos {pos0} seed {:#x}", p.temperature, p.top_k, p.top_p, p.seed),
        seed,
        mismatch: compare_bits(&outs, |row, v| format!("row {row}: index {v}")),
        backends: outs.into_iter().map(|o| o.0).collect(),
        unwritten,
        nmse: None,
        nmse_max: NMSE_MAX,
    })
}

/// The family's parity suite from `seed`: the router at 8, 60, 128, 257 and 512 experts (whole
/// and partial turns of 8 keys and rows of 128 slots) with k 1, 2, 8 and 10 (where k fits) for
/// 1..=8 tokens; the sampler at 1000 and 151,936 logits under several
/// top-k / top-p / temperature settings, seeds and positions. `backends[0]` is the reference.
pub fn parity_cases(backends: &[&dyn RouteOps], seed: u64) -> Result<Vec<Outcome>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for n_expert in [8, 60, 128, 257, 512] {
        for k in [1, 2, 8, 10].into_iter().filter(|&k| k <= n_expert) {
            out.push(router_case(backends, rng.random_range(1..=8), n_expert, k, rng.random())?);
        }
    }
    let settings = [(1.0, 1, 1.0), (0.7, 40, 0.95), (1.0, 256, 1.0), (0.3, 20, 0.5), (1.5, 256, 0.9), (2.0, 7, 1e-6)];
    for (n, max_rows) in [(1000, 8), (151_936, 3)] {
        for (temperature, top_k, top_p) in settings {
            let p = SampleParams { temperature, top_k, top_p, seed: rng.random() };
            let pos0 = if rng.random_bool(0.2) { u32::MAX as usize - 1 } else { rng.random_range(0..1 << 20) };
            out.push(sample_case(backends, rng.random_range(1..=max_rows), n, p, pos0, rng.random())?);
        }
    }
    Ok(out)
}

