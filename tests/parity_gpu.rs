//! Bitwise parity across backends, written once and instantiated per backend pair: `cuda`
//! (Rust PTX), `hip` (HIP sources through NVRTC) and `cpu` (the replica). Every output is
//! poisoned before the kernel runs and checked written; a failure prints the first differing
//! index and both values. Without a GPU these tests report themselves skipped, unless
//! `STRATA_REQUIRE_GPU=1`, where a missing GPU backend fails them.
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::cpu::CpuBackend;
use strata::host::parity::{self, Outcome};
use strata::host::{cuda, hip, Backend};
use strata_gpu_shared::formats::{FloatFormat, WeightFormat};

fn open(name: &str) -> Option<Box<dyn Backend>> {
    let opened: Result<Box<dyn Backend>, _> = match name {
        "cpu" => Ok(Box::new(CpuBackend::new())),
        "cuda" => cuda::open(0, strata::ptx::IMAGES).map(|b| Box::new(b) as _),
        "hip" => hip::open(0).map(|b| Box::new(b) as _),
        _ => unreachable!("unknown backend {name}"),
    };
    match opened {
        Ok(b) => Some(b),
        Err(e) => common::skip_or_fail(common::gpu_required(), &format!("{name} backend"), &e.to_string()),
    }
}

fn check(out: Outcome) {
    assert!(out.passed(), "{}", out.explain());
}

/// Fixed edge shapes (one row, one block, M not a multiple of the warps per block, the largest
/// K) followed by random ones.
fn mmvq_shapes(rng: &mut SmallRng, format: WeightFormat) -> Vec<(usize, usize, usize)> {
    let fixed = [(1, 32, 1), (5, 64, 8), (4097, 32, 3), (33, 8192, 8), (4096, 2048, 1)];
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
                for format in WeightFormat::ALL {
                    for (m, k, rows) in mmvq_shapes(&mut rng, format) {
                        let out = parity::mmvq_case(&[&*a, &*b], format, m, k, rows, rng.random(), $reference == "cpu").unwrap();
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
                let gu = [WeightFormat::Iq2Xxs, WeightFormat::Iq2Xs, WeightFormat::Iq2S, WeightFormat::Iq3Xxs, WeightFormat::Iq3S, WeightFormat::Q8_0];
                let dn = [WeightFormat::Iq4Nl, WeightFormat::Q2_0, WeightFormat::Iq3S, WeightFormat::Q8_0];
                for (i, &g) in gu.iter().enumerate() {
                    for (j, &d) in dn.iter().enumerate() {
                        // The model shapes for some pairs, smaller ones for the rest.
                        let (n_embd, n_ff) = match (i + j) % 3 {
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
                    // Router shapes (128 and 512 experts), odd sizes, then random ones.
                    let mut shapes = vec![(128, 2048, 1), (512, 2560, 8), (1, 1, 1), (37, 33, 5)];
                    shapes.extend((0..6).map(|_| (rng.random_range(1..=1024), rng.random_range(1..=4096), rng.random_range(1..=8))));
                    for (m, k, rows) in shapes {
                        check(parity::matvec_case(&[&*a, &*b], format, m, k, rows, rng.random()).unwrap());
                    }
                }
            }
        }
    };
}

parity_pair!(cuda_vs_cpu, "cpu", "cuda");
parity_pair!(hip_vs_cpu, "cpu", "hip");
parity_pair!(cuda_vs_hip, "cuda", "hip");

/// With `grid_pad` forced on, every kernel's output is byte-identical to the unpadded run, and
/// the guard words past every output stay untouched (the backend checks them on each call and
/// fails the call otherwise).
#[test]
fn padded_grids_change_nothing() {
    for name in ["cuda", "hip"] {
        let opened = match name {
            "cuda" => cuda::open(0, strata::ptx::IMAGES),
            _ => hip::open(0),
        };
        let (mut padded, plain) = match (opened, open(name)) {
            (Ok(p), Some(q)) => (p, q),
            (Err(e), _) => return common::skip_or_fail(common::gpu_required(), name, &e.to_string()).unwrap_or(()),
            _ => return,
        };
        padded.set_grid_pad(true);
        assert!(padded.grid_pad_on());
        let seed = common::seed("padded_grids_change_nothing");
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..4 {
            let seed = rng.random();
            let (m, k, rows) = parity::random_mmvq_shape(&mut rng, WeightFormat::Iq4Nl, 3000, 4096);
            check(parity::mmvq_case(&[&*plain, &padded], WeightFormat::Iq4Nl, m, k, rows, seed, false).unwrap());
            let (rows, n) = (rng.random_range(1..=8), rng.random_range(1..=160_000));
            check(parity::argmax_case(&[&*plain, &padded], rows, n, seed).unwrap());
            check(parity::top_prob_case(&[&*plain, &padded], rows, n, seed).unwrap());
            check(parity::quantize_case(&[&*plain, &padded], rows, 32 * rng.random_range(1..=300), seed).unwrap());
            check(parity::quantize_q8_0_case(&[&*plain, &padded], rows, 32 * rng.random_range(1..=300), true, seed).unwrap());
            check(parity::matvec_case(&[&*plain, &padded], FloatFormat::Bf16, rng.random_range(1..=700), rng.random_range(1..=3000), rows, seed).unwrap());
        }
    }
}

/// On each GPU backend, a token's combined output is bit-identical alone and inside windows of
/// 2..8 tokens with random other tokens.
#[test]
fn moe_window_invariance() {
    for name in ["cuda", "hip"] {
        let Some(g) = open(name) else { return };
        let seed = common::seed("moe_window_invariance");
        let mut rng = SmallRng::seed_from_u64(seed);
        for t in 2..=8 {
            let case = parity::MoeCase::random(&mut rng, (WeightFormat::Iq3Xxs, WeightFormat::Iq4Nl), 16, 2048, 768, t, 8);
            let row = case.n_embd / 32 * 36;
            let mut xq = vec![0u8; t * row];
            g.quantize_q8_1(&case.x, &mut xq).unwrap();
            let (_, _, full) = parity::run_moe(&*g, &case, &xq, 0).unwrap();
            for j in 0..t {
                let (_, _, alone) = parity::run_moe(&*g, &case.alone(j), &xq[j * row..(j + 1) * row], 0).unwrap();
                let inside = &full[j * case.n_embd..(j + 1) * case.n_embd];
                let diff = alone.iter().zip(inside).position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(diff.is_none(), "{name}: token {j} of a {t}-token window differs alone at column {diff:?}");
            }
        }
    }
}

/// EXPDEC gate/up (1 and 2 weight rows per lane) gives the plain `moe_gu` kernels' bytes on every
/// stage, on both GPU backends, for windows whose groups need one or two staging passes.
#[test]
fn expdec_matches_default() {
    use strata::host::gpu::ExpertKnobs;
    for name in ["cuda", "hip"] {
        let mut plain = match name {
            "cuda" => cuda::open(0, strata::ptx::IMAGES),
            _ => hip::open(0),
        }
        .map_err(|e| common::skip_or_fail::<()>(common::gpu_required(), name, &e.to_string()));
        let Ok(plain) = plain.as_mut() else { return };
        plain.set_expert_knobs(ExpertKnobs { expdec: false, r: 1 });
        let seed = common::seed("expdec_matches_default");
        let mut rng = SmallRng::seed_from_u64(seed);
        for r in [1, 2] {
            let mut fast = match name {
                "cuda" => cuda::open(0, strata::ptx::IMAGES).unwrap(),
                _ => hip::open(0).unwrap(),
            };
            fast.set_expert_knobs(ExpertKnobs { expdec: true, r });
            for g in [WeightFormat::Iq2Xxs, WeightFormat::Iq2Xs, WeightFormat::Iq2S, WeightFormat::Iq3Xxs, WeightFormat::Iq3S, WeightFormat::Q8_0] {
                let (n_embd, n_ff) = if rng.random_bool(0.5) { (2560, 640) } else { (2048, 768) };
                let (t, k) = (rng.random_range(1..=8), rng.random_range(1..=10));
                let case = parity::MoeCase::random(&mut rng, (g, WeightFormat::Iq4Nl), 10, n_embd, n_ff, t, k);
                let out = parity::moe_case(&[&*plain as &dyn Backend, &fast], &case, seed).unwrap();
                eprintln!("  {name} expdec r{r} {} {}: identical {}", out.kernel, out.shape, out.identical());
                check(out);
            }
        }
    }
}
