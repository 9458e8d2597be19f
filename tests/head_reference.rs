//! CPU-only: the sampler-head and Q8_0 quantizer replicas against independent readings of their
//! rules and against float64.
mod common;

use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::parity::{self, TOP_PROB_NMSE_MAX};
use strata::host::{Backend, Variant};

/// The rules written out plainly: NaN never wins over a number, larger wins, ties to the lowest
/// index, an all-NaN row gives 0 and the flag.
fn argmax_by_hand(row: &[f32]) -> (u32, u32) {
    let numbers: Vec<(usize, f32)> = row.iter().copied().enumerate().filter(|(_, v)| !v.is_nan()).collect();
    if numbers.is_empty() {
        return (0, 1);
    }
    let max = numbers.iter().map(|p| p.1).fold(f32::NEG_INFINITY, f32::max);
    (numbers.iter().find(|p| p.1 == max).unwrap().0 as u32, 0)
}

#[test]
fn argmax_replica_follows_the_rules() {
    let seed = common::seed("argmax_replica_follows_the_rules");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for _ in 0..40 {
        let (rows, n) = (rng.random_range(1..=8), rng.random_range(1..=20_000));
        let x = parity::random_logits(&mut rng, rows, n);
        let (mut idx, mut flag) = (vec![9; rows], vec![9; rows]);
        cpu.argmax_rows(&x, n, Variant::Fast, &mut idx, &mut flag).unwrap();
        for (r, row) in x.chunks(n).enumerate() {
            assert_eq!((idx[r], flag[r]), argmax_by_hand(row), "row {r} of {n}");
        }
    }
    // The named cases, by hand.
    let nan = f32::NAN;
    let cases: [(&[f32], (u32, u32)); 6] = [
        (&[nan, nan, nan], (0, 1)),
        (&[f32::NEG_INFINITY; 4], (0, 0)),
        (&[1.0, f32::INFINITY, nan, f32::INFINITY], (1, 0)),
        (&[nan, -5.0, nan], (1, 0)),
        (&[-0.0, 0.0, -1.0], (0, 0)),
        (&[3.0, 7.0, 7.0], (1, 0)),
    ];
    for (row, want) in cases {
        let (mut i, mut f) = ([0u32], [0u32]);
        cpu.argmax_rows(row, row.len(), Variant::Fast, &mut i, &mut f).unwrap();
        assert_eq!((i[0], f[0]), want, "{row:?}");
    }
}

#[test]
fn top_prob_replica_matches_float64() {
    let seed = common::seed("top_prob_replica_matches_float64");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for n in [106_299, 151_936, 248_320, 1, 4097, rng.random_range(2..50_000)] {
        let out = parity::top_prob_case(&[&cpu], rng.random_range(1..=8), n, rng.random()).unwrap();
        eprintln!("  {} {}: NMSE {:.2e}", out.kernel, out.shape, out.nmse.unwrap());
        assert!(out.passed() && out.nmse.unwrap() <= TOP_PROB_NMSE_MAX, "{}", out.explain());
    }
}

#[test]
fn quantize_q8_0_replica_follows_the_spec() {
    let seed = common::seed("quantize_q8_0_replica_follows_the_spec");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for per_column in [false, true] {
        let (rows, k) = (rng.random_range(1..=8), 32 * rng.random_range(1..=64));
        let x = parity::random_activations(&mut rng, rows * k);
        let scales: Vec<f32> = (0..if per_column { k } else { rows }).map(|_| rng.random_range(0.0f32..3.0)).collect();
        let mut out = vec![0u8; rows * k / 32 * 34];
        cpu.quantize_q8_0_scaled(&x, k, &scales, per_column, Variant::Fast, &mut out).unwrap();
        for (g, b) in out.chunks(34).enumerate() {
            let v: Vec<f32> = (0..32).map(|j| {
                let i = g * 32 + j;
                x[i] * if per_column { scales[i % k] } else { scales[i / k] }
            }).collect();
            let amax = v.iter().map(|a| a.abs()).fold(0.0f32, f32::max);
            let d = f16::from_f32((amax / 127.0).min(65504.0));
            assert_eq!(u16::from_le_bytes([b[0], b[1]]), d.to_bits(), "block {g}");
            for (j, &vj) in v.iter().enumerate() {
                let want = if d.to_f32() == 0.0 { 0.0 } else { (vj / d.to_f32()).round_ties_even().clamp(-127.0, 127.0) };
                assert_eq!(b[2 + j] as i8 as f32, want, "block {g} value {j}");
            }
        }
    }
}
