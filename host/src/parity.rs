//! The parity suite: random inputs from a printed seed, run on several backends, outputs
//! compared byte for byte, plus NMSE of the CPU replica against float64.
//!
//! Outputs are poisoned before every run (NaN with a marker payload for f32 outputs; two runs
//! with different fill bytes for byte outputs), so an element a kernel forgot to write is found
//! even where the other backends forgot it too.
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::backends::{Backend, ExpertTensor, FloatWeights, MoeOut, MoeWindow, Variant, Weights};
use crate::error::Result;
use crate::reference::{float_matvec_f64, matvec_f64, nmse};
use strata_gpu_shared::f16::f32_to_f16;
use strata_gpu_shared::formats::{q8_1, FloatFormat, WeightFormat, GROUP};
use strata_gpu_shared::launch::mmvq_launch;
use strata_gpu_shared::replica;

/// The NMSE bar against float64 (the one llama.cpp's backend tests use).
pub const NMSE_MAX: f64 = 5e-4;

/// Fewest output values NMSE is judged on. NMSE is a statistic of many outputs: for one or a few
/// dot products of random-sign terms the reference itself can land near zero (a single value
/// falls under 5e-4 only ~86% of the time at the replica's typical 1.5e-5), so smaller cases are
/// checked bit for bit only. At 32 values the chance a correct kernel fails is below 1e-20.
pub const NMSE_MIN_VALUES: usize = 32;

/// The bar for `row_top_prob`: a probability, so far tighter than the matvec bar.
pub const TOP_PROB_NMSE_MAX: f64 = 1e-6;

/// f32 poison: a quiet NaN with a payload no float operation produces.
pub const POISON_F32: u32 = 0x7fc0_5eed;

/// One case run on a set of backends.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub kernel: String,
    pub shape: String,
    pub seed: u64,
    /// Backends compared (with the kernel variant where a family has two), the reference first.
    pub backends: Vec<String>,
    /// `None` when all outputs are identical; else the first difference found.
    pub mismatch: Option<Mismatch>,
    /// Elements some backend left unwritten: (backend, count, first index).
    pub unwritten: Vec<(String, usize, usize)>,
    /// NMSE of the reference backend's output against float64 (where the kernel has one).
    pub nmse: Option<f64>,
    /// The bar that NMSE must meet ([`NMSE_MAX`] unless the kernel's issue sets another).
    pub nmse_max: f64,
}

#[derive(Clone, Debug)]
pub struct Mismatch {
    pub backend: String,
    pub index: usize,
    pub got: String,
    pub want: String,
}

impl Outcome {
    pub fn identical(&self) -> bool {
        self.mismatch.is_none() && self.unwritten.is_empty()
    }

    pub fn passed(&self) -> bool {
        self.identical() && self.nmse.is_none_or(|e| e <= self.nmse_max)
    }

    /// A one-paragraph account of what failed, for test failures and the CLI.
    pub fn explain(&self) -> String {
        let mut s = format!("{} {} seed {}:", self.kernel, self.shape, self.seed);
        for (b, n, first) in &self.unwritten {
            s += &format!(" {b} left {n} elements unwritten (first at {first});");
        }
        if let Some(m) = &self.mismatch {
            s += &format!(" {} differs from {} first at index {}: {} vs {};", m.backend, self.backends[0], m.index, m.got, m.want);
        }
        if let Some(e) = self.nmse {
            s += &format!(" NMSE vs float64 {e:.3e} (max {:.0e})", self.nmse_max);
        }
        s
    }
}

/// Random f32 activations: mostly normal-ish values with a per-row scale, plus zeros, exact
/// quantization ties and very small and very large groups, so every branch of the spec runs.
pub fn random_activations(rng: &mut SmallRng, n: usize) -> Vec<f32> {
    let mut x = vec![0f32; n];
    for g in x.chunks_mut(GROUP) {
        let kind = rng.random_range(0..10);
        let scale = match kind {
            0 => 1e-7,        // tiny: d rounds to an fp16 subnormal or 0
            1 => 3e6,         // huge: d clamps at 65504
            _ => 10f32.powf(rng.random_range(-3.0..2.0)),
        };
        for v in g.iter_mut() {
            let u: f32 = rng.random_range(-1.0..1.0);
            *v = u * scale;
        }
        match kind {
            2 => g.iter_mut().for_each(|v| *v = 0.0),
            3 => {
                // exact halves after scaling: amax 127 -> d 1, values k + 0.5 tie
                g[0] = 127.0;
                for (j, v) in g.iter_mut().enumerate().skip(1) {
                    *v = (j as f32 - 16.0) + 0.5;
                }
            }
            _ => {}
        }
    }
    x
}

/// Random fp16 scale bits, finite, with a magnitude `10^[lo, hi)` and either sign.
fn random_scale(rng: &mut SmallRng, lo: f32, hi: f32) -> u16 {
    let mag = 10f32.powf(rng.random_range(lo..hi));
    let s = if rng.random_bool(0.5) { -mag } else { mag };
    f32_to_f16(s)
}

/// Random weight blocks: random quant bytes (every pattern is valid) and finite scales.
pub fn random_weights(rng: &mut SmallRng, format: WeightFormat, m: usize, k: usize) -> Vec<u8> {
    if let Some(t) = format.tiling() {
        // By definition the base format's blocks (a scale each), tiled.
        let blocks = random_weights(rng, t.base, m, k);
        let mut tiles = vec![0u8; blocks.len()];
        t.tile(&blocks, &mut tiles);
        return tiles;
    }
    let bb = format.block_bytes();
    let mut data = vec![0u8; m * format.row_bytes(k)];
    rng.fill(&mut data[..]);
    let off = format.off_d();
    for block in data.chunks_exact_mut(bb) {
        block[off..off + 2].copy_from_slice(&random_scale(rng, -4.0, -1.0).to_le_bytes());
    }
    data
}


/// Runs `quantize_q8_1` on `backends` (reference first) for `rows` x `k` random activations.
pub fn quantize_case(backends: &[&dyn Backend], rows: usize, k: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let x = random_activations(&mut rng, rows * k);
    let len = q8_1::bytes_of(rows * k);
    let runs: Vec<_> = backends.iter().map(|&b| (b, Variant::Fast, b.name().to_string())).collect();
    let (outs, unwritten) = run_bytes(&runs, len, |b, _, out| b.quantize_q8_1(&x, out))?;
    let mismatch = compare_bits(&outs, |i, v| format!("byte {v} (block {}, offset {})", i / q8_1::BYTES, i % q8_1::BYTES));
    Ok(Outcome {
        kernel: "quantize_q8_1".into(),
        shape: format!("{rows}x{k}"),
        seed,
        backends: outs.into_iter().map(|o| o.0).collect(),
        mismatch,
        unwritten,
        nmse: None,
        nmse_max: NMSE_MAX,
    })
}

/// Runs `mmvq` for `format` on `backends` (reference first): `m` x `k` random weights times
/// `rows` random activation rows, quantized by the reference backend. With `check_reference`,
/// also the reference output's NMSE against float64 (when it has [`NMSE_MIN_VALUES`] values).
/// With `accumulate`, also accumulating into random outputs ([`run_f32`]).
#[allow(clippy::too_many_arguments)]
pub fn mmvq_case(
    backends: &[&dyn Backend],
    format: WeightFormat,
    m: usize,
    k: usize,
    rows: usize,
    seed: u64,
    check_reference: bool,
    accumulate: bool,
) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let data = random_weights(&mut rng, format, m, k);
    let w = Weights { format, m, k, data: &data };
    let x: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut xq = vec![0u8; q8_1::bytes_of(rows * k)];
    backends[0].quantize_q8_1(&x, &mut xq)?;
    let init = accumulate.then(|| random_activations(&mut rng, rows * m));
    let (outs, mismatch, unwritten) = run_f32(backends, rows * m, init.as_deref(), |b, acc, y| b.mmvq(&w, &xq, rows, acc, y))?;
    let nmse = (check_reference && rows * m >= NMSE_MIN_VALUES).then(|| nmse(&outs[0], &matvec_f64(&w, &x, rows)));
    Ok(Outcome {
        // The entry the backends' launch ran (`mmvq_launch` picks it by shape).
        kernel: mmvq_launch(format, m, rows, k / GROUP).kernel.into(),
        shape: format!("{m}x{k} x{rows}{}", accumulating(accumulate)),
        seed,
        backends: backends.iter().map(|b| b.name().to_string()).collect(),
        mismatch,
        unwritten,
        nmse,
        nmse_max: NMSE_MAX,
    })
}

/// Runs one kernel with an f32 output of `len` values on every backend, output poisoned first
/// (`run`'s flag false); with `init`, each backend runs it again accumulating into a copy of
/// `init` (the flag true), which must give `add_f32(init, its stored output)` bit for bit
/// ([`accumulated_mismatch`]; the stored outputs being equal, so are the accumulated ones).
/// Returns the stored outputs, the first mismatch and the unwritten counts.
#[allow(clippy::type_complexity)]
fn run_f32(
    backends: &[&dyn Backend],
    len: usize,
    init: Option<&[f32]>,
    run: impl Fn(&dyn Backend, bool, &mut [f32]) -> Result<()>,
) -> Result<(Vec<Vec<f32>>, Option<Mismatch>, Vec<(String, usize, usize)>)> {
    let mut outs = Vec::new();
    let mut unwritten = Vec::new();
    let mut wrong_sum = None;
    for &b in backends {
        let mut y = vec![f32::from_bits(POISON_F32); len];
        run(b, false, &mut y)?;
        note_unwritten(&mut unwritten, b.name(), y.iter().map(|v| v.to_bits() == POISON_F32));
        if let Some(init) = init {
            let mut sum = init.to_vec();
            run(b, true, &mut sum)?;
            wrong_sum = wrong_sum.or_else(|| accumulated_mismatch(b.name(), init, &y, &sum));
        }
        outs.push((b.name().to_string(), y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()));
    }
    let mismatch = compare_bits(&outs, |_, v| format!("{:e} ({v:#010x})", f32::from_bits(v))).or(wrong_sum);
    Ok((outs.into_iter().map(|(_, bits)| bits.into_iter().map(f32::from_bits).collect()).collect(), mismatch, unwritten))
}

/// Where `backend`'s output accumulated into `init` is not `add_f32(init, stored)` (the
/// replica's add of its stored output): the first such value. An accumulating kernel must give
/// the bits of the kernel followed by the residual add.
fn accumulated_mismatch(backend: &str, init: &[f32], stored: &[f32], sum: &[f32]) -> Option<Mismatch> {
    let mut want = vec![0f32; init.len()];
    replica::norm::add(init, stored, &mut want);
    let i = sum.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits())?;
    Some(Mismatch {
        backend: format!("{backend} accumulating"),
        index: i,
        got: format!("{:e} ({:#010x})", sum[i], sum[i].to_bits()),
        want: format!("add_f32({:e}, its stored {:e}) = {:e} ({:#010x})", init[i], stored[i], want[i], want[i].to_bits()),
    })
}

/// The shape suffix of a case run accumulating as well.
fn accumulating(accumulate: bool) -> &'static str {
    if accumulate {
        " +="
    } else {
        ""
    }
}

/// Records how many elements a run left unwritten (`left[i]` true), and the first.
pub(crate) fn note_unwritten(unwritten: &mut Vec<(String, usize, usize)>, name: &str, left: impl Iterator<Item = bool>) {
    let bad: Vec<usize> = left.enumerate().filter(|p| p.1).map(|p| p.0).collect();
    if let Some(&first) = bad.first() {
        unwritten.push((name.to_string(), bad.len(), first));
    }
}

/// Runs a kernel with a byte output of `len` bytes twice per (backend, variant), into buffers
/// filled with 0x00 and with 0xff: a byte the two runs disagree on was not written. Returns the
/// first run's bytes as words for [`compare_bits`].
#[allow(clippy::type_complexity)]
fn run_bytes(
    runs: &[(&dyn Backend, Variant, String)],
    len: usize,
    run: impl Fn(&dyn Backend, Variant, &mut [u8]) -> Result<()>,
) -> Result<(Vec<(String, Vec<u32>)>, Vec<(String, usize, usize)>)> {
    let mut outs = Vec::new();
    let mut unwritten = Vec::new();
    for (b, variant, name) in runs {
        let (mut a, mut c) = (vec![0x00u8; len], vec![0xffu8; len]);
        run(*b, *variant, &mut a)?;
        run(*b, *variant, &mut c)?;
        note_unwritten(&mut unwritten, name, a.iter().zip(&c).map(|(x, y)| x != y));
        outs.push((name.clone(), a.into_iter().map(u32::from).collect()));
    }
    Ok((outs, unwritten))
}

/// Runs `matvec` for float `format` on `backends` (reference first): `m` x `k` random weights
/// times `rows` random f32 rows, NMSE of the reference output against float64; with
/// `accumulate`, also accumulating into random outputs ([`run_f32`]).
pub fn matvec_case(backends: &[&dyn Backend], format: FloatFormat, m: usize, k: usize, rows: usize, seed: u64, accumulate: bool) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let data: Vec<u8> = (0..m * k)
        .flat_map(|_| {
            let v: f32 = rng.random_range(-1.0..1.0);
            match format {
                FloatFormat::F32 => v.to_le_bytes().to_vec(),
                FloatFormat::Bf16 => ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
                FloatFormat::F16 => f32_to_f16(v).to_le_bytes().to_vec(),
            }
        })
        .collect();
    let w = FloatWeights { format, m, k, data: &data };
    let x: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let init = accumulate.then(|| random_activations(&mut rng, rows * m));
    let (outs, mismatch, unwritten) = run_f32(backends, rows * m, init.as_deref(), |b, acc, y| b.matvec(&w, &x, rows, acc, y))?;
    let nmse = (rows * m >= NMSE_MIN_VALUES).then(|| nmse(&outs[0], &float_matvec_f64(&w, &x, rows)));
    Ok(Outcome {
        kernel: format.matvec_kernel().into(),
        shape: format!("{m}x{k} x{rows}{}", accumulating(accumulate)),
        seed,
        backends: backends.iter().map(|b| b.name().to_string()).collect(),
        mismatch,
        unwritten,
        nmse,
        nmse_max: NMSE_MAX,
    })
}

/// A random `mmvq` shape for `format`: rows 1..=8, K a multiple of the format's block up to
/// `max_k`, M up to `max_m`.
pub fn random_mmvq_shape(rng: &mut SmallRng, format: WeightFormat, max_m: usize, max_k: usize) -> (usize, usize, usize) {
    let m = rng.random_range(1..=max_m);
    let bv = format.block_values();
    let k = bv * rng.random_range(1..=(max_k / bv).max(1));
    let rows = rng.random_range(1..=8);
    (m, k, rows)
}

/// `k` rounded up to a whole number of `format`'s blocks: fixed test shapes written in 32-value
/// groups, made valid for every format.
pub fn fit_k(format: WeightFormat, k: usize) -> usize {
    k.div_ceil(format.block_values()) * format.block_values()
}

/// The seed for a run: `STRATA_SEED` if set, else from the clock. Callers print it.
pub fn seed_from_env() -> u64 {
    std::env::var("STRATA_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    })
}

/// Random logits rows: each row drawn from one of the cases the head rules name (plain values,
/// a tied maximum, NaNs among numbers, all NaN, all -inf, a +inf, signed zeros).
pub fn random_logits(rng: &mut SmallRng, rows: usize, n: usize) -> Vec<f32> {
    let mut x = vec![0f32; rows * n];
    for row in x.chunks_mut(n) {
        for v in row.iter_mut() {
            *v = rng.random_range(-12.0f32..12.0);
        }
        let at = |rng: &mut SmallRng| rng.random_range(0..n);
        match rng.random_range(0..10) {
            0 => {
                let (a, b) = (at(rng), at(rng));
                row[a] = 40.0;
                row[b] = 40.0; // tie: the lower index wins
            }
            1 => (0..n / 7 + 1).for_each(|_| row[at(rng)] = f32::NAN),
            2 => row.iter_mut().for_each(|v| *v = f32::NAN),
            3 => row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
            4 => row[at(rng)] = f32::INFINITY,
            5 => {
                row.iter_mut().for_each(|v| *v = -(v.abs()) - 1.0);
                row[at(rng)] = -0.0;
                row[at(rng)] = 0.0;
            }
            _ => {}
        }
    }
    x
}

/// One run of a kernel family variant on a backend, named for the report (`cuda/split`).
fn variants<'a>(backends: &[&'a dyn Backend]) -> Vec<(&'a dyn Backend, Variant, String)> {
    let mut v = Vec::new();
    for &b in backends {
        if b.name() == "cpu" {
            v.push((b, Variant::Fast, "cpu".to_string())); // the replica: one spec, no variants
        } else {
            v.push((b, Variant::Reference, format!("{}/ref", b.name())));
            v.push((b, Variant::Fast, format!("{}/fast", b.name())));
        }
    }
    v
}

/// Compares per-variant outputs (first = reference) element by element, as `u32` bit patterns.
pub(crate) fn compare_bits(outs: &[(String, Vec<u32>)], describe: impl Fn(usize, u32) -> String) -> Option<Mismatch> {
    let (_, want) = &outs[0];
    outs[1..].iter().find_map(|(name, got)| {
        got.iter().zip(want).position(|(a, b)| a != b).map(|i| Mismatch {
            backend: name.clone(),
            index: i,
            got: describe(i, got[i]),
            want: describe(i, want[i]),
        })
    })
}

/// `argmax_rows` on every backend and variant (one-block reference and split) for `rows` random
/// rows of `n` logits; outputs poisoned.
pub fn argmax_case(backends: &[&dyn Backend], rows: usize, n: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let x = random_logits(&mut rng, rows, n);
    let mut outs = Vec::new();
    let mut unwritten = Vec::new();
    for (b, variant, name) in variants(backends) {
        let (mut idx, mut flag) = (vec![POISON_F32; rows], vec![POISON_F32; rows]);
        b.argmax_rows(&x, n, variant, &mut idx, &mut flag)?;
        note_unwritten(&mut unwritten, &name, idx.iter().zip(&flag).map(|(&i, &f)| i == POISON_F32 || f == POISON_F32));
        // One word per row: index in the low 31 bits, the all-NaN flag on top.
        outs.push((name, idx.iter().zip(&flag).map(|(&i, &f)| i | f << 31).collect()));
    }
    Ok(Outcome {
        kernel: "argmax_rows".into(),
        shape: format!("{rows}x{n}"),
        seed,
        mismatch: compare_bits(&outs, |row, v| format!("row {row}: index {} all-NaN {}", v & 0x7fff_ffff, v >> 31)),
        backends: outs.into_iter().map(|o| o.0).collect(),
        unwritten,
        nmse: None,
        nmse_max: NMSE_MAX,
    })
}

/// The float64 probability of each row's maximum (NaN entries skipped, an all-NaN row 0).
pub fn top_prob_f64(x: &[f32], n: usize) -> Vec<f64> {
    x.chunks(n)
        .map(|row| {
            let m = row.iter().filter(|v| !v.is_nan()).fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let total: f64 = row.iter().filter(|v| !v.is_nan()).map(|&v| if v as f64 == m { 1.0 } else { (v as f64 - m).exp() }).sum();
            if total == 0.0 { 0.0 } else { 1.0 / total }
        })
        .collect()
}

/// `row_top_prob` on every backend and variant, NMSE of the reference against float64.
pub fn top_prob_case(backends: &[&dyn Backend], rows: usize, n: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let x = random_logits(&mut rng, rows, n);
    let mut outs = Vec::new();
    let mut unwritten = Vec::new();
    let mut first = Vec::new();
    for (b, variant, name) in variants(backends) {
        let mut p = vec![f32::from_bits(POISON_F32); rows];
        b.row_top_prob(&x, n, variant, &mut p)?;
        note_unwritten(&mut unwritten, &name, p.iter().map(|v| v.to_bits() == POISON_F32));
        if first.is_empty() {
            first = p.clone();
        }
        outs.push((name, p.iter().map(|v| v.to_bits()).collect()));
    }
    Ok(Outcome {
        kernel: "row_top_prob".into(),
        shape: format!("{rows}x{n}"),
        seed,
        mismatch: compare_bits(&outs, |row, v| format!("row {row}: {:e} ({v:#010x})", f32::from_bits(v))),
        backends: outs.into_iter().map(|o| o.0).collect(),
        unwritten,
        nmse: Some(nmse(&first, &top_prob_f64(&x, n))),
        nmse_max: TOP_PROB_NMSE_MAX,
    })
}

/// `quantize_q8_0_scaled` on every backend and variant (warp per block, thread per block) for
/// random rows with zeros, exact .5 ties and subnormals, scales per row or per column; every
/// byte checked written (two runs with different fill bytes must agree).
pub fn quantize_q8_0_case(backends: &[&dyn Backend], rows: usize, k: usize, per_column: bool, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut x = random_activations(&mut rng, rows * k);
    for v in x.iter_mut().step_by(97) {
        *v = f32::from_bits(rng.random_range(1..0x0080_0000)); // subnormals
    }
    let scales: Vec<f32> = (0..if per_column { k } else { rows })
        .map(|i| match i % 11 {
            0 => 0.0,
            1 => 1.0, // keeps the .5 ties of random_activations exact
            _ => rng.random_range(0.01f32..4.0),
        })
        .collect();
    let len = rows * k / GROUP * strata_gpu_shared::formats::q8_0::BYTES;
    let (outs, unwritten) = run_bytes(&variants(backends), len, |b, v, out| b.quantize_q8_0_scaled(&x, k, &scales, per_column, v, out))?;
    let mismatch = compare_bits(&outs, |i, v| format!("byte {v} (block {}, offset {})", i / 34, i % 34));
    Ok(Outcome {
        kernel: "quantize_q8_0_scaled".into(),
        shape: format!("{rows}x{k} {}", if per_column { "per-column" } else { "per-row" }),
        seed,
        mismatch,
        backends: outs.into_iter().map(|o| o.0).collect(),
        unwritten,
        nmse: None,
        nmse_max: NMSE_MAX,
    })
}

/// A random MoE layer and window: the expert tensors and the window's inputs.
pub struct MoeCase {
    pub gate: Vec<u8>,
    pub up: Vec<u8>,
    pub down: Vec<u8>,
    pub formats: (WeightFormat, WeightFormat),
    pub n_expert: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub tokens: usize,
    pub k: usize,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
    pub x: Vec<f32>,
}

impl MoeCase {
    /// Random weights; each token picks `k` distinct experts from a pool a little larger than
    /// `k`, so tokens share experts (groups of 1..tokens entries) and some experts go unused.
    #[allow(clippy::too_many_arguments)]
    pub fn random(rng: &mut SmallRng, formats: (WeightFormat, WeightFormat), n_expert: usize, n_embd: usize, n_ff: usize, tokens: usize, k: usize) -> MoeCase {
        let gate = random_weights(rng, formats.0, n_expert * n_ff, n_embd);
        let up = random_weights(rng, formats.0, n_expert * n_ff, n_embd);
        let down = random_weights(rng, formats.1, n_expert * n_embd, n_ff);
        let (ids, weights, x) = Self::random_window(rng, n_expert, n_embd, tokens, k);
        MoeCase { gate, up, down, formats, n_expert, n_embd, n_ff, tokens, k, ids, weights, x }
    }

    /// A window's selections, routing weights and activations: each token picks `k` distinct
    /// experts from a pool a little larger than `k` (so tokens share experts).
    pub fn random_window(rng: &mut SmallRng, n_expert: usize, n_embd: usize, tokens: usize, k: usize) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
        let pool_size = rng.random_range(k..=n_expert.min(k + 3));
        let mut pool: Vec<u32> = (0..n_expert as u32).collect();
        first_k(rng, &mut pool, pool_size);
        pool.truncate(pool_size);
        window_of(rng, n_embd, tokens, k, |rng| {
            let mut mine = pool.clone();
            first_k(rng, &mut mine, k);
            mine.truncate(k);
            mine
        })
    }

    /// A window whose `tokens` each select `k` distinct experts drawn uniformly from all
    /// `n_expert` (independently per token, as a trained router's windows roughly do), random
    /// renormalised weights and activations: the expert bench's uniform routing.
    pub fn uniform_window(rng: &mut SmallRng, n_expert: usize, n_embd: usize, tokens: usize, k: usize) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
        let mut all: Vec<u32> = (0..n_expert as u32).collect();
        window_of(rng, n_embd, tokens, k, |rng| {
            first_k(rng, &mut all, k);
            all[..k].to_vec()
        })
    }

    /// A window of 8 tokens x 10 selections over 16 experts whose groups have 0 to 11 entries:
    /// expert `order[e]` gets `e + 1` selections for `e < 11` (66), expert `order[11]` none, and
    /// the other 14 selections spread over the last four. Selections are shuffled over the
    /// (token, slot) pairs, so a token may select an expert twice (the kernels must not care).
    pub fn crowded(rng: &mut SmallRng, formats: (WeightFormat, WeightFormat), n_embd: usize, n_ff: usize) -> MoeCase {
        let (n_expert, tokens, k) = (16, 8, 10);
        let mut case = MoeCase::random(rng, formats, n_expert, n_embd, n_ff, tokens, k);
        let mut order: Vec<u32> = (0..n_expert as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let mut ids: Vec<u32> = (0..11).flat_map(|e| std::iter::repeat_n(order[e], e + 1)).collect();
        ids.extend((0..tokens * k - ids.len()).map(|i| order[12 + i % 4]));
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.random_range(0..=i));
        }
        case.ids = ids;
        case
    }

    /// How many of [`moe_words`]'s words are hq bytes and how many y values (the combined rows
    /// follow, stored, then accumulated).
    pub fn word_counts(&self) -> (usize, usize) {
        let n = self.tokens * self.k;
        (q8_1::bytes_of(n * self.n_ff), n * self.n_embd)
    }

    /// The window as backends take it, with `xq` the activations quantized by `quantizer`.
    pub fn window<'a>(&'a self, xq: &'a [u8]) -> MoeWindow<'a> {
        let t = |format, rows, cols, data: &'a [u8]| ExpertTensor { format, n_expert: self.n_expert, rows, cols, data };
        MoeWindow {
            tokens: self.tokens,
            k: self.k,
            ids: &self.ids,
            weights: &self.weights,
            xq,
            gate: t(self.formats.0, self.n_ff, self.n_embd, &self.gate),
            up: t(self.formats.0, self.n_ff, self.n_embd, &self.up),
            down: t(self.formats.1, self.n_embd, self.n_ff, &self.down),
        }
    }

    /// The same layer with only token `j` of the window.
    pub fn alone(&self, j: usize) -> MoeCase {
        let k = self.k;
        MoeCase {
            gate: self.gate.clone(),
            up: self.up.clone(),
            down: self.down.clone(),
            tokens: 1,
            ids: self.ids[j * k..(j + 1) * k].to_vec(),
            weights: self.weights[j * k..(j + 1) * k].to_vec(),
            x: self.x[j * self.n_embd..(j + 1) * self.n_embd].to_vec(),
            ..*self
        }
    }

    /// Float64 reference: dequantized weights, unquantized activations and SwiGLU output.
    pub fn reference_f64(&self) -> Vec<f64> {
        let w = self.window(&[]);
        let dot = |t: &ExpertTensor, e: usize, i: usize, v: &[f64]| -> f64 {
            let mut row = Vec::with_capacity(t.cols);
            crate::reference::dequant_row_f32(t.format, t.row(e, i), t.cols, &mut row);
            row.iter().zip(v).map(|(&a, b)| a as f64 * b).sum()
        };
        let mut out = vec![0.0f64; self.tokens * self.n_embd];
        for t in 0..self.tokens {
            let x: Vec<f64> = self.x[t * self.n_embd..(t + 1) * self.n_embd].iter().map(|&v| v as f64).collect();
            for s in 0..self.k {
                let e = self.ids[t * self.k + s] as usize;
                let h: Vec<f64> = (0..self.n_ff)
                    .map(|i| {
                        let g = dot(&w.gate, e, i, &x);
                        g / (1.0 + (-g).exp()) * dot(&w.up, e, i, &x)
                    })
                    .collect();
                for i in 0..self.n_embd {
                    out[t * self.n_embd + i] += self.weights[t * self.k + s] as f64 * dot(&w.down, e, i, &h);
                }
            }
        }
        out
    }
}

/// Runs a window on one backend with poisoned outputs, or with `accumulate` the combined rows
/// added to the window's activations (random values the shape of the output); returns (hq, y,
/// out).
pub fn run_moe(b: &dyn Backend, case: &MoeCase, xq: &[u8], hq_fill: u8, accumulate: bool) -> Result<(Vec<u8>, Vec<f32>, Vec<f32>)> {
    let n = case.tokens * case.k;
    let mut hq = vec![hq_fill; q8_1::bytes_of(n * case.n_ff)];
    let mut y = vec![f32::from_bits(POISON_F32); n * case.n_embd];
    let mut out = if accumulate { case.x.clone() } else { vec![f32::from_bits(POISON_F32); case.tokens * case.n_embd] };
    b.moe(&case.window(xq), &mut MoeOut { hq: &mut hq, y: &mut y, out: &mut out, accumulate })?;
    Ok((hq, y, out))
}

/// One backend's outputs of a window as words (the hq bytes, then the y and out bits, then the
/// out bits accumulated into the activations), run twice into outputs poisoned differently (the
/// second run the accumulating one); the flags mark the elements neither run wrote
/// ([`moe_outcome`] checks the accumulated rows against the stored ones).
pub fn moe_words(b: &dyn Backend, case: &MoeCase, xq: &[u8]) -> Result<(Vec<u32>, Vec<bool>)> {
    let (hq, y, out) = run_moe(b, case, xq, 0x00, false)?;
    let (hq2, _, sum) = run_moe(b, case, xq, 0xff, true)?;
    let unwritten = hq.iter().zip(&hq2).map(|(a, c)| a != c).chain(y.iter().chain(&out).map(|v| v.to_bits() == POISON_F32)).collect();
    let words = hq.iter().map(|&v| v as u32).chain(y.iter().chain(&out).chain(&sum).map(|v| v.to_bits())).collect();
    Ok((words, unwritten))
}

/// The window's activations quantized by `b`.
pub fn moe_xq(b: &dyn Backend, case: &MoeCase) -> Result<Vec<u8>> {
    let mut xq = vec![0u8; q8_1::bytes_of(case.tokens * case.n_embd)];
    b.quantize_q8_1(&case.x, &mut xq)?;
    Ok(xq)
}

/// The outcome of comparing `outs` (the reference first) for `case`: the first difference, named
/// by stage, selection and row, or else the first accumulated value that is not the stored one
/// added to the activations.
fn moe_outcome(case: &MoeCase, seed: u64, outs: Vec<(String, Vec<u32>)>, unwritten: Vec<(String, usize, usize)>, nmse: Option<f64>) -> Outcome {
    let (nh, ny) = case.word_counts();
    let no = case.x.len();
    let row_bytes = q8_1::bytes_of(case.n_ff);
    let row = |stage: &str, v: u32, at: usize| format!("{stage} {:e} (token {}, col {})", f32::from_bits(v), at / case.n_embd, at % case.n_embd);
    let mismatch = compare_bits(&outs, |i, v| match i {
        i if i < nh => format!("hq byte {v} (selection {}, block {})", i / row_bytes, i % row_bytes / q8_1::BYTES),
        i if i < nh + ny => format!("y {:e} (selection {}, row {})", f32::from_bits(v), (i - nh) / case.n_embd, (i - nh) % case.n_embd),
        i if i < nh + ny + no => row("out", v, i - nh - ny),
        i => row("accumulated out", v, i - nh - ny - no),
    })
    .or_else(|| {
        outs.iter().find_map(|(name, words)| {
            let floats = |from: usize| words[from..from + no].iter().map(|&w| f32::from_bits(w)).collect::<Vec<f32>>();
            accumulated_mismatch(name, &case.x, &floats(nh + ny), &floats(nh + ny + no))
        })
    });
    Outcome {
        kernel: format!("moe {}/{}", case.formats.0.name(), case.formats.1.name()),
        shape: format!("{}x{} e{} T{} k{}", case.n_embd, case.n_ff, case.n_expert, case.tokens, case.k),
        seed,
        backends: outs.into_iter().map(|o| o.0).collect(),
        mismatch,
        unwritten,
        nmse,
        nmse_max: NMSE_MAX,
    }
}

/// The MoE window on every backend: the SwiGLU q8_1 rows, the down rows and the combined rows
/// identical (first difference reported by stage), every element written, the combined rows
/// accumulated into the activations equal to the stored ones added to them, and the combined
/// rows' NMSE against float64 end to end.
pub fn moe_case(backends: &[&dyn Backend], case: &MoeCase, seed: u64) -> Result<Outcome> {
    let xq = moe_xq(backends[0], case)?;
    let (mut outs, mut unwritten) = (Vec::new(), Vec::new());
    for &b in backends {
        let (words, left) = moe_words(b, case, &xq)?;
        note_unwritten(&mut unwritten, b.name(), left.into_iter());
        outs.push((b.name().to_string(), words));
    }
    let (nh, ny) = case.word_counts();
    let first_out: Vec<f32> = outs[0].1[nh + ny..nh + ny + case.x.len()].iter().map(|&w| f32::from_bits(w)).collect();
    let nmse = nmse(&first_out, &case.reference_f64());
    Ok(moe_outcome(case, seed, outs, unwritten, Some(nmse)))
}

/// `b` (under the label `name`, e.g. its knobs) against a reference's words from [`moe_words`]
/// for the same case and `xq`: identical bytes, every element written.
pub fn moe_against(reference: (&str, &[u32]), b: &dyn Backend, name: &str, case: &MoeCase, xq: &[u8], seed: u64) -> Result<Outcome> {
    let (words, left) = moe_words(b, case, xq)?;
    let mut unwritten = Vec::new();
    note_unwritten(&mut unwritten, name, left.into_iter());
    Ok(moe_outcome(case, seed, vec![(reference.0.to_string(), reference.1.to_vec()), (name.to_string(), words)], unwritten, None))
}

/// Puts `k` distinct elements of `v`, drawn uniformly, in `v[..k]` (a partial Fisher-Yates).
fn first_k(rng: &mut SmallRng, v: &mut [u32], k: usize) {
    for i in 0..k {
        let j = rng.random_range(i..v.len());
        v.swap(i, j);
    }
}

/// A window of `tokens` tokens, each `select`ing its `k` experts, with random weights
/// renormalised to sum 1 per token, then `tokens x n_embd` random activations.
fn window_of(rng: &mut SmallRng, n_embd: usize, tokens: usize, k: usize, mut select: impl FnMut(&mut SmallRng) -> Vec<u32>) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for _ in 0..tokens {
        ids.extend(select(rng));
        let raw: Vec<f32> = (0..k).map(|_| rng.random_range(0.05f32..1.0)).collect();
        let sum: f32 = raw.iter().sum();
        weights.extend(raw.iter().map(|w| w / sum));
    }
    let x: Vec<f32> = (0..tokens * n_embd).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    (ids, weights, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uniform routing: each token's `k` experts are distinct and in range, and over many
    /// tokens every expert is chosen about `tokens * k / n_expert` times (the shared routing
    /// would keep to `k + 3` of them).
    #[test]
    fn uniform_windows_spread_over_every_expert() {
        let (n_expert, k, tokens) = (128, 8, 2000);
        let mut rng = SmallRng::seed_from_u64(5);
        let (ids, weights, x) = MoeCase::uniform_window(&mut rng, n_expert, 64, tokens, k);
        assert_eq!((ids.len(), weights.len(), x.len()), (tokens * k, tokens * k, tokens * 64));
        let mut count = vec![0usize; n_expert];
        for token in ids.chunks_exact(k) {
            let mut t = token.to_vec();
            t.sort_unstable();
            t.dedup();
            assert_eq!(t.len(), k, "a token selected an expert twice: {token:?}");
            for &e in token {
                count[e as usize] += 1;
            }
        }
        let mean = (tokens * k / n_expert) as f64;
        assert!(count.iter().all(|&c| (c as f64 - mean).abs() < 0.35 * mean), "{count:?}");
        for w in weights.chunks_exact(k) {
            assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }
}
