//! Pinned, device-mapped host memory and `copy_from_mapped_multi`: many host segments into
//! device memory in one launch (the alternative to one `cuMemcpyAsync` per segment).
use cudarc::driver::{sys, CudaSlice, DevicePtrMut, PinnedHostSlice, PushKernelArg};

use crate::error::{Error, Result};
use crate::backends::gpu::GpuBackend;
use strata_gpu_shared::launch::{COPY_CHUNK, COPY_SEGMENT_WORDS};

const KERNEL: &str = "copy_from_mapped_multi";

/// Page-locked host memory the device reads directly.
pub struct MappedHost {
    host: PinnedHostSlice<u8>,
    device_ptr: u64,
}

impl MappedHost {
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        let len = self.host.len();
        self.host.as_mut_slice().map_err(|cause| Error::Driver { backend: "gpu", kernel: KERNEL.into(), what: "mapped memory", cause }).map(|s| &mut s[..len])
    }

    /// The host bytes (page-locked, so copies from them are truly asynchronous).
    pub fn as_slice(&self) -> Result<&[u8]> {
        let len = self.host.len();
        self.host.as_slice().map_err(|cause| Error::Driver { backend: "gpu", kernel: KERNEL.into(), what: "mapped memory", cause }).map(|s| &s[..len])
    }

    pub fn len(&self) -> usize {
        self.host.len()
    }

    pub fn is_empty(&self) -> bool {
        self.host.len() == 0
    }
}

/// One segment: `len` bytes from `src` (offset in the mapped buffer) to `dst` (offset in the
/// destination buffer). Both offsets must be multiples of 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

impl GpuBackend {
    /// `len` bytes of pinned host memory mapped into the device's address space.
    pub fn alloc_mapped(&self, len: usize) -> Result<MappedHost> {
        let err = |what| move |cause| Error::Driver { backend: self.name_static(), kernel: KERNEL.into(), what, cause };
        // SAFETY: the bytes are uninitialized until the caller writes them through
        // `as_mut_slice`; nothing reads them before.
        let mut host = unsafe { self.stream().context().alloc_pinned_with_flags::<u8>(len.max(1), sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .map_err(err("pinned allocation"))?;
        let ptr = host.as_mut_ptr().map_err(err("pinned allocation"))?;
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live allocation from cuMemHostAlloc with DEVICEMAP in this context;
        // the call only writes the device address into `device_ptr`.
        let status = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, ptr.cast(), 0) };
        status.result().map_err(err("mapping host memory"))?;
        Ok(MappedHost { host, device_ptr })
    }

    /// Copies every segment of `host` into `dst` with one launch, and waits.
    pub fn copy_from_mapped_multi(&self, host: &MappedHost, segments: &[Segment], dst: &mut CudaSlice<u8>) -> Result<()> {
        let (table, total) = self.copy_table(host, segments, dst)?;
        let dtable = self.upload(KERNEL, &table)?;
        let n = segments.len() as u32;
        let mut args = self.builder(KERNEL);
        args.arg(&dtable).arg(&n).arg(&total);
        self.run(KERNEL, total, args)
    }

    /// The kernel's segment table (checked against both buffers) and its block count.
    pub(crate) fn copy_table(&self, host: &MappedHost, segments: &[Segment], dst: &mut CudaSlice<u8>) -> Result<(Vec<u64>, u32)> {
        let shape = |detail: String| Error::Shape { kernel: KERNEL, detail };
        let dst_len = dst.len();
        let (dst_ptr, _sync) = dst.device_ptr_mut(self.stream());
        let mut table = Vec::with_capacity(segments.len() * COPY_SEGMENT_WORDS);
        let mut first = 0u64;
        for (i, s) in segments.iter().enumerate() {
            if s.src % 4 != 0 || s.dst % 4 != 0 {
                return Err(shape(format!("segment {i}: offsets {} and {} are not multiples of 4", s.src, s.dst)));
            }
            if s.src.checked_add(s.len).is_none_or(|e| e > host.len()) || s.dst.checked_add(s.len).is_none_or(|e| e > dst_len) {
                return Err(shape(format!("segment {i} ({} bytes at {} -> {}) runs past a buffer", s.len, s.src, s.dst)));
            }
            table.extend([host.device_ptr + s.src as u64, dst_ptr + s.dst as u64, s.len as u64, first]);
            first += s.len.div_ceil(COPY_CHUNK) as u64;
        }
        let total = u32::try_from(first).map_err(|_| shape(format!("{first} blocks exceed one launch")))?;
        Ok((table, total))
    }

    /// Copies each segment with its own `cuMemcpyAsync` (the baseline), and waits.
    pub fn copy_segments_one_by_one(&self, host: &MappedHost, segments: &[Segment], dst: &mut CudaSlice<u8>) -> Result<()> {
        let from = host.as_slice()?;
        for s in segments {
            self.stream()
                .memcpy_htod(&from[s.src..s.src + s.len], &mut dst.slice_mut(s.dst..s.dst + s.len))
                .map_err(self.driver_err(KERNEL, "copy"))?;
        }
        self.stream().synchronize().map_err(self.driver_err(KERNEL, "copy"))
    }
}
