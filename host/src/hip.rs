//! The `hip` backend on NVIDIA: the hand-written `device/hip/*.hip` sources, compiled at run
//! time by NVRTC through `strata_hip.h` (which maps the HIP-side vocabulary to CUDA), with float
//! contraction off, then run like the `cuda` backend.
//!
//! The translation unit is assembled here: a generated prelude (launch bounds, sizes and
//! codebook words from gpu-shared, so the two sides cannot drift), the header, then each kernel
//! source. The same unit is what the AMD build (clang-22) compiles.
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use crate::error::{Error, Result};
use crate::gpu::{open_device, GpuBackend};
use strata_gpu_shared::formats::{iq4_nl, q8_0, q8_1, GROUP};
use strata_gpu_shared::launch::{amd_waves_per_eu, BOUNDS, MMVQ_MAX_ROWS, MMVQ_WARPS, QUANTIZE_WARPS};

const HEADER_NAME: &str = "strata_hip.h";
const HEADER: &str = include_str!("../../device/hip/strata_hip.h");

/// The kernel sources, in the order they are compiled.
pub const SOURCES: &[(&str, &str)] = &[
    ("quantize_q8_1.hip", include_str!("../../device/hip/quantize_q8_1.hip")),
    ("mmvq.hip", include_str!("../../device/hip/mmvq.hip")),
];

/// `#define`s generated from gpu-shared: launch bounds per kernel, sizes, codebook words.
pub fn prelude() -> String {
    let mut s = String::from("// generated from strata-gpu-shared by strata-host/src/hip.rs\n");
    for b in BOUNDS {
        s += &format!("#define STRATA_THREADS_{} {}\n", b.kernel, b.threads);
        s += &format!("#define STRATA_MINB_{} {}\n", b.kernel, b.min_blocks);
        s += &format!("#define STRATA_WAVES_PER_EU_{} {}\n", b.kernel, amd_waves_per_eu(b.threads, b.min_blocks));
    }
    let consts: [(&str, usize); 10] = [
        ("GROUP", GROUP),
        ("Q8_1_BYTES", q8_1::BYTES),
        ("Q8_1_OFF_D", q8_1::OFF_D),
        ("Q8_1_OFF_S", q8_1::OFF_S),
        ("Q8_1_OFF_Q", q8_1::OFF_Q),
        ("Q8_0_BYTES", q8_0::BYTES),
        ("IQ4_NL_BYTES", iq4_nl::BYTES),
        ("MMVQ_WARPS", MMVQ_WARPS as usize),
        ("MMVQ_MAX_ROWS", MMVQ_MAX_ROWS),
        ("QUANTIZE_WARPS", QUANTIZE_WARPS as usize),
    ];
    for (name, v) in consts {
        s += &format!("#define STRATA_{name} {v}\n");
    }
    for (i, w) in iq4_nl::LEVEL_WORDS.iter().enumerate() {
        s += &format!("#define STRATA_IQ4_NL_W{i} {w:#010x}u\n");
    }
    s
}

/// The whole translation unit: prelude, header, then every source with its
/// `#include "strata_hip.h"` line dropped (the header is already above it).
pub fn translation_unit() -> String {
    let include = format!("#include \"{HEADER_NAME}\"");
    let mut tu = prelude();
    tu += HEADER;
    for (name, src) in SOURCES {
        tu += &format!("\n// ---- {name} ----\n");
        for line in src.lines() {
            tu += if line.trim() == include { "" } else { line };
            tu.push('\n');
        }
    }
    tu
}

/// Whether NVRTC's library can be loaded (no GPU needed).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles the HIP sources to PTX for `compute_<major><minor>` with NVRTC.
pub fn compile_nvrtc(cc: (i32, i32)) -> Result<String> {
    if !nvrtc_present() {
        return Err(Error::Setup {
            backend: "hip",
            what: "NVRTC".into(),
            detail: "libnvrtc.so not found (install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib/ on LD_LIBRARY_PATH)".into(),
        });
    }
    let opts = CompileOptions {
        fmad: Some(false),
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1), "--std=c++17".into()],
        name: Some("strata_hip.cu".into()),
        ..Default::default()
    };
    compile_ptx_with_opts(translation_unit(), opts).map(|p| p.to_src()).map_err(|e| Error::Setup {
        backend: "hip",
        what: format!("NVRTC compile of {} for compute_{}{}", SOURCES.iter().map(|s| s.0).collect::<Vec<_>>().join(", "), cc.0, cc.1),
        detail: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        },
    })
}

pub fn open(ordinal: usize) -> Result<GpuBackend> {
    let (ctx, info) = open_device("hip", ordinal)?;
    let cc = info.compute_capability;
    let ptx = compile_nvrtc(cc)?;
    GpuBackend::new("hip", ctx, info, ptx, format!("compute_{}{} (NVRTC)", cc.0, cc.1))
}
