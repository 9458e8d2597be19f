//! `strata bench`: kernel speed on the GPU backends, against the device's copy bandwidth; `strata
//! bench decode`: the decode loop on any backend (measured by `strata_host::bench::decode`).
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

use super::decode::{BackendName, Opened};
use crate::backends::Available;
use strata_gpu_shared::formats::WeightFormat;
use strata_host::bench::kernels::{self, MmvqRow};
use strata_host::bench::decode::{self as bd, Kind, Launch, Row, Spread};
use strata_host::gguf::GgufFile;
use strata_host::model::synth::{build_in_memory, SynthSpec};
use strata_host::generate::Draft;
use strata_host::model::Model;
use strata_host::step::{Op, Pick, MAX_WINDOW};
use strata_host::backends::gpu::GpuBackend;
use strata_host::backends::knobs::KernelKnobs;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand)]
pub enum What {
    /// Quantized matvec (`mmvq`) per format, shape and activation rows, on `cuda` and `hip`:
    /// microseconds per call (weights read cold from a pool of at least 4x the L2), achieved
    /// GB/s (weight + activation bytes) and its percentage of the device-to-device copy
    /// bandwidth measured in the same run.
    Mmvq(MmvqArgs),
    /// The sampler head and the small kernels, on `cuda` and `hip`: `argmax_rows` and
    /// `row_top_prob` one block per row against the split kernels (vocabularies 106,299,
    /// 151,936 and 248,320 at 1, 4, 5 and 8 rows), the quantizers, and
    /// `copy_from_mapped_multi` against one copy per segment. Microseconds (medians) and
    /// speed-ups.
    Head(HeadArgs),
    /// Routed experts of one layer for verify windows of T tokens: the default kernels, the
    /// knobs in force (`--knob`, STRATA_EXPDEC_*), and each knob changed alone (`--variants`),
    /// per format pair (gate/up, down), at n_embd 2560 / n_ff 640 with 10 of 512 experts and
    /// 2048 / 768 with 8 of 128; weights read cold (12 windows of different experts cycled);
    /// the gate/up and down kernels and rows per block each variant ran, microseconds for the
    /// whole layer, gate/up and down, GB/s of expert weights read, % of the copy bandwidth, and
    /// `identical` (the variant's outputs equal the first variant's byte for byte).
    Experts(ExpertsArgs),
    /// A layer's attention at depth (`attn_chunk` + `attn_merge`, as the decode step launches
    /// them) for windows of T tokens, on `cuda` and `hip`: microseconds and the GB/s of the f16
    /// keys and values it must read, against the copy bandwidth.
    Attention(AttentionArgs),
    /// The decode loop on a model, like llama-bench: one-token steps (`tg N`) at several depths,
    /// full verify windows of T tokens, prompt-lookup speculation (acceptance, tokens per step),
    /// prefill, and the time per phase (GPU); tok/s median and min..max over `--runs`, and the
    /// GB/s of weights read against the copy bandwidth. Runs on cuda, hip or cpu.
    /// docs/bench-decode.md says what each row measures.
    Decode(DecodeArgs),
}

#[derive(clap::Args)]
pub struct DecodeArgs {
    /// A qwen3moe or qwen35moe GGUF file (default: $STRATA_BENCH_MODEL). The Qwen3-30B-A3B-shaped
    /// synthetic model: `strata synth --preset 30b-a3b --out F`; the Qwen3.5-35B-A3B-shaped one:
    /// `strata synth --arch qwen35moe --preset 35b-a3b --out F`.
    #[arg(value_name = "FILE", conflicts_with = "builtin")]
    pub file: Option<PathBuf>,
    /// Bench the small built-in random-weight model instead of a file.
    #[arg(long)]
    pub builtin: bool,
    /// Where to run: cuda (default when a GPU is present), hip, or cpu.
    #[arg(long, value_enum)]
    pub backend: Option<BackendName>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Tokens generated per test (`tg N`).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub n: usize,
    /// Depths of the one-token rows (the first generated position), comma-separated.
    #[arg(long, default_value = "0,8192,32768")]
    pub depths: String,
    /// Full verify windows: tokens per step (1..8), comma-separated; empty for none.
    #[arg(long, default_value = "2,4,8")]
    pub windows: String,
    /// What the full windows verify: `greedy` (the model's own greedy text from the pattern's
    /// first token: every draft accepted, but the text, and so which experts a window's tokens
    /// share, changes with the model's bits) or `random` (`-n` tokens drawn uniformly from the
    /// vocabulary with `--window-seed`: the same input for every build, few drafts accepted; a
    /// window's step costs the same either way).
    #[arg(long, value_enum, default_value_t = WindowInput::Greedy)]
    pub window_input: WindowInput,
    /// Seed of `--window-input random`.
    #[arg(long, default_value_t = 1)]
    pub window_seed: u64,
    /// Speculation: the largest verify window (1..8), comma-separated; empty for none.
    #[arg(long, default_value = "2,3,4,8")]
    pub spec: String,
    /// The drafts of the speculation rows (`specN` rows for prompt lookup, `mtpN` for the MTP
    /// block): as `strata decode --draft` (MTP where the file has it, else lookup).
    #[arg(long, value_enum)]
    pub draft: Option<super::decode::DraftSource>,
    /// Tokens of the prefill prompt (windows of 8); 0 skips it.
    #[arg(long, default_value_t = 512)]
    pub prefill: usize,
    /// Repetitions of each test (at least 1): every figure is their median and min..max.
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub runs: usize,
    /// Print JSON (one object per row, every figure) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// GPU: launch every kernel from the host instead of replaying captured graphs (then no
    /// `eager` comparison row is added).
    #[arg(long)]
    pub no_graph: bool,
    /// GPU: after the warm-up, run one more one-token step at depth 0 (as the tg rows run it)
    /// between cuProfilerStart and cuProfilerStop, so a profiler started with collection off
    /// sees exactly that step's launches: `ncu --profile-from-start off ... strata bench decode
    /// FILE --profile-step` (docs/bench-decode.md). The rows then run as usual.
    #[arg(long)]
    pub profile_step: bool,
    /// GPU: also time the one-token steps at depth 0 with kernels left out, one row per group,
    /// and print what each group costs a step and a launch inside the chain of launches, where
    /// a profiler, timing launches one at a time, cannot say. Groups are comma-separated, each
    /// kernel-name prefixes joined by `+`: `moe_down,attn_chunk,expdec_gu+moe_down+moe_combine`.
    /// The outputs of what is left out keep what they held, so those steps compute nothing
    /// meaningful (docs/bench-decode.md).
    #[arg(long, value_name = "GROUPS", default_value = "")]
    pub drop: String,
    /// GPU: also run the one-token rows (every `--depths`) and the full windows (`--windows`)
    /// with other kernel knobs, in one process on the loaded model: variants
    /// comma-separated, each `knobs` (the knobs in force), `plain` (the default kernels) or
    /// `KNOB=VALUE[+KNOB=VALUE...]` over the knobs in force (`strata knobs` lists them). Every
    /// variant runs in turn, `--variant-rounds` times, a row each (`tg128 [EXPDEC_WARP_ROWS=0 #2]`),
    /// then a table gives each test's tok/s per variant over all its rounds and its ratio to the
    /// first variant's: put `knobs` first to compare against the knobs in force.
    #[arg(long, value_name = "VARIANTS", default_value = "")]
    pub variants: String,
    /// GPU (cuda): instead of the rows, lay out the one-token step at each `--depths` and a full
    /// window of each `--windows` (random tokens, `--window-seed`) launch by launch, ROUNDS times
    /// (their medians): the kernels run in their timeline build, whose
    /// blocks stamp the GPU's global timer when they start, when their wait for the previous
    /// grid returns and when they end. A table gives each kernel's launches a step: the gap from
    /// the previous launch's last block to their release (the chain's handoff), their run from
    /// release to last block, and how early their blocks were resident; then every launch in
    /// order (docs/bench-decode.md). 0: off.
    #[arg(long, value_name = "ROUNDS", default_value_t = 0)]
    pub timeline: usize,
    /// Rounds of `--variants` (at least 1): each runs every variant once, in turn, so that a
    /// drift of the GPU's speed during the run falls on all of them.
    #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub variant_rounds: usize,
}

/// The input of the full-window rows (`--window-input`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WindowInput {
    Greedy,
    Random,
}

#[derive(clap::Args)]
pub struct ExpertsArgs {
    /// Format pairs `GATEUP/DOWN`, comma-separated: GGUF formats, or a tiled device layout
    /// (`IQ4_NLT`: IQ4_NL in tiles of 8 blocks, `IQ3_ST`: IQ3_S in tiles of 8 blocks, what the
    /// decode step holds IQ4_NL and IQ3_S experts as where their rows are whole tiles).
    #[arg(long, default_value = "IQ3_XXS/IQ4_NL,IQ3_S/IQ4_NL,IQ2_S/IQ4_NL,IQ3_XXS/Q2_0,IQ3_S/Q2_0,IQ2_S/Q2_0,IQ2_XXS/IQ4_NL")]
    pub pairs: String,
    /// Layer shapes `N_EMBD/N_FF/EXPERTS/K`, comma-separated.
    #[arg(long, default_value = "2560/640/512/10,2048/768/128/8")]
    pub shapes: String,
    /// Window sizes (tokens), comma-separated.
    #[arg(long, default_value = "1,2,3,4,8")]
    pub tokens: String,
    /// How the windows select experts, comma-separated: `uniform` (each token k distinct
    /// experts drawn from all, independently: a window of T reads up to T x k experts) or
    /// `shared` (the tokens share k to k + 3 experts).
    #[arg(long, default_value = "uniform,shared")]
    pub routing: String,
    /// Variants, comma-separated: `plain` (the default kernels: EXPDEC, EXPDEC_DOWN and
    /// EXPDEC_D20 off), `knobs` (the knobs in force), or `KNOB=VALUE[+KNOB=VALUE...]` over the
    /// knobs in force.
    #[arg(long, default_value = "plain,knobs,EXPDEC_R=2,EXPDEC_MINB=4,EXPDEC_WARPS=8,EXPDEC_RB=64,EXPDEC_D20=0,EXPDEC_DR=1,EXPDEC_DRB=64,EXPDEC_DMINB=2,EXPDEC_DOWN=1+EXPDEC_DR=1+EXPDEC_DRB=32")]
    pub variants: String,
    #[command(flatten)]
    pub run: RunArgs,
}

/// What every GPU bench takes: where it runs and how often it measures.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Backends, comma-separated (`cuda`, `hip`).
    #[arg(long, default_value = "cuda,hip")]
    pub backends: String,
    /// Timed rounds per configuration (at least 1); the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub rounds: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

#[derive(clap::Args)]
pub struct AttentionArgs {
    /// Heads `N_Q/N_KV/HEAD_DIM` (default: Qwen3-30B-A3B's).
    #[arg(long, default_value = "32/4/128")]
    pub heads: String,
    /// Depths (the window's first position), comma-separated.
    #[arg(long, default_value = "4096,32768")]
    pub depths: String,
    /// Window sizes (tokens), comma-separated (1..8).
    #[arg(long, default_value = "1,4,8")]
    pub tokens: String,
    /// Query heads per `attn_chunk` block, comma-separated: `rule` (what the decode step
    /// launches) or a count (1..8 dividing the KV group; others are skipped).
    #[arg(long, default_value = "rule")]
    pub bands: String,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Args)]
pub struct HeadArgs {
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Args)]
pub struct MmvqArgs {
    /// Formats, comma-separated (`Q8_0,IQ4_NL`), or `all`.
    #[arg(long, default_value = "all")]
    pub formats: String,
    /// Shapes `MxK` (weight rows x row length), comma-separated. Default: the model's matrices
    /// 2048x2048, 2048x768, 768x2048, 4096x2048, 2560x640 and the head 151936x2048.
    #[arg(long, default_value = "2048x2048,2048x768,768x2048,4096x2048,2560x640,151936x2048")]
    pub shapes: String,
    /// Activation rows per call, comma-separated (1..8).
    #[arg(long, default_value = "1,2,4,8")]
    pub rows: String,
    /// Seed of the random weights and activations.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub run: RunArgs,
    /// Print JSON (one object per measurement) instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn list<T>(s: &str, what: &str, parse: impl Fn(&str) -> Option<T>) -> anyhow::Result<Vec<T>> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(|x| parse(x).with_context(|| format!("bad {what} `{x}`"))).collect()
}

fn parse_shape(s: &str) -> Option<(usize, usize)> {
    let (m, k) = s.split_once('x')?;
    Some((m.parse().ok().filter(|&m| m > 0)?, k.parse().ok().filter(|&k| k > 0)?))
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.what {
        What::Mmvq(a) => mmvq(a),
        What::Head(a) => head(a),
        What::Attention(a) => attention(a),
        What::Experts(a) => experts(a),
        What::Decode(a) => Ok(match decode(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("strata: error: {e:#}");
                ExitCode::from(2)
            }
        }),
    }
}

/// The model `strata bench decode` measures: FILE, $STRATA_BENCH_MODEL, or the built-in one.
fn bench_model(a: &DecodeArgs) -> anyhow::Result<Arc<Model>> {
    if a.builtin {
        let file = GgufFile::from_bytes(build_in_memory(&SynthSpec::tiny()), "<built-in model>")?;
        return Ok(Arc::new(Model::load(Arc::new(file))?));
    }
    let path = match (&a.file, std::env::var_os("STRATA_BENCH_MODEL")) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => bail!(
            "no model to bench: give FILE, set STRATA_BENCH_MODEL=FILE, or pass --builtin (the small random model). \
The Qwen3-30B-A3B-shaped synthetic model (about 15 GB) is written by `strata synth --preset 30b-a3b --out F`; then run `strata bench decode F`"
        ),
    };
    Ok(Arc::new(Model::open(&path)?))
}

/// Where a bench ran, for the header and every JSON row.
struct Setting {
    model: String,
    backend: &'static str,
    gpu: Option<String>,
    /// Device-to-device copy bandwidth, GB/s (GPU only).
    copy: Option<f64>,
    /// Weight bytes a one-token step reads.
    bytes: usize,
    /// What the full windows verify (`--window-input`, `--window-seed`).
    window_input: WindowInput,
    window_seed: u64,
    /// Characters of the test column (`bd::test_column_width`).
    test_width: usize,
}

fn decode(a: &DecodeArgs) -> anyhow::Result<()> {
    let tokens = |t: &str| t.parse().ok().filter(|t| (1..=MAX_WINDOW).contains(t));
    let depths = list(&a.depths, "--depths item", |d| d.parse::<usize>().ok())?;
    let windows = list(&a.windows, "--windows item (1..8 tokens)", tokens)?;
    let specs = list(&a.spec, "--spec item (1..8 tokens)", tokens)?;
    if let Some(t) = windows.iter().find(|&&t| t > a.n) {
        bail!("--windows {t}: more tokens than the {} of -n", a.n);
    }
    let base = KernelKnobs::process().map_err(|e| anyhow::anyhow!(e))?;
    let variants = list(&a.variants, "--variants item", |v| Some(v.to_string()))?
        .iter()
        .map(|v| variant(v, base))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--variants: {e}"))?;
    if a.timeline > 0 {
        super::timeline::check(a)?;
    }
    let model = bench_model(a)?;
    let c = model.config.clone();
    if let Some(bad) = bd::PATTERN.iter().find(|&&id| id as usize >= c.n_vocab) {
        bail!("the prompt pattern's token {bad} is outside the vocabulary of {} tokens", c.n_vocab);
    }
    let n_ctx = bd::context_for(&depths, a.n, a.prefill, c.n_ctx_train)?;
    if a.timeline > 0 {
        return super::timeline::run(a, model, &depths, &windows, n_ctx);
    }
    let drops = list(&a.drop, "--drop group", |g| Some(g.to_string()))?;
    let mut opened = super::decode::open(a.backend, a.device, model.clone(), n_ctx)?;
    match &mut opened {
        Opened::Gpu(g) => g.set_graphs(!a.no_graph),
        Opened::Cpu(_) if a.profile_step => bail!("--profile-step brackets a step for a GPU profiler: it needs --backend cuda or hip"),
        Opened::Cpu(_) if !drops.is_empty() => bail!("--drop leaves kernel launches out of the step: it needs --backend cuda or hip"),
        Opened::Cpu(_) if !variants.is_empty() => bail!("--variants sets the GPU's kernel knobs: it needs --backend cuda or hip"),
        Opened::Cpu(_) => {}
    }
    let (gpu, copy) = match &opened {
        Opened::Gpu(g) => (Some(g.backend().info().name.clone()), Some(kernels::copy_bandwidth(g.backend(), 1 << 30, 5)?)),
        Opened::Cpu(_) => (None, None),
    };
    let chained = matches!(&opened, Opened::Gpu(g) if g.backend().chained());
    let labels: Vec<String> = variants.iter().map(|(label, _)| label.clone()).collect();
    let test_width = bd::test_column_width(a.n, &depths, &windows, &labels, a.variant_rounds, &drops);
    let set = Setting {
        model: model.weights.file.path.display().to_string(),
        backend: opened.executor().name(),
        gpu,
        copy,
        bytes: model.step_weight_bytes(),
        window_input: a.window_input,
        window_seed: a.window_seed,
        test_width,
    };
    let header = [
        format!(
            "strata bench decode: {}: {}; weights {:.3} GB, a one-token step reads {:.4} GB",
            set.model,
            model.describe(),
            model.weights.total_bytes() as f64 / 1e9,
            set.bytes as f64 / 1e9
        ),
        format!("formats: {}", model.formats_summary()),
        match (&set.gpu, set.copy) {
            (Some(gpu), Some(copy)) => format!(
                "backend: {} on {gpu} (device {}), launches {}; device-to-device copy {copy:.0} GB/s (1 GiB, read + write, median of 5)",
                set.backend,
                a.device,
                if chained { "chained (STRATA_PDL=0: unchained)" } else { "unchained" }
            ),
            _ => "backend: cpu (the replica); copy bandwidth n/a".to_string(),
        },
        format!(
            "context {n_ctx} positions; {} runs per test: median and min..max; prompts: token ids {:?} repeated (speculation: {} tokens)",
            a.runs,
            bd::PATTERN,
            bd::SPEC_PROMPT
        ),
        match a.window_input {
            WindowInput::Greedy => format!("full windows verify the model's greedy text from token {}", bd::PATTERN[0]),
            WindowInput::Random => format!("full windows verify {} tokens drawn uniformly from the {} of the vocabulary (seed {})", a.n, c.n_vocab, a.window_seed),
        },
    ];
    for line in &header {
        if a.json {
            eprintln!("strata: {line}");
        } else {
            println!("{line}");
        }
    }
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(ProgressStyle::with_template("{spinner} bench decode: {msg} ({elapsed})").expect("a valid template"));
    spinner.enable_steady_tick(Duration::from_millis(200));
    let show = |row: &Row| spinner.suspend(|| println!("{}", if a.json { row_json(&set, row) } else { row_line(&set, row) }));
    if !a.json {
        let w = set.test_width;
        println!(
            "| {:<w$} | {:>12} | {:>21} | {:>14} | {:>13} | {:>6} | {:>11} | {:>8} |",
            "test", "tok/s median", "tok/s spread", "ms/step median", "weights GB/s", "% copy", "accept rate", "tok/step"
        );
        println!("|{:-<w2$}|{:->14}|{:->23}|{:->16}|{:->15}|{:->8}|{:->13}|{:->10}|", "", ":", ":", ":", ":", ":", ":", ":", w2 = w + 2);
    }
    let ops = model.step_ops(Op::Pick(Pick::Greedy));
    let first = bd::PATTERN[0];
    let exec = opened.executor();
    spinner.set_message("warm-up");
    bd::warm_up(exec, &ops, first)?;
    if a.profile_step {
        let Opened::Gpu(g) = &mut opened else { unreachable!("--profile-step is refused without a GPU backend") };
        spinner.set_message("one one-token step, profiled");
        g.profiled(|g| bd::tg(g, &ops, first, 0, 1, 1))?;
    }
    let exec = opened.executor();
    let runs = a.runs;
    let mut tg0 = None;
    for &d in &depths {
        spinner.set_message(format!("tg{} @ d{d}, {runs} runs", a.n));
        let row = bd::tg(exec, &ops, first, d, a.n, runs)?;
        show(&row);
        if d == 0 {
            tg0 = Some(row);
        }
    }
    // The same one-token steps launched kernel by kernel: what the graphs save.
    if let Opened::Gpu(g) = &mut opened {
        if g.graphs_on() {
            spinner.set_message(format!("tg{} launched eagerly, {runs} runs", a.n));
            g.set_graphs(false);
            let row = bd::tg(g.as_mut(), &ops, first, 0, a.n, runs).map(|r| Row { launch: Launch::Eager, ..r });
            g.set_graphs(true);
            show(&row?);
        }
    }
    // The same steps with kernels left out: what each group costs inside the chain.
    let mut costs = None;
    if let (Opened::Gpu(g), false) = (&mut opened, drops.is_empty()) {
        spinner.set_message("the kernels of a one-token step");
        let kernels = g.step_kernels(&ops, &[first], 0)?;
        let groups = drops.iter().map(|d| bd::DropGroup::parse(d, &kernels)).collect::<Result<Vec<_>, _>>()?;
        let with = match tg0.take() {
            Some(row) => row,
            None => {
                spinner.set_message(format!("tg{} @ d0, {runs} runs", a.n));
                let row = bd::tg(g.as_mut(), &ops, first, 0, a.n, runs)?;
                show(&row);
                row
            }
        };
        let mut without = Vec::new();
        for group in groups {
            spinner.set_message(format!("tg{} without {}, {runs} runs", a.n, group.label()));
            // Setting the drops drops the captured graphs: one untimed step captures the next.
            g.set_dropped(group.prefixes.clone());
            let row = bd::tg(g.as_mut(), &ops, first, 0, 1, 1).and_then(|_| bd::tg(g.as_mut(), &ops, first, 0, a.n, runs));
            g.set_dropped(Vec::new());
            let row = Row { dropped: Some(group.label()), ..row? };
            show(&row);
            without.push((group, row));
        }
        costs = Some(Costs { with, launches: kernels.len(), without });
        spinner.set_message("warm-up");
        bd::warm_up(g.as_mut(), &ops, first)?;
    }
    let exec = opened.executor();
    let seq = match a.window_input {
        _ if windows.is_empty() => Vec::new(),
        WindowInput::Greedy => {
            spinner.set_message("the greedy tokens the windows take");
            bd::greedy_tokens(exec, &ops, first, a.n)?
        }
        WindowInput::Random => bd::random_tokens(first, a.n, c.n_vocab, a.window_seed),
    };
    for &t in &windows {
        spinner.set_message(format!("tg{} in windows of {t}, {runs} runs", a.n));
        show(&bd::windows(exec, &ops, &seq, t, runs)?);
    }
    // The one-token rows and the windows again under each variant's knobs, in turn, round
    // after round; then the knobs in force again.
    let mut variant_rows = Vec::new();
    if let (Opened::Gpu(g), false) = (&mut opened, variants.is_empty()) {
        let in_force = g.kernel_knobs();
        for round in 1..=a.variant_rounds {
            for (label, knobs) in &variants {
                spinner.set_message(format!("variant {label}, round {round} of {}", a.variant_rounds));
                // New knobs drop the captured graphs: an untimed step captures the next.
                g.set_kernel_knobs(*knobs);
                bd::tg(g.as_mut(), &ops, first, 0, 1, 1)?;
                let tag = |row: Row| Row { variant: Some((label.clone(), round)), ..row };
                for &d in &depths {
                    let row = tag(bd::tg(g.as_mut(), &ops, first, d, a.n, runs)?);
                    show(&row);
                    variant_rows.push(row);
                }
                for &t in &windows {
                    let row = tag(bd::windows(g.as_mut(), &ops, &seq, t, runs)?);
                    show(&row);
                    variant_rows.push(row);
                }
            }
        }
        g.set_kernel_knobs(in_force);
        spinner.set_message("warm-up");
        bd::warm_up(g.as_mut(), &ops, first)?;
    }
    let exec = opened.executor();
    let prompt = bd::pattern(bd::SPEC_PROMPT);
    let draft = super::decode::draft_of(a.draft, &model)?;
    for &s in &specs {
        spinner.set_message(format!("tg{} with speculation up to {s}, {runs} runs", a.n));
        show(&bd::spec(exec, &ops, &draft, &prompt, a.n, s, runs)?);
    }
    if a.prefill > 0 {
        spinner.set_message(format!("pp{}, {runs} runs", a.prefill));
        show(&bd::prefill(exec, &ops, &bd::pattern(a.prefill), MAX_WINDOW, runs)?);
    }
    spinner.set_message(format!("tg{} per phase (profiled), {runs} runs", a.n));
    let phases = match &mut opened {
        Opened::Gpu(g) => {
            // Events between the phases need eager launches.
            g.set_profiling(true);
            let p = bd::phases(g.as_mut(), &ops, first, a.n, runs);
            g.set_profiling(false);
            p?
        }
        Opened::Cpu(_) => None,
    };
    let mtp = match &draft {
        Draft::Mtp(mtp) => {
            spinner.set_message(format!("{} MTP draft steps, {runs} runs", a.n));
            Some(bd::mtp_steps(opened.executor(), &ops, mtp, first, a.n, runs)?)
        }
        _ => None,
    };
    spinner.finish_and_clear();
    print_phases(&set, a, phases.as_deref());
    if let Some(c) = &costs {
        print_costs(&set, a, c);
    }
    if !variant_rows.is_empty() {
        print_variants(&set, a, &bd::variant_figures(&variant_rows));
    }
    if let Some(s) = mtp {
        if a.json {
            println!("{{{},\"mtp_step\":{}}}", json_setting(&set, "mtp draft step"), json_spread("us", s));
        } else {
            println!("MTP block: one draft step {:.1} us median ({:.1}..{:.1}; one-token steps chained as the drafts are, graphs as set)", s.median, s.min, s.max);
        }
    }
    if !a.json {
        println!(
            "weights GB/s = {:.4} GB (what a one-token step reads) x tok/s: exact for one-token steps; `<=` marks an upper bound (a window reads the shared weights once for all its tokens)",
            set.bytes as f64 / 1e9
        );
    }
    Ok(())
}

fn row_line(set: &Setting, r: &Row) -> String {
    let (tok, ms, gbps) = (r.tok_s(), r.ms_per_step(), r.weights_gbps(set.bytes));
    let bound = if r.gbps_is_upper_bound() { "<=" } else { "" };
    let (gbps, pct) = match (r.reads_every_weight(), set.copy) {
        (false, _) => ("-".to_string(), "-".to_string()),
        (true, copy) => (format!("{bound}{:.1}", gbps.median), copy.map_or("n/a".into(), |c| format!("{:.1}", 100.0 * gbps.median / c))),
    };
    format!(
        "| {:<w$} | {:>12.2} | {:>21} | {:>14.3} | {:>13} | {:>6} | {:>11} | {:>8.2} |",
        r.name(),
        tok.median,
        format!("{:.2}..{:.2}", tok.min, tok.max),
        ms.median,
        gbps,
        pct,
        r.acceptance().map_or("-".into(), |s| format!("{:.2}", s.median)),
        r.tokens_per_step().median,
        w = set.test_width
    )
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `"key":median,"key_min":min,"key_max":max`.
fn json_spread(key: &str, s: Spread) -> String {
    format!("\"{key}\":{},\"{key}_min\":{},\"{key}_max\":{}", s.median, s.min, s.max)
}

/// The fields every JSON row starts with.
fn json_setting(set: &Setting, test: &str) -> String {
    format!(
        "\"test\":{},\"model\":{},\"backend\":\"{}\",\"gpu\":{},\"copy_gbps\":{}",
        json_str(test),
        json_str(&set.model),
        set.backend,
        set.gpu.as_deref().map_or("null".into(), json_str),
        set.copy.map_or("null".into(), |c| c.to_string())
    )
}

fn row_json(set: &Setting, r: &Row) -> String {
    let gbps = r.weights_gbps(set.bytes);
    let first = r.runs[0];
    let mut fields = vec![
        json_setting(set, &r.name()),
        format!("\"kind\":\"{}\",\"n\":{},\"depth\":{},\"window\":{},\"runs\":{}", r.kind.name(), r.n, r.depth, r.window, r.runs.len()),
        format!("\"tokens\":{},\"steps\":{},\"drafted\":{},\"accepted\":{}", first.tokens, first.steps, first.drafted, first.accepted),
        json_spread("tok_s", r.tok_s()),
        json_spread("ms_per_step", r.ms_per_step()),
        json_spread("tokens_per_step", r.tokens_per_step()),
        r.acceptance().map_or("\"acceptance\":null".into(), |s| json_spread("acceptance", s)),
        match (r.kind, set.window_input) {
            (Kind::Window, WindowInput::Greedy) => "\"window_input\":\"greedy\",\"window_seed\":null".into(),
            (Kind::Window, WindowInput::Random) => format!("\"window_input\":\"random\",\"window_seed\":{}", set.window_seed),
            _ => "\"window_input\":null,\"window_seed\":null".into(),
        },
        format!("\"weight_bytes_per_token\":{},\"gbps_upper_bound\":{}", set.bytes, r.gbps_is_upper_bound()),
        format!("\"dropped\":{}", r.dropped.as_deref().map_or("null".into(), json_str)),
        match &r.variant {
            Some((v, round)) => format!("\"variant\":{},\"round\":{round}", json_str(v)),
            None => "\"variant\":null,\"round\":null".into(),
        },
    ];
    fields.push(match (r.reads_every_weight(), set.copy) {
        (false, _) => "\"gbps\":null,\"gbps_min\":null,\"gbps_max\":null,\"pct_copy\":null,\"pct_copy_min\":null,\"pct_copy_max\":null".into(),
        (true, Some(c)) => format!("{},{}", json_spread("gbps", gbps), json_spread("pct_copy", gbps.map(|g| 100.0 * g / c))),
        (true, None) => format!("{},\"pct_copy\":null", json_spread("gbps", gbps)),
    });
    format!("{{{}}}", fields.join(","))
}

/// The per-phase table (or JSON rows): microseconds per one-token step, from a separate
/// profiled run.
fn print_phases(set: &Setting, a: &DecodeArgs, phases: Option<&[bd::PhaseRow]>) {
    let test = format!("tg{} phases", a.n);
    let Some(phases) = phases else {
        if a.json {
            println!("{{{},\"phases\":null}}", json_setting(set, &test));
        } else {
            println!("per phase: n/a (the {} executor has no phase timers; GPU backends only)", set.backend);
        }
        return;
    };
    let spreads: Vec<(&str, Spread)> = phases.iter().map(|p| (p.phase, Spread::of(p.us_per_step.iter().copied()))).collect();
    let total: f64 = spreads.iter().map(|(_, s)| s.median).sum();
    if !a.json {
        println!("per phase of a one-token step ({test} @ d0, a separate run with an event at each phase change, which slows the step):");
        println!("| {:<10} | {:>14} | {:>21} | {:>9} |", "phase", "us/step median", "us/step spread", "% of step");
        println!("|{:-<12}|{:->16}|{:->23}|{:->11}|", "", ":", ":", ":");
    }
    for (phase, s) in spreads {
        let pct = if total > 0.0 { 100.0 * s.median / total } else { 0.0 };
        if a.json {
            println!("{{{},\"phase\":\"{phase}\",\"runs\":{},{},\"pct\":{pct}}}", json_setting(set, &test), a.runs, json_spread("us_per_step", s));
        } else {
            println!("| {:<10} | {:>14.1} | {:>21} | {:>9.1} |", phase, s.median, format!("{:.1}..{:.1}", s.min, s.max), pct);
        }
    }
}

/// The `--variants` table: each test's tok/s per variant over all its rounds, and its ratio
/// to the first variant's.
fn print_variants(set: &Setting, a: &DecodeArgs, figures: &[bd::VariantFigure]) {
    if !a.json {
        println!(
            "variants ({} rounds, each variant in turn; tok/s over every run of every round; ratio: median over the first variant's):",
            a.variant_rounds
        );
        println!("| {:<20} | {:<32} | {:>12} | {:>21} | {:>7} |", "test", "variant", "tok/s median", "tok/s spread", "ratio");
        println!("|{:-<22}|{:-<34}|{:->14}|{:->23}|{:->9}|", "", "", ":", ":", ":");
    }
    for f in figures {
        if a.json {
            println!(
                "{{{},\"variant\":{},\"rounds\":{},{},\"ratio\":{}}}",
                json_setting(set, &format!("{} variants", f.test)),
                json_str(&f.variant),
                f.rounds,
                json_spread("tok_s", f.tok_s),
                f.ratio
            );
        } else {
            println!("| {:<20} | {:<32} | {:>12.2} | {:>21} | {:>7.4} |", f.test, f.variant, f.tok_s.median, format!("{:.2}..{:.2}", f.tok_s.min, f.tok_s.max), f.ratio);
        }
    }
}

/// What `--drop` measured: the one-token steps at depth 0 with everything (`with`, `launches`
/// a step) and without each group.
struct Costs {
    with: Row,
    launches: usize,
    without: Vec<(bd::DropGroup, Row)>,
}

/// The `--drop` table: each group's launches a step, the median step without it, and what it
/// costs a step and a launch.
fn print_costs(set: &Setting, a: &DecodeArgs, c: &Costs) {
    let test = format!("tg{} chained cost", a.n);
    let with_ms = c.with.ms_per_step().median;
    if a.json {
        println!("{{{},\"dropped\":null,\"launches\":{},\"ms_per_step\":{with_ms}}}", json_setting(set, &test), c.launches);
    } else {
        println!(
            "chained cost of each group left out of the one-token steps (tg{} @ d0: {with_ms:.3} ms/step median, {} launches a step; what is left out keeps its outputs as they were, so a group whose output steers later kernels, as router_topk's does, is not measured alone):",
            a.n, c.launches
        );
        println!("| {:<32} | {:>8} | {:>14} | {:>12} | {:>12} |", "left out", "launches", "ms/step median", "us a step", "us a launch");
        println!("|{:-<34}|{:->10}|{:->16}|{:->14}|{:->14}|", "", ":", ":", ":", ":");
    }
    for (group, row) in &c.without {
        let (step, launch) = group.cost_us(&c.with, row);
        let ms = row.ms_per_step().median;
        if a.json {
            println!(
                "{{{},\"dropped\":{},\"launches\":{},\"ms_per_step\":{ms},\"us_per_step\":{step},\"us_per_launch\":{launch}}}",
                json_setting(set, &test),
                json_str(&group.label()),
                group.launches
            );
        } else {
            println!("| {:<32} | {:>8} | {:>14.3} | {:>12.1} | {:>12.2} |", group.label(), group.launches, ms, step, launch);
        }
    }
}

fn experts(a: &ExpertsArgs) -> anyhow::Result<ExitCode> {
    let fmt = |s: &str| WeightFormat::MATVEC.into_iter().find(|w| w.name().eq_ignore_ascii_case(s));
    let pairs = list(&a.pairs, "format pair (GATEUP/DOWN)", |p| p.split_once('/').and_then(|(g, d)| Some((fmt(g)?, fmt(d)?))))?;
    let shapes = list(&a.shapes, "shape (N_EMBD/N_FF/EXPERTS/K)", |s| {
        let v: Vec<usize> = s.split('/').map(|x| x.parse().ok().filter(|&x| x > 0)).collect::<Option<_>>()?;
        (v.len() == 4 && v[0] % 256 == 0 && v[1] % 32 == 0).then(|| (v[0], v[1], v[2], v[3]))
    })?;
    let tokens = list(&a.tokens, "token count (1..8)", |t| t.parse().ok().filter(|t| (1..=8).contains(t)))?;
    let routings = list(&a.routing, "routing (uniform, shared)", |r| [kernels::Routing::Uniform, kernels::Routing::Shared].into_iter().find(|x| x.name() == r))?;
    let base = KernelKnobs::process().map_err(anyhow::Error::msg)?;
    let variants: Vec<_> =
        a.variants.split(',').map(str::trim).filter(|v| !v.is_empty()).map(|v| variant(v, base)).collect::<Result<_, _>>().map_err(anyhow::Error::msg)?;
    let mut found = Available::open(a.run.device);
    let wanted = list(&a.run.backends, "backend (cuda, hip)", |b| ["cuda", "hip"].into_iter().find(|x| *x == b))?;
    let copy = kernels::copy_bandwidth(open_gpus(&found, &a.run.backends)?[0], 1 << 30, 5)?;
    println!("device-to-device copy: {copy:.0} GB/s; knobs in force: {}", base.describe());
    println!(
        "{:<15} {:<17} {:<7} {:>1} {:<4} {:<16} {:<22} {:<24} {:>8} {:>8} {:>8} {:>6} {:>5} {:>5}",
        "pair", "shape", "routing", "T", "be", "variant", "gate/up kernel (rb)", "down kernel (drb)", "all us", "gu us", "down us", "GB/s", "%copy", "ident"
    );
    for &(gf, df) in &pairs {
        for &(n_embd, n_ff, n_expert, k) in &shapes {
            if n_embd % gf.block_values() != 0 || n_ff % df.block_values() != 0 {
                eprintln!(
                    "bench experts: skipping {}/{} at {n_embd}/{n_ff}: gate/up rows need a multiple of {} values, down rows of {}",
                    gf.name(),
                    df.name(),
                    gf.block_values(),
                    df.block_values()
                );
                continue;
            }
            for &routing in &routings {
                for (name, b) in [("cuda", &mut found.cuda), ("hip", &mut found.hip)] {
                    if !wanted.contains(&name) {
                        continue;
                    }
                    let g = b.as_mut().map_err(|e| anyhow::anyhow!("{e}"))?;
                    eprint!("\rbench experts: {}/{} {n_embd}/{n_ff} {} on {name}...      ", gf.name(), df.name(), routing.name());
                    let rows = kernels::experts(g, (gf, df), (n_embd, n_ff, n_expert, k), &tokens, &variants, routing, a.run.rounds, 1)?;
                    eprint!("\r{:60}\r", "");
                    for r in rows {
                        println!(
                            "{:<15} {:<17} {:<7} {:>1} {:<4} {:<16} {:<22} {:<24} {:>8.2} {:>8.2} {:>8.2} {:>6.0} {:>5.1} {:>5}",
                            format!("{}/{}", gf.name(), df.name()),
                            format!("{n_embd}/{n_ff} {k}of{n_expert}"),
                            routing.name(),
                            r.tokens,
                            r.backend,
                            r.variant,
                            format!("{} ({})", r.plan.gu.kernel, r.plan.gu.rows_per_block),
                            format!("{} ({})", r.plan.down.kernel, r.plan.down.rows_per_block),
                            r.all_us,
                            r.gu_us,
                            r.down_us,
                            r.gbps,
                            100.0 * r.gbps / copy,
                            if r.identical { "yes" } else { "NO" }
                        );
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A `--variants` item: its label and knobs.
fn variant(v: &str, base: KernelKnobs) -> Result<(String, KernelKnobs), String> {
    let mut k = base;
    match v {
        "plain" => {
            (k.expdec, k.down, k.d20) = (false, false, false);
        }
        "knobs" => {}
        _ => {
            for set in v.split('+') {
                let (name, value) = set.split_once('=').ok_or_else(|| format!("variant {v:?}: expected plain, knobs or KNOB=VALUE[+KNOB=VALUE]"))?;
                k.set(name, value)?;
            }
        }
    }
    k.check().map_err(|e| format!("variant {v:?}: {e}"))?;
    Ok((v.to_string(), k))
}

/// The GPU backends named in `list` (comma-separated), opened on `device`.
fn open_gpus<'a>(found: &'a Available, list: &str) -> anyhow::Result<Vec<&'a GpuBackend>> {
    let wanted = super::bench::list(list, "backend (cuda, hip)", |b| ["cuda", "hip"].into_iter().find(|x| *x == b))?;
    let mut gpus = Vec::new();
    for (name, b) in [("cuda", &found.cuda), ("hip", &found.hip)] {
        if wanted.contains(&name) {
            gpus.push(b.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?);
        }
    }
    if gpus.is_empty() {
        bail!("no backend selected");
    }
    Ok(gpus)
}

fn head(a: &HeadArgs) -> anyhow::Result<ExitCode> {
    let found = Available::open(a.run.device);
    let gpus = open_gpus(&found, &a.run.backends)?;
    println!("device: {}", gpus[0].info().name);
    println!("{:<22} {:<16} {:<6} {:>12} {:>12} {:>9}", "kernel", "shape", "backend", "ref us", "fast us", "speed-up");
    let print = |r: &kernels::HeadRow| {
        let reference = if r.reference_us > 0.0 { format!("{:.2}", r.reference_us) } else { "-".into() };
        let speedup = if r.reference_us > 0.0 { format!("{:.2}x", r.reference_us / r.fast_us) } else { "-".into() };
        println!("{:<22} {:<16} {:<6} {:>12} {:>12.2} {:>9}", r.what, r.shape, r.backend, reference, r.fast_us, speedup);
    };
    for vocab in [106_299, 151_936, 248_320] {
        for rows in [1, 4, 5, 8] {
            for g in &gpus {
                eprint!("\rbench head: {rows}x{vocab} on {}...      ", g.name_static());
                let rs = kernels::head(g, vocab, rows, a.run.rounds, 1)?;
                eprint!("\r{:50}\r", "");
                rs.iter().for_each(print);
            }
        }
    }
    println!("(quantizers: `ref us` is quantize_q8_0_scaled one thread per block, `fast us` one warp per block)");
    for (rows, k) in [(1, 2048), (8, 2048), (8, 4096)] {
        for g in &gpus {
            kernels::quantizers(g, rows, k, a.run.rounds, 1)?.iter().for_each(print);
        }
    }
    println!("(mapped copies: `ref us` is one cuMemcpyAsync per segment, `fast us` one copy_from_mapped_multi launch)");
    for n in [1, 4, 16, 64] {
        for len in [4 << 10, 64 << 10, 1 << 20, 4 << 20] {
            for g in &gpus {
                print(&kernels::mapped_copy(g, n, len, a.run.rounds)?);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn attention(a: &AttentionArgs) -> anyhow::Result<ExitCode> {
    let heads = list(&a.heads, "heads (N_Q/N_KV/HEAD_DIM)", |s| {
        let v: Vec<usize> = s.split('/').map(|x| x.parse().ok().filter(|&x| x > 0)).collect::<Option<_>>()?;
        (v.len() == 3 && v[0] % v[1] == 0 && v[2] % 32 == 0).then(|| (v[0], v[1], v[2]))
    })?;
    let depths = list(&a.depths, "depth", |d| d.parse::<usize>().ok())?;
    let tokens = list(&a.tokens, "token count (1..8)", |t| t.parse().ok().filter(|t| (1..=8).contains(t)))?;
    let bands = list(&a.bands, "band (rule or 1..8)", |b| if b == "rule" { Some(0) } else { b.parse().ok().filter(|b| (1..=8).contains(b)) })?;
    let found = Available::open(a.run.device);
    let gpus = open_gpus(&found, &a.run.backends)?;
    let copy = kernels::copy_bandwidth(gpus[0], 1 << 30, 5)?;
    println!("device-to-device copy: {copy:.0} GB/s (1 GiB, read + write bytes, median of 5)");
    println!("{:<12} {:>6} {:>2} {:>5} {:<4} {:>9} {:>7} {:>5}", "heads", "depth", "T", "band", "be", "us", "GB/s", "%copy");
    for &(n_q, n_kv, hd) in &heads {
        for g in &gpus {
            eprint!("\rbench attention: {n_q}/{n_kv}/{hd} on {}...        ", g.name_static());
            let rows = kernels::attention(g, (n_q, n_kv, hd), &depths, &tokens, &bands, a.run.rounds, 1)?;
            eprint!("\r{:60}\r", "");
            for r in rows {
                let band = format!("{}{}", r.band, if r.rule { "*" } else { "" });
                println!(
                    "{:<12} {:>6} {:>2} {:>5} {:<4} {:>9.2} {:>7.0} {:>5.1}",
                    format!("{n_q}/{n_kv}/{hd}"),
                    r.depth,
                    r.tokens,
                    band,
                    r.backend,
                    r.us,
                    r.gbps,
                    100.0 * r.gbps / copy
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn mmvq(a: &MmvqArgs) -> anyhow::Result<ExitCode> {
    let formats = if a.formats == "all" {
        WeightFormat::MATVEC.to_vec()
    } else {
        list(&a.formats, "format", |f| WeightFormat::MATVEC.into_iter().find(|w| w.name().eq_ignore_ascii_case(f)))?
    };
    let shapes = list(&a.shapes, "shape (MxK)", parse_shape)?;
    let rows = list(&a.rows, "row count (1..8)", |r| r.parse().ok().filter(|r| (1..=8).contains(r)))?;
    let found = Available::open(a.run.device);
    let gpus = open_gpus(&found, &a.run.backends)?;
    let first = gpus[0];
    let info = first.info();
    let copy = kernels::copy_bandwidth(first, 1 << 30, 5)?;
    if !a.json {
        println!("device: {}, {} SMs, L2 {} MiB", info.name, info.sm_count, info.l2_bytes >> 20);
        println!("device-to-device copy: {copy:.0} GB/s (1 GiB, read + write bytes, median of 5)");
        print!("{:<8} {:<12} {:>4} {:<15}", "format", "shape", "rows", "kernel");
        for g in &gpus {
            print!(" | {:>9} {:>7} {:>5}", format!("{} us", g.name_static()), "GB/s", "%copy");
        }
        println!("{}", if gpus.len() == 2 { " | hip/cuda" } else { "" });
    }
    for &format in &formats {
        for &(m, k) in &shapes {
            let k = k.div_ceil(format.block_values()) * format.block_values();
            let mut per: Vec<Vec<MmvqRow>> = Vec::new();
            for g in &gpus {
                eprint!("\rbench mmvq: {} {m}x{k} on {}...        ", format.name(), g.name_static());
                per.push(kernels::mmvq(g, format, m, k, &rows, a.run.rounds, a.seed)?);
            }
            eprint!("\r{:60}\r", "");
            for (i, row) in per[0].iter().enumerate() {
                let r = row.rows;
                if a.json {
                    for p in &per {
                        let x = &p[i];
                        println!(
                            "{{\"kernel\":\"{}\",\"backend\":\"{}\",\"format\":\"{}\",\"m\":{m},\"k\":{k},\"rows\":{r},\"us\":{:.3},\"gbps\":{:.1},\"copy_gbps\":{copy:.1},\"pct_copy\":{:.1},\"pool_slots\":{}}}",
                            x.kernel, x.backend, format.name(), x.us, x.gbps, 100.0 * x.gbps / copy, x.slots
                        );
                    }
                    continue;
                }
                print!("{:<8} {:<12} {:>4} {:<15}", format.name(), format!("{m}x{k}"), r, row.kernel);
                for p in &per {
                    let x = &p[i];
                    print!(" | {:>9.2} {:>7.0} {:>5.1}", x.us, x.gbps, 100.0 * x.gbps / copy);
                }
                if per.len() == 2 {
                    print!(" | {:>8.3}", per[1][i].us / per[0][i].us);
                }
                println!();
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
