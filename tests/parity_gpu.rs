//! Bitwise parity across backends, written once and instantiated per backend pair: `cuda`
//! (Rust PTX), `hip` (HIP sources through NVRTC), `cpu` (the replica) and `sim` (the Rust
//! kernels' own code in the simulator, on every machine). Every output is
//! poisoned before the kernel runs and checked written; a failure prints the first differing
//! index and both values. Without a GPU these tests report themselves skipped, unless
//! `STRATA_REQUIRE_GPU=1`, where a missing GPU backend fails them.
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::backends::sim::SimBackend;
use strata::host::parity::{self, Outcome};
use strata::host::Backend;
use strata_gpu_shared::formats::{FloatFormat, WeightFormat};

fn open(name: &str) -> Option<Box<dyn Backend>> {
    match name {
        "cpu" => Some(Box::new(CpuBackend::new())),
        "sim" => Some(Box::new(SimBackend::new(132))),
        _ => common::open_gpu(name).map(|b| Box::new(b) as _),
    }
}


fn check(out: Outcome) {
    assert!(out.passed(), "{}", out.explain());
}

/// Fixed edge shapes (one row, one block, M not a multiple of the warps per block, the largest
/// K) followed by random ones.
fn mmvq_shapes(rng: &mut SmallRng, format: WeightFormat) -> Vec<(usize, usize, usize)> {
    // One-row shapes run, under 16,384 rows, `mmvq_*` to one weight group a lane and `mmvq1a_*`
    // past it, and `mmvq1_*` from there (`launch::mmvq_launch`): rows of 1, 2, 2 and a part, and
    // 4+ groups a lane, and for 32 or 64 groups two rows a warp (`launch::mmvq1_pairs`), the last
    // warp of an odd count with one.
    let fixed = [(1, 32, 1), (5, 64, 8), (4097, 32, 3), (33, 8192, 8), (300, 1024, 1), (4096, 2048, 1), (61, 2400, 1), (77, 4256, 1), (9, 8192, 1), (16384, 2048, 1), (16385, 1024, 1), (16390, 4256, 1)];
    let mut v: Vec<_> = fixed.into_iter().map(|(m, k, r)| (m, parity::fit_k(format, k), r)).collect();
    v.extend((0..8).map(|_| parity::random_mmvq_shape(rng, format, 4096, 8192)));
    v
}

macro_rules! parity_pair {
    ($pair:ident, $reference:literal, $other:literal) => {
        mod $pair {
            use super::*;

            #[test]
            fn quantize_q8_1_identical() {
                let (Some(a), Some(b)) = (open($reference), open($other)) else { return };
                let seed = common::seed(concat!(stringify!($pair), "::quantize_q8_1"));
                let mut rng = SmallRng::seed_from_u64(seed);
                for _ in 0..12 {
                    let (rows, k) = (rng.random_range(1..=8), 32 * rng.random_range(1..=256));
                    check(parity::quantize_case(&[&*a, &*b], rows, k, rng.random()).unwrap());
                }
                // One large launch: many blocks, the grid's tail block partly empty.
                check(parity::quantize_case(&[&*a, &*b], 8, 32 * 4099, rng.random()).unwrap());
            }

            #[test]
            fn mmvq_identical() {
                let (Some(a), Some(b)) = (open($reference), open($other)) else { return };
                let seed = common::seed(concat!(stringify!($pair), "::mmvq"));
                let mut rng = SmallRng::seed_from_u64(seed);
                for format in WeightFormat::MATVEC {
                    // Every other shape accumulating into random outputs as well.
                    for (i, (m, k, rows)) in mmvq_shapes(&mut rng, format).into_iter().enumerate() {
                        let out = parity::mmvq_case(&[&*a, &*b], format, m, k, rows, rng.random(), $reference == "cpu", i % 2 == 1).unwrap();
                        eprintln!("  {} {} {}: identical {}", out.kernel, out.shape, out.backends.join("="), out.identical());
                        check(out);
                    }
                }
            }

            #[test]
            fn head_identical() {
                let (Some(a), Some(b)) = (open($reference), open($other)) else { return };
                let seed = common::seed(concat!(stringify!($pair), "::head"));
                let mut rng = SmallRng::seed_from_u64(seed);
                // The vocabularies that matter, 1, 4, 5 and 8 rows, then odd sizes.
                let mut shapes: Vec<(usize, usize)> = [106_299, 151_936, 248_320].iter().flat_map(|&n| [(1, n), (4, n), (5, n), (8, n)]).collect();
                shapes.extend([(3, 1), (2, 4096), (2, 4097), (7, rng.random_range(2..30_000))]);
                for (rows, n) in shapes {
                    check(parity::argmax_case(&[&*a, &*b], rows, n, rng.random()).unwrap());
                    check(parity::top_prob_case(&[&*a, &*b], rows, n, rng.random()).unwrap());
                }
            }

            #[test]
            fn quantize_q8_0_scaled_identical() {
                let (Some(a), Some(b)) = (open($reference), open($other)) else { return };
                let seed = common::seed(concat!(stringify!($pair), "::quantize_q8_0_scaled"));
                let mut rng = SmallRng::seed_from_u64(seed);
                for _ in 0..6 {
                    let (rows, k) = (rng.random_range(1..=8), 32 * rng.random_range(1..=128));
                    for per_column in [false, true] {
                        check(parity::quantize_q8_0_case(&[&*a, &*b], rows, k, per_column, rng.random()).unwrap());
                    }
                }
            }

            #[test]
            fn moe_identical() {
                let (Some(a), Some(b)) = (open($reference), open($other)) else { return };
                let seed = common::seed(concat!(stringify!($pair), "::moe"));
                let mut rng = SmallRng::seed_from_u64(seed);
                let gu = [WeightFormat::Iq2Xxs, WeightFormat::Iq2Xs, WeightFormat::Iq2S, WeightFormat::Iq3Xxs, WeightFormat::Iq3S, WeightFormat::Q8_0, WeightFormat::Iq4NlT, WeightFormat::Iq3ST];
                // IQ4_NLT, IQ3_ST: the tiles the step holds IQ4_NL and IQ3_S experts as (rows of
                // 256 and 2,048 values and more). Q6_K down: the format with unsigned group bytes
                // (`Block::OFFSET`). (As gate/up format with Q2_0 down its windows gave the same
                // bits on every backend but an NMSE against float64 over the bound, 1e-3 to 2e-2:
                // not in the list until that is understood.)
                let dn = [WeightFormat::Iq4Nl, WeightFormat::Q2_0, WeightFormat::Iq3S, WeightFormat::Q8_0, WeightFormat::Iq4NlT, WeightFormat::Q6K];
                for (i, &g) in gu.iter().enumerate() {
                    for (j, &d) in dn.iter().enumerate() {
                        // The model shapes for some pairs, smaller ones for the rest. IQ3_ST at
                        // n_embd 4096 stages 51 KB (its signed codebook is 32 KB): over the 48 KiB
                        // a launch gets without the backends' opt-in.
                        let (n_embd, n_ff) = match (i + j) % 3 {
                            _ if g == WeightFormat::Iq3ST => [(2048, 768), (4096, 512)][j % 2],
                            0 => (2560, 768),
                            1 => (2048, 768),
                            _ => (512, 512),
                        };
                        let (t, k) = (rng.random_range(1..=8), rng.random_range(1..=10));
                        let case = parity::MoeCase::random(&mut rng, (g, d), 12, n_embd, n_ff, t, k);
                        let out = parity::moe_case(&[&*a, &*b], &case, seed).unwrap();
                        eprintln!("  {} {} {}: identical {} NMSE {:.2e}", out.kernel, out.shape, out.backends.join("="), out.identical(), out.nmse.unwrap());
                        check(out);
                    }
                }
            }

            #[test]
            fn matvec_identical() {
                let (Some(a), Some(b)) = (open($reference), open($other)) else { return };
                let seed = common::seed(concat!(stringify!($pair), "::matvec"));
                let mut rng = SmallRng::seed_from_u64(seed);
                for format in FloatFormat::ALL {
                    // Router shapes (128 and 512 experts), odd sizes, a row whose every lane
                    // takes a chunk of 64, one of 16 and single elements (2,660 = 32 x 83 + 4)
                    // for 3 rows and for one (the one-row entry, accumulating), then random ones.
                    let mut shapes = vec![(128, 2048, 1), (512, 2560, 8), (1, 1, 1), (37, 33, 5), (7, 2660, 3), (7, 2660, 1)];
                    shapes.extend((0..6).map(|_| (rng.random_range(1..=1024), rng.random_range(1..=4096), rng.random_range(1..=8))));
                    for (i, (m, k, rows)) in shapes.into_iter().enumerate() {
                        check(parity::matvec_case(&[&*a, &*b], format, m, k, rows, rng.random(), i % 2 == 1).unwrap());
                    }
                }
            }
        }
    };
}

parity_pair!(cuda_vs_cpu, "cpu", "cuda");
parity_pair!(sim_vs_cpu, "cpu", "sim");
parity_pair!(hip_vs_cpu, "cpu", "hip");
parity_pair!(cuda_vs_hip, "cuda", "hip");

/// With `grid_pad` forced on, every kernel's output is byte-identical to the unpadded run, and
/// the guard words past every output stay untouched (the backend checks them on each call and
/// fails the call otherwise).
#[test]
fn padded_grids_change_nothing() {
    for name in ["cuda", "hip"] {
        let (Some(mut padded), Some(plain)) = (common::open_gpu(name), open(name)) else { return };
        padded.set_grid_pad(true);
        assert!(padded.grid_pad_on());
        let seed = common::seed("padded_grids_change_nothing");
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..4 {
            let seed = rng.random();
            let (m, k, rows) = parity::random_mmvq_shape(&mut rng, WeightFormat::Iq4Nl, 3000, 4096);
            check(parity::mmvq_case(&[&*plain, &padded], WeightFormat::Iq4Nl, m, k, rows, seed, false, true).unwrap());
            let (rows, n) = (rng.random_range(1..=8), rng.random_range(1..=160_000));
            check(parity::argmax_case(&[&*plain, &padded], rows, n, seed).unwrap());
            check(parity::top_prob_case(&[&*plain, &padded], rows, n, seed).unwrap());
            check(parity::quantize_case(&[&*plain, &padded], rows, 32 * rng.random_range(1..=300), seed).unwrap());
            check(parity::quantize_q8_0_case(&[&*plain, &padded], rows, 32 * rng.random_range(1..=300), true, seed).unwrap());
            check(parity::matvec_case(&[&*plain, &padded], FloatFormat::Bf16, rng.random_range(1..=700), rng.random_range(1..=3000), rows, seed, true).unwrap());
            // The expert kernels, a one-token window among them (on cuda sm_90 the pair
            // gate/up blocks, whose padded grid stays whole clusters).
            let (tokens, k) = (rng.random_range(1..=2), rng.random_range(6..=10));
            let case = parity::MoeCase::random(&mut rng, (WeightFormat::Iq3S, WeightFormat::Iq4Nl), 16, 2048, 768, tokens, k);
            check(parity::moe_case(&[&*plain, &padded], &case, seed).unwrap());
        }
    }
}

/// On each GPU backend, a token's combined output is bit-identical alone and inside windows of
/// 2..8 tokens with random other tokens, with the default knobs (so the rows per block the
/// minimum-blocks rule picks, and the warps a gate/up block has, differ between the lone token
/// and the window), for an IQ4_NL and a Q2_0 (EXPDEC down) layer.
#[test]
fn moe_window_invariance() {
    for name in ["cuda", "hip"] {
        let Some(g) = open(name) else { return };
        let seed = common::seed("moe_window_invariance");
        let mut rng = SmallRng::seed_from_u64(seed);
        for t in 2..=8 {
            let (formats, n_embd, n_ff, k) = match t % 2 {
                0 => ((WeightFormat::Iq3Xxs, WeightFormat::Iq4Nl), 2048, 768, 8),
                _ => ((WeightFormat::Iq2S, WeightFormat::Q2_0), 2560, 640, 10),
            };
            let case = parity::MoeCase::random(&mut rng, formats, 16, n_embd, n_ff, t, k);
            let row = case.n_embd / 32 * 36;
            let mut xq = vec![0u8; t * row];
            g.quantize_q8_1(&case.x, &mut xq).unwrap();
            let (_, _, full) = parity::run_moe(&*g, &case, &xq, 0, false).unwrap();
            for j in 0..t {
                let (_, _, alone) = parity::run_moe(&*g, &case.alone(j), &xq[j * row..(j + 1) * row], 0, false).unwrap();
                let inside = &full[j * case.n_embd..(j + 1) * case.n_embd];
                let diff = alone.iter().zip(inside).position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(diff.is_none(), "{name}: token {j} of a {t}-token window differs alone at column {diff:?}");
            }
        }
    }
}

/// Every value of every expert knob gives the CPU replica's bytes on both GPU backends (hq, y
/// and the combined rows, all written): gate/up knobs (EXPDEC, R, MINB, WARPS, PAIRS,
/// EXPDEC_WARP_ROWS for 8-warp blocks and with pair blocks, RB including the rule) per gate/up format, down knobs (EXPDEC down, DR, DMINB, DRB including the rule) for Q2_0,
/// IQ4_NL and its tiles (IQ4_NLT, at n_ff 768 only), over windows whose groups hold 0 to 11 entries, at the model shapes and an odd one
/// (n_ff 448: 14 q8_1 chunks, so 128 rows per block leave a partial block; 14 groups per down
/// row, so 18 row slots per block).
#[test]
fn expert_knobs_every_value() {
    use strata::host::backends::knobs::KernelKnobs;
    use strata_gpu_shared::launch::{
        EXPDEC_DR, EXPDEC_DRB, EXPDEC_GU_FORMATS, EXPDEC_GU_MINB4_FORMATS, EXPDEC_MINB, EXPDEC_MINB4_MAX_DR, EXPDEC_MINB4_MAX_R, EXPDEC_R, EXPDEC_RB,
    };
    let cpu = CpuBackend::new();
    for name in ["cuda", "hip"] {
        let Some(mut g) = common::open_gpu(name) else { return };
        // The cuda backend of a device with clusters must have the pair entries to test.
        assert_eq!(g.sm90_entries(), name == "cuda" && g.info().compute_capability.0 >= 9, "{name}: cluster entries");
        let seed = common::seed("expert_knobs_every_value");
        let mut rng = SmallRng::seed_from_u64(seed);
        let plain = KernelKnobs { expdec: false, down: false, d20: false, warp_rows: false, ..KernelKnobs::default() };
        let mut sets = vec![plain];
        for r in EXPDEC_R {
            for minb in EXPDEC_MINB {
                for rb in [0].into_iter().chain(EXPDEC_RB) {
                    if minb == 4 && r > EXPDEC_MINB4_MAX_R {
                        continue; // not compiled (spills)
                    }
                    sets.push(KernelKnobs { expdec: true, r, minb, rb, warps: 8, minblk: rng.random_range(1..=2000), ..plain });
                }
            }
        }
        for rb in [0].into_iter().chain(EXPDEC_RB) {
            sets.push(KernelKnobs { expdec: true, r: 1, rb, warps: 16, minblk: rng.random_range(1..=2000), ..plain });
        }
        // The pair entries (cuda on sm_90 and later; the plan refuses them elsewhere).
        sets.push(KernelKnobs { expdec: true, r: 1, warps: 0, pairs: 2, ..plain });
        // Rows copied warp by warp where a format has the entry (IQ3_ST's `_m2w`), the 8-warp
        // blocks at every rows-per-block (4 to 16 rows a warp through two slots); pair blocks
        // keep their own copy.
        sets.push(KernelKnobs { expdec: true, r: 1, warps: 0, pairs: 2, warp_rows: true, ..plain });
        for rb in [0].into_iter().chain(EXPDEC_RB) {
            sets.push(KernelKnobs { expdec: true, r: 1, minb: 2, rb, warps: 8, warp_rows: true, minblk: rng.random_range(1..=2000), ..plain });
        }
        for dr in EXPDEC_DR {
            for dminb in EXPDEC_MINB {
                for drb in [0].into_iter().chain(EXPDEC_DRB) {
                    if dminb == 4 && dr > EXPDEC_MINB4_MAX_DR {
                        continue; // not compiled (spills)
                    }
                    sets.push(KernelKnobs { down: true, d20: true, dr, dminb, drb, minblk: rng.random_range(1..=4000), ..plain });
                }
            }
        }
        let mut runs = 0;
        for (i, &gf) in EXPDEC_GU_FORMATS.iter().enumerate() {
            let df = [WeightFormat::Q2_0, WeightFormat::Iq4Nl, WeightFormat::Iq4NlT][i % 3];
            // Rows of whole tiles: IQ4_NLT down rows of 256 values (768 of the three), IQ3_ST
            // gate/up rows of 2,048.
            for (n_embd, n_ff) in [(2560, 640), (2048, 768), (512, 448)].into_iter().filter(|s| s.0 % gf.block_values() == 0 && s.1 % df.block_values() == 0) {
                let case = parity::MoeCase::crowded(&mut rng, (gf, df), n_embd, n_ff);
                let xq = parity::moe_xq(&cpu, &case).unwrap();
                let (want, _) = parity::moe_words(&cpu, &case, &xq).unwrap();
                let (sms, clusters) = (g.info().sms(), g.sm90_entries());
                for &knobs in &sets {
                    let pairs = knobs.expdec && knobs.pairs == 2;
                    if knobs.expdec && (knobs.minb == 4 || knobs.warps == 16 || pairs) && !EXPDEC_GU_MINB4_FORMATS.contains(&gf) || pairs && !clusters {
                        // Not compiled (spills at 4 blocks per SM; no 16-warp or pair entry), or
                        // no cluster entries on this backend: the plan refuses it.
                        assert!(knobs.plan((gf, df), n_embd, n_ff, case.tokens * case.k, sms, clusters).is_err(), "{}", knobs.describe());
                        continue;
                    }
                    g.set_kernel_knobs(knobs);
                    let plan = knobs.plan((gf, df), n_embd, n_ff, case.tokens * case.k, sms, clusters).unwrap();
                    assert_eq!(plan.gu.kernel.ends_with("_w16"), knobs.expdec && knobs.warps == 16, "{}", plan.gu.kernel);
                    assert_eq!(plan.gu.kernel.ends_with("_p2"), pairs, "{}", plan.gu.kernel);
                    let warp_rows = knobs.expdec && knobs.warp_rows && gf == WeightFormat::Iq3ST;
                    assert_eq!(plan.gu.kernel.ends_with("_m2w"), !pairs && warp_rows, "{}", plan.gu.kernel);
                    let label = format!("{name} {} {}/{}", knobs.describe(), plan.gu.kernel, plan.down.kernel);
                    check(parity::moe_against(("cpu", &want), &g, &label, &case, &xq, seed).unwrap());
                    runs += 1;
                }
            }
        }
        eprintln!("  {name}: {runs} knob settings x windows identical to the replica (seed {seed})");
    }
}
