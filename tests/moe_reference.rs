//! CPU-only: the routed-expert replica against float64 end to end, and a token's output the
//! same, bit for bit, alone and inside windows of 2..8 tokens.
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::parity::{self, MoeCase};
use strata::host::{Backend, Error, MoeOut};
use strata_gpu_shared::formats::WeightFormat as W;

#[test]
fn moe_replica_matches_float64() {
    let seed = common::seed("moe_replica_matches_float64");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for formats in [(W::Iq3Xxs, W::Iq4Nl), (W::Iq2S, W::Q2_0), (W::Iq3S, W::Iq3S), (W::Q8_0, W::Q8_0)] {
        let (t, k) = (rng.random_range(1..=8), rng.random_range(1..=10));
        let case = MoeCase::random(&mut rng, formats, 24, 512, 512, t, k);
        let out = parity::moe_case(&[&cpu], &case, seed).unwrap();
        eprintln!("  {} {}: NMSE {:.2e}", out.kernel, out.shape, out.nmse.unwrap());
        assert!(out.passed(), "{}", out.explain());
    }
}

/// A window whose groups hold 0 to 11 entries (a token may select an expert twice): the table
/// has every group size from 1 to 11, and the replica still meets float64.
#[test]
fn crowded_groups_match_float64() {
    let seed = common::seed("crowded_groups_match_float64");
    let mut rng = SmallRng::seed_from_u64(seed);
    let case = MoeCase::crowded(&mut rng, (W::Iq2Xxs, W::Q2_0), 256, 448);
    let mut sizes = vec![0; case.n_expert];
    case.ids.iter().for_each(|&e| sizes[e as usize] += 1);
    sizes.sort_unstable();
    assert_eq!((sizes[0], sizes[case.n_expert - 1]), (0, 11), "{sizes:?}");
    assert!((1..=11).all(|s| sizes.contains(&s)), "{sizes:?}");
    let out = parity::moe_case(&[&CpuBackend::new()], &case, seed).unwrap();
    eprintln!("  {} {}: NMSE {:.2e}", out.kernel, out.shape, out.nmse.unwrap());
    assert!(out.passed(), "{}", out.explain());
}

/// Token j of a window gives the same bits alone and in windows of 2..8 with random others.
#[test]
fn a_token_is_the_same_in_any_window() {
    let seed = common::seed("a_token_is_the_same_in_any_window");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    let case = MoeCase::random(&mut rng, (W::Iq3S, W::Q2_0), 16, 256, 256, 8, 4);
    let mut xq = vec![0u8; case.tokens * case.n_embd / 32 * 36];
    cpu.quantize_q8_1(&case.x, &mut xq).unwrap();
    let (_, _, full) = parity::run_moe(&cpu, &case, &xq, 0, false).unwrap();
    for j in 0..case.tokens {
        let alone = case.alone(j);
        let (_, _, out) = parity::run_moe(&cpu, &alone, &xq[j * case.n_embd / 32 * 36..(j + 1) * case.n_embd / 32 * 36], 0, false).unwrap();
        let row = &full[j * case.n_embd..(j + 1) * case.n_embd];
        assert!(out.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()), "token {j}: alone differs from the 8-token window");
    }
}

#[test]
fn bad_windows_are_errors_naming_moe() {
    let mut rng = SmallRng::seed_from_u64(3);
    let cpu = CpuBackend::new();
    let mut case = MoeCase::random(&mut rng, (W::Iq4Nl, W::Iq4Nl), 4, 64, 64, 2, 2);
    case.ids[1] = 4; // out of range
    let xq = vec![0u8; 2 * 2 * 36];
    let (mut hq, mut y, mut out) = (vec![0u8; 4 * 2 * 36], vec![0f32; 4 * 64], vec![0f32; 2 * 64]);
    let e = cpu.moe(&case.window(&xq), &mut MoeOut { hq: &mut hq, y: &mut y, out: &mut out, accumulate: false }).unwrap_err();
    assert!(matches!(e, Error::Shape { kernel: "moe", .. }) && e.to_string().contains("expert id 4"), "{e}");
    // Down rows of 64 values in a format of 256-value blocks.
    let odd = MoeCase::random(&mut rng, (W::Iq4Nl, W::Iq2Xxs), 2, 256, 64, 1, 1);
    let (mut hq1, mut y1, mut out1) = (vec![0u8; 2 * 36], vec![0f32; 256], vec![0f32; 256]);
    let e = cpu.moe(&odd.window(&[0u8; 8 * 36]), &mut MoeOut { hq: &mut hq1, y: &mut y1, out: &mut out1, accumulate: false }).unwrap_err();
    assert!(e.to_string().contains("IQ2_XXS expert rows of 64 values: not a multiple of the format's 256-value block"), "{e}");
    case.ids[1] = 0;
    let mut short = vec![0f32; 10];
    let e = cpu.moe(&case.window(&xq), &mut MoeOut { hq: &mut hq, y: &mut y, out: &mut short, accumulate: false }).unwrap_err();
    assert!(e.to_string().starts_with("kernel moe:"), "{e}");
}
