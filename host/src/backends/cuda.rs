//! The `cuda` backend: the Rust kernels of `device/`, built to PTX by build.rs and embedded in
//! the `strata` crate, which hands them in here.
use crate::error::{Error, Result};
use crate::backends::gpu::{open_device, DeviceInfo, GpuBackend};
use crate::backends::trace;

/// Embedded PTX images, one per target architecture, newest last.
#[derive(Clone, Copy, Debug)]
pub struct PtxImage {
    /// `sm_80`, `sm_90`: the `-Ctarget-cpu` the image was built with.
    pub arch: &'static str,
    /// Lowest compute capability it runs on.
    pub min_cc: (i32, i32),
    /// Every entry begins with `griddepcontrol.wait` (sm_90 and later; build.rs checks it), so
    /// its launches may be chained ([`crate::backends::launch`]).
    pub chains_grids: bool,
    pub ptx: &'static str,
}

/// Picks the newest image the device can run.
pub fn pick(images: &[PtxImage], cc: (i32, i32)) -> Option<PtxImage> {
    images.iter().copied().filter(|i| i.min_cc <= cc).max_by_key(|i| i.min_cc)
}

pub fn open(ordinal: usize, images: &[PtxImage]) -> Result<GpuBackend> {
    let (ctx, info) = open_device("cuda", ordinal)?;
    let image = runnable(images, &info)?;
    GpuBackend::new("cuda", ctx, info, image.ptx.to_string(), image.arch.to_string(), image.chains_grids)
}

/// As [`open`], with the timeline build of the image ([`trace`]: every entry stamps its blocks'
/// start, release and end). Refused where the device's image does not chain its launches: the
/// timeline lays out the chain.
pub fn open_traced(ordinal: usize, images: &[PtxImage]) -> Result<GpuBackend> {
    let (ctx, info) = open_device("cuda", ordinal)?;
    let image = runnable(images, &info)?;
    if !image.chains_grids {
        return Err(Error::Request(format!(
            "the timeline lays out chained launches; {} runs the {} image, which does not chain them",
            info.name, image.arch
        )));
    }
    let traced = trace::instrument(image.ptx).map_err(|detail| Error::Setup { backend: "cuda", what: format!("the timeline build of the {} PTX", image.arch), detail })?;
    let mut gpu = GpuBackend::new("cuda", ctx, info, traced.ptx, image.arch.to_string(), true)?;
    gpu.set_trace_entries(traced.entries);
    Ok(gpu)
}

/// The image [`pick`] gives for the device, or why none runs there.
fn runnable(images: &[PtxImage], info: &DeviceInfo) -> Result<PtxImage> {
    pick(images, info.compute_capability).ok_or_else(|| Error::NoGpu {
        backend: "cuda",
        reason: format!(
            "{} has compute capability {}.{}; the embedded PTX needs {}",
            info.name,
            info.compute_capability.0,
            info.compute_capability.1,
            images.iter().map(|i| format!("{}.{}+ ({})", i.min_cc.0, i.min_cc.1, i.arch)).collect::<Vec<_>>().join(" or ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_newest_runnable_image() {
        let imgs = [
            PtxImage { arch: "sm_80", min_cc: (8, 0), chains_grids: false, ptx: "" },
            PtxImage { arch: "sm_90", min_cc: (9, 0), chains_grids: true, ptx: "" },
        ];
        assert_eq!(pick(&imgs, (9, 0)).unwrap().arch, "sm_90");
        assert_eq!(pick(&imgs, (12, 0)).unwrap().arch, "sm_90");
        assert_eq!(pick(&imgs, (8, 9)).unwrap().arch, "sm_80");
        assert!(pick(&imgs, (7, 5)).is_none());
    }
}
