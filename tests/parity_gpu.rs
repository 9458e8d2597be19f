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
