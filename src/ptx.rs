//! The Rust kernels of `device/` as PTX, built by build.rs and embedded here.
use strata_host::backends::cuda::PtxImage;

pub const IMAGES: &[PtxImage] = &[
    PtxImage { arch: "sm_80", min_cc: (8, 0), chains_grids: false, ptx: include_str!(concat!(env!("OUT_DIR"), "/strata_sm_80.ptx")) },
    PtxImage { arch: "sm_90", min_cc: (9, 0), chains_grids: true, ptx: include_str!(concat!(env!("OUT_DIR"), "/strata_sm_90.ptx")) },
];
