//! One kernel launch: its parameters, and the driver call that queues it, chained to the launch
//! before it on the stream by programmatic dependent launch (PDL) where the backend's kernels
//! allow it.
//!
//! With PDL (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`), a grid may start while the
//! grid before it on the stream still runs, once every block of that grid has signalled
//! `griddepcontrol.launch_dependents`. What makes that safe is the kernels' side: every entry of
//! the `sm_90` image calls `arch::sync::chain_grids` (`griddepcontrol.wait`, which returns
//! when the previous grid has completed and its memory is visible, then the signal) before it
//! writes any buffer or reads any buffer but weights, in every block. Weights are constant while
//! kernels run: every weight buffer is filled by a copy (`GpuBackend::upload`, or
//! `copy_from_mapped_multi`, which waits for its kernel), and a chained grid overlaps only a
//! kernel before it that asks for the overlap, never a copy (the driver's rule for the
//! attribute). So on every path that launches (the step, the benches, the parity suite) an entry
//! may load weights, or ask L2 for them, before its wait. And as every block signals only after
//! its own wait returned, a grid starts only once the grid two launches back has completed and
//! its writes have reached L2: an entry may also read before its wait, from L2 (`mem::ld_cg_u32`,
//! not the SM's L1, which may hold older lines), a buffer the launch just before it does not
//! write. (Such reads by every warp of a large grid all go to the L2 slice of the same few lines
//! while the grid before streams through L2: down reading its group table so made gate/up 2.9 us
//! a launch slower, docs/kernels/moe.md.) Two kinds of entry do: `attn_prep` and the `attn_chunk` entries read the window's
//! position, which only a copy before the step or the accept op at a step's end writes, several
//! launches before any of them (and `attn_chunk` then only asks L2 for cache rows, a hint).
//! build.rs refuses an `sm_90` image with
//! an entry that lacks the wait. A grid therefore only overlaps its predecessor's tail with its
//! own launch and start-up, and completes after it: the order, and so every bit, is the stream's.
//!
//! Before a launch, the widths of the arguments pushed are checked against the parameters the
//! kernel declares in its PTX ([`entry_param_widths`]): a host argument list that a kernel's
//! change left behind is an error naming the kernel, not a launch reading the wrong bytes.
use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::driver::sys::{
    self, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DriverError, PushKernelArg};

/// The most buffer parameters one kernel takes (the largest has 17 parameters in all).
const MAX_BUFFERS: usize = 24;

/// Each entry's parameter widths in bytes, in order, as a PTX image declares them: `.u64`,
/// `.b64`, `.f64` 8 (a pointer is a `.u64`), `.u32`, `.f32` 4, and so on, an array `.b8 p[N]`
/// N. What a launch's arguments must match ([`KernelArgs::mismatch`]); an entry whose list does
/// not parse is left out.
pub fn entry_param_widths(ptx: &str) -> HashMap<String, Vec<u32>> {
    let width = |decl: &str| -> Option<u32> {
        if let Some((_, n)) = decl.split_once('[') {
            return n.trim_end_matches(']').trim().parse().ok();
        }
        // The type is the first word after `.param` of a width: `.u64`, `.f32`, `.b8`, ...
        decl.split_whitespace().skip_while(|w| *w != ".param").skip(1).find_map(|w| match w.get(2..) {
            Some("8") => Some(1),
            Some("16") => Some(2),
            Some("32") => Some(4),
            Some("64") => Some(8),
            _ => None,
        })
    };
    let mut out = HashMap::new();
    for rest in ptx.split(".entry ").skip(1) {
        let Some((name, rest)) = rest.split_once('(') else { continue };
        let Some(end) = rest.find(')') else { continue };
        let widths = rest[..end].split(',').map(str::trim).filter(|d| !d.is_empty()).map(width).collect::<Option<Vec<u32>>>();
        if let Some(widths) = widths {
            out.insert(name.trim().to_string(), widths);
        }
    }
    out
}

/// The parameters of one launch, pushed in the kernel's order with [`PushKernelArg::arg`].
pub struct KernelArgs<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    /// The kernel's parameter widths ([`entry_param_widths`]) and those pushed so far.
    declared: &'a [u32],
    pushed: Vec<u32>,
    /// The device addresses of the buffer parameters: the driver reads each parameter through a
    /// pointer, so they live here, boxed, at addresses that do not move while more are pushed.
    buffers: Box<[sys::CUdeviceptr; MAX_BUFFERS]>,
    n_buffers: usize,
    /// One pointer per parameter, in order: into `buffers`, or at the caller's scalar (borrowed
    /// for `'a`).
    params: Vec<*mut c_void>,
}

impl<'a> KernelArgs<'a> {
    /// A launch of `func`, whose parameters have the widths `declared`.
    pub(crate) fn new(stream: &'a CudaStream, func: &'a CudaFunction, declared: &'a [u32]) -> Self {
        KernelArgs { stream, func, declared, pushed: Vec::with_capacity(20), buffers: Box::new([0; MAX_BUFFERS]), n_buffers: 0, params: Vec::with_capacity(20) }
    }

    fn push_buffer(&mut self, ptr: sys::CUdeviceptr) -> &mut Self {
        assert!(self.n_buffers < MAX_BUFFERS, "a kernel with more than {MAX_BUFFERS} buffer parameters");
        self.buffers[self.n_buffers] = ptr;
        self.params.push(&mut self.buffers[self.n_buffers] as *mut sys::CUdeviceptr as *mut c_void);
        self.pushed.push(std::mem::size_of::<sys::CUdeviceptr>() as u32);
        self.n_buffers += 1;
        self
    }

    /// Where the pushed arguments do not match the kernel's parameters in count and widths
    /// (the driver would read past them, or into the wrong ones): what each is.
    pub(crate) fn mismatch(&self) -> Option<String> {
        (self.pushed != self.declared).then(|| format!("the host pushed arguments of {:?} bytes where the kernel declares parameters of {:?}", self.pushed, self.declared))
    }

    /// Queues the kernel over `grid` blocks of `threads` threads with `smem` bytes of dynamic
    /// shared memory; `chained`: with programmatic dependent launch.
    ///
    /// # Safety
    /// The parameters are exactly the ones the kernel declares, its buffers hold what its
    /// contract asks for this shape, and when `chained`, the kernel waits for the previous grid
    /// (`griddepcontrol.wait`) before it touches memory, in every block.
    pub(crate) unsafe fn launch(mut self, grid: u32, threads: u32, smem: u32, chained: bool) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let mut attr = CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            // SAFETY: a plain C union of integers and arrays: all zeros is a valid value of it.
            value: unsafe { std::mem::zeroed::<CUlaunchAttributeValue>() },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: chained as u32,
        };
        // SAFETY: `config` and `attr` outlive the call; every parameter pointer points at a live
        // value of the parameter's type (the caller's contract for the kernel's signature).
        unsafe { sys::cuLaunchKernelEx(&config, self.func.cu_function(), self.params.as_mut_ptr(), std::ptr::null_mut()) }.result()
    }
}

// The kernels' scalar parameters: by address, as the driver reads them.
macro_rules! scalar_params {
    ($($t:ty),*) => {$(
        // SAFETY: a plain value the kernel takes by value; the borrow outlives the launch call.
        unsafe impl<'a, 'b: 'a> PushKernelArg<&'b $t> for KernelArgs<'a> {
            fn arg(&mut self, arg: &'b $t) -> &mut Self {
                self.params.push(arg as *const $t as *mut c_void);
                self.pushed.push(std::mem::size_of::<$t>() as u32);
                self
            }
        }
    )*};
}
scalar_params!(u32, i32, u64, f32);

// Buffers: their device address (cudarc's per-buffer event tracking is off, `gpu::open_device`,
// so the guards these calls return do nothing).
// SAFETY (all four): the device address of a live allocation, which the borrow keeps alive.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b CudaSlice<T>> for KernelArgs<'a> {
    fn arg(&mut self, arg: &'b CudaSlice<T>) -> &mut Self {
        let ptr = arg.device_ptr(self.stream).0;
        self.push_buffer(ptr)
    }
}

unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut CudaSlice<T>> for KernelArgs<'a> {
    fn arg(&mut self, arg: &'b mut CudaSlice<T>) -> &mut Self {
        let ptr = arg.device_ptr_mut(self.stream).0;
        self.push_buffer(ptr)
    }
}

unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaView<'c, T>> for KernelArgs<'a> {
    fn arg(&mut self, arg: &'b CudaView<'c, T>) -> &mut Self {
        let ptr = arg.device_ptr(self.stream).0;
        self.push_buffer(ptr)
    }
}

unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut CudaViewMut<'c, T>> for KernelArgs<'a> {
    fn arg(&mut self, arg: &'b mut CudaViewMut<'c, T>) -> &mut Self {
        let ptr = arg.device_ptr_mut(self.stream).0;
        self.push_buffer(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::entry_param_widths;

    #[test]
    fn entry_param_widths_reads_each_entrys_types_in_order() {
        let ptx = "//\n.visible .entry k(\n\t.param .u64 .ptr .align 1 k_param_0,\n\t.param .u32 k_param_1,\n\t.param .f32 k_param_2,\n\t.param .align 8 .b8 k_param_3[24]\n)\n.maxntid 128, 1, 1\n{\n}\n.entry none(\n)\n{\n}\n.visible .entry odd(\n\t.param .pred odd_param_0\n)\n{\n}\n";
        let w = entry_param_widths(ptx);
        assert_eq!(w["k"], [8, 4, 4, 24]);
        assert_eq!(w["none"], Vec::<u32>::new());
        assert!(!w.contains_key("odd"), "a type of no known width leaves the entry out: {w:?}");
        assert_eq!(w.len(), 2);
    }
}
