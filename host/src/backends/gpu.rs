//! What the `cuda` and `hip` backends share: a CUDA driver context, a module of kernels loaded
//! from PTX, and the launches. They differ only in where the PTX comes from (Rust `device/` or
//! the `.hip` sources through NVRTC).
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    sys::{CUdevice_attribute, CUfunction_attribute}, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaViewMut, DeviceRepr, DriverError, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::backends::{
    check_head, check_matvec, check_mmvq, matvec_grid, check_moe, check_quantize, check_quantize_q8_0, Backend, ExpertTensor, FloatWeights, MoeOut,
    MoeWindow, Variant, Weights,
};
use crate::error::{Error, Result};
use crate::backends::launch::{entry_param_widths, KernelArgs};
use crate::backends::trace;
use strata_gpu_shared::grid_pad::{grid_pad, WaveSlots};
use crate::backends::knobs::{KernelKnobs, Launch, EXPDEC_SMEM_MAX};
use strata_gpu_shared::formats::{q8_1, FloatFormat, WeightFormat, GROUP};
use strata_gpu_shared::launch::{bounds, cluster_blocks, expdec_entry, image_bounds, Bounds, SM90_ARCHS, HEAD_CHUNK, mmvq_launch, MMVQ_MAX_ROWS, MOE_MAX_SELECTIONS, QUANTIZE_WARPS};
use strata_gpu_shared::moe;

/// One MoE layer's expert tensors on the device.
pub struct MoeLayer {
    pub gate: CudaSlice<u8>,
    pub up: CudaSlice<u8>,
    pub down: CudaSlice<u8>,
    pub formats: (strata_gpu_shared::formats::WeightFormat, strata_gpu_shared::formats::WeightFormat),
    pub n_expert: usize,
    pub n_embd: usize,
    pub n_ff: usize,
}

/// One window's inputs and scratch on the device (outputs may carry guard elements); the
/// combined rows go where [`GpuBackend::moe_queue`] is told.
pub struct MoeBuffers {
    pub tokens: usize,
    pub k: usize,
    pub ids: CudaSlice<u32>,
    pub weights: CudaSlice<f32>,
    pub xq: CudaSlice<u8>,
    pub table: CudaSlice<u32>,
    /// `table` already holds the group table of `ids` (`router_topk` writes it for one token):
    /// [`GpuBackend::moe_queue`] then queues no `moe_group`, and clears this.
    pub grouped: bool,
    pub hq: CudaSlice<u8>,
    pub y: CudaSlice<f32>,
}

/// Which launches of a MoE window to queue (benches time the stages apart).
#[derive(Clone, Copy, Debug)]
pub struct MoeStages {
    pub group: bool,
    pub gate_up: bool,
    pub down: bool,
    pub combine: bool,
}

impl MoeStages {
    pub const ALL: MoeStages = MoeStages { group: true, gate_up: true, down: true, combine: true };
}

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

impl Guard for u16 {
    const GUARD: u16 = 0xa5a5;
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

/// Checks that a device buffer of `have` elements holds the `need` a launch reads or writes.
/// Typed launchers take buffers at least that long: the decode step sizes its buffers for its
/// largest window, and parity's outputs carry guard elements.
pub(crate) fn holds(kernel: &'static str, what: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(Error::Shape { kernel, detail: format!("{what} buffer holds {have} elements, {need} needed") });
    }
    Ok(())
}

/// Checks a matvec's weight rows (1..=u32::MAX) and activation rows (1..=`MMVQ_MAX_ROWS`).
fn check_rows(kernel: &'static str, m: usize, rows: usize) -> Result<()> {
    if m == 0 || m > u32::MAX as usize {
        return Err(Error::Shape { kernel, detail: format!("{m} weight rows") });
    }
    if !(1..=MMVQ_MAX_ROWS).contains(&rows) {
        return Err(Error::Shape { kernel, detail: format!("{rows} activation rows, supported 1..={MMVQ_MAX_ROWS}") });
    }
    Ok(())
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
    /// SMs (compute units), at least 1.
    pub fn sms(&self) -> u32 {
        self.sm_count.max(1) as u32
    }

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

/// `STRATA_PDL`: `0` launches every kernel after the previous one has completed, `1` (the
/// default) chains them where the kernels allow it ([`crate::backends::launch`]).
fn pdl_wanted() -> std::result::Result<bool, String> {
    match std::env::var("STRATA_PDL").as_deref() {
        Err(_) | Ok("1") => Ok(true),
        Ok("0") => Ok(false),
        Ok(other) => Err(format!("`{other}` is not 0 or 1")),
    }
}

/// Opens device `ordinal` and reads what `strata info` shows.
pub fn open_device(backend: &'static str, ordinal: usize) -> Result<(Arc<CudaContext>, DeviceInfo)> {
    probe().map_err(|reason| Error::NoGpu { backend, reason })?;
    let setup = |what: &str, e: DriverError| Error::Setup { backend, what: what.into(), detail: e.to_string() };
    let ctx = CudaContext::new(ordinal).map_err(|e| setup("opening the device", e))?;
    // SAFETY: cudarc's per-buffer event tracking only matters across streams. A backend issues
    // all its work on its one stream (which the decode step captures into graphs), and the one
    // other stream (the bench's graph-capture stream) is used only after an explicit
    // synchronize; and recording tracking events inside a capture is what a capture refuses.
    // So tracking is off, for buffers created from here on.
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
    /// Every kernel of the launch-bounds table, with its bounds and its parameters' widths
    /// (looked up on every launch).
    functions: HashMap<&'static str, (CudaFunction, Bounds, Vec<u32>)>,
    info: DeviceInfo,
    /// What the PTX was built for (`sm_90`, `compute_90`, ...), for `strata info`.
    pub ptx_arch: String,
    /// Launch grids go through `grid_pad` for these wave slots when set.
    pad: Option<WaveSlots>,
    /// Which expert and attention kernels run.
    knobs: KernelKnobs,
    /// Every kernel waits for the previous grid first, so launches may be chained.
    chains_grids: bool,
    /// Launches are chained by programmatic dependent launch ([`crate::backends::launch`]).
    chained: bool,
    /// The module has the sm_90 image's own entries (`launch::SM90_BOUNDS`): the thread-block
    /// cluster entries and the lean attention entry.
    sm90_entries: bool,
    /// Kernel-name prefixes whose launches are left out ([`Self::set_dropped`]).
    dropped: Vec<String>,
    /// While recording ([`Self::start_recording`]), every launched kernel's name, in order.
    recorded: Mutex<Option<Vec<&'static str>>>,
    /// The module's entries in order, where it is the timeline build ([`trace`]): a stamp's
    /// entry index names one.
    trace_entries: Option<Vec<trace::Entry>>,
    module: Arc<CudaModule>,
}

impl GpuBackend {
    /// Loads `ptx` into `ctx` and looks up every kernel of the launch-bounds table.
    /// `chains_grids`: every kernel of `ptx` waits for the previous grid before it touches
    /// memory, so launches may be chained ([`crate::backends::launch`]; `STRATA_PDL=0` turns it
    /// off).
    pub fn new(name: &'static str, ctx: Arc<CudaContext>, info: DeviceInfo, ptx: String, ptx_arch: String, chains_grids: bool) -> Result<Self> {
        let mut widths = entry_param_widths(&ptx);
        let module = ctx.load_module(Ptx::from_src(ptx)).map_err(|e| Error::Setup {
            backend: name,
            what: format!("loading {ptx_arch} PTX on {}", info.name),
            detail: e.to_string(),
        })?;
        let mut functions = HashMap::new();
        // The cluster entries and the lean attention entry exist in the SM90_ARCHS images only.
        let sm90_entries = SM90_ARCHS.contains(&ptx_arch.as_str());
        for b in image_bounds(&ptx_arch) {
            let f = module.load_function(b.kernel).map_err(|e| Error::Setup {
                backend: name,
                what: format!("kernel {} missing from the module", b.kernel),
                detail: e.to_string(),
            })?;
            if expdec_entry(b.kernel) {
                f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, EXPDEC_SMEM_MAX as i32).map_err(|e| Error::Setup {
                    backend: name,
                    what: format!("letting kernel {} take {EXPDEC_SMEM_MAX} bytes of shared memory on {}", b.kernel, info.name),
                    detail: e.to_string(),
                })?;
            }
            let params = widths.remove(b.kernel).ok_or_else(|| Error::Setup {
                backend: name,
                what: format!("kernel {}'s parameters", b.kernel),
                detail: format!("no parameter list of known types in the {ptx_arch} PTX"),
            })?;
            functions.insert(b.kernel, (f, *b, params));
        }
        let arch = format!("sm_{}{}", info.compute_capability.0, info.compute_capability.1);
        let pad = grid_pad_wanted(&arch).then(|| info.wave_slots());
        let knobs = KernelKnobs::process().map_err(|detail| Error::Setup { backend: name, what: "kernel knobs".into(), detail })?;
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(|e| Error::Setup { backend: name, what: "creating a stream".into(), detail: e.to_string() })?;
        let chained = chains_grids && pdl_wanted().map_err(|detail| Error::Setup { backend: name, what: "STRATA_PDL".into(), detail })?;
        Ok(GpuBackend { name, stream, functions, info, ptx_arch, pad, knobs, chains_grids, chained, sm90_entries, dropped: Vec::new(), recorded: Mutex::new(None), trace_entries: None, module })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Turns grid padding on or off for this backend (tests force it on to prove the kernels
    /// ignore the extra blocks).
    pub fn set_grid_pad(&mut self, on: bool) {
        self.pad = on.then(|| self.info.wave_slots());
    }

    /// Chooses the expert and attention kernels (tests and benches compare the variants).
    pub fn set_kernel_knobs(&mut self, knobs: KernelKnobs) {
        self.knobs = knobs;
    }

    pub fn kernel_knobs(&self) -> KernelKnobs {
        self.knobs
    }

    pub fn grid_pad_on(&self) -> bool {
        self.pad.is_some()
    }

    /// Whether the module has the sm_90 image's own entries (`launch::SM90_BOUNDS`): the pair
    /// gate/up kernels (thread-block clusters) and `attn_chunk_128`'s lean twin
    /// `attn_chunk_128_m4` (`ATTN_MINB`).
    pub fn sm90_entries(&self) -> bool {
        self.sm90_entries
    }

    /// Whether launches are chained by programmatic dependent launch.
    pub fn chained(&self) -> bool {
        self.chained
    }

    /// Turns chained launches off, or back on where the kernels allow it (tests and benches
    /// compare both). Returns whether they are on.
    pub fn set_chained(&mut self, on: bool) -> bool {
        self.chained = on && self.chains_grids;
        self.chained
    }

    /// Leaves out every later launch of a kernel whose name starts with one of `prefixes` (none:
    /// launch everything), to time a step without them (`strata bench decode --drop`). Their
    /// outputs keep what they held, so nothing computed meanwhile means anything.
    pub fn set_dropped(&mut self, prefixes: Vec<String>) {
        self.dropped = prefixes;
    }

    /// Marks the module as the timeline build whose entries, in module order, are `entries`
    /// ([`crate::backends::cuda::open_traced`]).
    pub(crate) fn set_trace_entries(&mut self, entries: Vec<trace::Entry>) {
        self.trace_entries = Some(entries);
    }

    /// The timeline build's entries in module order (a stamp's entry index names one); `None`
    /// where the module is not the timeline build.
    pub fn trace_entries(&self) -> Option<&[trace::Entry]> {
        self.trace_entries.as_deref()
    }

    /// The timeline table in device memory.
    fn trace_table(&self) -> Result<CudaViewMut<'_, u8>> {
        if self.trace_entries.is_none() {
            return Err(Error::Request(format!("{}: the kernels are not the timeline build (strata bench decode --timeline opens it)", self.name)));
        }
        self.module.get_global(trace::SYMBOL, &self.stream).map_err(self.driver_err(trace::SYMBOL, "finding the timeline table"))
    }

    /// Sets the timeline table to its state before a step ([`trace::initial_table`]), after the
    /// work queued so far.
    pub fn trace_reset(&self) -> Result<()> {
        let mut table = self.trace_table()?;
        self.stream.memcpy_htod(&trace::initial_table(), &mut table).map_err(self.driver_err(trace::SYMBOL, "resetting the timeline table"))
    }

    /// The timeline table once the work queued so far is done.
    pub fn trace_read(&self) -> Result<Vec<u8>> {
        let table = self.trace_table()?;
        self.stream.clone_dtoh(&table).map_err(self.driver_err(trace::SYMBOL, "reading the timeline table"))
    }

    /// Starts recording the name of every kernel launched (afresh, if it was on).
    pub fn start_recording(&self) {
        *self.recorded.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    }

    /// Stops recording: the kernels launched since [`Self::start_recording`], in order (left out
    /// ones too).
    pub fn stop_recording(&self) -> Vec<&'static str> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default()
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

    /// The launch bounds of `kernel` (every kernel of the module is in the table).
    pub(crate) fn bounds_of(&self, kernel: &str) -> Bounds {
        self.functions.get(kernel).map(|f| f.1).unwrap_or_else(|| panic!("kernel {kernel} is not in BOUNDS"))
    }

    /// A launch of `kernel`; the caller pushes its parameters in order and hands it to
    /// [`Self::run`] or [`Self::launch_async`].
    pub(crate) fn builder(&self, kernel: &'static str) -> KernelArgs<'_> {
        self.builder_on(&self.stream, kernel)
    }

    /// As [`Self::builder`], on another stream of the same context (graph capture cannot use
    /// the default stream).
    pub(crate) fn builder_on<'a>(&'a self, stream: &'a CudaStream, kernel: &'static str) -> KernelArgs<'a> {
        let (f, _, params) = &self.functions[kernel];
        KernelArgs::new(stream, f, params)
    }

    /// Queues the launch over `blocks` blocks of the kernel's table thread count, without
    /// waiting (benches, graph capture).
    ///
    /// # Safety
    /// `args` holds exactly the parameters the kernel declares, with device buffers of the sizes
    /// its contract names (the shape checks in `backends` establish them for the safe callers).
    pub(crate) unsafe fn launch_async(&self, kernel: &'static str, blocks: u32, args: KernelArgs) -> Result<()> {
        let smem = self.bounds_of(kernel).smem_bytes;
        self.launch_async_smem(kernel, blocks, smem, args)
    }

    /// As [`Self::launch_async`] with the dynamic shared memory given (kernels whose need
    /// depends on the shape).
    ///
    /// # Safety
    /// As [`Self::launch_async`], and `smem` is what the kernel needs for this launch's shape.
    pub(crate) unsafe fn launch_async_smem(&self, kernel: &'static str, blocks: u32, smem: u32, args: KernelArgs) -> Result<()> {
        if let Some(detail) = args.mismatch() {
            return Err(Error::Shape { kernel, detail });
        }
        if let Some(names) = self.recorded.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            names.push(kernel);
        }
        if self.dropped.iter().any(|p| kernel.starts_with(p.as_str())) {
            return Ok(());
        }
        let threads = self.bounds_of(kernel).threads;
        // SAFETY: the caller's contract; `chained` only where every kernel waits for the grid
        // before it (`new`).
        unsafe { args.launch(blocks, threads, smem, self.chained) }.map_err(self.driver_err(kernel, "launch"))
    }

    /// Launches (on a padded grid when padding is on) and waits, so an execution error is
    /// reported against this kernel.
    pub(crate) fn run(&self, kernel: &'static str, blocks: u32, args: KernelArgs) -> Result<()> {
        self.run_smem(kernel, blocks, self.bounds_of(kernel).smem_bytes, args)
    }

    /// As [`Self::run`] with the dynamic shared memory given.
    pub(crate) fn run_smem(&self, kernel: &'static str, blocks: u32, smem: u32, args: KernelArgs) -> Result<()> {
        // SAFETY: every caller pushes exactly the parameters the kernel declares, device
        // buffers sized by the shape checks in `backends` and the shared memory its shape needs;
        // every kernel returns at once in blocks past its real work, so a padded grid is covered.
        unsafe { self.launch_async_smem(kernel, self.padded_grid(kernel, blocks), smem, args) }?;
        self.synchronize(kernel)
    }

    /// `blocks` of `kernel`, padded by `grid_pad` when this backend pads its grids.
    pub(crate) fn padded_grid(&self, kernel: &str, blocks: u32) -> u32 {
        let threads = self.bounds_of(kernel).threads;
        // A cluster entry's grid stays whole clusters.
        self.pad.map_or(blocks, |slots| grid_pad(blocks, threads, slots).next_multiple_of(cluster_blocks(kernel)))
    }

    /// Waits for the queued work, reporting a failure against `kernel`.
    pub(crate) fn synchronize(&self, kernel: &str) -> Result<()> {
        self.stream.synchronize().map_err(self.driver_err(kernel, "execution"))
    }

    /// Queues `quantize_q8_1` of the first `values` floats of `x` (a multiple of 32) into
    /// `values / 32` q8_1 blocks of `out`. Buffers may be longer than needed.
    pub fn quantize_q8_1_queue(&self, x: &CudaSlice<f32>, out: &mut CudaSlice<u8>, values: usize) -> Result<()> {
        let kernel = "quantize_q8_1";
        if values % GROUP != 0 || values / GROUP > u32::MAX as usize {
            return Err(Error::Shape { kernel, detail: format!("{values} values are not whole {GROUP}-value groups of one launch") });
        }
        let groups = values / GROUP;
        holds(kernel, "input", x.len(), values)?;
        holds(kernel, "output", out.len(), groups * q8_1::BYTES)?;
        if groups == 0 {
            return Ok(());
        }
        let groups = groups as u32;
        let mut a = self.builder(kernel);
        a.arg(x).arg(out).arg(&groups);
        // SAFETY: the kernel's parameters in order, buffers checked to hold `groups` groups;
        // blocks past the last group return at once, so a padded grid is covered.
        unsafe { self.launch_async(kernel, self.padded_grid(kernel, groups.div_ceil(QUANTIZE_WARPS)), a) }
    }

    /// Queues `mmvq` of `m` x `k` weights of `format` times `rows` (1..=8) q8_1 rows of `k`
    /// values into `y[r * m + i]` (added to it with `accumulate`). Buffers may be longer than
    /// needed.
    #[allow(clippy::too_many_arguments)]
    pub fn mmvq_queue(
        &self,
        w: &CudaSlice<u8>,
        format: WeightFormat,
        m: usize,
        k: usize,
        xq: &CudaSlice<u8>,
        rows: usize,
        accumulate: bool,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let groups = k / GROUP;
        let launch = mmvq_launch(format, m, rows, groups);
        let kernel = launch.kernel;
        if k == 0 || k % format.block_values() != 0 || k > u32::MAX as usize {
            return Err(Error::Shape { kernel, detail: format!("row length {k} is not a positive multiple of {} in u32", format.block_values()) });
        }
        check_rows(kernel, m, rows)?;
        holds(kernel, "weights", w.len(), m.saturating_mul(format.row_bytes(k)))?;
        holds(kernel, "q8_1 input", xq.len(), rows * groups * q8_1::BYTES)?;
        holds(kernel, "output", y.len(), rows * m)?;
        let (m, groups, rows, accumulate) = (m as u32, groups as u32, rows as u32, accumulate as u32);
        let mut a = self.builder(kernel);
        a.arg(w).arg(xq).arg(y).arg(&m).arg(&groups).arg(&rows).arg(&accumulate);
        // SAFETY: the kernel's parameters in order, buffers checked against the shape; warps
        // past the last weight row return at once (the staged kernel's after its barrier), so a
        // padded grid is covered; the staged kernel gets the shared memory its rows need.
        unsafe { self.launch_async_smem(kernel, self.padded_grid(kernel, m.div_ceil(launch.rows_per_block)), launch.smem, a) }
    }

    /// Queues the float `matvec` of `m` x `k` weights of `format` times `rows` (1..=8) f32 rows of
    /// `k` values into `y[r * m + i]` (added to it with `accumulate`). Buffers may be longer than
    /// needed.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_queue(
        &self,
        w: &CudaSlice<u8>,
        format: FloatFormat,
        m: usize,
        k: usize,
        x: &CudaSlice<f32>,
        rows: usize,
        accumulate: bool,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let kernel = format.matvec_kernel();
        if k == 0 || k > u32::MAX as usize {
            return Err(Error::Shape { kernel, detail: format!("row length {k} is not in 1..=u32::MAX") });
        }
        check_rows(kernel, m, rows)?;
        let blocks = matvec_grid(kernel, m, rows)?;
        holds(kernel, "weights", w.len(), m.saturating_mul(k).saturating_mul(format.bytes()))?;
        holds(kernel, "input", x.len(), rows * k)?;
        holds(kernel, "output", y.len(), rows * m)?;
        let (m, k, rows, accumulate) = (m as u32, k as u32, rows as u32, accumulate as u32);
        let mut a = self.builder(kernel);
        a.arg(w).arg(x).arg(y).arg(&m).arg(&k).arg(&rows).arg(&accumulate);
        // SAFETY: as `mmvq_queue`; a block a weight block and activation row.
        unsafe { self.launch_async(kernel, self.padded_grid(kernel, blocks), a) }
    }

    /// An output buffer: the caller's current contents (its poison), then guard elements.
    pub(crate) fn upload_out<T: Guard>(&self, kernel: &str, host: &[T]) -> Result<CudaSlice<T>> {
        let mut v = host.to_vec();
        v.extend(std::iter::repeat_n(T::GUARD, GUARD_ELEMS));
        self.upload(kernel, &v)
    }

    /// Copies an output back and checks its guard elements are untouched.
    pub(crate) fn download_out<T: Guard>(&self, kernel: &str, dev: &CudaSlice<T>, host: &mut [T]) -> Result<()> {
        let mut v = vec![T::default(); host.len() + GUARD_ELEMS];
        self.download(kernel, dev, &mut v)?;
        if !v[host.len()..].iter().all(Guard::is_guard) {
            return Err(Error::WrotePastOutput { backend: self.name, kernel: kernel.to_string() });
        }
        host.copy_from_slice(&v[..host.len()]);
        Ok(())
    }

    /// Uploads a layer's expert tensors (shapes already checked by `check_moe`).
    pub fn upload_layer(&self, gate: ExpertTensor, up: ExpertTensor, down: ExpertTensor) -> Result<MoeLayer> {
        Ok(MoeLayer {
            gate: self.upload("moe_gu", gate.data)?,
            up: self.upload("moe_gu", up.data)?,
            down: self.upload("moe_down", down.data)?,
            formats: (gate.format, down.format),
            n_expert: gate.n_expert,
            n_embd: gate.cols,
            n_ff: gate.rows,
        })
    }

    /// Queues `moe_group`: the group table (`moe::group`) of the `n` selections `ids` into
    /// `table` (buffers may be longer than needed).
    pub fn moe_group_queue(&self, ids: &CudaSlice<u32>, n: usize, n_expert: usize, table: &mut CudaSlice<u32>) -> Result<()> {
        if n == 0 || n > MOE_MAX_SELECTIONS || n_expert > u32::MAX as usize {
            return Err(Error::Shape { kernel: "moe_group", detail: format!("{n} selections of {n_expert} experts (1..={MOE_MAX_SELECTIONS} selections)") });
        }
        holds("moe_group", "ids", ids.len(), n)?;
        holds("moe_group", "table", table.len(), moe::table_words(n))?;
        let (n, n_expert) = (n as u32, n_expert as u32);
        let mut a = self.builder("moe_group");
        a.arg(ids).arg(&n).arg(&n_expert).arg(table);
        // SAFETY: the kernel's parameters in order over the buffers checked above; one block of
        // the kernel's 32 threads.
        unsafe { self.launch_async("moe_group", 1, a) }
    }

    /// Queues a window's launches (without waiting): grouping, gate/up, down, combine, with the
    /// kernels and sizes the knobs plan for this shape and window. The combined rows go to `out`
    /// (`tokens` x `n_embd`), added to its values with `accumulate`.
    pub fn moe_queue(&self, l: &MoeLayer, w: &mut MoeBuffers, out: &mut CudaSlice<f32>, accumulate: bool, stages: MoeStages) -> Result<()> {
        // The buffers must hold the window (the step's are sized for its largest one).
        let sel = w.tokens * w.k;
        if w.tokens == 0 || w.k == 0 || sel > MOE_MAX_SELECTIONS {
            return Err(Error::Shape { kernel: "moe", detail: format!("{} tokens x {} slots (1..={MOE_MAX_SELECTIONS} selections supported)", w.tokens, w.k) });
        }
        holds("moe", "ids", w.ids.len(), sel)?;
        holds("moe", "weights", w.weights.len(), sel)?;
        holds("moe", "xq", w.xq.len(), q8_1::bytes_of(w.tokens * l.n_embd))?;
        holds("moe", "table", w.table.len(), moe::table_words(sel))?;
        holds("moe", "hq", w.hq.len(), q8_1::bytes_of(sel * l.n_ff))?;
        holds("moe", "y", w.y.len(), sel * l.n_embd)?;
        holds("moe", "out", out.len(), w.tokens * l.n_embd)?;
        let (g, d) = l.formats;
        let n = (w.tokens * w.k) as u32;
        let (k, tokens) = (w.k as u32, w.tokens as u32);
        let (embd_groups, ff_groups, n_embd, n_ff) = ((l.n_embd / 32) as u32, (l.n_ff / 32) as u32, l.n_embd as u32, l.n_ff as u32);
        let gu_bytes = (l.n_ff * g.row_bytes(l.n_embd)) as u64;
        let down_bytes = (l.n_embd * d.row_bytes(l.n_ff)) as u64;
        let plan = self.knobs.plan(l.formats, l.n_embd, l.n_ff, n as usize, self.info.sms(), self.sm90_entries).map_err(|e| Error::Request(format!("{}: kernel knobs: {e}", self.name)))?;
        let pad = |kernel: &str, blocks: u32| self.padded_grid(kernel, blocks);
        // SAFETY (all four): the parameters are each kernel's, in order, over buffers sized by
        // `check_moe` (or the bench's own equivalent shapes), with the shared memory the plan
        // computed for this shape; kernels return at once in blocks past the real groups, rows
        // or values, so padded and worst-case grids are covered.
        if stages.group && !w.grouped {
            self.moe_group_queue(&w.ids, sel, l.n_expert, &mut w.table)?;
        }
        w.grouped = false;
        if stages.gate_up {
            let gu = plan.gu;
            self.log_first_launch(gu);
            let mut a = self.builder(gu.kernel);
            a.arg(&l.gate).arg(&l.up).arg(&gu_bytes).arg(&w.xq).arg(&w.table).arg(&n).arg(&k).arg(&embd_groups).arg(&n_ff);
            if gu.kernel.starts_with("expdec") {
                a.arg(&gu.rows_per_block).arg(&l.down).arg(&down_bytes);
            }
            a.arg(&mut w.hq);
            unsafe { self.launch_async_smem(gu.kernel, pad(gu.kernel, gu.blocks), gu.smem, a) }?;
        }
        if stages.down {
            let down = plan.down;
            self.log_first_launch(down);
            let mut a = self.builder(down.kernel);
            a.arg(&l.down).arg(&down_bytes).arg(&w.hq).arg(&w.table).arg(&n).arg(&ff_groups).arg(&n_embd);
            if down.kernel.starts_with("expdec") {
                a.arg(&down.rows_per_block);
            }
            a.arg(&mut w.y);
            unsafe { self.launch_async_smem(down.kernel, pad(down.kernel, down.blocks), down.smem, a) }?;
        }
        if stages.combine {
            let accumulate = accumulate as u32;
            let mut a = self.builder("moe_combine");
            a.arg(&w.y).arg(&w.weights).arg(&tokens).arg(&k).arg(&n_embd).arg(out).arg(&accumulate);
            unsafe { self.launch_async("moe_combine", pad("moe_combine", (tokens * n_embd).div_ceil(256)), a) }?;
        }
        Ok(())
    }

    /// With `STRATA_LOG=info`, one line the first time each expert kernel launches on this
    /// backend: its name, launch bounds, rows per block, shared memory and the knobs.
    fn log_first_launch(&self, l: Launch) {
        static SEEN: std::sync::Mutex<Vec<(&'static str, &'static str)>> = std::sync::Mutex::new(Vec::new());
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *ON.get_or_init(|| std::env::var("STRATA_LOG").is_ok_and(|v| v == "info")) {
            let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
            if !seen.contains(&(self.name, l.kernel)) {
                seen.push((self.name, l.kernel));
                let b = bounds(l.kernel).expect("a planned kernel is in BOUNDS");
                eprintln!(
                    "strata: {}: first launch of {}: {} threads, min {} blocks/SM, {} rows/block, {} blocks, {} bytes shared; knobs {}",
                    self.name, l.kernel, b.threads, b.min_blocks, l.rows_per_block, l.blocks, l.smem, self.knobs.describe()
                );
            }
        }
    }

    /// Device scratch of `len` elements.
    pub(crate) fn scratch<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(&self, kernel: &str, len: usize) -> Result<CudaSlice<T>> {
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
        if check_quantize(x, out)? == 0 {
            return Ok(());
        }
        let dx = self.upload(kernel, x)?;
        let mut dout = self.upload_out(kernel, out)?;
        self.quantize_q8_1_queue(&dx, &mut dout, x.len())?;
        self.synchronize(kernel)?;
        self.download_out(kernel, &dout, out)
    }

    fn mmvq(&self, w: &Weights, xq: &[u8], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()> {
        let kernel = mmvq_launch(w.format, w.m, rows, w.k / GROUP).kernel;
        check_mmvq(w, xq, rows, y)?;
        let dw = self.upload(kernel, w.data)?;
        let dx = self.upload(kernel, xq)?;
        let mut dy = self.upload_out(kernel, y)?;
        self.mmvq_queue(&dw, w.format, w.m, w.k, &dx, rows, accumulate, &mut dy)?;
        self.synchronize(kernel)?;
        self.download_out(kernel, &dy, y)
    }

    fn matvec(&self, w: &FloatWeights, x: &[f32], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()> {
        let kernel = w.format.matvec_kernel();
        check_matvec(w, x, rows, y)?;
        let dw = self.upload(kernel, w.data)?;
        let dx = self.upload(kernel, x)?;
        let mut dy = self.upload_out(kernel, y)?;
        self.matvec_queue(&dw, w.format, w.m, w.k, &dx, rows, accumulate, &mut dy)?;
        self.synchronize(kernel)?;
        self.download_out(kernel, &dy, y)
    }

    fn argmax_rows(&self, x: &[f32], n: usize, variant: Variant, idx: &mut [u32], all_nan: &mut [u32]) -> Result<()> {
        let rows = check_head("argmax_rows", x, n, &[idx.len(), all_nan.len()])? as u32;
        let n32 = n as u32;
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
                let mut scratch = self.argmax_scratch(rows as usize, n)?;
                self.argmax_rows_queue(&dx, rows as usize, n, &mut scratch, &mut di, &mut df)?;
                self.stream.synchronize().map_err(self.driver_err("argmax_rows", "execution"))?;
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
        let layer = self.upload_layer(w.gate, w.up, w.down)?;
        let n = w.tokens * w.k;
        let mut win = MoeBuffers {
            tokens: w.tokens,
            k: w.k,
            ids: self.upload("moe_group", w.ids)?,
            weights: self.upload("moe_combine", w.weights)?,
            xq: self.upload("moe_gu", w.xq)?,
            table: self.scratch::<u32>("moe_group", moe::table_words(n))?,
            grouped: false,
            hq: self.upload_out("moe_gu", o.hq)?,
            y: self.upload_out("moe_down", o.y)?,
        };
        let mut out = self.upload_out("moe_combine", o.out)?;
        debug_assert_eq!((layer.n_embd, layer.n_ff), (n_embd, n_ff));
        self.moe_queue(&layer, &mut win, &mut out, o.accumulate, MoeStages::ALL)?;
        self.stream.synchronize().map_err(self.driver_err("moe", "execution"))?;
        self.download_out("moe_gu", &win.hq, o.hq)?;
        self.download_out("moe_down", &win.y, o.y)?;
        self.download_out("moe_combine", &out, o.out)
    }
}
