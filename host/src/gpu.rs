//! What the `cuda` and `hip` backends share: a CUDA driver context, a module of kernels loaded
//! from PTX, and the launches. They differ only in where the PTX comes from (Rust `device/` or
//! the `.hip` sources through NVRTC).
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    sys::CUdevice_attribute, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchArgs,
    DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::backend::{check_matvec, check_mmvq, check_quantize, Backend, FloatWeights, Weights};
use crate::error::{Error, Result};
use strata_gpu_shared::launch::{bounds, BOUNDS, MMVQ_WARPS, QUANTIZE_WARPS};

/// The GPU a backend runs on.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_mem: usize,
    pub sm_count: i32,
    pub l2_bytes: i32,
}

/// Why there is no GPU, or how many there are. Never panics, whatever the machine lacks.
pub fn probe() -> std::result::Result<usize, String> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) found".into());
    }
    match CudaContext::device_count() {
        Ok(0) => Err("the CUDA driver reports no device".into()),
        Ok(n) => Ok(n as usize),
        Err(e) => Err(format!("CUDA driver: {e}")),
    }
}

/// Opens device `ordinal` and reads what `strata info` shows.
pub fn open_device(backend: &'static str, ordinal: usize) -> Result<(Arc<CudaContext>, DeviceInfo)> {
    probe().map_err(|reason| Error::NoGpu { backend, reason })?;
    let setup = |what: &str, e: DriverError| Error::Setup { backend, what: what.into(), detail: e.to_string() };
    let ctx = CudaContext::new(ordinal).map_err(|e| setup("opening the device", e))?;
    // SAFETY: cudarc's per-buffer event tracking only matters across streams. A backend issues
    // all its work on one stream, and the one other stream (the bench's graph-capture stream)
    // is used only after an explicit synchronize; and recording tracking events inside a
    // capture is what a capture refuses. So tracking is off, for buffers created from here on.
    unsafe { ctx.disable_event_tracking() };
    let info = DeviceInfo {
        ordinal,
        name: ctx.name().map_err(|e| setup("device name", e))?,
        compute_capability: ctx.compute_capability().map_err(|e| setup("compute capability", e))?,
        total_mem: ctx.total_mem().map_err(|e| setup("device memory", e))?,
        sm_count: ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| setup("SM count", e))?,
        l2_bytes: ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .map_err(|e| setup("L2 size", e))?,
    };
    Ok((ctx, info))
}

/// A backend that runs PTX kernels through the CUDA driver.
pub struct GpuBackend {
    name: &'static str,
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
    info: DeviceInfo,
    /// What the PTX was built for (`sm_90`, `compute_90`, ...), for `strata info`.
    pub ptx_arch: String,
    _module: Arc<CudaModule>,
}

impl GpuBackend {
    /// Loads `ptx` into `ctx` and looks up every kernel of the launch-bounds table.
    pub fn new(name: &'static str, ctx: Arc<CudaContext>, info: DeviceInfo, ptx: String, ptx_arch: String) -> Result<Self> {
        let module = ctx.load_module(Ptx::from_src(ptx)).map_err(|e| Error::Setup {
            backend: name,
            what: format!("loading {ptx_arch} PTX on {}", info.name),
            detail: e.to_string(),
        })?;
        let mut functions = HashMap::new();
        for b in BOUNDS {
            let f = module.load_function(b.kernel).map_err(|e| Error::Setup {
                backend: name,
                what: format!("kernel {} missing from the module", b.kernel),
                detail: e.to_string(),
            })?;
            functions.insert(b.kernel, f);
        }
        Ok(GpuBackend { name, stream: ctx.default_stream(), functions, info, ptx_arch, _module: module })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub(crate) fn driver_err<'a>(&self, kernel: &'a str, what: &'static str) -> impl Fn(DriverError) -> Error + 'a {
        let backend = self.name;
        move |cause| Error::Driver { backend, kernel: kernel.to_string(), what, cause }
    }

    pub(crate) fn upload<T: DeviceRepr>(&self, kernel: &str, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(host).map_err(self.driver_err(kernel, "copy to device"))
    }

    /// `cuda` or `hip`.
    pub fn name_static(&self) -> &'static str {
        self.name
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A launch of `kernel`; the caller pushes its parameters in order and hands it to
    /// [`Self::run`] or [`Self::launch_async`].
    pub(crate) fn builder(&self, kernel: &'static str) -> LaunchArgs<'_> {
        self.builder_on(&self.stream, kernel)
    }

    /// As [`Self::builder`], on another stream of the same context (graph capture cannot use
    /// the default stream).
    pub(crate) fn builder_on<'a>(&'a self, stream: &'a CudaStream, kernel: &'static str) -> LaunchArgs<'a> {
        stream.launch_builder(&self.functions[kernel])
    }

    /// Queues the launch over `blocks` blocks of the kernel's table thread count, without
    /// waiting (benches, graph capture).
    ///
    /// # Safety
    /// `args` holds exactly the parameters the kernel declares, with device buffers of the sizes
    /// its contract names (the shape checks in `backend` establish them for the safe callers).
    pub(crate) unsafe fn launch_async(&self, kernel: &'static str, blocks: u32, mut args: LaunchArgs) -> Result<()> {
        let threads = bounds(kernel).expect("every launched kernel is in BOUNDS").threads;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
        args.launch(cfg).map(|_| ()).map_err(self.driver_err(kernel, "launch"))
    }

    /// Launches and waits, so an execution error is reported against this kernel.
    fn run(&self, kernel: &'static str, blocks: u32, args: LaunchArgs) -> Result<()> {
        // SAFETY: every caller pushes exactly the parameters the kernel declares, device buffers
        // sized by the shape checks in `backend`, and a grid the kernel's own bounds test covers.
        unsafe { self.launch_async(kernel, blocks, args) }?;
        self.stream.synchronize().map_err(self.driver_err(kernel, "execution"))
    }

    fn download<T: DeviceRepr>(&self, kernel: &str, dev: &CudaSlice<T>, host: &mut [T]) -> Result<()> {
        self.stream.memcpy_dtoh(dev, host).map_err(self.driver_err(kernel, "copy to host"))?;
        self.stream.synchronize().map_err(self.driver_err(kernel, "copy to host"))
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn quantize_q8_1(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        let kernel = "quantize_q8_1";
        let groups = check_quantize(x, out)? as u32;
        if groups == 0 {
            return Ok(());
        }
        let dx = self.upload(kernel, x)?;
        let mut dout = self.upload(kernel, out)?;
        let mut args = self.builder(kernel);
        args.arg(&dx).arg(&mut dout).arg(&groups);
        self.run(kernel, groups.div_ceil(QUANTIZE_WARPS), args)?;
        self.download(kernel, &dout, out)
    }

    fn mmvq(&self, w: &Weights, xq: &[u8], rows: usize, y: &mut [f32]) -> Result<()> {
        let kernel = w.format.mmvq_kernel();
        let groups = check_mmvq(w, xq, rows, y)? as u32;
        let (m, rows) = (w.m as u32, rows as u32);
        let dw = self.upload(kernel, w.data)?;
        let dx = self.upload(kernel, xq)?;
        let mut dy = self.upload(kernel, y)?;
        let mut args = self.builder(kernel);
        args.arg(&dw).arg(&dx).arg(&mut dy).arg(&m).arg(&groups).arg(&rows);
        self.run(kernel, m.div_ceil(MMVQ_WARPS), args)?;
        self.download(kernel, &dy, y)
    }

    fn matvec(&self, w: &FloatWeights, x: &[f32], rows: usize, y: &mut [f32]) -> Result<()> {
        let kernel = w.format.matvec_kernel();
        check_matvec(w, x, rows, y)?;
        let (m, k, rows) = (w.m as u32, w.k as u32, rows as u32);
        let dw = self.upload(kernel, w.data)?;
        let dx = self.upload(kernel, x)?;
        let mut dy = self.upload(kernel, y)?;
        let mut args = self.builder(kernel);
        args.arg(&dw).arg(&dx).arg(&mut dy).arg(&m).arg(&k).arg(&rows);
        self.run(kernel, m.div_ceil(MMVQ_WARPS), args)?;
        self.download(kernel, &dy, y)
    }
}
