//! `strata bench decode --timeline`: a step's launches laid out in time, from the timeline
//! build's stamps ([`crate::backends::trace`]). Each round runs a step (a one-token step, or a
//! full window), resets the table, runs the next step (the one-token step at the next position,
//! or the next full window) and reads its launches; the figures are medians over the rounds.
//! (One step a table: a graph's replays stamp the same `%gridid`s, so two steps of one graph
//! would share their slots.)
//!
//! For launch `i` of the step (in launch order), with the stamps' times:
//!
//! - `gap` = its first block's release from the grid wait - launch `i - 1`'s last block end: the
//!   chain's handoff (the grid's completion, its memory flush, the release);
//! - `run` = its last block end - its first release;
//! - `early` = its first release - its first block start: how long its blocks were resident
//!   before the release (the preamble the chain overlaps with the grid before);
//! - `spread` = its last release - its first: blocks that started late (more blocks than fit);
//! - `block` = the mean of its blocks' runs, release to end: near `run` where every block takes
//!   the launch's time (a chain of latencies in each), well below it where late or slow blocks
//!   make the launch's time (waves, a tail);
//! - each mark of the kernel (`trace_mark!`): the mean over its blocks of the time from their
//!   release to the mark, so that a block's run splits into the phases between its marks.
//!
//! `gap + run` of every launch telescopes to the step's span (its first block's start to its last
//! end), so the step splits exactly into handoffs and runs. The table holds no launch before the
//! step's first, which follows the table's reset after the step before had finished: its gap is
//! its own blocks' wait for their release (`early`), not a handoff.
use crate::backends::trace::{self, Entry, LaunchTrace};
use crate::bench::decode::{chained_steps, step, Spread};
use crate::error::{Error, Result};
use crate::step::gpu::GpuExecutor;
use crate::step::Op;

/// One launch of a traced step, microseconds (in a [`Timeline`], medians over the rounds: the
/// mean block run and each mark's over the rounds that had it).
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: String,
    pub blocks: u32,
    pub gap_us: f64,
    pub run_us: f64,
    pub early_us: f64,
    pub spread_us: f64,
    /// The mean block run; `None` where the blocks' releases and ends do not pair up.
    pub block_us: Option<f64>,
    /// The kernel's marks in order: each its name and the mean time from a block's release to
    /// it (`None` where not every released block passed it once).
    pub marks: Vec<(String, Option<f64>)>,
}

/// `later - earlier` in microseconds. The difference is taken in integers: `%globaltimer` counts
/// nanoseconds since 1970 (about 2^60.6), where an f64 steps by 256 ns.
fn us(later: u64, earlier: u64) -> f64 {
    (i128::from(later) - i128::from(earlier)) as f64 / 1e3
}

/// The launches of the last whole step in `traced` (a table's launches in launch order; `entries`
/// names their entry indices and marks), where `step` is one step's kernel sequence. Refused
/// where the trace does not hold the sequence (launches lost to a slot clash, or a step that
/// launched otherwise).
pub fn step_launches(traced: &[LaunchTrace], entries: &[Entry], step: &[&str]) -> Result<Vec<Launch>> {
    let name = |l: &LaunchTrace| entries.get(l.entry as usize).map_or("?", |e| e.name.as_str());
    let found = if step.is_empty() { None } else { traced.windows(step.len()).rposition(|w| w.iter().zip(step).all(|(l, k)| name(l) == *k)) };
    let Some(at) = found else {
        let got: Vec<&str> = traced.iter().map(name).collect();
        return Err(Error::Request(format!(
            "timeline: the table's {} launches do not hold the step's {} ({}...); they are {}...",
            traced.len(),
            step.len(),
            step.iter().take(4).copied().collect::<Vec<_>>().join(", "),
            got.iter().take(8).copied().collect::<Vec<_>>().join(", ")
        )));
    };
    Ok(traced[at..at + step.len()]
        .iter()
        .enumerate()
        .map(|(i, l)| {
            // The first launch of the first step in the table has no launch before it.
            let before = if at + i > 0 { traced[at + i - 1].last_end } else { l.first_start };
            Launch {
                kernel: name(l).to_string(),
                blocks: l.blocks,
                gap_us: us(l.first_release, before),
                run_us: us(l.last_end, l.first_release),
                early_us: us(l.first_release, l.first_start),
                spread_us: us(l.last_release, l.first_release),
                block_us: l.mean_block_run_ns().map(|ns| ns / 1e3),
                marks: entries.get(l.entry as usize).map_or(Vec::new(), |e| {
                    (1..=trace::MARKS).filter_map(|n| Some((e.marks[n - 1].clone()?, l.mean_mark_ns(n).map(|ns| ns / 1e3)))).collect()
                }),
            }
        })
        .collect())
}

/// The smallest step of the timer between two distinct stamps of `traced`, nanoseconds.
pub fn timer_step_ns(traced: &[LaunchTrace]) -> Option<u64> {
    let mut t: Vec<u64> = traced.iter().flat_map(|l| [l.first_start, l.first_release, l.last_release, l.last_end]).collect();
    t.sort_unstable();
    t.dedup();
    t.windows(2).map(|w| w[1] - w[0]).min()
}

/// A kernel's launches in the step together: sums of their medians, a step (`block_us` and each
/// mark's: the sum over the launches that have it, and how many do).
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyRow {
    pub kernel: String,
    pub launches: usize,
    pub gap_us: f64,
    pub run_us: f64,
    pub early_us: f64,
    /// Its launches' spreads summed (blocks released late: more blocks than the SMs held, or a
    /// grid slow to dispatch).
    pub spread_us: f64,
    pub block_us: f64,
    pub block_launches: usize,
    /// The kernel's marks: name, sum, launches.
    pub marks: Vec<(String, f64, usize)>,
}

impl FamilyRow {
    /// The row of `l`'s kernel before any launch is added.
    fn of(l: &Launch) -> FamilyRow {
        FamilyRow {
            kernel: l.kernel.clone(),
            launches: 0,
            gap_us: 0.0,
            run_us: 0.0,
            early_us: 0.0,
            spread_us: 0.0,
            block_us: 0.0,
            block_launches: 0,
            marks: l.marks.iter().map(|(name, _)| (name.clone(), 0.0, 0)).collect(),
        }
    }

    /// Adds launch `l` of the kernel.
    fn add(&mut self, l: &Launch) {
        self.launches += 1;
        self.gap_us += l.gap_us;
        self.run_us += l.run_us;
        self.early_us += l.early_us;
        self.spread_us += l.spread_us;
        self.block_us += l.block_us.unwrap_or(0.0);
        self.block_launches += usize::from(l.block_us.is_some());
        for ((_, sum, n), (_, v)) in self.marks.iter_mut().zip(&l.marks) {
            *sum += v.unwrap_or(0.0);
            *n += usize::from(v.is_some());
        }
    }
}

/// A step laid out, medians over `rounds`.
#[derive(Clone, Debug)]
pub struct Timeline {
    /// A full window's step (else a one-token step, run after the one before it had ended), its
    /// tokens, and the depth its round starts from (`--depths`; 0 for full windows).
    pub window: bool,
    pub tokens: usize,
    pub depth: usize,
    pub rounds: usize,
    /// The step's span (the sum of every launch's gap and run), over the rounds.
    pub step_us: Spread,
    pub launches: Vec<Launch>,
    /// Largest share of the step first.
    pub families: Vec<FamilyRow>,
    /// The smallest timer step seen, nanoseconds.
    pub timer_step_ns: Option<u64>,
}

impl Timeline {
    /// The launches' gaps and runs, summed: microseconds a step.
    pub fn gaps_and_runs(&self) -> (f64, f64) {
        (self.launches.iter().map(|l| l.gap_us).sum(), self.launches.iter().map(|l| l.run_us).sum())
    }
}

/// The median of the values where every round has one: a median over only the rounds that had
/// a value would not compare with the medians over all of them (a block mean over two rounds
/// could exceed the launch's run over three, the block's own run never does).
fn median_of_all(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let all: Option<Vec<f64>> = values.collect();
    all.map(|v| Spread::of(v).median)
}

/// The medians of `rounds` (each a step's launches, the same kernels in the same order) of a
/// full window of `tokens` (`window`) or the one-token step at `depth`.
pub fn summarize(window: bool, tokens: usize, depth: usize, rounds: &[Vec<Launch>], timer_step_ns: Option<u64>) -> Timeline {
    assert!(!rounds.is_empty(), "a timeline of no rounds");
    let median = |f: &dyn Fn(&Launch) -> f64, i: usize| Spread::of(rounds.iter().map(|r| f(&r[i]))).median;
    let launches: Vec<Launch> = (0..rounds[0].len())
        .map(|i| Launch {
            kernel: rounds[0][i].kernel.clone(),
            blocks: rounds[0][i].blocks,
            gap_us: median(&|l| l.gap_us, i),
            run_us: median(&|l| l.run_us, i),
            early_us: median(&|l| l.early_us, i),
            spread_us: median(&|l| l.spread_us, i),
            block_us: median_of_all(rounds.iter().map(|r| r[i].block_us)),
            marks: (0..rounds[0][i].marks.len()).map(|m| (rounds[0][i].marks[m].0.clone(), median_of_all(rounds.iter().map(|r| r[i].marks[m].1)))).collect(),
        })
        .collect();
    let mut families: Vec<FamilyRow> = Vec::new();
    for l in &launches {
        let at = match families.iter().position(|f| f.kernel == l.kernel) {
            Some(at) => at,
            None => {
                families.push(FamilyRow::of(l));
                families.len() - 1
            }
        };
        families[at].add(l);
    }
    families.sort_by(|a, b| (b.gap_us + b.run_us).total_cmp(&(a.gap_us + a.run_us)));
    let step_us = Spread::of(rounds.iter().map(|r| r.iter().map(|l| l.gap_us + l.run_us).sum()));
    Timeline { window, tokens, depth, rounds: rounds.len(), step_us, launches, families, timer_step_ns }
}

/// Lays out the one-token step at `depth` on `exec` (opened with the timeline build), `rounds`
/// times: each round the step at `depth`, then the one at `depth + 1`, whose launches are kept.
pub fn one_token(exec: &mut GpuExecutor, ops: &[Op], first: u32, depth: usize, rounds: usize) -> Result<Timeline> {
    // (The kernels of the kept step, at `depth + 1`: a step past a context bound launches others.)
    let step = exec.step_kernels(ops, &[first], depth + 1)?;
    let at = |depth| move |e: &mut GpuExecutor| chained_steps(e, ops, first, depth, 1).map(|_| ());
    let laid = lay_out(exec, &step, rounds, at(depth), at(depth + 1))?;
    Ok(summarize(false, 1, depth, &laid.0, laid.1))
}

/// Lays out a full window of `seq.len() / 2` tokens on `exec`, `rounds` times: each round the
/// windows `seq[..t]` at position 0 and `seq[t..]` at `t`, as the full-window rows run them, the
/// second's launches kept.
pub fn window(exec: &mut GpuExecutor, ops: &[Op], seq: &[u32], rounds: usize) -> Result<Timeline> {
    let t = seq.len() / 2;
    if t == 0 || seq.len() != 2 * t {
        return Err(Error::Request(format!("timeline: two windows of tokens, not {}", seq.len())));
    }
    let kernels = exec.step_kernels(ops, &seq[t..], t)?;
    let laid = lay_out(exec, &kernels, rounds, |e| step(e, ops, &seq[..t], 0).map(|_| ()), |e| step(e, ops, &seq[t..], t).map(|_| ()))?;
    Ok(summarize(true, t, 0, &laid.0, laid.1))
}

/// `rounds` rounds of `before` (a step, run to its end) then `kept` (the step that launches
/// `kernels`) into a table reset between them, each laid out; and the smallest timer step seen.
fn lay_out(
    exec: &mut GpuExecutor,
    kernels: &[&str],
    rounds: usize,
    mut before: impl FnMut(&mut GpuExecutor) -> Result<()>,
    mut kept: impl FnMut(&mut GpuExecutor) -> Result<()>,
) -> Result<(Vec<Vec<Launch>>, Option<u64>)> {
    if rounds == 0 {
        return Err(Error::Request("timeline: at least one round".into()));
    }
    let entries = exec
        .backend()
        .trace_entries()
        .ok_or_else(|| Error::Request("timeline: the executor's kernels are not the timeline build".into()))?
        .to_vec();
    if kernels.len() > trace::SLOTS {
        return Err(Error::Request(format!("timeline: a step of {} launches; the table tells {} apart", kernels.len(), trace::SLOTS)));
    }
    let (mut laid, mut timer) = (Vec::with_capacity(rounds), None::<u64>);
    for _ in 0..rounds {
        before(exec)?;
        exec.backend().trace_reset()?;
        kept(exec)?;
        let traced = trace::launches(&exec.backend().trace_read()?).map_err(|e| Error::Request(format!("timeline: {e}")))?;
        // The step's launches in slots of their own: fewer, and launches stamped the same slots
        // (a %gridid that does not number each launch of a step), their times mixed.
        if traced.len() < kernels.len() {
            return Err(Error::Request(format!(
                "timeline: the table holds {} launches after a step of {}: %gridid does not number each launch here",
                traced.len(),
                kernels.len()
            )));
        }
        timer = match (timer, timer_step_ns(&traced)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        laid.push(step_launches(&traced, &entries, kernels)?);
    }
    Ok((laid, timer))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launch whose blocks ran from `release` to `end` on average (every block released once).
    fn l(gridid: u64, entry: u32, blocks: u32, start: u64, release: u64, last_release: u64, end: u64) -> LaunchTrace {
        let (sum_release, sum_end) = (blocks as u64 * release, blocks as u64 * end);
        LaunchTrace {
            gridid,
            entry,
            blocks,
            first_start: start,
            first_release: release,
            last_release,
            last_end: end,
            releases: blocks,
            sum_release,
            sum_end,
            mark_sums: [0; trace::MARKS],
            mark_counts: [0; trace::MARKS],
        }
    }

    /// Entries norm, proj (marks 1 `loaded` and 3 `summed`) and attn.
    fn names() -> Vec<Entry> {
        let e = |name: &str| Entry { name: name.into(), marks: Default::default() };
        let proj = Entry { marks: [Some("loaded".into()), None, Some("summed".into()), None], ..e("proj") };
        vec![e("norm"), proj, e("attn")]
    }

    #[test]
    fn the_last_step_in_the_trace_splits_into_gaps_and_runs() {
        // Two steps of norm, proj, attn (entries 0, 1, 2); times in ns.
        let traced = [
            l(1, 0, 8, 0, 1_000, 1_000, 2_000),
            l(2, 1, 64, 1_500, 2_500, 3_000, 6_000),
            l(3, 2, 16, 5_000, 7_000, 7_000, 9_000),
            l(4, 0, 8, 8_500, 10_000, 10_000, 11_000),
            // proj's blocks reached `loaded` 0.5 us after their release on average; one of them
            // never reached `summed`.
            LaunchTrace { mark_sums: [64 * 11_900, 0, 63 * 14_000, 0], mark_counts: [64, 0, 63, 0], ..l(5, 1, 64, 10_200, 11_400, 11_900, 15_000) },
            LaunchTrace { releases: 15, ..l(6, 2, 16, 14_000, 16_000, 16_500, 18_000) },
        ];
        let got = step_launches(&traced, &names(), &["norm", "proj", "attn"]).unwrap();
        let want = [
            Launch { kernel: "norm".into(), blocks: 8, gap_us: 1.0, run_us: 1.0, early_us: 1.5, spread_us: 0.0, block_us: Some(1.0), marks: vec![] },
            Launch {
                kernel: "proj".into(),
                blocks: 64,
                gap_us: 0.4,
                run_us: 3.6,
                early_us: 1.2,
                spread_us: 0.5,
                block_us: Some(3.6),
                marks: vec![("loaded".into(), Some(0.5)), ("summed".into(), None)],
            },
            Launch { kernel: "attn".into(), blocks: 16, gap_us: 1.0, run_us: 2.0, early_us: 2.0, spread_us: 0.5, block_us: None, marks: vec![] },
        ];
        assert_eq!(got.len(), 3);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((g.kernel.as_str(), g.blocks), (w.kernel.as_str(), w.blocks));
            for (a, b) in [(g.gap_us, w.gap_us), (g.run_us, w.run_us), (g.early_us, w.early_us), (g.spread_us, w.spread_us)] {
                assert!((a - b).abs() < 1e-9, "{g:?} against {w:?}");
            }
            assert_eq!(g.block_us.map(|b| (b * 1e6).round()), w.block_us.map(|b| (b * 1e6).round()), "{g:?} against {w:?}");
            let marks = |l: &Launch| l.marks.iter().map(|(n, v)| (n.clone(), v.map(|v| (v * 1e6).round()))).collect::<Vec<_>>();
            assert_eq!(marks(g), marks(w), "{g:?} against {w:?}");
        }
        // The gaps and runs telescope to the period: the first step's end to the second's.
        let period: f64 = got.iter().map(|x| x.gap_us + x.run_us).sum();
        assert!((period - 9.0).abs() < 1e-9);
        assert_eq!(timer_step_ns(&traced), Some(200));
        // A lone step's first launch has no launch before it: its gap is its early part.
        let lone = step_launches(&traced[..3], &names(), &["norm", "proj", "attn"]).unwrap();
        assert!((lone[0].gap_us - 1.0).abs() < 1e-9 && (lone[1].gap_us - 0.5).abs() < 1e-9);
    }

    /// Stamps as `%globaltimer` gives them (nanoseconds since 1970): a one-block launch's run is
    /// its block's run to the nanosecond (an f64 of each stamp would round them to 256 ns).
    #[test]
    fn differences_of_wall_clock_stamps_are_exact() {
        let t0 = 1_764_950_000_123_456_789u64;
        let traced = [l(1, 0, 1, t0, t0 + 1_024, t0 + 1_024, t0 + 2_176), l(2, 1, 1, t0 + 2_208, t0 + 2_720, t0 + 2_720, t0 + 3_552)];
        let got = step_launches(&traced, &names(), &["norm", "proj"]).unwrap();
        let got: Vec<_> = got.iter().map(|l| (l.gap_us, l.run_us, l.early_us, l.block_us)).collect();
        assert_eq!(got, [(1.024, 1.152, 1.024, Some(1.152)), (0.544, 0.832, 0.512, Some(0.832))]);
    }

    #[test]
    fn a_trace_without_the_step_is_refused() {
        let traced = [l(1, 0, 8, 0, 1, 1, 2), l(2, 2, 8, 2, 3, 3, 4)];
        let err = step_launches(&traced, &names(), &["norm", "proj", "attn"]).unwrap_err().to_string();
        assert!(err.contains("do not hold the step's 3") && err.contains("norm, attn"), "{err}");
        assert!(step_launches(&[], &names(), &["norm"]).is_err());
        // An entry index outside the module's entries names no kernel of the step.
        assert!(step_launches(&[l(1, 9, 1, 0, 1, 1, 2)], &names(), &["norm"]).is_err());
    }

    #[test]
    fn rounds_give_medians_and_families_sum_their_launches() {
        let round = |scale: f64| {
            vec![
                Launch { kernel: "norm".into(), blocks: 8, gap_us: 1.0 * scale, run_us: 1.0, early_us: 0.5, spread_us: 0.0, block_us: Some(0.5 * scale), marks: vec![] },
                Launch {
                    kernel: "proj".into(),
                    blocks: 64,
                    gap_us: 0.5,
                    run_us: 4.0 * scale,
                    early_us: 1.0,
                    spread_us: 0.2,
                    block_us: Some(scale),
                    marks: vec![("loaded".into(), Some(scale)), ("summed".into(), (scale < 3.0).then_some(1.0))],
                },
                // A one-block launch (its block's run is the launch's) whose first round lost
                // its release stamp: over the other two rounds its block mean would be 3.75 us
                // against a run of 3.
                Launch { kernel: "norm".into(), blocks: 1, gap_us: 1.0, run_us: 1.5 * scale, early_us: 0.5, spread_us: 0.0, block_us: (scale > 1.0).then_some(1.5 * scale), marks: vec![] },
            ]
        };
        let t = summarize(false, 1, 0, &[round(1.0), round(3.0), round(2.0)], Some(32));
        assert_eq!(t.rounds, 3);
        assert_eq!(t.launches.iter().map(|l| l.kernel.as_str()).collect::<Vec<_>>(), ["norm", "proj", "norm"]);
        assert_eq!((t.launches[0].gap_us, t.launches[1].run_us), (2.0, 8.0), "medians over the rounds");
        // proj: 0.5 + 8 = 8.5 a step, ahead of norm's two launches: 2 + 1 + 1 + 3 = 7.
        assert_eq!(t.families.iter().map(|f| (f.kernel.as_str(), f.launches)).collect::<Vec<_>>(), [("proj", 1), ("norm", 2)]);
        assert_eq!((t.families[1].gap_us, t.families[1].run_us), (3.0, 4.0));
        // proj's spread is 0.2 in every round; norm's 0 (one block, or all released at once).
        assert_eq!((t.families[0].spread_us, t.families[1].spread_us), (0.2, 0.0));
        // The mean block runs: medians over the rounds where every round had one (proj: 2), none
        // where a round had none (the second norm: never more than its run); a family sums
        // those it has.
        assert_eq!(t.launches.iter().map(|l| l.block_us).collect::<Vec<_>>(), [Some(1.0), Some(2.0), None]);
        assert!(t.launches.iter().all(|l| l.block_us.is_none_or(|b| b <= l.run_us)));
        assert_eq!((t.families[1].block_us, t.families[1].block_launches), (1.0, 1));
        // A mark's median likewise; the family sums it over the launches that have it.
        assert_eq!(t.launches[1].marks, [("loaded".to_string(), Some(2.0)), ("summed".to_string(), None)]);
        assert_eq!(t.families[0].marks, [("loaded".to_string(), 2.0, 1), ("summed".to_string(), 0.0, 0)]);
        assert!(t.families[1].marks.is_empty());
        assert_eq!(t.gaps_and_runs(), (3.5, 12.0));
        // The period of each round (6.5 scale + 2.5): 9, 22 and 15.5 us; the median 15.5.
        assert_eq!((t.step_us.median, t.step_us.min, t.step_us.max), (15.5, 9.0, 22.0));
    }
}
