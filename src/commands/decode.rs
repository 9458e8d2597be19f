//! `strata decode`: load a qwen3moe or qwen35moe GGUF (or build the built-in random model), prefill the
//! prompt in windows, generate, stream the text, report speed.
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::ValueEnum;

use strata_host::generate::{generate, Draft, Request, Stop};
use strata_host::gguf::GgufFile;
use strata_host::model::synth::{build_in_memory, SynthSpec};
use strata_host::model::Model;
use strata_host::ops::route::SampleParams;
use strata_host::step::cpu::CpuExecutor;
use strata_host::step::gpu::{device_bytes, GpuExecutor};
use strata_host::step::{Executor, Op, Pick, MAX_WINDOW, PHASES};
use strata_host::tokenizer::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendName {
    /// The Rust kernels (PTX) on the GPU.
    Cuda,
    /// The hand-written HIP kernels, compiled by NVRTC, on the GPU.
    Hip,
    /// The CPU replica of every kernel (same bits, much slower).
    Cpu,
}

/// `--spec` when not given: chosen by `strata decode` and `strata bench decode` on the H200.
const DEFAULT_SPEC: u8 = 3;

#[derive(clap::Args)]
pub struct Args {
    /// A qwen3moe or qwen35moe GGUF file. Without it, a small random-weight qwen3moe is built in memory (its
    /// output is noise: it shows the engine runs).
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// The prompt text (tokenized with the file's vocabulary).
    #[arg(long, short, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated (for files without a vocabulary).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub n_predict: u32,
    /// Sampling temperature; 0 picks the most likely token (greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    /// Sample among the K most likely tokens (1..=256).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Sample from the smallest set of those whose probability reaches P (0 < P <= 1).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Seed of the sampler: the token drawn at position i depends on (seed, i) alone.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where to run: cuda (default when a GPU is present), hip, or cpu.
    #[arg(long, value_enum)]
    pub backend: Option<BackendName>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Context size in positions (default: the model's training context, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Prompt tokens per prefill step (1..=8).
    #[arg(long, default_value_t = MAX_WINDOW as u8, value_parser = clap::value_parser!(u8).range(1..=MAX_WINDOW as i64))]
    pub window: u8,
    /// Speculative verify windows while generating: the last token plus up to N-1 drafts per
    /// step (1 = off: one-token steps chained on the device; up to 8). The tokens are the same
    /// for every N and every --draft; only the number of steps changes. The default, 3, was the fastest
    /// of 1, 2, 3, 4 and 8 on the H200 (docs/decode.md).
    #[arg(long, default_value_t = DEFAULT_SPEC, value_parser = clap::value_parser!(u8).range(1..=MAX_WINDOW as i64))]
    pub spec: u8,
    /// Where the drafts of the verify windows come from: the model's MTP block (the default
    /// where the file has one), prompt lookup (the continuation of the longest recent n-gram
    /// seen before; the default otherwise), or none (one-token steps).
    #[arg(long, value_enum)]
    pub draft: Option<DraftSource>,
    /// Do not stop at the end-of-generation token: always generate -n tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Write, for every generated token, the logits it was chosen from: little-endian f32,
    /// n_vocab per row, one row per token.
    #[arg(long, value_name = "FILE")]
    pub logits_out: Option<PathBuf>,
    /// Write the generated token ids as a JSON list.
    #[arg(long, value_name = "FILE")]
    pub ids_out: Option<PathBuf>,
    /// Wrap the prompt in the file's ChatML turns (user, then assistant).
    #[arg(long)]
    pub chat: bool,
    /// Time each phase of the step on the GPU (attention, deltanet, router, experts, shared
    /// expert, head, mtp, sampling, other) and print the split at the end. Profiled steps launch their kernels one by one
    /// (as --no-graph), so they are slower than unprofiled ones.
    #[arg(long)]
    pub profile: bool,
    /// GPU: launch every kernel of every step from the host instead of replaying the step's
    /// captured CUDA graph (one per window size). Same tokens and logits; for profiling and
    /// comparison.
    #[arg(long)]
    pub no_graph: bool,
    /// Print the generated token ids instead of text.
    #[arg(long)]
    pub print_ids: bool,
}

pub fn run(a: &Args) -> ExitCode {
    match decode(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The model named, or the built-in one.
fn load_model(a: &Args) -> anyhow::Result<Arc<Model>> {
    let file = match &a.model {
        Some(path) => Arc::new(GgufFile::open(path)?),
        None => {
            let spec = SynthSpec::tiny();
            eprintln!(
                "strata: no --model given: decoding the built-in random-weight qwen3moe ({} layers, {} experts top-{}, seed {}); its text is noise",
                spec.config.n_layer, spec.config.n_expert, spec.config.n_expert_used, spec.seed
            );
            Arc::new(GgufFile::from_bytes(build_in_memory(&spec), "<built-in model>")?)
        }
    };
    Ok(Arc::new(Model::load(file)?))
}

fn pick(a: &Args) -> anyhow::Result<Pick> {
    if a.temp == 0.0 {
        return Ok(Pick::Greedy);
    }
    let p = SampleParams { temperature: a.temp, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    p.check().map_err(|e| anyhow!("sampling: {e}"))?;
    Ok(Pick::Sample(p))
}

fn open_executor(a: &Args, model: Arc<Model>, n_ctx: usize) -> anyhow::Result<Box<dyn Executor>> {
    Ok(match open(a.backend, a.device, model, n_ctx)? {
        Opened::Cpu(exec) => exec,
        Opened::Gpu(mut exec) => {
            exec.set_profiling(a.profile);
            exec.set_graphs(!a.no_graph);
            exec
        }
    })
}

/// An executor as opened, its type kept: a GPU one has a backend and can profile.
pub(crate) enum Opened {
    Cpu(Box<CpuExecutor>),
    Gpu(Box<GpuExecutor>),
}

impl Opened {
    pub(crate) fn executor(&mut self) -> &mut dyn Executor {
        match self {
            Opened::Cpu(e) => e.as_mut(),
            Opened::Gpu(e) => e.as_mut(),
        }
    }
}

/// The executor for `backend` (cuda when a GPU is present, else cpu, when `None`) on GPU
/// `device`, with a `n_ctx`-position context (the weights uploaded with a progress bar).
pub(crate) fn open(backend: Option<BackendName>, device: usize, model: Arc<Model>, n_ctx: usize) -> anyhow::Result<Opened> {
    let name = backend.unwrap_or(if strata_host::backends::gpu::probe().is_ok() { BackendName::Cuda } else { BackendName::Cpu });
    let gpu = match name {
        BackendName::Cpu => return Ok(Opened::Cpu(Box::new(CpuExecutor::new(model, n_ctx)?))),
        BackendName::Cuda => strata_host::backends::cuda::open(device, crate::ptx::IMAGES)?,
        BackendName::Hip => strata_host::backends::hip::open(device)?,
    };
    Ok(Opened::Gpu(Box::new(GpuExecutor::new(gpu, model, n_ctx, true)?)))
}

fn decode(a: &Args) -> anyhow::Result<()> {
    if a.chat && a.prompt.is_none() {
        bail!("--chat wraps a text prompt: give it with --prompt");
    }
    let pick = pick(a)?;
    let model = load_model(a)?;
    let c = model.config.clone();
    // The file's training context, at most 4096 (4096 where the file's is unusable).
    let n_ctx = a.ctx.unwrap_or(if c.n_ctx_train >= 2 { c.n_ctx_train.min(4096) } else { 4096 });
    if !(2..=1 << 30).contains(&n_ctx) {
        bail!("--ctx {n_ctx}: choose 2..={}", 1 << 30);
    }
    let tokenizer = match Tokenizer::from_gguf(&model.weights.file) {
        Ok(t) => Some(t),
        Err(e) if a.prompt.is_some() => bail!("{e}"),
        Err(_) => None,
    };
    let prompt = match (&a.prompt, &a.prompt_ids) {
        (Some(text), _) => {
            let tok = tokenizer.as_ref().expect("checked above");
            let text = if a.chat { tok.chat_wrap(text).ok_or_else(|| anyhow!("--chat: the vocabulary has no ChatML tokens"))? } else { text.clone() };
            tok.encode(&text).map_err(|e| anyhow!("tokenizing the prompt: {e}"))?
        }
        (None, Some(ids)) => ids.clone(),
        (None, None) if a.model.is_none() => vec![tokenizer.as_ref().and_then(|t| t.encode("The").ok()).and_then(|v| v.first().copied()).unwrap_or(0)],
        (None, None) => bail!("give a prompt: --prompt TEXT or --prompt-ids IDS"),
    };
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= c.n_vocab) {
        bail!("prompt token id {bad} is outside the vocabulary of {} tokens", c.n_vocab);
    }
    if prompt.len() >= n_ctx {
        bail!("the prompt has {} tokens; the context holds {n_ctx} positions (raise --ctx)", prompt.len());
    }
    eprintln!(
        "strata: {}: {}; weights {:.1} MiB, {} positions of context",
        model.weights.file.path.display(),
        model.describe(),
        model.weights.total_bytes() as f64 / (1u64 << 20) as f64,
        n_ctx
    );
    eprintln!("strata: formats: {}", model.formats_summary());
    let mut exec = open_executor(a, model.clone(), n_ctx)?;
    if exec.name() != "cpu" {
        eprintln!("strata: {} backend, {:.2} GiB on the device", exec.name(), device_bytes(&model, n_ctx) as f64 / (1u64 << 30) as f64);
    } else {
        eprintln!("strata: cpu backend (the replica)");
    }
    let ops = model.step_ops(Op::Pick(pick));
    let stop: Vec<u32> = tokenizer.as_ref().map(|t| (0..c.n_vocab as u32).filter(|&id| t.is_eog(id)).collect()).unwrap_or_default();
    let draft = draft_of(a.draft, &model)?;
    let req = Request { prompt: prompt.clone(), n_predict: a.n_predict as usize, window: a.window as usize, spec: a.spec as usize, stop, ignore_eos: a.ignore_eos, want_logits: a.logits_out.is_some(), draft };
    let mut logits_file = match &a.logits_out {
        Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p).with_context(|| format!("--logits-out {}", p.display()))?)),
        None => None,
    };
    let mut ids = Vec::new();
    let mut stream = tokenizer.as_ref().filter(|_| !a.print_ids).map(Tokenizer::stream);
    let mut out = std::io::stdout().lock();
    let stats = generate(exec.as_mut(), &ops, &req, |id, logits| {
        ids.push(id);
        if let (Some(f), Some(l)) = (logits_file.as_mut(), logits) {
            for v in l {
                f.write_all(&v.to_le_bytes()).map_err(|e| strata_host::Error::Request(format!("writing --logits-out: {e}")))?;
            }
        }
        let text = match stream.as_mut() {
            Some(s) => s.push(id),
            None => format!("{id} "),
        };
        let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
        Ok(())
    })?;
    if let Some(s) = stream {
        let _ = out.write_all(s.finish().as_bytes());
    }
    let _ = writeln!(out);
    if let Some(mut f) = logits_file {
        f.flush().context("writing --logits-out")?;
    }
    if let Some(p) = &a.ids_out {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        std::fs::write(p, format!("[{}]\n", list.join(","))).with_context(|| format!("--ids-out {}", p.display()))?;
    }
    let rate = |n: usize, d: std::time::Duration| if d.as_secs_f64() > 0.0 { n as f64 / d.as_secs_f64() } else { 0.0 };
    let steps = stats.generated.saturating_sub(1);
    eprintln!(
        "strata: prefill {} tokens in {:.1} ms ({:.1} tok/s, windows of {}); decode {} tokens in {:.1} ms ({:.1} tok/s){}",
        stats.prompt_tokens,
        stats.prefill.as_secs_f64() * 1e3,
        rate(stats.prompt_tokens, stats.prefill),
        a.window,
        steps,
        stats.decode.as_secs_f64() * 1e3,
        rate(steps, stats.decode),
        match stats.stopped {
            Stop::Eos => ", stopped at end of generation",
            Stop::Context => ", stopped at the end of the context",
            Stop::Length => "",
        }
    );
    if a.spec > 1 && stats.steps > 0 {
        eprintln!(
            "strata: speculation ({} drafts): {} steps of up to {} tokens, {} of {} drafts accepted ({:.0}%), {:.2} tokens a step",
            match req.draft {
                Draft::Mtp(_) => "MTP",
                Draft::Lookup => "prompt-lookup",
                Draft::None => "no",
            },
            stats.steps,
            a.spec,
            stats.accepted,
            stats.drafted,
            100.0 * stats.accepted as f64 / stats.drafted.max(1) as f64,
            steps as f64 / stats.steps as f64
        );
    }
    if a.spec == 1 && steps > 0 && stats.decode.as_secs_f64() > 0.0 {
        let bytes = model.step_weight_bytes() as f64;
        let per_step = |d: std::time::Duration| 1e6 * d.as_secs_f64() / steps as f64;
        let issue = if exec.name() == "cpu" {
            String::new()
        } else {
            format!("; {} ops, issued by the host in {:.0} us of the step's {:.0} us", ops.len(), per_step(stats.enqueue), per_step(stats.decode))
        };
        eprintln!("strata: a decode step reads {:.4} GB of weights: {:.1} GB/s effective{issue}", bytes / 1e9, bytes * rate(steps, stats.decode) / 1e9);
    }
    if !stats.phases.is_empty() && steps > 0 {
        let total: f64 = stats.phases.iter().map(|p| p.1).sum();
        let split: Vec<String> = PHASES
            .iter()
            .filter_map(|name| stats.phases.iter().find(|p| p.0 == *name))
            .map(|(p, ms)| format!("{p} {:.1} us ({:.0}%)", 1e3 * ms / steps as f64, 100.0 * ms / total))
            .collect();
        eprintln!("strata: per decode step (GPU time): {}", split.join(", "));
    }
    Ok(())
}

/// `--draft`: where the verify windows' drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftSource {
    /// The model's multi-token-prediction block (qwen35moe files that have one).
    Mtp,
    /// Prompt lookup.
    Lookup,
    /// No drafts.
    None,
}

/// The drafts `--draft` asks for (MTP where the model has it when not given); an error for MTP
/// on a model without an MTP block.
pub(crate) fn draft_of(asked: Option<DraftSource>, model: &Model) -> anyhow::Result<Draft> {
    Ok(match (asked, model.mtp_ops()) {
        (Some(DraftSource::Mtp) | None, Some(ops)) => Draft::Mtp(ops),
        (Some(DraftSource::Mtp), None) => bail!("--draft mtp: {} has no MTP block (nextn_predict_layers); use --draft lookup", model.weights.file.path.display()),
        (Some(DraftSource::Lookup) | None, None) | (Some(DraftSource::Lookup), Some(_)) => Draft::Lookup,
        (Some(DraftSource::None), _) => Draft::None,
    })
}
