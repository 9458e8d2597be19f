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

use crate::backend::{
    check_head, check_matvec, check_mmvq, check_moe, check_quantize, check_quantize_q8_0, Backend, FloatWeights, MoeOut, MoeWindow,
    Variant, Weights,
};
use crate::error::{Error, Result};
use strata_gpu_shared::grid_pad::{grid_pad, WaveSlots};
use strata_gpu_shared::launch::{bounds, BOUNDS, HEAD_CHUNK, MMVQ_WARPS, MOE_GU_ROWS, QUANTIZE_WARPS};
use strata_gpu_shared::moe;

/// Guard elements after every output buffer, filled with [`Guard::GUARD`] and checked after the
/// kernel: a kernel that writes past its output is caught on every call, padded grids included.
const GUARD_ELEMS: usize = 64;

/// An output element type with a recognizable guard pattern.
pub trait Guard: DeviceRepr + Copy + Default {
    const GUARD: Self;
    fn is_guard(&self) -> bool;
}

impl Guard for u8 {
    const GUARD: u8 = 0xa5;
    fn is_guard(&self) -> bool {
        *self == Self::GUARD
    }
}

impl Guard for u32 {
    const GUARD: u32 = 0xa5a5_a5a5;
    fn is_guard(&self) -> bool {
        *self == Self::GUARD
    }
}

impl Guard for f32 {
    const GUARD: f32 = f32::from_bits(0x7fa5_a5a5);
    fn is_guard(&self) -> bool {
        self.to_bits() == Self::GUARD.to_bits()
    }
}

/// Whether grids are padded (`grid_pad`): `STRATA_GRID_PAD=0` never, `=1` on every device,
/// unset on gfx1200/gfx1201 only (where the stall was measured), so never on NVIDIA. Read once.
pub fn grid_pad_wanted(arch: &str) -> bool {
    static SETTING: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let setting = *SETTING.get_or_init(|| match std::env::var("STRATA_GRID_PAD").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    });
    setting.unwrap_or(arch == "gfx1200" || arch == "gfx1201")
}

/// The GPU a backend runs on.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_mem: usize,
    pub sm_count: i32,
    pub l2_bytes: i32,
    pub max_threads_per_sm: i32,
}

impl DeviceInfo {
    /// The device's wave (warp) slots, for `grid_pad`.
    pub fn wave_slots(&self) -> WaveSlots {
        WaveSlots { slots: (self.sm_count.max(1) * (self.max_threads_per_sm.max(32) / 32)) as u32, wave: 32 }
    }
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
        max_threads_per_sm: ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
            .map_err(|e| setup("threads per SM", e))?,
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
    /// Launch grids go through `grid_pad` for these wave slots when set.
    pad: Option<WaveSlots>,
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
        let arch = format!("sm_{}{}", info.compute_capability.0, info.compute_capability.1);
        let pad = grid_pad_wanted(&arch).then(|| info.wave_slots());
        Ok(GpuBackend { name, stream: ctx.default_stream(), functions, info, ptx_arch, pad, _module: module })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Turns grid padding on or off for this backend (tests force it on to prove the kernels
    /// ignore the extra blocks).
    pub fn set_grid_pad(&mut self, on: bool) {
        self.pad = on.then(|| self.info.wave_slots());
    }

    pub fn grid_pad_on(&self) -> bool {
        self.pad.is_some()
    }

    pub(crate) fn driver_err<'a>(&self, kernel: &'a str, what: &'static str) -> impl Fn(DriverError) -> Error + 'a {
        let backend = self.name;
        move |cause| Error::Driver { backend, kernel: kernel.to_string(), what, cause }
    }

    pub fn upload<T: DeviceRepr>(&self, kernel: &str, host: &[T]) -> Result<CudaSlice<T>> {
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
        let b = bounds(kernel).expect("every launched kernel is in BOUNDS");
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (b.threads, 1, 1), shared_mem_bytes: b.smem_bytes };
        args.launch(cfg).map(|_| ()).map_err(self.driver_err(kernel, "launch"))
    }

    /// Launches (on a padded grid when padding is on) and waits, so an execution error is
    /// reported against this kernel.
    pub(crate) fn run(&self, kernel: &'static str, blocks: u32, args: LaunchArgs) -> Result<()> {
        let threads = bounds(kernel).expect("every launched kernel is in BOUNDS").threads;
        let blocks = self.pad.map_or(blocks, |slots| grid_pad(blocks, threads, slots));
        // SAFETY: every caller pushes exactly the parameters the kernel declares and device
        // buffers sized by the shape checks in `backend`; every kernel returns at once in blocks
        // past its real work, so a padded grid is covered.
        unsafe { self.launch_async(kernel, blocks, args) }?;
        self.stream.synchronize().map_err(self.driver_err(kernel, "execution"))
    }

    /// An output buffer: the caller's current contents (its poison), then guard elements.
    fn upload_out<T: Guard>(&self, kernel: &str, host: &[T]) -> Result<CudaSlice<T>> {
        let mut v = host.to_vec();
        v.extend(std::iter::repeat_n(T::GUARD, GUARD_ELEMS));
        self.upload(kernel, &v)
    }

    /// Copies an output back and checks its guard elements are untouched.
    fn download_out<T: Guard>(&self, kernel: &str, dev: &CudaSlice<T>, host: &mut [T]) -> Result<()> {
        let mut v = vec![T::default(); host.len() + GUARD_ELEMS];
        self.download(kernel, dev, &mut v)?;
        if !v[host.len()..].iter().all(Guard::is_guard) {
            return Err(Error::WrotePastOutput { backend: self.name, kernel: kernel.to_string() });
        }
        host.copy_from_slice(&v[..host.len()]);
        Ok(())
    }

    /// The table's `'static` name of a kernel built at run time (`moe_gu_iq3_s`).
    fn kernel(&self, name: &str) -> Result<&'static str> {
        bounds(name).map(|b| b.kernel).ok_or_else(|| Error::Setup { backend: self.name, what: format!("kernel {name}"), detail: "not in the launch table".into() })
    }

    /// Device scratch of `len` elements.
    fn scratch<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(&self, kernel: &str, len: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros(len).map_err(self.driver_err(kernel, "scratch allocation"))
    }

    pub fn download<T: DeviceRepr>(&self, kernel: &str, dev: &CudaSlice<T>, host: &mut [T]) -> Result<()> {
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
        let mut dout = self.upload_out(kernel, out)?;
        let mut args = self.builder(kernel);
        args.arg(&dx).arg(&mut dout).arg(&groups);
        self.run(kernel, groups.div_ceil(QUANTIZE_WARPS), args)?;
        self.download_out(kernel, &dout, out)
    }

    fn mmvq(&self, w: &Weights, xq: &[u8], rows: usize, y: &mut [f32]) -> Result<()> {
        let kernel = w.format.mmvq_kernel();
        let groups = check_mmvq(w, xq, rows, y)? as u32;
        let (m, rows) = (w.m as u32, rows as u32);
        let dw = self.upload(kernel, w.data)?;
        let dx = self.upload(kernel, xq)?;
        let mut dy = self.upload_out(kernel, y)?;
        let mut args = self.builder(kernel);
        args.arg(&dw).arg(&dx).arg(&mut dy).arg(&m).arg(&groups).arg(&rows);
        self.run(kernel, m.div_ceil(MMVQ_WARPS), args)?;
        self.download_out(kernel, &dy, y)
    }

    fn matvec(&self, w: &FloatWeights, x: &[f32], rows: usize, y: &mut [f32]) -> Result<()> {
        let kernel = w.format.matvec_kernel();
        check_matvec(w, x, rows, y)?;
        let (m, k, rows) = (w.m as u32, w.k as u32, rows as u32);
        let dw = self.upload(kernel, w.data)?;
        let dx = self.upload(kernel, x)?;
        let mut dy = self.upload_out(kernel, y)?;
        let mut args = self.builder(kernel);
        args.arg(&dw).arg(&dx).arg(&mut dy).arg(&m).arg(&k).arg(&rows);
        self.run(kernel, m.div_ceil(MMVQ_WARPS), args)?;
        self.download_out(kernel, &dy, y)
    }

    fn argmax_rows(&self, x: &[f32], n: usize, variant: Variant, idx: &mut [u32], all_nan: &mut [u32]) -> Result<()> {
        let rows = check_head("argmax_rows", x, n, &[idx.len(), all_nan.len()])? as u32;
        let (n32, chunks) = (n as u32, n.div_ceil(HEAD_CHUNK) as u32);
        let dx = self.upload("argmax_rows", x)?;
        let mut di = self.upload_out("argmax_rows", idx)?;
        let mut df = self.upload_out("argmax_rows", all_nan)?;
        match variant {
            Variant::Reference => {
                let mut a = self.builder("argmax_rows_ref");
                a.arg(&dx).arg(&n32).arg(&rows).arg(&mut di).arg(&mut df);
                self.run("argmax_rows_ref", rows, a)?;
            }
            Variant::Fast => {
                let mut pv = self.scratch::<f32>("argmax_rows_split", (rows * chunks) as usize)?;
                let mut pi = self.scratch::<u32>("argmax_rows_split", (rows * chunks) as usize)?;
                let mut a = self.builder("argmax_rows_split");
                a.arg(&dx).arg(&n32).arg(&rows).arg(&chunks).arg(&mut pv).arg(&mut pi);
                self.run("argmax_rows_split", rows * chunks, a)?;
                let mut a = self.builder("argmax_rows_final");
                a.arg(&pv).arg(&pi).arg(&rows).arg(&chunks).arg(&mut di).arg(&mut df);
                self.run("argmax_rows_final", rows, a)?;
            }
        }
        self.download_out("argmax_rows", &di, idx)?;
        self.download_out("argmax_rows", &df, all_nan)
    }

    fn row_top_prob(&self, x: &[f32], n: usize, variant: Variant, p: &mut [f32]) -> Result<()> {
        let rows = check_head("row_top_prob", x, n, &[p.len()])? as u32;
        let (n32, chunks) = (n as u32, n.div_ceil(HEAD_CHUNK) as u32);
        let dx = self.upload("row_top_prob", x)?;
        let mut dp = self.upload_out("row_top_prob", p)?;
        match variant {
            Variant::Reference => {
                let mut a = self.builder("row_top_prob_ref");
                a.arg(&dx).arg(&n32).arg(&rows).arg(&mut dp);
                self.run("row_top_prob_ref", rows, a)?;
            }
            Variant::Fast => {
                let mut pm = self.scratch::<f32>("row_top_prob_max", (rows * chunks) as usize)?;
                let mut ps = self.scratch::<f32>("row_top_prob_sum", (rows * chunks) as usize)?;
                let mut a = self.builder("row_top_prob_max");
                a.arg(&dx).arg(&n32).arg(&rows).arg(&chunks).arg(&mut pm);
                self.run("row_top_prob_max", rows * chunks, a)?;
                let mut a = self.builder("row_top_prob_sum");
                a.arg(&dx).arg(&n32).arg(&rows).arg(&chunks).arg(&pm).arg(&mut ps);
                self.run("row_top_prob_sum", rows * chunks, a)?;
                let mut a = self.builder("row_top_prob_final");
                a.arg(&ps).arg(&rows).arg(&chunks).arg(&mut dp);
                self.run("row_top_prob_final", rows, a)?;
            }
        }
        self.download_out("row_top_prob", &dp, p)
    }

    fn quantize_q8_0_scaled(&self, x: &[f32], k: usize, scales: &[f32], per_column: bool, variant: Variant, out: &mut [u8]) -> Result<()> {
        let (kernel, per_block) = match variant {
            Variant::Reference => ("quantize_q8_0_scaled_ref", 32 * QUANTIZE_WARPS),
            Variant::Fast => ("quantize_q8_0_scaled", QUANTIZE_WARPS),
        };
        let groups = check_quantize_q8_0(x, k, scales, per_column, out)? as u32;
        let (k32, col) = (k as u32, per_column as u32);
        let dx = self.upload(kernel, x)?;
        let ds = self.upload(kernel, scales)?;
        let mut dout = self.upload_out(kernel, out)?;
        let mut a = self.builder(kernel);
        a.arg(&dx).arg(&k32).arg(&ds).arg(&col).arg(&groups).arg(&mut dout);
        self.run(kernel, groups.div_ceil(per_block), a)?;
        self.download_out(kernel, &dout, out)
    }

    fn moe(&self, w: &MoeWindow, o: &mut MoeOut) -> Result<()> {
        let (n_embd, n_ff) = check_moe(w, o)?;
        let (gu, down) = (self.kernel(&format!("moe_gu_{}", w.gate.format.tag()))?, self.kernel(&format!("moe_down_{}", w.down.format.tag()))?);
        let n = (w.tokens * w.k) as u32;
        let (k, n_expert, tokens) = (w.k as u32, w.gate.n_expert as u32, w.tokens as u32);
        let (embd_groups, ff_groups, n_embd32, n_ff32) = ((n_embd / 32) as u32, (n_ff / 32) as u32, n_embd as u32, n_ff as u32);
        let (gu_bytes, down_bytes) = (w.gate.expert_bytes() as u64, w.down.expert_bytes() as u64);
        let ids = self.upload("moe_group", w.ids)?;
        let weights = self.upload("moe_combine", w.weights)?;
        let xq = self.upload(gu, w.xq)?;
        let (gate, up, dn) = (self.upload(gu, w.gate.data)?, self.upload(gu, w.up.data)?, self.upload(down, w.down.data)?);
        let mut table = self.scratch::<u32>("moe_group", moe::table_words(n as usize))?;
        let mut hq = self.upload_out(gu, o.hq)?;
        let mut y = self.upload_out(down, o.y)?;
        let mut out = self.upload_out("moe_combine", o.out)?;
        let mut a = self.builder("moe_group");
        a.arg(&ids).arg(&n).arg(&n_expert).arg(&mut table);
        self.run("moe_group", 1, a)?;
        let mut a = self.builder(gu);
        a.arg(&gate).arg(&up).arg(&gu_bytes).arg(&xq).arg(&table).arg(&n).arg(&k).arg(&embd_groups).arg(&n_ff32).arg(&mut hq);
        self.run(gu, n * (n_ff32 / MOE_GU_ROWS), a)?;
        let mut a = self.builder(down);
        a.arg(&dn).arg(&down_bytes).arg(&hq).arg(&table).arg(&n).arg(&ff_groups).arg(&n_embd32).arg(&mut y);
        self.run(down, n * n_embd32.div_ceil(MMVQ_WARPS), a)?;
        let mut a = self.builder("moe_combine");
        a.arg(&y).arg(&weights).arg(&tokens).arg(&k).arg(&n_embd32).arg(&mut out);
        self.run("moe_combine", (tokens * n_embd32).div_ceil(256), a)?;
        self.download_out(gu, &hq, o.hq)?;
        self.download_out(down, &y, o.y)?;
        self.download_out("moe_combine", &out, o.out)
    }
}
