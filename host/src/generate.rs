//! The decode loop: prefill the prompt in windows, then generate one token a step, handing each
//! token (and, when asked, the logits it was chosen from) to the caller as it arrives.
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::step::{Executor, Op, Window, MAX_WINDOW};

/// What to decode.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub n_predict: usize,
    /// Prompt tokens per prefill step (1..=MAX_WINDOW).
    pub window: usize,
    /// Token ids that end generation (ignored with `ignore_eos`).
    pub stop: Vec<u32>,
    pub ignore_eos: bool,
    /// Hand the logits each token was chosen from to the caller.
    pub want_logits: bool,
}

/// Timings of one decode.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub prefill: Duration,
    pub generated: usize,
    pub decode: Duration,
    /// Host time spent issuing the generation steps' ops (for a GPU backend: enqueueing the
    /// launches; the step's total time is in `decode`).
    pub enqueue: Duration,
    /// Time per phase summed over the generation steps, where the backend measured it (ms).
    pub phases: Vec<(&'static str, f64)>,
    /// Why generation ended.
    pub stopped: Stop,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stop {
    #[default]
    Length,
    Eos,
    Context,
}

/// Runs `req` through `ops` on `exec`. `on_token(id, logits)` sees every generated token in
/// order, as soon as its step is done; it may stop the decode by returning an error.
pub fn generate(exec: &mut dyn Executor, ops: &[Op], req: &Request, mut on_token: impl FnMut(u32, Option<&[f32]>) -> Result<()>) -> Result<Stats> {
    let n_ctx = exec.n_ctx();
    if req.prompt.is_empty() {
        return Err(Error::Request("the prompt is empty".into()));
    }
    if req.prompt.len() >= n_ctx {
        return Err(Error::Request(format!("the prompt has {} tokens; the context holds {n_ctx} positions (raise --ctx)", req.prompt.len())));
    }
    if !(1..=MAX_WINDOW).contains(&req.window) {
        return Err(Error::Request(format!("window {} (1..={MAX_WINDOW})", req.window)));
    }
    let mut stats = Stats { prompt_tokens: req.prompt.len(), ..Stats::default() };
    let start = Instant::now();
    let mut pos = 0;
    let mut next = 0;
    let mut logits: Option<Vec<f32>> = None;
    for chunk in req.prompt.chunks(req.window) {
        let w = Window { tokens: chunk.len(), pos0: pos };
        exec.set_tokens(chunk)?;
        exec.run(ops, w)?;
        next = *exec.next_ids(w.tokens)?.last().expect("a window has a token");
        if req.want_logits {
            let all = exec.logits(w.tokens)?;
            logits = Some(all[all.len() / w.tokens * (w.tokens - 1)..].to_vec());
        }
        pos += chunk.len();
    }
    stats.prefill = start.elapsed();
    let start = Instant::now();
    loop {
        on_token(next, logits.as_deref())?;
        stats.generated += 1;
        if !req.ignore_eos && req.stop.contains(&next) {
            stats.stopped = Stop::Eos;
            break;
        }
        if stats.generated >= req.n_predict {
            break;
        }
        if pos >= n_ctx {
            stats.stopped = Stop::Context;
            break;
        }
        let w = Window { tokens: 1, pos0: pos };
        exec.set_tokens(&[next])?;
        let issue = Instant::now();
        exec.run(ops, w)?;
        stats.enqueue += issue.elapsed();
        next = exec.next_ids(1)?[0];
        if req.want_logits {
            logits = Some(exec.logits(1)?);
        }
        if let Some(times) = exec.phase_times() {
            for (p, ms) in times {
                match stats.phases.iter_mut().find(|(q, _)| *q == p) {
                    Some((_, t)) => *t += ms,
                    None => stats.phases.push((p, ms)),
                }
            }
        }
        pos += 1;
    }
    stats.decode = start.elapsed();
    Ok(stats)
}

/// The logits of every position of `seq` (`n_vocab` per position), fed in windows of `window`
/// tokens from position 0 (teacher forcing): what window invariance and the reference
/// comparisons check.
pub fn forced_logits(exec: &mut dyn Executor, ops: &[Op], seq: &[u32], window: usize) -> Result<Vec<f32>> {
    let mut all = Vec::new();
    for (i, chunk) in seq.chunks(window).enumerate() {
        let w = Window { tokens: chunk.len(), pos0: i * window };
        exec.set_tokens(chunk)?;
        exec.run(ops, w)?;
        exec.next_ids(w.tokens)?;
        all.extend(exec.logits(w.tokens)?);
    }
    Ok(all)
}
