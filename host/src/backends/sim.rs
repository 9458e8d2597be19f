//! The `sim` backend: the device kernels' own code (`device/src`, compiled for the host as the
//! `strata-device-sim` crate) run on CPU coroutines by the simulator (`strata_device::arch::sim`),
//! launched as the cuda backend launches them: the same entries, grids, plans and arguments in
//! the same order. For tests where no GPU is at hand: a kernel's logic bit for bit against the
//! replica, every global access through `arch::mem` checked against the launch's buffers,
//! every shared access against its size, and a missing `cp.async` wait seen. It says nothing of
//! speed. Built only with the `sim` feature (the tests'). docs/simulator.md.
//!
//! Families it runs: the [`Backend`] trait's (quantize, mmvq, matvec, the head's argmax and top
//! probability, the q8_0 quantizer, the routed experts) here, and in `ops` beside the cuda
//! backend's: attention, the norms, the router and sampler, `spec_accept` and the gdn family.
use std::marker::PhantomData;

use crate::backends::knobs::KernelKnobs;
use crate::backends::{check_head, check_matvec, check_mmvq, check_moe, check_quantize, check_quantize_q8_0, Backend, FloatWeights, MoeOut, MoeWindow, Variant, Weights};
use crate::error::{Error, Result};
use strata_device::arch::sim::{self, Arg, Region};
use strata_gpu_shared::formats::GROUP;
use strata_gpu_shared::launch::{image_bounds, mmvq_launch, HEAD_CHUNK, QUANTIZE_WARPS};
use strata_gpu_shared::codebooks::{IQ2_S_GRID, IQ2_XS_GRID, IQ2_XXS_GRID, IQ3_S_GRID, IQ3_XXS_GRID};
use strata_gpu_shared::moe;
use strata_gpu_shared::lane_grids::IQ3_S_LANES;

/// The statics the kernels read through `arch::mem` as module constants (`blocks::Grid`'s
/// codebooks and the repeated copy the IQ3_ST entries stage): every launch may read them.
/// (A static missing here shows as a load "outside every buffer" naming the kernel.)
fn module_constants() -> [Region; 6] {
    [
        Region::of(&IQ2_XXS_GRID, false),
        Region::of(&IQ2_XS_GRID, false),
        Region::of(&IQ2_S_GRID, false),
        Region::of(&IQ3_XXS_GRID, false),
        Region::of(&IQ3_S_GRID, false),
        Region::of(&IQ3_S_LANES.0, false),
    ]
}

/// The simulator and the launch choices a GPU's size or a knob would make.
#[derive(Clone, Debug)]
pub struct SimBackend {
    /// The SM count the launch rules see (the band rule, the lean rule, the expert plan).
    pub sms: usize,
    /// The kernel knobs (the expert plan, `ATTN_MINB`), as on the cuda backend.
    pub knobs: KernelKnobs,
    /// The attention band (query heads an `attn_chunk` block takes): `None` for the rule's.
    pub attn_band: Option<usize>,
}

impl SimBackend {
    /// The launch rules of a GPU of `sms` SMs, the default knobs.
    pub fn new(sms: usize) -> Self {
        SimBackend { sms, knobs: KernelKnobs::default(), attn_band: None }
    }

    /// Launches the entry `kernel` over `blocks` blocks of its launch bounds' threads (the sm_90
    /// image's: the simulator compiles its entries but the cluster ones), with `smem` bytes of
    /// dynamic shared memory (`None`: its bounds'), and `args`. Crate-internal as the cuda
    /// backend's `run`: every caller pushes exactly the entry's parameters, over buffers its
    /// family's shape checks sized.
    pub(crate) fn run(&self, kernel: &'static str, blocks: u32, smem: Option<u32>, args: &Args) -> Result<()> {
        let fail = |detail: String| Error::Simulated { kernel: kernel.into(), detail };
        let bounds = image_bounds("sm_90").find(|b| b.kernel == kernel).ok_or_else(|| fail("no launch bounds for this entry".into()))?;
        let entry = sim::entry(kernel).ok_or_else(|| fail("no such entry in the simulator's build".into()))?;
        if entry.params.len() != args.args.len() {
            return Err(fail(format!("{} arguments for the parameters {:?}", args.args.len(), entry.params)));
        }
        let memory = [args.memory.as_slice(), &module_constants()].concat();
        // SAFETY: every caller pushes the entry's parameters over buffers sized by the family's
        // shape checks, as the cuda launches do; the simulator checks each access through
        // `arch::mem` against those buffers.
        sim::launch(blocks, bounds.threads, smem.unwrap_or(bounds.smem_bytes) as usize, &memory, || unsafe { (entry.call)(&args.args) }).map_err(fail)
    }
}

/// A launch's arguments, pushed in the entry's parameter order as the cuda backend pushes them,
/// and the buffers among them (what the launch may touch). Borrows each buffer for `'a`.
#[derive(Default)]
pub(crate) struct Args<'a> {
    args: Vec<Arg>,
    memory: Vec<Region>,
    buffers: PhantomData<&'a mut [u8]>,
}

impl<'a> Args<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// A buffer the kernel reads.
    pub fn input<T>(&mut self, s: &'a [T]) -> &mut Self {
        self.memory.push(Region::of(s, false));
        self.arg(Arg::Ptr(s.as_ptr() as usize))
    }

    /// A buffer the kernel writes (and may read).
    pub fn output<T>(&mut self, s: &'a mut [T]) -> &mut Self {
        self.memory.push(Region::of(s, true));
        self.arg(Arg::Ptr(s.as_mut_ptr() as usize))
    }

    /// The address `at` inside a buffer given elsewhere in the list (an in-place kernel's input
    /// that is its output).
    pub fn address(&mut self, at: usize) -> &mut Self {
        self.arg(Arg::Ptr(at))
    }

    /// A buffer parameter given no buffer (a null pointer).
    pub fn null(&mut self) -> &mut Self {
        self.arg(Arg::Ptr(0))
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.arg(Arg::U32(v))
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.arg(Arg::U64(v))
    }

    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.arg(Arg::F32(v))
    }

    fn arg(&mut self, a: Arg) -> &mut Self {
        self.args.push(a);
        self
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn quantize_q8_1(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        let groups = check_quantize(x, out)? as u32;
        if groups == 0 {
            return Ok(());
        }
        self.run("quantize_q8_1", groups.div_ceil(QUANTIZE_WARPS), None, Args::new().input(x).output(out).u32(groups))
    }

    fn mmvq(&self, w: &Weights, xq: &[u8], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()> {
        check_mmvq(w, xq, rows, y)?;
        let groups = w.k / GROUP;
        let l = mmvq_launch(w.format, w.m, rows, groups);
        let mut a = Args::new();
        a.input(w.data).input(xq).output(y).u32(w.m as u32).u32(groups as u32).u32(rows as u32).u32(accumulate as u32);
        self.run(l.kernel, (w.m as u32).div_ceil(l.rows_per_block), Some(l.smem), &a)
    }

    fn matvec(&self, w: &FloatWeights, x: &[f32], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()> {
        let blocks = check_matvec(w, x, rows, y)?;
        let mut a = Args::new();
        a.input(w.data).input(x).output(y).u32(w.m as u32).u32(w.k as u32).u32(rows as u32).u32(accumulate as u32);
        self.run(w.format.matvec_kernel(), blocks, None, &a)
    }

    fn argmax_rows(&self, x: &[f32], n: usize, variant: Variant, idx: &mut [u32], all_nan: &mut [u32]) -> Result<()> {
        let rows = check_head("argmax_rows", x, n, &[idx.len(), all_nan.len()])? as u32;
        let n32 = n as u32;
        match variant {
            Variant::Reference => self.run("argmax_rows_ref", rows, None, Args::new().input(x).u32(n32).u32(rows).output(idx).output(all_nan)),
            Variant::Fast => {
                let chunks = n.div_ceil(HEAD_CHUNK) as u32;
                let (mut pv, mut pi) = (vec![f32::NAN; (rows * chunks) as usize], vec![u32::MAX; (rows * chunks) as usize]);
                self.run("argmax_rows_split", rows * chunks, None, Args::new().input(x).u32(n32).u32(rows).u32(chunks).output(&mut pv).output(&mut pi))?;
                self.run("argmax_rows_final", rows, None, Args::new().input(&pv).input(&pi).u32(rows).u32(chunks).output(idx).output(all_nan))
            }
        }
    }

    fn row_top_prob(&self, x: &[f32], n: usize, variant: Variant, p: &mut [f32]) -> Result<()> {
        let rows = check_head("row_top_prob", x, n, &[p.len()])? as u32;
        let (n32, chunks) = (n as u32, n.div_ceil(HEAD_CHUNK) as u32);
        match variant {
            Variant::Reference => self.run("row_top_prob_ref", rows, None, Args::new().input(x).u32(n32).u32(rows).output(p)),
            Variant::Fast => {
                let (mut pm, mut ps) = (vec![f32::NAN; (rows * chunks) as usize], vec![f32::NAN; (rows * chunks) as usize]);
                self.run("row_top_prob_max", rows * chunks, None, Args::new().input(x).u32(n32).u32(rows).u32(chunks).output(&mut pm))?;
                self.run("row_top_prob_sum", rows * chunks, None, Args::new().input(x).u32(n32).u32(rows).u32(chunks).input(&pm).output(&mut ps))?;
                self.run("row_top_prob_final", rows, None, Args::new().input(&ps).u32(rows).u32(chunks).output(p))
            }
        }
    }

    fn quantize_q8_0_scaled(&self, x: &[f32], k: usize, scales: &[f32], per_column: bool, variant: Variant, out: &mut [u8]) -> Result<()> {
        let (kernel, per_block) = match variant {
            Variant::Reference => ("quantize_q8_0_scaled_ref", 32 * QUANTIZE_WARPS),
            Variant::Fast => ("quantize_q8_0_scaled", QUANTIZE_WARPS),
        };
        let groups = check_quantize_q8_0(x, k, scales, per_column, out)? as u32;
        self.run(kernel, groups.div_ceil(per_block), None, Args::new().input(x).u32(k as u32).input(scales).u32(per_column as u32).u32(groups).output(out))
    }

    /// The cuda backend's `moe_queue` with every stage: grouping, gate/up, down and the combine,
    /// as the knobs plan them for a GPU of `sms` SMs without the sm_90 cluster entries.
    fn moe(&self, w: &MoeWindow, o: &mut MoeOut) -> Result<()> {
        let (n_embd, n_ff) = check_moe(w, o)?;
        let n = w.tokens * w.k;
        let (g, d) = (w.gate.format, w.down.format);
        let plan = self.knobs.plan((g, d), n_embd, n_ff, n, self.sms as u32, false).map_err(|e| Error::Request(format!("sim: kernel knobs: {e}")))?;
        let (n32, k, tokens) = (n as u32, w.k as u32, w.tokens as u32);
        let (embd_groups, ff_groups) = ((n_embd / 32) as u32, (n_ff / 32) as u32);
        let gu_bytes = (n_ff * g.row_bytes(n_embd)) as u64;
        let down_bytes = (n_embd * d.row_bytes(n_ff)) as u64;
        // Poisoned: a table word the group kernel does not write shows.
        let mut table = vec![u32::MAX; moe::table_words(n)];
        self.run("moe_group", 1, None, Args::new().input(w.ids).u32(n32).u32(w.gate.n_expert as u32).output(&mut table))?;
        let gu = plan.gu;
        let mut a = Args::new();
        a.input(w.gate.data).input(w.up.data).u64(gu_bytes).input(w.xq).input(&table).u32(n32).u32(k).u32(embd_groups).u32(n_ff as u32);
        if gu.kernel.starts_with("expdec") {
            a.u32(gu.rows_per_block).input(w.down.data).u64(down_bytes);
        }
        a.output(o.hq);
        self.run(gu.kernel, gu.blocks, Some(gu.smem), &a)?;
        let down = plan.down;
        let mut a = Args::new();
        a.input(w.down.data).u64(down_bytes).input(o.hq).input(&table).u32(n32).u32(ff_groups).u32(n_embd as u32);
        if down.kernel.starts_with("expdec") {
            a.u32(down.rows_per_block);
        }
        a.output(o.y);
        self.run(down.kernel, down.blocks, Some(down.smem), &a)?;
        let mut a = Args::new();
        a.input(o.y).input(w.weights).u32(tokens).u32(k).u32(n_embd as u32).output(o.out).u32(o.accumulate as u32);
        self.run("moe_combine", (tokens * n_embd as u32).div_ceil(256), None, &a)
    }
}
