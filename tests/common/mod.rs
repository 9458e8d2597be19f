//! Helpers shared by the integration tests: tool discovery, GPU gating, seeds.
#![allow(dead_code)] // each test binary uses a different subset

pub mod llama;

use std::path::PathBuf;

/// `STRATA_REQUIRE_GPU=1`: a missing GPU backend is a failure, not a skip.
pub fn gpu_required() -> bool {
    std::env::var("STRATA_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// `STRATA_REQUIRE_TOOLS=1` (set by `make test`): a missing ptxas / NVRTC / clang-22 is a failure.
pub fn tools_required() -> bool {
    std::env::var("STRATA_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Skips (returns `None` after saying why) or fails, as the requirement says.
pub fn skip_or_fail<T>(required: bool, what: &str, why: &str) -> Option<T> {
    if required {
        panic!("{what} required but unavailable: {why}");
    }
    eprintln!("SKIPPED {what}: {why}");
    None
}

/// The project's python venv site-packages `nvidia/cu13` folder, where the pinned wheels put
/// ptxas and libnvrtc.
fn venv_cuda_dir() -> Option<PathBuf> {
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    std::fs::read_dir(lib).ok()?.flatten().map(|e| e.path().join("site-packages/nvidia/cu13")).find(|p| p.exists())
}

/// ptxas: `STRATA_PTXAS`, the venv's wheel, or PATH.
pub fn ptxas() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("STRATA_PTXAS") {
        return Some(p.into());
    }
    if let Some(p) = venv_cuda_dir().map(|d| d.join("bin/ptxas")).filter(|p| p.exists()) {
        return Some(p);
    }
    which("ptxas")
}

pub fn clang22() -> Option<PathBuf> {
    [PathBuf::from("/usr/lib/llvm-22/bin/clang")].into_iter().find(|p| p.exists()).or_else(|| which("clang-22"))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.exists())
}

/// The seed of this test run (`STRATA_SEED` or the clock), printed so a failure can be replayed.
pub fn seed(test: &str) -> u64 {
    let s = strata::host::parity::seed_from_env();
    eprintln!("{test}: seed {s} (replay with STRATA_SEED={s})");
    s
}

/// The project venv's python, when it has the `gguf` package (scripts/setup-toolchain.sh).
pub fn venv_python() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let ok = p.exists() && std::process::Command::new(&p).args(["-c", "import gguf"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

/// GPU backend `name` (`cuda` or `hip`) on device 0; `None` (reported skipped, or a failure when
/// a GPU is required) when it cannot open.
pub fn open_gpu(name: &str) -> Option<strata::host::backends::gpu::GpuBackend> {
    let opened = match name {
        "cuda" => strata::host::backends::cuda::open(0, strata::ptx::IMAGES),
        "hip" => strata::host::backends::hip::open(0),
        _ => unreachable!("unknown backend {name}"),
    };
    match opened {
        Ok(b) => Some(b),
        Err(e) => skip_or_fail(gpu_required(), &format!("{name} backend"), &e.to_string()),
    }
}

/// Asserts that every outcome passed, printing one line each (seen with `--nocapture`).
pub fn check_all(outs: Vec<strata::host::parity::Outcome>) {
    for o in outs {
        eprintln!("  {} {}: {} passed {} NMSE {:?}", o.kernel, o.shape, o.backends.join("="), o.passed(), o.nmse);
        assert!(o.passed(), "{}", o.explain());
    }
}

/// The GPU half of a kernel family's parity suite, written once and instantiated per family:
/// `cuda_vs_cpu` and `hip_vs_cpu` run `$against(backend)` (the family's own checks on that
/// backend), and `padded_grids_change_nothing` runs the family's `parity_cases` with `grid_pad`
/// on (extra warps and blocks must change nothing; the guard words past each output are checked
/// on every call). `gpu_parity_suite!(cases: parity_cases)` takes the family's parity cases as
/// its whole GPU check.
#[macro_export]
macro_rules! gpu_parity_suite {
    ($against:ident, $cases:path) => {
        #[test]
        fn cuda_vs_cpu() {
            $against("cuda");
        }

        #[test]
        fn hip_vs_cpu() {
            $against("hip");
        }

        #[test]
        fn padded_grids_change_nothing() {
            for name in ["cuda", "hip"] {
                let Some(mut gpu) = common::open_gpu(name) else { return };
                gpu.set_grid_pad(true);
                let seed = common::seed(&format!("{name}_padded"));
                common::check_all($cases(&[&strata::host::backends::cpu::CpuBackend::new(), &gpu], seed).unwrap());
            }
        }
    };
    (cases: $cases:path) => {
        /// The family's parity cases, three seeds, against the replica.
        fn gpu_against_cpu(name: &str) {
            use rand::{Rng, SeedableRng};
            let Some(gpu) = common::open_gpu(name) else { return };
            let mut rng = rand::rngs::SmallRng::seed_from_u64(common::seed(&format!("{name}_vs_cpu")));
            for _ in 0..3 {
                common::check_all($cases(&[&strata::host::backends::cpu::CpuBackend::new(), &gpu], rng.random()).unwrap());
            }
        }
        $crate::gpu_parity_suite!(gpu_against_cpu, $cases);
    };
}

/// A tensor of a GGUF file being rewritten: name, dims, type, bytes.
pub type TensorParts = (String, Vec<u64>, strata::host::gguf::GgmlType, Vec<u8>);

/// The built-in model (with or without its vocabulary) as GGUF bytes, its metadata and tensors
/// rewritten by `edit` first: hostile and variant files for the loader and the step.
pub fn rewritten_tiny(vocab: bool, edit: impl Fn(&mut Vec<(String, strata::host::gguf::Value)>, &mut Vec<TensorParts>)) -> Vec<u8> {
    let mut spec = strata::host::model::synth::SynthSpec::tiny();
    spec.vocab = vocab;
    rewritten(&spec, edit)
}

/// The synthetic model of `spec` as GGUF bytes, its metadata and tensors rewritten by `edit`.
pub fn rewritten(spec: &strata::host::model::synth::SynthSpec, edit: impl Fn(&mut Vec<(String, strata::host::gguf::Value)>, &mut Vec<TensorParts>)) -> Vec<u8> {
    use strata::host::gguf::{GgufFile, GgufWriter};
    let f = GgufFile::from_bytes(strata::host::model::synth::build_in_memory(spec), "synthetic").expect("a synthetic model parses");
    let mut meta: Vec<_> = f.metadata.iter().filter(|(k, _)| k != "general.alignment").cloned().collect();
    let mut tensors: Vec<TensorParts> = f.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty, f.data(t).to_vec())).collect();
    edit(&mut meta, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.meta(&k, v);
    }
    for (n, dims, ty, data) in tensors {
        w.tensor(&n, &dims, ty, data).expect("a valid tensor");
    }
    w.to_bytes()
}
