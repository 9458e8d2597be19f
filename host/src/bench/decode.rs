//! `strata bench decode`: the decode loop's speed on one executor, llama-bench style. Each
//! measurement is a function over `&mut dyn Executor` and the step's op list (greedy pick), so
//! the same code runs on the CPU executor in the tests and on the GPU executors on the H200:
//!
//! - [`tg`]: one-token steps from a depth (the first generated position),
//! - [`windows`]: full verify windows of T tokens, every draft accepted (the ceiling of a window),
//! - [`spec`]: [`generate`] with prompt-lookup speculation on a repetitive prompt,
//! - [`prefill`]: a prompt in windows,
//! - [`phases`]: the time per phase of one-token steps, where the executor measures it.
//!
//! Every function repeats its measurement `runs` times and returns one [`Run`] per repetition;
//! [`Row`] and [`Spread`] turn them into medians and ranges. Wall-clock times: a step ends when
//! its tokens are back on the host, so the GPU's work is inside the time.
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};
use crate::generate::{chain, generate, Draft, Request};
use crate::step::{add_phase_time, Executor, Op, Window, MAX_WINDOW, PHASES};

/// The token pattern of the speculation and prefill prompts, repeated to their length.
pub const PATTERN: [u32; 8] = [11, 12, 13, 14, 15, 16, 17, 18];

/// Tokens of the speculation prompt ([`PATTERN`] 8 times).
pub const SPEC_PROMPT: usize = 64;

/// [`PATTERN`] repeated to `len` tokens.
pub fn pattern(len: usize) -> Vec<u32> {
    PATTERN.iter().copied().cycle().take(len).collect()
}

/// The context a bench needs: the deepest one-token run (`max depth + n`), the speculation
/// prompt and its `n` tokens, the prefill prompt, plus a window of slack. Refuses one past the
/// model's context (`n_ctx_train`).
pub fn context_for(depths: &[usize], n: usize, prefill: usize, n_ctx_train: usize) -> Result<usize> {
    let deepest = depths.iter().copied().max().unwrap_or(0);
    let need = deepest.checked_add(n).map(|d| d.max(SPEC_PROMPT.saturating_add(n).saturating_add(1)).max(prefill)).and_then(|d| d.checked_add(MAX_WINDOW));
    let n_ctx = need.unwrap_or(usize::MAX);
    if n_ctx > n_ctx_train {
        return Err(Error::Request(format!(
            "depth {deepest} + {n} generated tokens (+ {MAX_WINDOW}; prefill {prefill}) need a {n_ctx}-position context; the model's context is {n_ctx_train} positions (lower --depths, -n or --prefill)"
        )));
    }
    Ok(n_ctx)
}

/// One repetition of a measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Run {
    /// Wall time of the timed steps, seconds.
    pub secs: f64,
    /// Tokens the timed steps produced (generated, or prompt tokens for prefill).
    pub tokens: usize,
    pub steps: usize,
    /// Draft tokens the steps carried and how many of them the model confirmed.
    pub drafted: usize,
    pub accepted: usize,
}

/// Median and range of a figure over the runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The median (the mean of the middle two for an even count), minimum and maximum of
    /// `values` (at least one).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.into_iter().collect();
        assert!(!v.is_empty(), "a spread of no values");
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Spread { median, min: v[0], max: v[n - 1] }
    }

    /// `f` of each figure (`f` monotonic increasing).
    pub fn map(self, f: impl Fn(f64) -> f64) -> Spread {
        Spread { median: f(self.median), min: f(self.min), max: f(self.max) }
    }
}

/// What a row measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One-token steps ([`tg`]).
    Tg,
    /// Full verify windows ([`windows`]).
    Window,
    /// Prompt-lookup speculation ([`spec`]).
    Spec,
    /// Speculation with the model's MTP drafts ([`spec`]).
    Mtp,
    /// Prompt prefill ([`prefill`]).
    Prefill,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Tg => "tg",
            Kind::Window => "window",
            Kind::Spec => "spec",
            Kind::Mtp => "mtp",
            Kind::Prefill => "prefill",
        }
    }
}

/// How a row's steps were launched, where it is not the executor's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Launch {
    #[default]
    Default,
    /// A GPU executor launching every kernel from the host (`--no-graph`), for comparison.
    Eager,
}

/// One measured test: its parameters and one [`Run`] per repetition.
#[derive(Clone, Debug)]
pub struct Row {
    pub launch: Launch,
    pub kind: Kind,
    /// Tokens asked for (generated, or the prompt's length for prefill).
    pub n: usize,
    /// The first position of the timed steps.
    pub depth: usize,
    /// Tokens per step (at most, for speculation).
    pub window: usize,
    /// The kernel families left out of the steps ([`DropGroup`]), if any.
    pub dropped: Option<String>,
    /// The knobs the steps ran with where a variant set them (`strata bench decode
    /// --variants`), and its round (from 1; each round runs every variant in turn).
    pub variant: Option<(String, usize)>,
    pub runs: Vec<Run>,
}

impl Row {
    /// llama-bench style: `tg128`, `tg128 @ d8192`, `tg128 win4`, `tg128 spec4`, `pp512 win8`;
    /// `tg128 eager` for eager launches, `tg128 w/o moe_down` with kernels left out,
    /// `tg128 win4 [EXPDEC_WARP_ROWS=0 #2]` for round 2 of a variant.
    pub fn name(&self) -> String {
        match &self.variant {
            Some((v, round)) => format!("{} [{v} #{round}]", self.test()),
            None => self.test(),
        }
    }

    /// [`Self::name`] without the variant: what the rows of every variant have in common.
    pub fn test(&self) -> String {
        let depth = if self.depth > 0 { format!(" @ d{}", self.depth) } else { String::new() };
        let name = match self.kind {
            Kind::Tg => format!("tg{}{depth}", self.n),
            Kind::Window => format!("tg{} win{}{depth}", self.n, self.window),
            Kind::Spec => format!("tg{} spec{}", self.n, self.window),
            Kind::Mtp => format!("tg{} mtp{}", self.n, self.window),
            Kind::Prefill => format!("pp{} win{}", self.n, self.window),
        };
        let name = match self.launch {
            Launch::Default => name,
            Launch::Eager => format!("{name} eager"),
        };
        match &self.dropped {
            Some(d) => format!("{name} w/o {d}"),
            None => name,
        }
    }

    /// Tokens per second of each run: tokens / time.
    pub fn tok_s(&self) -> Spread {
        tok_s(&self.runs)
    }

    /// Milliseconds per step: time / steps.
    pub fn ms_per_step(&self) -> Spread {
        Spread::of(self.runs.iter().map(|r| 1e3 * r.secs / r.steps.max(1) as f64))
    }

    /// Tokens per step: tokens / steps.
    pub fn tokens_per_step(&self) -> Spread {
        Spread::of(self.runs.iter().map(|r| r.tokens as f64 / r.steps.max(1) as f64))
    }

    /// Accepted / drafted, for the rows whose steps carry drafts (0 where none was proposed).
    pub fn acceptance(&self) -> Option<Spread> {
        matches!(self.kind, Kind::Window | Kind::Spec | Kind::Mtp)
            .then(|| Spread::of(self.runs.iter().map(|r| if r.drafted == 0 { 0.0 } else { r.accepted as f64 / r.drafted as f64 })))
    }

    /// Whether [`Self::weights_gbps`] is an upper bound (steps of more than one token).
    pub fn gbps_is_upper_bound(&self) -> bool {
        self.kind != Kind::Tg
    }

    /// Whether [`Self::weights_gbps`] means anything: not with kernels left out, whose bytes the
    /// steps did not read.
    pub fn reads_every_weight(&self) -> bool {
        self.dropped.is_none()
    }

    /// GB/s of weights read: `bytes_per_token` (a one-token step's, `step_weight_bytes`) x
    /// tok/s. Exact for one-token steps; for windows an upper bound, as a window reads the
    /// shared weights once for all its tokens (and an expert once for every token choosing it).
    pub fn weights_gbps(&self, bytes_per_token: usize) -> Spread {
        self.tok_s().map(|t| bytes_per_token as f64 * t / 1e9)
    }
}

/// One test's figures over the rounds of one `--variants` item: tok/s over every run of every
/// round, and its median against the first variant's for the same test.
#[derive(Clone, Debug)]
pub struct VariantFigure {
    pub test: String,
    pub variant: String,
    pub rounds: usize,
    pub tok_s: Spread,
    /// This variant's median tok/s over the first variant's (1 for the first).
    pub ratio: f64,
}

/// Characters of the table's test column: 20, or more where a row of the run will have a longer
/// name: the one-token rows at `depths` and the full windows of `windows` tokens under each of
/// `variants` (its last round, `rounds`), and the one-token rows without each `--drop` group of
/// `drops` (as given: prefixes joined by `+`). The rows then line up with the header they stream
/// under.
pub fn test_column_width(n: usize, depths: &[usize], windows: &[usize], variants: &[String], rounds: usize, drops: &[String]) -> usize {
    let name = |kind, depth, window, dropped: Option<String>, variant: Option<(String, usize)>| {
        Row { launch: Launch::Default, kind, n, depth, window, dropped, variant, runs: Vec::new() }.name().chars().count()
    };
    let variant_rows = variants.iter().flat_map(|v| {
        let tg = depths.iter().map(move |&d| name(Kind::Tg, d, 1, None, Some((v.clone(), rounds))));
        tg.chain(windows.iter().map(move |&t| name(Kind::Window, 0, t, None, Some((v.clone(), rounds)))))
    });
    let drop_rows = drops.iter().map(|g| name(Kind::Tg, 0, 1, Some(g.split('+').map(str::trim).collect::<Vec<_>>().join("+")), None));
    variant_rows.chain(drop_rows).fold(20, usize::max)
}

/// The `--variants` summary of `rows` (those with a variant): per test in the order first met,
/// per variant in the order first met, the runs of all its rounds pooled.
pub fn variant_figures(rows: &[Row]) -> Vec<VariantFigure> {
    let mut tests: Vec<String> = Vec::new();
    let mut variants: Vec<String> = Vec::new();
    for (r, (v, _)) in rows.iter().filter_map(|r| Some((r, r.variant.as_ref()?))) {
        if !tests.contains(&r.test()) {
            tests.push(r.test());
        }
        if !variants.contains(v) {
            variants.push(v.clone());
        }
    }
    let mut out = Vec::new();
    for test in &tests {
        let mut first = None;
        for v in &variants {
            let of: Vec<&Row> = rows.iter().filter(|r| r.test() == *test && r.variant.as_ref().is_some_and(|(rv, _)| rv == v)).collect();
            if of.is_empty() {
                continue;
            }
            let tok_s = tok_s(&of.iter().flat_map(|r| r.runs.iter().copied()).collect::<Vec<_>>());
            let base = *first.get_or_insert(tok_s.median);
            out.push(VariantFigure { test: test.clone(), variant: v.clone(), rounds: of.len(), tok_s, ratio: tok_s.median / base });
        }
    }
    out
}

/// Tokens per second of each of `runs`: tokens / time.
fn tok_s(runs: &[Run]) -> Spread {
    Spread::of(runs.iter().map(|r| r.tokens as f64 / r.secs.max(1e-9)))
}

/// The time per phase of a step, where the executor measures it.
#[derive(Clone, Debug)]
pub struct PhaseRow {
    pub phase: &'static str,
    /// Microseconds per step, one figure per run.
    pub us_per_step: Vec<f64>,
}

fn check_runs(runs: usize) -> Result<()> {
    if runs == 0 {
        return Err(Error::Request("at least one run".into()));
    }
    Ok(())
}

/// One generation step: `tokens` at `pos0..`, ending when the tokens it emits are back (the
/// accepted drafts and the model's next token, as [`generate`] reads them).
pub(crate) fn step(exec: &mut dyn Executor, ops: &[Op], tokens: &[u32], pos0: usize) -> Result<Vec<u32>> {
    exec.set_tokens(tokens)?;
    exec.run(ops, Window { tokens: tokens.len(), pos0 })?;
    Ok(exec.emitted()?.ids)
}

/// `n` one-token steps from position `depth` as the decode loop runs them ([`chain`]: each
/// continues the previous one on the device, one queued ahead): the seconds they took and the
/// tokens fed (`first`, then each step's choice but the last).
pub(crate) fn chained_steps(exec: &mut dyn Executor, ops: &[Op], first: u32, depth: usize, n: usize) -> Result<(f64, Vec<u32>)> {
    let mut fed = vec![first];
    let start = Instant::now();
    let (steps, _) = chain(exec, ops, first, depth, n, |id| {
        fed.push(id);
        Ok(true)
    })?;
    let secs = start.elapsed().as_secs_f64();
    if steps != n {
        return Err(Error::Request(format!("{steps} of {n} one-token steps ran")));
    }
    fed.truncate(n);
    Ok((secs, fed))
}

/// `n` one-token steps from position `depth`, each fed the previous step's token (the first
/// `first`) by the host and waited for, calling `after` after each (the phase times of one
/// step at a time).
fn one_token_steps(
    exec: &mut dyn Executor,
    ops: &[Op],
    first: u32,
    depth: usize,
    n: usize,
    mut after: impl FnMut(&mut dyn Executor),
) -> Result<(f64, Vec<u32>)> {
    let mut fed = Vec::with_capacity(n);
    let mut next = first;
    let start = Instant::now();
    for i in 0..n {
        fed.push(next);
        next = step(exec, ops, &[next], depth + i)?[0];
        after(exec);
    }
    Ok((start.elapsed().as_secs_f64(), fed))
}

/// One untimed step of every window size at position 0: first launches, caches and clocks
/// out of the way of the first timed run.
pub fn warm_up(exec: &mut dyn Executor, ops: &[Op], first: u32) -> Result<()> {
    for t in 1..=MAX_WINDOW {
        step(exec, ops, &vec![first; t], 0)?;
    }
    Ok(())
}

/// `tg n` at `depth`: `n` one-token steps at `Window { tokens: 1, pos0: depth + i }`, each fed
/// the model's token from the step before (the first: `first`) as the decode loop feeds them
/// ([`chain`]), timed from the first step's `set_tokens` to the last step's token coming back. The cache below `depth` is whatever
/// earlier runs left there (zeros at first): the time does not depend on its contents.
pub fn tg(exec: &mut dyn Executor, ops: &[Op], first: u32, depth: usize, n: usize, runs: usize) -> Result<Row> {
    check_runs(runs)?;
    let runs = (0..runs)
        .map(|_| chained_steps(exec, ops, first, depth, n).map(|(secs, _)| Run { secs, tokens: n, steps: n, ..Run::default() }))
        .collect::<Result<_>>()?;
    Ok(Row { launch: Launch::Default, kind: Kind::Tg, n, depth, window: 1, dropped: None, variant: None, runs })
}

/// The `n` tokens a greedy decode from `first` at position 0 feeds its steps (`first`, then
/// each step's choice): the input of [`windows`].
pub fn greedy_tokens(exec: &mut dyn Executor, ops: &[Op], first: u32, n: usize) -> Result<Vec<u32>> {
    Ok(chained_steps(exec, ops, first, 0, n)?.1)
}

/// `n` tokens drawn uniformly from a vocabulary of `n_vocab` (seeded), the first `first`: an
/// input of [`windows`] that, unlike [`greedy_tokens`], does not depend on the model's
/// numerics, so two builds whose bits differ verify the same windows (the greedy text changes
/// with the bits, and with it which experts a window's tokens share).
pub fn random_tokens(first: u32, n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut seq = vec![first];
    seq.extend((1..n).map(|_| rng.random_range(0..n_vocab as u32)));
    seq.truncate(n);
    seq
}

/// Full verify windows: `seq` in `seq.len() / t` steps of `t` tokens at consecutive positions
/// from 0, timed like [`tg`]. A window's step computes all its tokens whatever it accepts, so
/// the time is that of full windows for any `seq`. From [`greedy_tokens`] every draft is the
/// model's own choice and is accepted: the throughput ceiling of speculation with windows of
/// `t`. From [`random_tokens`] few are; the row's acceptance says so.
pub fn windows(exec: &mut dyn Executor, ops: &[Op], seq: &[u32], t: usize, runs: usize) -> Result<Row> {
    check_runs(runs)?;
    if !(1..=MAX_WINDOW).contains(&t) {
        return Err(Error::Request(format!("window {t}: 1..={MAX_WINDOW} tokens")));
    }
    let steps = seq.len() / t;
    if steps == 0 {
        return Err(Error::Request(format!("{} tokens make no window of {t}", seq.len())));
    }
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut accepted = 0;
        let start = Instant::now();
        for (s, w) in seq.chunks_exact(t).enumerate() {
            accepted += step(exec, ops, w, s * t)?.len() - 1;
        }
        out.push(Run { secs: start.elapsed().as_secs_f64(), tokens: steps * t, steps, drafted: steps * (t - 1), accepted });
    }
    Ok(Row { launch: Launch::Default, kind: Kind::Window, n: seq.len(), depth: 0, window: t, dropped: None, variant: None, runs: out })
}

/// Speculation with `draft` (prompt lookup or the model's MTP block): [`generate`] of `n` tokens
/// after `prompt` (prefilled in windows of 8, untimed), greedy, end-of-generation ignored,
/// verify windows of up to `spec` tokens. Time: `Stats::decode` (the generation steps, the MTP
/// drafting included); tokens: the `n` generated after the prefill's own token; steps, drafts
/// and accepted drafts from `Stats`.
pub fn spec(exec: &mut dyn Executor, ops: &[Op], draft: &Draft, prompt: &[u32], n: usize, spec: usize, runs: usize) -> Result<Row> {
    check_runs(runs)?;
    let kind = if matches!(draft, Draft::Mtp(_)) { Kind::Mtp } else { Kind::Spec };
    let req = Request { prompt: prompt.to_vec(), n_predict: n + 1, window: MAX_WINDOW, spec, stop: Vec::new(), ignore_eos: true, want_logits: false, draft: draft.clone() };
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let stats = generate(exec, ops, &req, |_, _| Ok(()))?;
        out.push(Run {
            secs: stats.decode.as_secs_f64(),
            tokens: stats.generated.saturating_sub(1),
            steps: stats.steps,
            drafted: stats.drafted,
            accepted: stats.accepted,
        });
    }
    Ok(Row { launch: Launch::Default, kind, n, depth: 0, window: spec, dropped: None, variant: None, runs: out })
}

/// Prefill: `prompt` in windows of `window` tokens from position 0, as [`generate`] prefills,
/// timed from the first window's `set_tokens` to the last window's `next_ids`.
pub fn prefill(exec: &mut dyn Executor, ops: &[Op], prompt: &[u32], window: usize, runs: usize) -> Result<Row> {
    check_runs(runs)?;
    if !(1..=MAX_WINDOW).contains(&window) || prompt.is_empty() {
        return Err(Error::Request(format!("prefill of {} tokens in windows of {window} (1..={MAX_WINDOW})", prompt.len())));
    }
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        for (i, chunk) in prompt.chunks(window).enumerate() {
            exec.set_tokens(chunk)?;
            exec.run(ops, Window { tokens: chunk.len(), pos0: i * window })?;
            exec.next_ids(chunk.len())?;
        }
        out.push(Run { secs: start.elapsed().as_secs_f64(), tokens: prompt.len(), steps: prompt.len().div_ceil(window), ..Run::default() });
    }
    Ok(Row { launch: Launch::Default, kind: Kind::Prefill, n: prompt.len(), depth: 0, window, dropped: None, variant: None, runs: out })
}

/// The MTP block's one-token draft step: one trunk step at position 0 (so the hidden state is
/// the model's), then `n` MTP steps at positions `0..n`, each fed the draft of the one before
/// (the first: `first`), as the decode loop chains drafts; microseconds per MTP step from the
/// first `set_tokens` to the last draft coming back, `runs` times.
pub fn mtp_steps(exec: &mut dyn Executor, ops: &[Op], mtp: &[Op], first: u32, n: usize, runs: usize) -> Result<Spread> {
    check_runs(runs)?;
    let mut us = Vec::with_capacity(runs);
    for _ in 0..runs {
        step(exec, ops, &[first], 0)?;
        let (start, mut draft) = (Instant::now(), first);
        for pos0 in 0..n {
            exec.set_tokens(&[draft])?;
            exec.run(mtp, Window { tokens: 1, pos0 })?;
            draft = exec.next_ids(1)?[0];
        }
        us.push(1e6 * start.elapsed().as_secs_f64() / n as f64);
    }
    Ok(Spread::of(us))
}

/// The time per phase of `n` one-token steps from position 0 (as [`tg`]), `runs` times, from
/// [`Executor::phase_times`] after each step: microseconds per step, in [`PHASES`] order.
/// `None` where the executor does not measure phases (cpu; a GPU executor with profiling off).
pub fn phases(exec: &mut dyn Executor, ops: &[Op], first: u32, n: usize, runs: usize) -> Result<Option<Vec<PhaseRow>>> {
    check_runs(runs)?;
    let mut per_run: Vec<Vec<(&'static str, f64)>> = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut sums: Vec<(&'static str, f64)> = Vec::new();
        let mut measured = true;
        one_token_steps(exec, ops, first, 0, n, |e| match e.phase_times() {
            Some(times) => {
                for (p, ms) in times {
                    add_phase_time(&mut sums, p, ms);
                }
            }
            None => measured = false,
        })?;
        if !measured {
            return Ok(None);
        }
        per_run.push(sums);
    }
    let rows = PHASES
        .iter()
        .filter(|p| per_run.iter().any(|r| r.iter().any(|(q, _)| q == *p)))
        .map(|&phase| PhaseRow {
            phase,
            us_per_step: per_run.iter().map(|r| 1e3 * r.iter().find(|(q, _)| *q == phase).map_or(0.0, |x| x.1) / n as f64).collect(),
        })
        .collect();
    Ok(Some(rows))
}

/// Kernels that pick and emit a step's tokens and move its position on: never left out, or the
/// decode loop the rows time would not be one.
pub const KEEP: [&str; 3] = ["argmax_rows", "sample_rows", "spec_accept"];

/// Kernel families left out of one-token steps together (`strata bench decode --drop`): the
/// step's time without them, against the step with everything, is what they cost inside the
/// chain of launches, where each overlaps its neighbours (a profiler times launches one at a
/// time, so it cannot say). Their outputs keep what they held: where a later kernel's work
/// depends on them (`router_topk`'s group table steers the experts), the difference is not
/// theirs alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropGroup {
    /// Kernel-name prefixes (`moe_down`, `attn_chunk`, `mmvq_q8_0t`, ...).
    pub prefixes: Vec<String>,
    /// How many of a one-token step's launches they match.
    pub launches: usize,
}

impl DropGroup {
    /// `spec` (prefixes joined by `+`) against the kernels a one-token step launches: refused
    /// where a prefix is empty, matches none of them, or matches one of [`KEEP`].
    pub fn parse(spec: &str, step_kernels: &[&str]) -> Result<DropGroup> {
        let prefixes: Vec<String> = spec.split('+').map(|p| p.trim().to_string()).collect();
        for p in &prefixes {
            if p.is_empty() {
                return Err(Error::Request(format!("--drop {spec:?}: an empty kernel prefix")));
            }
            let matched: Vec<&str> = step_kernels.iter().copied().filter(|k| k.starts_with(p.as_str())).collect();
            if matched.is_empty() {
                let mut names = step_kernels.to_vec();
                names.sort_unstable();
                names.dedup();
                return Err(Error::Request(format!("--drop {p}: no kernel of the one-token step starts with it (its kernels: {})", names.join(", "))));
            }
            if let Some(k) = matched.iter().find(|k| KEEP.iter().any(|keep| k.starts_with(keep))) {
                return Err(Error::Request(format!("--drop {p}: {k} picks or emits the step's tokens, which the timed loop needs")));
            }
        }
        let launches = step_kernels.iter().filter(|k| prefixes.iter().any(|p| k.starts_with(p.as_str()))).count();
        Ok(DropGroup { prefixes, launches })
    }

    /// `+`-joined, as given.
    pub fn label(&self) -> String {
        self.prefixes.join("+")
    }

    /// Microseconds the group costs a step, and a launch of it: the median step without it
    /// (`without`) against the median step with everything (`with`), both [`tg`] rows.
    pub fn cost_us(&self, with: &Row, without: &Row) -> (f64, f64) {
        let step = 1e3 * (with.ms_per_step().median - without.ms_per_step().median);
        (step, step / self.launches.max(1) as f64)
    }
}
