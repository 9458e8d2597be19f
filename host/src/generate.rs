//! The decode loop: prefill the prompt in windows, then generate in verify windows (the last
//! token and up to `spec - 1` drafts: from prompt lookup on the host, or from the model's MTP
//! block run on the backend after each window, [`Draft`]),
//! or without speculation in one-token steps that follow each other on the device ([`chain`]:
//! the host keeps one step queued ahead and never writes a step's input), handing each token
//! (and, when asked, the logits it was chosen from) to the caller as it arrives. The model's choice at a position does not depend on the window it is computed in
//! (window invariance, and sampling's random number from (seed, position)), so speculation
//! changes how many steps the tokens take, never the tokens.
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::step::{add_phase_time, Executor, Op, Window, MAX_WINDOW};

/// What to decode.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub n_predict: usize,
    /// Prompt tokens per prefill step (1..=MAX_WINDOW).
    pub window: usize,
    /// Verify-window size while generating (1..=MAX_WINDOW): the last token plus up to
    /// `spec - 1` drafts; 1 is no speculation.
    pub spec: usize,
    /// Token ids that end generation (ignored with `ignore_eos`).
    pub stop: Vec<u32>,
    pub ignore_eos: bool,
    /// Hand the logits each token was chosen from to the caller.
    pub want_logits: bool,
    /// Where the verify windows' drafts come from.
    pub draft: Draft,
}

/// The drafts of a verify window.
#[derive(Clone, Debug, PartialEq)]
pub enum Draft {
    /// None: every step is one token.
    None,
    /// Prompt lookup: the continuation of the longest recent n-gram seen before ([`crate::lookup`]).
    Lookup,
    /// The model's MTP block, as this op list ([`crate::model::Model::mtp_ops`]): after every
    /// trunk step it runs over the step's positions (its KV cache and the first draft), then
    /// chains one-token steps for the other drafts.
    Mtp(Vec<Op>),
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
    /// Generation steps, drafts proposed and drafts accepted.
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
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
    if req.prompt.is_empty() || req.n_predict == 0 {
        return Err(Error::Request(format!("a prompt of {} tokens, {} to generate: both must be at least 1", req.prompt.len(), req.n_predict)));
    }
    if req.prompt.len() >= n_ctx {
        return Err(Error::Request(format!("the prompt has {} tokens; the context holds {n_ctx} positions (raise --ctx)", req.prompt.len())));
    }
    if !(1..=MAX_WINDOW).contains(&req.window) || !(1..=MAX_WINDOW).contains(&req.spec) {
        return Err(Error::Request(format!("window {} and speculation window {} (each 1..={MAX_WINDOW})", req.window, req.spec)));
    }
    let mut stats = Stats { prompt_tokens: req.prompt.len(), ..Stats::default() };
    exec.drain()?;
    let start = Instant::now();
    let mut pos = 0;
    let mut next = 0;
    let mut logits: Option<Vec<f32>> = None;
    // MTP drafts are made only for verify windows.
    let mtp = match &req.draft {
        Draft::Mtp(ops) if req.spec > 1 => Some(ops.as_slice()),
        _ => None,
    };
    // The MTP block's draft for the position after the next window's first.
    let mut mtp_draft = None;
    for chunk in req.prompt.chunks(req.window) {
        let w = Window { tokens: chunk.len(), pos0: pos };
        exec.set_tokens(chunk)?;
        exec.run(ops, w)?;
        next = *exec.next_ids(w.tokens)?.last().expect("a window has a token");
        if exec.nan_rows(w.tokens)?[w.tokens - 1] {
            return Err(all_nan(w.pos0 + w.tokens - 1));
        }
        if req.want_logits {
            let all = exec.logits(w.tokens)?;
            logits = Some(all[all.len() / w.tokens * (w.tokens - 1)..].to_vec());
        }
        if let Some(mtp) = mtp {
            // Row t reads the token after its position: the prompt's, then the model's choice.
            let after: Vec<u32> = (pos + 1..=pos + chunk.len()).map(|p| req.prompt.get(p).copied().unwrap_or(next)).collect();
            mtp_draft = Some(mtp_step(exec, mtp, &after, pos, &mut stats)?);
        }
        pos += chunk.len();
    }
    stats.prefill = start.elapsed();
    let start = Instant::now();
    let mut history = req.prompt.clone();
    // Hands a token on; whether generation goes on after it.
    let mut emit = |id: u32, logits: Option<&[f32]>, stats: &mut Stats| -> Result<bool> {
        on_token(id, logits)?;
        stats.generated += 1;
        if !req.ignore_eos && req.stop.contains(&id) {
            stats.stopped = Stop::Eos;
            return Ok(false);
        }
        Ok(stats.generated < req.n_predict)
    };
    let mut go = emit(next, logits.as_deref(), &mut stats)?;
    history.push(next);
    // Chained steps, unless the caller wants each step's logits or the executor times each
    // step's phases (both need the step read before the next one is queued).
    if go && req.spec == 1 && !req.want_logits && !exec.times_phases() {
        let max = (n_ctx - pos).min(req.n_predict - stats.generated);
        let (steps, enqueue) = chain(exec, ops, next, pos, max, |id| emit(id, None, &mut stats))?;
        (stats.steps, stats.enqueue) = (steps, enqueue);
        if steps == max && stats.generated < req.n_predict && stats.stopped != Stop::Eos {
            stats.stopped = Stop::Context;
        }
        stats.decode = start.elapsed();
        return Ok(stats);
    }
    while go {
        if pos >= n_ctx {
            stats.stopped = Stop::Context;
            break;
        }
        // The window: the last token, then drafts that fit the context and the tokens left.
        let room = (n_ctx - pos).min(req.n_predict - stats.generated).min(req.spec);
        let mut window = vec![next];
        match (&req.draft, mtp, mtp_draft) {
            (Draft::Lookup, ..) => window.extend(crate::lookup::draft(&history, room - 1)),
            (_, Some(mtp), Some(first)) if room > 1 => {
                // Draft k (k >= 2) chains from draft k - 1 at position pos + k - 2, on the MTP
                // block's own hidden state of the step before.
                window.push(first);
                while window.len() < room {
                    let d = mtp_step(exec, mtp, &[*window.last().expect("not empty")], pos + window.len() - 2, &mut stats)?;
                    window.push(d);
                }
            }
            _ => {}
        }
        let w = Window { tokens: window.len(), pos0: pos };
        exec.set_tokens(&window)?;
        let issue = Instant::now();
        exec.run(ops, w)?;
        stats.enqueue += issue.elapsed();
        let out = exec.emitted()?;
        if let Some(i) = out.all_nan.iter().position(|&f| f) {
            return Err(all_nan(pos + i));
        }
        let rows = if req.want_logits { Some(exec.logits(w.tokens)?) } else { None };
        (stats.steps, stats.drafted, stats.accepted) = (stats.steps + 1, stats.drafted + w.tokens - 1, stats.accepted + out.ids.len() - 1);
        for (p, ms) in exec.phase_times().unwrap_or_default() {
            add_phase_time(&mut stats.phases, p, ms);
        }
        let n_vocab = rows.as_ref().map_or(0, |r| r.len() / w.tokens);
        for (i, &id) in out.ids.iter().enumerate() {
            go = emit(id, rows.as_ref().map(|r| &r[i * n_vocab..(i + 1) * n_vocab]), &mut stats)?;
            history.push(id);
            if !go {
                break;
            }
        }
        if let (true, Some(mtp)) = (go, mtp) {
            // The MTP block over the accepted positions (each reads the token after it): its
            // cache, and the first draft of the next window.
            mtp_draft = Some(mtp_step(exec, mtp, &out.ids, pos, &mut stats)?);
        }
        pos += out.ids.len();
        next = *out.ids.last().expect("a window emits at least one token");
    }
    stats.decode = start.elapsed();
    Ok(stats)
}

/// Up to `max` one-token steps from position `pos`, the first fed `first` and each later one
/// the token the step before chose: from the second step on the window is continued on the
/// device ([`Executor::run_continued`]), and the host keeps one step queued ahead of the one
/// whose token it reads. `on_token(id)` sees each token as soon as its step is done and says
/// whether to go on (a step queued past the last one read is left to finish and forgotten).
/// Returns the steps read and the host time spent queueing them.
pub fn chain(exec: &mut dyn Executor, ops: &[Op], first: u32, pos: usize, max: usize, mut on_token: impl FnMut(u32) -> Result<bool>) -> Result<(usize, Duration)> {
    if max == 0 {
        return Ok((0, Duration::ZERO));
    }
    let issue = Instant::now();
    exec.set_tokens(&[first])?;
    exec.run(ops, Window { tokens: 1, pos0: pos })?;
    let mut enqueue = issue.elapsed();
    let (mut queued, mut read) = (1, 0);
    loop {
        if queued < max {
            let issue = Instant::now();
            exec.run_continued(ops, pos + queued)?;
            enqueue += issue.elapsed();
            queued += 1;
        }
        let out = exec.emitted()?;
        read += 1;
        if out.all_nan[0] {
            return Err(all_nan(pos + read - 1));
        }
        if !on_token(out.ids[0])? || read == max {
            break;
        }
    }
    exec.drain()?;
    Ok((read, enqueue))
}

/// The logits of every position of `seq` (`n_vocab` per position), fed in windows of `window`
/// tokens from position 0 (teacher forcing): what window invariance and the reference
/// comparisons check.
pub fn forced_logits(exec: &mut dyn Executor, ops: &[Op], seq: &[u32], window: usize) -> Result<Vec<f32>> {
    if !(1..=MAX_WINDOW).contains(&window) {
        return Err(Error::Request(format!("window {window} (1..={MAX_WINDOW})")));
    }
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

/// One MTP step over positions `pos ..` fed `after` (the token after each position; the hidden
/// states are where the last step left them): returns its last row's draft, and adds its time
/// to the `mtp` phase when the executor measures phases.
fn mtp_step(exec: &mut dyn Executor, mtp: &[Op], after: &[u32], pos: usize, stats: &mut Stats) -> Result<u32> {
    exec.set_tokens(after)?;
    exec.run(mtp, Window { tokens: after.len(), pos0: pos })?;
    let draft = *exec.next_ids(after.len())?.last().expect("a window has a token");
    if let Some(times) = exec.phase_times() {
        add_phase_time(&mut stats.phases, "mtp", times.iter().map(|(_, ms)| ms).sum());
    }
    Ok(draft)
}

/// Greedy decoding met a row of NaN logits at `pos`: there is no token to pick.
fn all_nan(pos: usize) -> Error {
    Error::Request(format!("the model's logits at position {pos} are all NaN: greedy decoding has no token to pick"))
}
