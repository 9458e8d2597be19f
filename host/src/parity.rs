//! The parity suite: random inputs from a printed seed, run on several backends, outputs
//! compared byte for byte, plus NMSE of the CPU replica against float64.
//!
//! Outputs are poisoned before every run (NaN with a marker payload for f32 outputs; two runs
//! with different fill bytes for byte outputs), so an element a kernel forgot to write is found
//! even where the other backends forgot it too.
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::backend::{Backend, FloatWeights, Weights};
use crate::error::Result;
use crate::reference::{float_matvec_f64, matvec_f64, nmse};
use strata_gpu_shared::f16::f32_to_f16;
use strata_gpu_shared::formats::{q8_1, FloatFormat, WeightFormat, GROUP};

/// The NMSE bar against float64 (the one llama.cpp's backend tests use).
pub const NMSE_MAX: f64 = 5e-4;

/// Fewest output values NMSE is judged on. NMSE is a statistic of many outputs: for one or a few
/// dot products of random-sign terms the reference itself can land near zero (a single value
/// falls under 5e-4 only ~86% of the time at the replica's typical 1.5e-5), so smaller cases are
/// checked bit for bit only. At 32 values the chance a correct kernel fails is below 1e-20.
pub const NMSE_MIN_VALUES: usize = 32;

/// f32 poison: a quiet NaN with a payload no float operation produces.
pub const POISON_F32: u32 = 0x7fc0_5eed;

/// One case run on a set of backends.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub kernel: String,
    pub shape: String,
    pub seed: u64,
    /// Backends compared, the reference (`cpu`) first.
    pub backends: Vec<&'static str>,
    /// `None` when all outputs are identical; else the first difference found.
    pub mismatch: Option<Mismatch>,
    /// Elements some backend left unwritten: (backend, count, first index).
    pub unwritten: Vec<(&'static str, usize, usize)>,
    /// NMSE of the reference backend's output against float64 (where the kernel has one).
    pub nmse: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct Mismatch {
    pub backend: &'static str,
    pub index: usize,
    pub got: String,
    pub want: String,
}

impl Outcome {
    pub fn identical(&self) -> bool {
        self.mismatch.is_none() && self.unwritten.is_empty()
    }

    pub fn passed(&self) -> bool {
        self.identical() && self.nmse.is_none_or(|e| e <= NMSE_MAX)
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
            s += &format!(" NMSE vs float64 {e:.3e} (max {NMSE_MAX:.0e})");
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
    let bb = format.block_bytes();
    let mut data = vec![0u8; m * format.row_bytes(k)];
    rng.fill(&mut data[..]);
    let off = format.off_d();
    for block in data.chunks_exact_mut(bb) {
        block[off..off + 2].copy_from_slice(&random_scale(rng, -4.0, -1.0).to_le_bytes());
    }
    data
}

fn first_diff<T: PartialEq + std::fmt::Debug>(a: &[T], b: &[T]) -> Option<(usize, String, String)> {
    a.iter().zip(b).position(|(x, y)| x != y).map(|i| (i, format!("{:?}", a[i]), format!("{:?}", b[i])))
}

/// Runs `quantize_q8_1` on `backends` (reference first) for `rows` x `k` random activations.
pub fn quantize_case(backends: &[&dyn Backend], rows: usize, k: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let x = random_activations(&mut rng, rows * k);
    let len = rows * k / GROUP * q8_1::BYTES;
    let mut outs = Vec::new();
    let mut unwritten = Vec::new();
    for b in backends {
        let (mut a, mut c) = (vec![0x00u8; len], vec![0xffu8; len]);
        b.quantize_q8_1(&x, &mut a)?;
        b.quantize_q8_1(&x, &mut c)?;
        let bad: Vec<usize> = (0..len).filter(|&i| a[i] != c[i]).collect();
        if let Some(&first) = bad.first() {
            unwritten.push((b.name(), bad.len(), first));
        }
        outs.push(a);
    }
    let mismatch = outs[1..].iter().zip(&backends[1..]).find_map(|(o, b)| {
        first_diff(o, &outs[0]).map(|(index, got, want)| Mismatch {
            backend: b.name(),
            index,
            got: format!("byte {got} (block {}, offset {})", index / q8_1::BYTES, index % q8_1::BYTES),
            want: format!("byte {want}"),
        })
    });
    Ok(Outcome {
        kernel: "quantize_q8_1".into(),
        shape: format!("{rows}x{k}"),
        seed,
        backends: backends.iter().map(|b| b.name()).collect(),
        mismatch,
        unwritten,
        nmse: None,
    })
}

/// Runs `mmvq` for `format` on `backends` (reference first): `m` x `k` random weights times
/// `rows` random activation rows, quantized by the reference backend. With `check_reference`,
/// also the reference output's NMSE against float64 (when it has [`NMSE_MIN_VALUES`] values).
pub fn mmvq_case(
    backends: &[&dyn Backend],
    format: WeightFormat,
    m: usize,
    k: usize,
    rows: usize,
    seed: u64,
    check_reference: bool,
) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let data = random_weights(&mut rng, format, m, k);
    let w = Weights { format, m, k, data: &data };
    let x: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut xq = vec![0u8; rows * k / GROUP * q8_1::BYTES];
    backends[0].quantize_q8_1(&x, &mut xq)?;
    let (outs, mismatch, unwritten) = run_f32(backends, rows * m, |b, y| b.mmvq(&w, &xq, rows, y))?;
    let nmse = (check_reference && rows * m >= NMSE_MIN_VALUES).then(|| nmse(&outs[0], &matvec_f64(&w, &x, rows)));
    Ok(Outcome {
        kernel: format.mmvq_kernel().into(),
        shape: format!("{m}x{k} x{rows}"),
        seed,
        backends: backends.iter().map(|b| b.name()).collect(),
        mismatch,
        unwritten,
        nmse,
    })
}

/// Runs one kernel with an f32 output of `len` values on every backend, output poisoned first;
/// returns the outputs, the first mismatch against the first backend, and the unwritten counts.
#[allow(clippy::type_complexity)]
fn run_f32(
    backends: &[&dyn Backend],
    len: usize,
    run: impl Fn(&dyn Backend, &mut [f32]) -> Result<()>,
) -> Result<(Vec<Vec<f32>>, Option<Mismatch>, Vec<(&'static str, usize, usize)>)> {
    let mut outs: Vec<Vec<f32>> = Vec::new();
    let mut unwritten = Vec::new();
    for &b in backends {
        let mut y = vec![f32::from_bits(POISON_F32); len];
        run(b, &mut y)?;
        let bad: Vec<usize> = (0..y.len()).filter(|&i| y[i].to_bits() == POISON_F32).collect();
        if let Some(&first) = bad.first() {
            unwritten.push((b.name(), bad.len(), first));
        }
        outs.push(y);
    }
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
    let reference = bits(&outs[0]);
    let mismatch = outs[1..].iter().zip(&backends[1..]).find_map(|(o, b)| {
        first_diff(&bits(o), &reference).map(|(index, _, _)| Mismatch {
            backend: b.name(),
            index,
            got: format!("{:e} ({:#010x})", o[index], o[index].to_bits()),
            want: format!("{:e} ({:#010x})", outs[0][index], reference[index]),
        })
    });
    Ok((outs, mismatch, unwritten))
}

/// Runs `matvec` for float `format` on `backends` (reference first): `m` x `k` random weights
/// times `rows` random f32 rows, NMSE of the reference output against float64.
pub fn matvec_case(backends: &[&dyn Backend], format: FloatFormat, m: usize, k: usize, rows: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let data: Vec<u8> = (0..m * k)
        .flat_map(|_| {
            let v: f32 = rng.random_range(-1.0..1.0);
            match format {
                FloatFormat::F32 => v.to_le_bytes().to_vec(),
                FloatFormat::Bf16 => ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
            }
        })
        .collect();
    let w = FloatWeights { format, m, k, data: &data };
    let x: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let (outs, mismatch, unwritten) = run_f32(backends, rows * m, |b, y| b.matvec(&w, &x, rows, y))?;
    let nmse = (rows * m >= NMSE_MIN_VALUES).then(|| nmse(&outs[0], &float_matvec_f64(&w, &x, rows)));
    Ok(Outcome {
        kernel: format.matvec_kernel().into(),
        shape: format!("{m}x{k} x{rows}"),
        seed,
        backends: backends.iter().map(|b| b.name()).collect(),
        mismatch,
        unwritten,
        nmse,
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
