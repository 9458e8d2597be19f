//! The step on a GPU backend (`cuda` or `hip`): every weight, activation, KV cache and the
//! expert selections live on the device; each op enqueues its kernels on the backend's one
//! stream through their typed launchers.
//!
//! The kernels read the window's ids and first position from device memory, so the step's
//! launches for a window of T tokens are the same at every position: they are captured once
//! per T into a CUDA graph and replayed (`--no-graph` launches them one by one, for profiling
//! and the tests that compare the two). `spec_accept` moves the ids and position on for the
//! next window, so a one-token step can follow another without the host writing anything;
//! each step's emitted tokens are copied into a slot of pinned host memory that the host reads
//! when it wants them, while the next step already runs.
use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, PinnedHostSlice};
use indicatif::{ProgressBar, ProgressStyle};

use super::{act_len, attn_scale, StateSizes, check_run, emitted_from, picks_greedy, qx_len, Act, Emitted, Executor, Op, Pick, Qx, Window, MAX_WINDOW};
use crate::backends::ExpertTensor;
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::backends::gpu::{GpuBackend, MoeBuffers, MoeLayer, MoeStages};
use crate::backends::knobs::KernelKnobs;
use crate::model::{float_format, Data, WeightId};
use crate::model::Model;
use crate::ops::attention::{attn_part_len, rope_table, AttnShape};
use crate::ops::route::ArgmaxScratch;
use strata_gpu_shared::formats::{q8_1, WeightFormat};
use strata_gpu_shared::launch::attention::attn_split;
use strata_gpu_shared::launch::bounds;
use strata_gpu_shared::moe;

/// A weight on the device: a matrix as the file stores it, or a prepared f32 vector.
enum DevWeight {
    Bytes(CudaSlice<u8>),
    F32(CudaSlice<f32>),
}

pub struct GpuExecutor {
    model: Arc<Model>,
    gpu: GpuBackend,
    n_ctx: usize,
    weights: HashMap<WeightId, DevWeight>,
    /// Expert tensors, keyed by the layer's gate weight.
    experts: HashMap<WeightId, MoeLayer>,
    /// The weights held tiled, with the format the kernels read them as ([`tiled_weights`]).
    tiled: HashMap<WeightId, WeightFormat>,
    act: HashMap<Act, CudaSlice<f32>>,
    /// The q8_1 buffers but `Qx::X`, which is the experts' input, `moe.xq`.
    qx: HashMap<Qx, CudaSlice<u8>>,
    /// The window's expert selections, their q8_1 input and scratch.
    moe: MoeBuffers,
    /// Per layer: its K and V caches (attention) or its conv ring and recurrent states (Gated
    /// DeltaNet).
    cache: Vec<Option<(CudaSlice<u16>, CudaSlice<u16>)>>,
    gdn: Vec<Option<(CudaSlice<f32>, CudaSlice<f32>)>>,
    rope: CudaSlice<f32>,
    part: CudaSlice<f32>,
    /// The window's ids and first position, read by the kernels; `spec_accept` moves them on.
    tokens: CudaSlice<u32>,
    pos: CudaSlice<u32>,
    next: CudaSlice<u32>,
    all_nan: CudaSlice<u32>,
    /// The accepted count, then the window's chosen ids (`spec_accept`).
    accept: CudaSlice<u32>,
    argmax: ArgmaxScratch,
    /// Token ids given by `set_tokens` (copied to the device by `run`), the window size of
    /// the last step, and whether its pick was greedy (its all-NaN flags are then valid).
    staged: Vec<u32>,
    n_tokens: usize,
    greedy: bool,
    /// Captured steps per window size and attention grid ([`attn_split`] of the context the
    /// step reaches), each with the op list it was captured from (the trunk's step and the MTP
    /// block's alternate), at most [`GRAPHS_PER_SHAPE`]; `None` launches eagerly.
    graphs: Option<HashMap<(usize, usize), Vec<(Vec<Op>, CudaGraph)>>>,
    /// Pinned slots the steps' emitted tokens are copied into, and the queued steps' slots
    /// (with their window size and pick) in order.
    slots: Vec<Slot>,
    queued: VecDeque<(usize, usize, bool)>,
    next_slot: usize,
    /// With profiling on: an event at each phase change of the last step.
    marks: Option<Vec<(&'static str, CudaEvent)>>,
}

/// Steps that may be queued before the host reads the first one's tokens.
const SLOTS: usize = 4;
/// Op lists kept captured per window size and attention grid (the oldest is dropped).
const GRAPHS_PER_SHAPE: usize = 4;

/// Host memory one step's outcome is copied into: `spec_accept`'s words and the all-NaN flags,
/// and the event recorded after the copies. (The pinned slices' own events are recorded only
/// with cudarc's event tracking, which the backend turns off, so the slot keeps its own.)
struct Slot {
    accept: PinnedHostSlice<u32>,
    all_nan: PinnedHostSlice<u32>,
    copied: CudaEvent,
}

/// What the device must hold for `model` at context `n_ctx`, in bytes: weights, KV caches and
/// the step's buffers.
pub fn device_bytes(model: &Model, n_ctx: usize) -> usize {
    let c = &model.config;
    let state = StateSizes::of(c, n_ctx).bytes();
    let acts: usize = Act::ALL.iter().map(|&a| 4 * MAX_WINDOW * act_len(c, a)).sum();
    let rope = 4 * n_ctx * c.n_rot;
    let part = 4 * attn_part_len(attn_shape(model, MAX_WINDOW, n_ctx));
    let moe = MAX_WINDOW * c.n_expert_used * (q8_1::bytes_of(c.n_ff_exp) + 4 * c.n_embd);
    model.weights.total_bytes() + state + acts + rope + part + moe
}

/// The weights the device holds in a tiled layout (`formats::tiles`: the same values, aligned
/// 16-byte loads), each with the tiled format the kernels read it as: the matrices only
/// [`Op::Linear`] reads (an embedding table keeps the file's blocks, which `embed_rows` reads) and
/// the routed experts whose tiled format has expert kernels (in the launch table), where the
/// format has a tiled layout and a row holds whole tiles.
pub fn tiled_weights(model: &Model) -> HashMap<WeightId, WeightFormat> {
    let ops: Vec<Op> = model.step_ops(Op::Pick(Pick::Greedy)).into_iter().chain(model.mtp_ops().into_iter().flatten()).collect();
    let embedded: HashSet<WeightId> = ops.iter().filter_map(|o| if let Op::Embed { table, .. } = o { Some(*table) } else { None }).collect();
    let w = &model.weights;
    let tiled = |id: WeightId| match w.get(id).ty {
        GgmlType::Quant(f) => f.tiled().filter(|t| w.get(id).cols % t.block_values() == 0).map(|t| (id, t)),
        _ => None,
    };
    let linear = ops.iter().filter_map(|o| if let Op::Linear { w, .. } = o { Some(*w) } else { None }).filter(|w| !embedded.contains(w)).filter_map(tiled);
    let has_moe = |t: WeightFormat| bounds(&format!("moe_gu_{}", t.tag())).is_some() && bounds(&format!("moe_down_{}", t.tag())).is_some();
    let experts = w.all_layers().flat_map(|l| [l.gate, l.up, l.down]).filter_map(tiled).filter(|&(_, t)| has_moe(t));
    linear.chain(experts).collect()
}

/// Blocks of a tiled format's base, tiled.
fn tile(format: WeightFormat, blocks: &[u8]) -> Vec<u8> {
    let mut tiles = vec![0u8; blocks.len()];
    format.tiling().expect("tiled_weights holds tiled formats only").tile(blocks, &mut tiles);
    tiles
}

fn attn_shape(model: &Model, tokens: usize, n_ctx: usize) -> AttnShape {
    let c = &model.config;
    AttnShape { tokens, n_q: c.n_head, n_kv: c.n_head_kv, hd: c.head_dim, n_rot: c.n_rot, n_ctx }
}

impl GpuExecutor {
    /// Uploads the model (with a progress bar on stderr) and allocates the step's buffers.
    /// Refuses, before allocating, a model and context the device cannot hold.
    pub fn new(gpu: GpuBackend, model: Arc<Model>, n_ctx: usize, progress: bool) -> Result<GpuExecutor> {
        let need = device_bytes(&model, n_ctx);
        let backend = gpu.name_static();
        let (free, total) = gpu.stream().context().mem_get_info().map_err(|e| Error::Setup { backend, what: "device memory query".into(), detail: e.to_string() })?;
        if need > free {
            return Err(Error::Request(format!(
                "{}: the model and a {n_ctx}-position context need {:.2} GiB on the device; {} has {:.2} GiB free of {:.2} GiB (lower --ctx or use a smaller model)",
                model.weights.file.path.display(),
                gib(need),
                gpu.info().name,
                gib(free),
                gib(total)
            )));
        }
        let c = model.config.clone();
        let w = &model.weights;
        let bar = if progress { ProgressBar::new(w.total_bytes() as u64) } else { ProgressBar::hidden() };
        bar.set_style(ProgressStyle::with_template("{msg} [{bar:40}] {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec})").expect("a valid template").progress_chars("=> "));
        bar.set_message(format!("uploading to {}", gpu.info().name));
        let mut weights = HashMap::new();
        let mut experts = HashMap::new();
        let tiled = tiled_weights(&model);
        let expert_ids: Vec<WeightId> = w.all_layers().flat_map(|l| [l.gate, l.up, l.down]).collect();
        for l in w.all_layers() {
            // Each tensor's format and bytes as the device holds them.
            let held = [l.gate, l.up, l.down].map(|id| {
                let GgmlType::Quant(format) = w.get(id).ty else { unreachable!("the loader admits quantized experts only") };
                match tiled.get(&id) {
                    Some(&t) => (id, t, Cow::Owned(tile(t, w.data(id)))),
                    None => (id, format, Cow::Borrowed(w.data(id))),
                }
            });
            let [gate, up, down] = held.each_ref().map(|(id, format, data)| {
                let e = w.get(*id);
                ExpertTensor { format: *format, n_expert: e.n_expert, rows: e.rows, cols: e.cols, data }
            });
            experts.insert(l.gate, gpu.upload_layer(gate, up, down)?);
            bar.inc([l.gate, l.up, l.down].iter().map(|&id| w.get(id).bytes() as u64).sum());
        }
        for (i, weight) in w.list.iter().enumerate() {
            let id = WeightId(i);
            if expert_ids.contains(&id) {
                continue;
            }
            let dev = match &weight.data {
                Data::F32(v) => DevWeight::F32(gpu.upload(&weight.name, v)?),
                Data::File { .. } | Data::Rows(_) => match tiled.get(&id) {
                    Some(&t) => DevWeight::Bytes(gpu.upload(&weight.name, &tile(t, w.data(id)))?),
                    None => DevWeight::Bytes(gpu.upload(&weight.name, w.data(id))?),
                },
            };
            weights.insert(id, dev);
            bar.inc(weight.bytes() as u64);
        }
        bar.finish_and_clear();
        // A failed upload is reported here, as the weights' copy, not by the first kernel that
        // reads them. (Kernels may read weights before their grid wait for another reason:
        // `crate::backends::launch`.)
        gpu.stream().synchronize().map_err(gpu.driver_err("weights", "copy to device"))?;
        let zeros_f32 = |n: usize| gpu.scratch::<f32>("step buffers", n);
        // Only the buffers the architecture has (a zero-length allocation is an error).
        let act = Act::ALL.iter().filter(|&&a| act_len(&c, a) > 0).map(|&a| Ok((a, zeros_f32(MAX_WINDOW * act_len(&c, a))?))).collect::<Result<HashMap<_, _>>>()?;
        let sel = MAX_WINDOW * c.n_expert_used;
        let moe = MoeBuffers {
            tokens: 1,
            k: c.n_expert_used,
            ids: gpu.scratch("moe", sel)?,
            weights: gpu.scratch("moe", sel)?,
            xq: gpu.scratch("moe", q8_1::bytes_of(MAX_WINDOW * qx_len(&c, Qx::X)))?,
            table: gpu.scratch("moe", moe::table_words(sel))?,
            grouped: false,
            hq: gpu.scratch("moe", q8_1::bytes_of(sel * c.n_ff_exp))?,
            y: gpu.scratch("moe", sel * c.n_embd)?,
        };
        let sizes = StateSizes::of(&c, n_ctx);
        let cache = sizes.layers.iter().map(|l| Ok(if l.kv > 0 { Some((gpu.scratch("kv cache", l.kv)?, gpu.scratch("kv cache", l.kv)?)) } else { None })).collect::<Result<Vec<_>>>()?;
        let gdn = sizes.layers.iter().map(|l| Ok(if l.state > 0 { Some((gpu.scratch("gdn state", l.ring)?, gpu.scratch("gdn state", l.state)?)) } else { None })).collect::<Result<Vec<_>>>()?;
        Ok(GpuExecutor {
            qx: [Qx::Attn, Qx::Sh, Qx::Eh]
                .into_iter()
                .filter(|&q| qx_len(&c, q) > 0)
                .map(|q| Ok((q, gpu.scratch("step buffers", q8_1::bytes_of(MAX_WINDOW * qx_len(&c, q)))?)))
                .collect::<Result<HashMap<_, _>>>()?,
            rope: gpu.upload("rope table", &rope_table(n_ctx, c.n_rot, c.rope_freq_base))?,
            part: zeros_f32(attn_part_len(attn_shape(&model, MAX_WINDOW, n_ctx)))?,
            tokens: gpu.scratch("step buffers", MAX_WINDOW)?,
            pos: gpu.scratch("step buffers", 1)?,
            next: gpu.scratch("step buffers", MAX_WINDOW)?,
            all_nan: gpu.scratch("step buffers", MAX_WINDOW)?,
            accept: gpu.scratch("step buffers", MAX_WINDOW + 1)?,
            argmax: gpu.argmax_scratch(MAX_WINDOW, c.n_vocab)?,
            marks: None,
            staged: Vec::new(),
            n_tokens: 0,
            greedy: false,
            graphs: Some(HashMap::new()),
            slots: (0..SLOTS).map(|_| slot(&gpu)).collect::<Result<_>>()?,
            queued: VecDeque::new(),
            next_slot: 0,
            weights,
            experts,
            tiled,
            act,
            moe,
            cache,
            gdn,
            n_ctx,
            model,
            gpu,
        })
    }

    pub fn backend(&self) -> &GpuBackend {
        &self.gpu
    }

    /// Records an event at every phase change of the following steps (`strata decode --profile`);
    /// profiled steps launch eagerly (events inside a replayed graph would time nothing).
    pub fn set_profiling(&mut self, on: bool) {
        self.marks = on.then(Vec::new);
    }

    /// Replays one captured graph per window size (the default), or launches every kernel of
    /// every step (`--no-graph`). Turning graphs off drops the captured ones.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs = on.then(HashMap::new);
    }

    pub fn graphs_on(&self) -> bool {
        self.graphs.is_some()
    }

    /// Leaves every launch of a kernel whose name starts with one of `prefixes` out of the
    /// following steps (`GpuBackend::set_dropped`; `strata bench decode --drop`), and drops the
    /// captured graphs, which hold the launches as they were.
    pub fn set_dropped(&mut self, prefixes: Vec<String>) {
        self.gpu.set_dropped(prefixes);
        self.forget_graphs();
    }

    /// Sets the kernel knobs of the following steps (`strata bench decode
    /// --variants`), and drops the captured graphs, which hold the kernels the knobs before
    /// chose.
    pub fn set_kernel_knobs(&mut self, knobs: KernelKnobs) {
        self.gpu.set_kernel_knobs(knobs);
        self.forget_graphs();
    }

    pub fn kernel_knobs(&self) -> KernelKnobs {
        self.gpu.kernel_knobs()
    }

    /// Drops the captured graphs (graphs stay on): the next step of each window size captures
    /// its launches again.
    fn forget_graphs(&mut self) {
        if let Some(g) = &mut self.graphs {
            g.clear();
        }
    }

    /// The kernels one step of `ops` launches, in order: a window of `tokens` at `pos0`,
    /// launched eagerly (whatever the graph setting), and waited for.
    pub fn step_kernels(&mut self, ops: &[Op], tokens: &[u32], pos0: usize) -> Result<Vec<&'static str>> {
        let graphs = self.graphs.take();
        self.gpu.start_recording();
        let ran = self.set_tokens(tokens).and_then(|_| self.run(ops, Window { tokens: tokens.len(), pos0 })).and_then(|_| self.drain());
        let names = self.gpu.stop_recording();
        self.graphs = graphs;
        ran.map(|_| names)
    }

    /// Runs `f` (steps it queues and waits for) between `cuProfilerStart` and `cuProfilerStop`,
    /// the stream drained on both sides: a profiler started with collection off (`ncu
    /// --profile-from-start off`) sees exactly the launches `f` makes.
    pub fn profiled<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.drain()?;
        self.profiler(true)?;
        let r = f(self);
        let drained = self.drain();
        self.profiler(false)?;
        let r = r?;
        drained.map(|_| r)
    }

    fn profiler(&self, on: bool) -> Result<()> {
        self.gpu.stream().context().bind_to_thread().map_err(self.driver("binding the context for the profiler"))?;
        // SAFETY: driver calls that take no arguments, with the executor's context current.
        let r = unsafe { if on { cudarc::driver::sys::cuProfilerStart() } else { cudarc::driver::sys::cuProfilerStop() } };
        r.result().map_err(self.driver(if on { "cuProfilerStart" } else { "cuProfilerStop" }))
    }

    /// Queues the step's launches for window `w`, whose ids and position are on the device: the
    /// graph of its size and attention grid (captured from `ops` the first time, or again if
    /// `ops` changed), or each op eagerly; then the copy of what it emitted into the next slot.
    fn queue_step(&mut self, ops: &[Op], w: Window) -> Result<()> {
        if self.queued.len() == SLOTS {
            return Err(Error::Request(format!("{SLOTS} steps queued whose tokens were not read")));
        }
        self.n_tokens = w.tokens;
        let key = (w.tokens, attn_split(w.pos0 + w.tokens));
        let found = self.graphs.as_ref().and_then(|g| g.get(&key)).and_then(|list| list.iter().position(|(o, _)| o == ops));
        match (&self.graphs, &self.marks) {
            (Some(_), None) => {
                let i = match found {
                    Some(i) => i,
                    None => {
                        let graph = self.capture(ops, w)?;
                        let list = self.graphs.as_mut().expect("graphs are on").entry(key).or_default();
                        if list.len() == GRAPHS_PER_SHAPE {
                            list.remove(0);
                        }
                        list.push((ops.to_vec(), graph));
                        list.len() - 1
                    }
                };
                let (_, graph) = &self.graphs.as_ref().expect("graphs are on")[&key][i];
                graph.launch().map_err(self.driver("graph launch"))?;
            }
            _ => {
                for op in ops {
                    self.op(op, w)?;
                }
                self.mark("end")?;
            }
        }
        self.greedy = picks_greedy(ops);
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % SLOTS;
        let (stream, backend) = (self.gpu.stream().clone(), self.gpu.name_static());
        let err = |what: &'static str| move |cause| Error::Driver { backend, kernel: "step".into(), what, cause };
        let s = &mut self.slots[slot];
        stream.memcpy_dtoh(&self.accept, &mut s.accept).map_err(err("copy of the emitted tokens"))?;
        stream.memcpy_dtoh(&self.all_nan, &mut s.all_nan).map_err(err("copy of the all-NaN flags"))?;
        s.copied.record(&stream).map_err(err("event"))?;
        self.queued.push_back((slot, w.tokens, self.greedy));
        Ok(())
    }

    /// Captures the eager launches of `ops` for `w` into a graph (nothing runs while capturing).
    fn capture(&mut self, ops: &[Op], w: Window) -> Result<CudaGraph> {
        let stream = self.gpu.stream().clone();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(self.driver("graph capture"))?;
        let queued = ops.iter().try_for_each(|op| self.op(op, w));
        // The capture ends whatever happened, so that the stream is usable again.
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(self.driver("graph capture"));
        queued?;
        graph?.ok_or_else(|| Error::Request("the step's op list is empty".into()))
    }

    fn bytes(&self, id: WeightId) -> &CudaSlice<u8> {
        match &self.weights[&id] {
            DevWeight::Bytes(b) => b,
            DevWeight::F32(_) => unreachable!("{} is a matrix", self.model.weights.get(id).name),
        }
    }

    fn f32s(&self, id: WeightId) -> &CudaSlice<f32> {
        prepared(&self.weights, &self.model, id)
    }

    /// The first `rows` rows of an activation, copied to the host once the stream is done.
    fn read_rows(&self, a: Act, rows: usize, what: &'static str) -> Result<Vec<f32>> {
        let mut v = vec![0f32; rows * act_len(&self.model.config, a)];
        let stream = self.gpu.stream().clone();
        stream.memcpy_dtoh(&self.act[&a].slice(..v.len()), &mut v).map_err(self.driver(what))?;
        stream.synchronize().map_err(self.driver(what))?;
        Ok(v)
    }

    fn take(&mut self, a: Act) -> CudaSlice<f32> {
        self.act.remove(&a).expect("every activation is allocated")
    }

    /// Marks the start of `phase` when profiling and the phase changes.
    fn mark(&mut self, phase: &'static str) -> Result<()> {
        let Some(marks) = &self.marks else { return Ok(()) };
        if marks.last().is_some_and(|(p, _)| *p == phase) {
            return Ok(());
        }
        let backend = self.gpu.name_static();
        let ev = self.gpu.stream().record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| Error::Driver { backend, kernel: phase.into(), what: "event", cause: e })?;
        self.marks.as_mut().expect("checked above").push((phase, ev));
        Ok(())
    }

    fn driver(&self, what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
        let backend = self.gpu.name_static();
        move |cause| Error::Driver { backend, kernel: "step".into(), what, cause }
    }
}

/// A result slot: page-locked host memory readable by the host (not write-combined) for
/// `spec_accept`'s words and the all-NaN flags, and a spinning event without timing (the
/// lowest latency to wake the host).
fn slot(gpu: &GpuBackend) -> Result<Slot> {
    let backend = gpu.name_static();
    let err = |what: &'static str| move |cause| Error::Driver { backend, kernel: "step".into(), what, cause };
    let ctx = gpu.stream().context();
    // SAFETY: the words are written by a device copy before the host reads them (`emitted`
    // waits for the slot's event); their initial contents are never read.
    let pinned = |len: usize| unsafe { ctx.alloc_pinned_with_flags::<u32>(len, 0) }.map_err(err("pinned host memory"));
    Ok(Slot { accept: pinned(MAX_WINDOW + 1)?, all_nan: pinned(MAX_WINDOW)?, copied: ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(err("event"))? })
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

impl Executor for GpuExecutor {
    fn name(&self) -> &'static str {
        self.gpu.name_static()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn set_tokens(&mut self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() || ids.len() > MAX_WINDOW {
            return Err(Error::Request(format!("{} tokens in one step (1..={MAX_WINDOW})", ids.len())));
        }
        self.staged = ids.to_vec();
        self.n_tokens = ids.len();
        Ok(())
    }

    fn run(&mut self, ops: &[Op], w: Window) -> Result<()> {
        check_run(w, self.staged.len(), self.n_ctx)?;
        if let Some(m) = self.marks.as_mut() {
            m.clear();
        }
        let stream = self.gpu.stream().clone();
        let ids = std::mem::take(&mut self.staged);
        let copied = stream.memcpy_htod(&ids, &mut self.tokens.slice_mut(..ids.len())).and_then(|_| stream.memcpy_htod(&[w.pos0 as u32], &mut self.pos));
        self.staged = ids;
        copied.map_err(self.driver("copy of the window's ids and position"))?;
        self.queue_step(ops, w)
    }

    fn run_continued(&mut self, ops: &[Op], pos0: usize) -> Result<()> {
        let w = Window { tokens: 1, pos0 };
        check_run(w, 1, self.n_ctx)?;
        if let Some(m) = self.marks.as_mut() {
            m.clear();
        }
        self.queue_step(ops, w)
    }

    fn emitted(&mut self) -> Result<Emitted> {
        let (slot, tokens, greedy) = self.queued.pop_front().ok_or_else(|| Error::Request("no queued step left to read".into()))?;
        let s = &self.slots[slot];
        // Waits for this step's copies only (the steps queued after it may still run).
        s.copied.synchronize().map_err(self.driver("execution of the step"))?;
        let accept = s.accept.as_slice().map_err(self.driver("execution of the step"))?;
        let all_nan = s.all_nan.as_slice().map_err(self.driver("execution of the step"))?;
        Ok(emitted_from(accept, all_nan, tokens, greedy))
    }

    fn drain(&mut self) -> Result<()> {
        self.queued.clear();
        self.gpu.stream().synchronize().map_err(self.driver("execution of the step"))
    }

    fn op(&mut self, op: &Op, w: Window) -> Result<()> {
        let model = self.model.clone();
        let (c, weights) = (&model.config, &model.weights);
        super::check_window(w, self.n_tokens)?;
        let t = w.tokens;
        if self.marks.is_some() {
            self.mark(super::phase_of(op, weights))?;
        }
        match *op {
            Op::Embed { table, out } => {
                let tw = weights.get(table);
                let mut o = self.take(out);
                let r = self.gpu.embed_rows_queue(self.bytes(table), tw.ty, tw.rows, tw.cols, &self.tokens, t, &mut o);
                self.act.insert(out, o);
                r
            }
            Op::RmsNorm { x, w: nw, out } => {
                let mut o = self.take(out);
                let r = self.gpu.rms_norm_queue(&self.act[&x], self.f32s(nw), &mut o, t, act_len(c, x), c.rms_eps);
                self.act.insert(out, o);
                r
            }
            Op::NormQuant { x, w: nw, out, q } => {
                let mut o = self.take(out);
                let xq = q8_1_buffer(&mut self.qx, &mut self.moe, q);
                let r = self.gpu.rms_norm_q8_1_queue(&self.act[&x], prepared(&self.weights, &model, nw), &mut o, xq, t, act_len(c, x), c.rms_eps);
                self.act.insert(out, o);
                r
            }
            Op::Quantize { x, out } => {
                let n = t * act_len(c, x);
                self.gpu.quantize_q8_1_queue(&self.act[&x], q8_1_buffer(&mut self.qx, &mut self.moe, out), n)
            }
            Op::Linear { w: id, xq, x, out, accumulate } => {
                let lw = weights.get(id);
                let mut o = self.take(out);
                let r = match lw.ty {
                    GgmlType::Quant(format) => {
                        let format = self.tiled.get(&id).copied().unwrap_or(format);
                        let q = match xq {
                            Qx::X => &self.moe.xq,
                            q => &self.qx[&q],
                        };
                        self.gpu.mmvq_queue(self.bytes(id), format, lw.rows, lw.cols, q, t, accumulate, &mut o)
                    }
                    ty => {
                        let format = float_format(ty).expect("not quantized, so float");
                        self.gpu.matvec_queue(self.bytes(id), format, lw.rows, lw.cols, &self.act[&x], t, accumulate, &mut o)
                    }
                };
                self.act.insert(out, o);
                r
            }
            Op::AddWeight { acc, w: id } => {
                let mut a = self.take(acc);
                let r = self.gpu.add_into_queue(&mut a, self.f32s(id), t * act_len(c, acc));
                self.act.insert(acc, a);
                r
            }
            Op::AddInto { acc, b } => {
                let mut a = self.take(acc);
                let r = self.gpu.add_into_queue(&mut a, &self.act[&b], t * act_len(c, acc));
                self.act.insert(acc, a);
                r
            }
            Op::AttnPrep { layer, layout, q_norm, k_norm } => {
                let shape = attn_shape(&model, t, self.n_ctx);
                let mut q_out = self.take(Act::Qr);
                let (kc, vc) = self.cache[layer].as_mut().expect("attention layers have a KV cache");
                let ([q, k, v], strides) = layout.views(c);
                let view = |(a, first): (Act, usize)| self.act[&a].slice(first..);
                let r = self.gpu.attn_prep_queue(
                    &view(q),
                    &view(k),
                    &view(v),
                    strides,
                    prepared(&self.weights, &model, q_norm),
                    prepared(&self.weights, &model, k_norm),
                    &self.rope,
                    shape,
                    &self.pos,
                    c.rms_eps,
                    &mut q_out,
                    kc,
                    vc,
                );
                self.act.insert(Act::Qr, q_out);
                r
            }
            Op::Attention { layer, q } => {
                let shape = attn_shape(&model, t, self.n_ctx);
                let mut o = self.take(Act::Attn);
                let (kc, vc) = self.cache[layer].as_ref().expect("attention layers have a KV cache");
                let xq = q.map(|q| q8_1_buffer(&mut self.qx, &mut self.moe, q));
                // The window's end bounds every token's context: one-chunk contexts skip the merge.
                let r = self.gpu.attention_queue(&self.act[&Act::Qr], kc, vc, shape, &self.pos, w.pos0 + t, true, attn_scale(c.head_dim), None, &mut self.part, &mut o, xq);
                self.act.insert(Act::Attn, o);
                r
            }
            Op::PrepAttention { layer, layout, q_norm, k_norm, q } => {
                let shape = attn_shape(&model, t, self.n_ctx);
                // The window's end bounds its context, as for `Op::Attention`.
                let bound = w.pos0 + t;
                if self.gpu.prep_attention_kernel(shape, bound).is_none() {
                    let [prep, attention] = op.unfused().expect("a joined op");
                    return self.op(&prep, w).and_then(|()| self.op(&attention, w));
                }
                let mut o = self.take(Act::Attn);
                let (kc, vc) = self.cache[layer].as_mut().expect("attention layers have a KV cache");
                let ([qv, kv, vv], strides) = layout.views(c);
                let xq = q.map(|q| q8_1_buffer(&mut self.qx, &mut self.moe, q));
                let view = |(a, first): (Act, usize)| self.act[&a].slice(first..);
                let (qn, kn) = (prepared(&self.weights, &model, q_norm), prepared(&self.weights, &model, k_norm));
                let r = self.gpu.prep_attention_queue(&view(qv), &view(kv), &view(vv), strides, qn, kn, &self.rope, shape, &self.pos, bound, c.rms_eps, attn_scale(c.head_dim), kc, vc, &mut o, xq);
                self.act.insert(Act::Attn, o);
                r
            }
            Op::SigmoidMul { acc, gate } => {
                let mut a = self.take(acc);
                let r = self.gpu.sigmoid_mul_queue(&mut a, &self.act[&gate], t * act_len(c, acc));
                self.act.insert(acc, a);
                r
            }
            Op::GdnConv { layer, w: taps } => {
                let h = c.hybrid.as_ref().expect("GDN ops come from a hybrid model");
                let mut o = self.take(Act::Conv);
                let (ring, _) = self.gdn[layer].as_mut().expect("GDN layers have their state");
                let taps = prepared(&self.weights, &model, taps);
                let r = self.gpu.gdn_conv_queue(&self.act[&Act::Mixed], taps, ring, &mut o, &self.pos, t, h.conv_channels(), h.d_conv);
                self.act.insert(Act::Conv, o);
                r
            }
            Op::GdnRecur { layer, dt_bias, a } => {
                let h = c.hybrid.as_ref().expect("GDN ops come from a hybrid model");
                let shape = h.recur_shape(t);
                let mut o = self.take(Act::Gdn);
                let (_, state) = self.gdn[layer].as_mut().expect("GDN layers have their state");
                let vec = |id: WeightId| prepared(&self.weights, &model, id);
                let (act, pos) = (&self.act, &self.pos);
                let r = self.gpu.gdn_recur_queue(&act[&Act::Conv], &act[&Act::Alpha], &act[&Act::Beta], vec(dt_bias), vec(a), state, &mut o, pos, shape, c.rms_eps, attn_scale(h.d_state));
                self.act.insert(Act::Gdn, o);
                r
            }
            Op::RmsNormGated { x, w: nw, z, out, n } => {
                let mut o = self.take(out);
                let rows = t * act_len(c, x) / n;
                let r = self.gpu.rms_norm_gated_queue(&self.act[&x], self.f32s(nw), &self.act[&z], &mut o, rows, n, c.rms_eps);
                self.act.insert(out, o);
                r
            }
            Op::Swiglu { gate, up, out } => {
                let mut o = self.take(out);
                let r = self.gpu.swiglu_queue(&self.act[&gate], &self.act[&up], &mut o, t * act_len(c, out));
                self.act.insert(out, o);
                r
            }
            Op::AddGated { acc, y, s } => {
                let mut a = self.take(acc);
                let r = self.gpu.add_gated_queue(&mut a, &self.act[&y], &self.act[&s], t, act_len(c, acc));
                self.act.insert(acc, a);
                r
            }
            Op::Concat { a, b, out } => {
                let mut o = self.take(out);
                let r = self.gpu.concat_rows_queue(&self.act[&a], &self.act[&b], &mut o, t, act_len(c, a), act_len(c, b));
                self.act.insert(out, o);
                r
            }
            Op::LastRowFirst { act } => {
                let n = act_len(c, act);
                if t == 1 {
                    return Ok(());
                }
                let buf = self.act.get_mut(&act).expect("allocated");
                let (first, rest) = buf.split_at_mut(n);
                let (mut first, last) = (first, rest.slice((t - 2) * n..(t - 1) * n));
                self.gpu.stream().memcpy_dtod(&last, &mut first).map_err(self.gpu.driver_err("last row first", "copy"))
            }
            Op::RouterTopK { k } => {
                // A one-token window's group table comes with its picks (no `moe_group` launch).
                let table = (t == 1).then_some(&mut self.moe.table);
                self.gpu.router_topk_queue(&self.act[&Act::Router], t, c.n_expert, k, &mut self.moe.ids, &mut self.moe.weights, table)?;
                self.moe.grouped = t == 1;
                Ok(())
            }
            Op::Experts { gate, out, accumulate, .. } => {
                self.moe.tokens = t;
                let mut o = self.take(out);
                let r = self.gpu.moe_queue(&self.experts[&gate], &mut self.moe, &mut o, accumulate, MoeStages::ALL);
                self.act.insert(out, o);
                r
            }
            Op::Pick(pick) => match pick {
                Pick::Greedy => self.gpu.argmax_rows_queue(&self.act[&Act::Logits], t, c.n_vocab, &mut self.argmax, &mut self.next, &mut self.all_nan),
                Pick::Sample(p) => self.gpu.sample_rows_queue(&self.act[&Act::Logits], t, c.n_vocab, p, &self.pos, &mut self.next),
            },
            Op::Accept => self.gpu.spec_accept_queue(&mut self.tokens, &self.next, t, &mut self.accept, &mut self.pos),
        }
    }

    fn next_ids(&mut self, tokens: usize) -> Result<Vec<u32>> {
        let mut ids = vec![0u32; tokens];
        let stream = self.gpu.stream().clone();
        stream.memcpy_dtoh(&self.next.slice(..tokens), &mut ids).map_err(self.driver("copy of the chosen ids"))?;
        self.drain()?;
        Ok(ids)
    }

    fn logits(&mut self, tokens: usize) -> Result<Vec<f32>> {
        self.read_rows(Act::Logits, tokens, "copy of the logits")
    }

    fn hidden(&mut self, tokens: usize) -> Result<Vec<f32>> {
        self.read_rows(Act::Hidden, tokens, "copy of the hidden states")
    }

    fn nan_rows(&mut self, tokens: usize) -> Result<Vec<bool>> {
        if !self.greedy {
            return Ok(vec![false; tokens]);
        }
        let mut flags = vec![0u32; tokens];
        let stream = self.gpu.stream().clone();
        stream.memcpy_dtoh(&self.all_nan.slice(..tokens), &mut flags).map_err(self.driver("copy of the all-NaN flags"))?;
        stream.synchronize().map_err(self.driver("execution of the step"))?;
        Ok(flags.into_iter().map(|f| f != 0).collect())
    }

    fn loaded_tokens(&self) -> usize {
        self.n_tokens
    }

    fn times_phases(&self) -> bool {
        self.marks.is_some()
    }

    fn phase_times(&mut self) -> Option<Vec<(&'static str, f64)>> {
        let marks = self.marks.as_ref()?;
        let mut out: Vec<(&'static str, f64)> = Vec::new();
        for pair in marks.windows(2) {
            let ms = pair[0].1.elapsed_ms(&pair[1].1).ok()? as f64;
            match out.iter_mut().find(|(p, _)| *p == pair[0].0) {
                Some((_, t)) => *t += ms,
                None => out.push((pair[0].0, ms)),
            }
        }
        Some(out)
    }
}

/// The device buffer of a q8_1 activation: `Qx::X`, the routed experts' input, lives in the
/// expert buffers; the others in the executor's map. A free function over the two, so the
/// executor can read its activations and weights while it holds the buffer.
fn q8_1_buffer<'a>(qx: &'a mut HashMap<Qx, CudaSlice<u8>>, moe: &'a mut MoeBuffers, q: Qx) -> &'a mut CudaSlice<u8> {
    match q {
        Qx::X => &mut moe.xq,
        q => qx.get_mut(&q).expect("allocated for the models that use it"),
    }
}

/// A prepared vector's device buffer (norms, biases, conv taps): a free function over the weight
/// map, so the executor can hold a cache or state mutably while it reads one.
fn prepared<'a>(weights: &'a HashMap<WeightId, DevWeight>, model: &Model, id: WeightId) -> &'a CudaSlice<f32> {
    match &weights[&id] {
        DevWeight::F32(v) => v,
        DevWeight::Bytes(_) => unreachable!("{} is a prepared vector", model.weights.get(id).name),
    }
}
