//! The `hip` backend on NVIDIA: the hand-written `device/hip/*.hip` sources, compiled at run
//! time by NVRTC through `strata_hip.h` (which maps the HIP-side vocabulary to CUDA), with float
//! contraction off, then run like the `cuda` backend.
//!
//! The translation unit is assembled here: a generated prelude (launch bounds, sizes and
//! codebook words from gpu-shared, so the two sides cannot drift), the header, then each kernel
//! source. The same unit is what the AMD build (clang-22) compiles.
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use crate::error::{Error, Result};
use crate::backends::gpu::{open_device, GpuBackend};
use strata_gpu_shared::codebooks::{IQ2_S_GRID, IQ2_XS_GRID, IQ2_XXS_GRID, IQ3_S_GRID, IQ3_XXS_GRID};
use strata_gpu_shared::lane_grids::{GRID_LANES, IQ3_S_LANES};
use strata_gpu_shared::formats::{iq4_nl, LAYOUT_CONSTANTS};
use strata_gpu_shared::launch::{
    amd_waves_per_eu, BOUNDS, MATVEC_AHEAD, MATVEC_AHEAD_REST, MATVEC_WARPS, COPY_CHUNK, EXPDEC_ENTRIES, EXPDEC_THREADS, EXPDEC_W16_THREADS, COPY_SEGMENT_WORDS, HEAD_AHEAD, HEAD_CHUNK, MMVQ1_AHEAD, MMVQ1_MIN_ROWS, MMVQS_WARPS, MMVQ_MAX_ROWS, MMVQ_WARPS, MOE_COMBINE_AHEAD, MOE_DOWN_ROWS, MOE_ENTRY_PASS,
    MOE_GROUP_THREADS, MOE_GU_ROWS, MOE_GU_WARPS, MOE_MAX_SELECTIONS, QUANTIZE_WARPS,
};
use strata_gpu_shared::order::HEAD_THREADS;

const HEADER_NAME: &str = "strata_hip.h";
const HEADER: &str = include_str!("../../../device/hip/strata_hip.h");

/// The kernel sources, in the order they are compiled.
/// Sources that others include (`blocks.hip`) come before their includers.
pub const SOURCES: &[(&str, &str)] = &[
    ("quantize_q8_1.hip", include_str!("../../../device/hip/quantize_q8_1.hip")),
    ("blocks.hip", include_str!("../../../device/hip/blocks.hip")),
    ("stage.hip", include_str!("../../../device/hip/stage.hip")),
    ("mmvq.hip", include_str!("../../../device/hip/mmvq.hip")),
    ("matvec.hip", include_str!("../../../device/hip/matvec.hip")),
    ("head.hip", include_str!("../../../device/hip/head.hip")),
    ("quantize_q8_0.hip", include_str!("../../../device/hip/quantize_q8_0.hip")),
    ("copy.hip", include_str!("../../../device/hip/copy.hip")),
    ("moe.hip", include_str!("../../../device/hip/moe.hip")),
    ("expdec_gu.hip", include_str!("../../../device/hip/expdec_gu.hip")),
    ("expdec_down.hip", include_str!("../../../device/hip/expdec_down.hip")),
    ("embed.hip", include_str!("../../../device/hip/embed.hip")),
    ("norm.hip", include_str!("../../../device/hip/norm.hip")),
    ("attention.hip", include_str!("../../../device/hip/attention.hip")),
    ("route.hip", include_str!("../../../device/hip/route.hip")),
    ("sample.hip", include_str!("../../../device/hip/sample.hip")),
    ("spec.hip", include_str!("../../../device/hip/spec.hip")),
    ("gdn.hip", include_str!("../../../device/hip/gdn.hip")),
    ("gate.hip", include_str!("../../../device/hip/gate.hip")),
];

/// `#define`s generated from gpu-shared: launch bounds per kernel, sizes and offsets, the
/// IQ4_NL level words.
pub fn prelude() -> String {
    let mut s = String::from("// generated from strata-gpu-shared by strata-host/src/backends/hip.rs\n");
    for b in BOUNDS {
        s += &format!("#define STRATA_THREADS_{} {}\n", b.kernel, b.threads);
        s += &format!("#define STRATA_MINB_{} {}\n", b.kernel, b.min_blocks);
        s += &format!("#define STRATA_WAVES_PER_EU_{} {}\n", b.kernel, amd_waves_per_eu(b.threads, b.min_blocks));
    }
    let geometry = [
        ("MMVQ_WARPS", MMVQ_WARPS as usize),
        ("MMVQ1_AHEAD", MMVQ1_AHEAD as usize),
        ("MMVQ1_MIN_ROWS", MMVQ1_MIN_ROWS),
        ("MMVQS_WARPS", MMVQS_WARPS as usize),
        ("MMVQ_MAX_ROWS", MMVQ_MAX_ROWS),
        ("MATVEC_AHEAD", MATVEC_AHEAD as usize),
        ("MATVEC_AHEAD_REST", MATVEC_AHEAD_REST as usize),
        ("MATVEC_WARPS", MATVEC_WARPS as usize),
        ("QUANTIZE_WARPS", QUANTIZE_WARPS as usize),
        ("HEAD_THREADS", HEAD_THREADS),
        ("HEAD_CHUNK", HEAD_CHUNK),
        ("HEAD_AHEAD", HEAD_AHEAD as usize),
        ("COPY_CHUNK", COPY_CHUNK),
        ("MOE_GU_WARPS", MOE_GU_WARPS as usize),
        ("MOE_GU_ROWS", MOE_GU_ROWS as usize),
        ("MOE_ENTRY_PASS", MOE_ENTRY_PASS as usize),
        ("MOE_DOWN_ROWS", MOE_DOWN_ROWS as usize),
        ("MOE_COMBINE_AHEAD", MOE_COMBINE_AHEAD as usize),
        ("MOE_MAX_SELECTIONS", MOE_MAX_SELECTIONS),
        ("MOE_GROUP_THREADS", MOE_GROUP_THREADS as usize),
        ("EXPDEC_ENTRIES", EXPDEC_ENTRIES as usize),
        ("EXPDEC_THREADS", EXPDEC_THREADS as usize),
        ("EXPDEC_W16_THREADS", EXPDEC_W16_THREADS as usize),
        ("COPY_SEGMENT_WORDS", COPY_SEGMENT_WORDS),
        ("GRID_LANES", GRID_LANES),
    ];
    let step = strata_gpu_shared::launch::STEP_GEOMETRY.iter().flat_map(|g| g.iter().copied());
    for (name, v) in LAYOUT_CONSTANTS.iter().copied().chain(geometry).chain(step) {
        s += &format!("#define STRATA_{name} {v}\n");
    }
    for (i, w) in iq4_nl::LEVEL_WORDS.iter().enumerate() {
        s += &format!("#define STRATA_IQ4_NL_W{i} {w:#010x}u\n");
    }
    s
}

/// The IQ grids and their repeated copies (`lane_grids`) as `__device__` arrays (after the header, which
/// defines the types).
pub fn codebooks() -> String {
    let mut s = String::from("// generated from strata-gpu-shared's codebooks by strata-host/src/backends/hip.rs\n");
    let grids: [(&str, &[u32]); 5] = [
        ("IQ2_XXS_GRID", &IQ2_XXS_GRID),
        ("IQ2_XS_GRID", &IQ2_XS_GRID),
        ("IQ2_S_GRID", &IQ2_S_GRID),
        ("IQ3_XXS_GRID", &IQ3_XXS_GRID),
        ("IQ3_S_GRID", &IQ3_S_GRID),
    ];
    let lanes: [(&str, &[u32]); 1] = [("IQ3_S_LANES", &IQ3_S_LANES.0)];
    for ((name, words), align) in grids.into_iter().map(|g| (g, 4)).chain(lanes.into_iter().map(|g| (g, 16))) {
        let body: Vec<String> = words.iter().map(|w| format!("{w:#x}u")).collect();
        s += &format!("__device__ __attribute__((aligned({align}))) const uint32_t STRATA_{name}[{}] = {{{}}};\n", words.len(), body.join(","));
    }
    s
}

/// The whole translation unit: prelude, header, codebooks, then every source in order, with the
/// `#include` lines that name the header or another source dropped (what they name is already
/// above them).
pub fn translation_unit() -> String {
    let ours: Vec<String> =
        std::iter::once(HEADER_NAME).chain(SOURCES.iter().map(|s| s.0)).map(|n| format!("#include \"{n}\"")).collect();
    let mut tu = prelude();
    tu += HEADER;
    tu += &codebooks();
    for (name, src) in SOURCES {
        tu += &format!("\n// ---- {name} ----\n");
        for line in src.lines() {
            tu += if ours.iter().any(|i| line.trim() == i) { "" } else { line };
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
            CompileError::CompileError { log, .. } => clip_lines(&log.to_string_lossy()),
            other => other.to_string(),
        },
    })
}

/// A compiler log with each line cut to 300 characters: the codebook arrays are single lines of
/// tens of kilobytes, and an error quoting one would bury the message.
pub fn clip_lines(log: &str) -> String {
    log.lines()
        .map(|l| if l.len() > 300 { format!("{}...", &l[..l.floor_char_boundary(300)]) } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn open(ordinal: usize) -> Result<GpuBackend> {
    let (ctx, info) = open_device("hip", ordinal)?;
    let cc = info.compute_capability;
    let ptx = compile_nvrtc(cc)?;
    // The HIP sources have no grid-dependency wait (AMD has no programmatic dependent launch):
    // their launches are never chained.
    GpuBackend::new("hip", ctx, info, ptx, format!("compute_{}{} (NVRTC)", cc.0, cc.1), false)
}
