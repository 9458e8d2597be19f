//! `strata bench decode --timeline ROUNDS`: the one-token step at each `--depths` and a full window
//! of each `--windows` laid out launch by launch, with the kernels' timeline build (measured by
//! `strata_host::bench::timeline`).
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};

use super::bench::DecodeArgs;
use super::decode::BackendName;
use strata_host::bench::decode as bd;
use strata_host::bench::timeline::{self, Timeline};
use strata_host::model::Model;
use strata_host::step::gpu::GpuExecutor;
use strata_host::step::{Op, Pick};

/// What `--timeline` cannot be combined with, checked before the model loads.
pub(crate) fn check(a: &DecodeArgs) -> anyhow::Result<()> {
    if let Some(b @ (BackendName::Cpu | BackendName::Hip)) = a.backend {
        let b = if b == BackendName::Cpu { "cpu" } else { "hip" };
        bail!("--timeline runs the timeline build of the Rust kernels: it needs --backend cuda, not {b}");
    }
    for (on, flag) in [(!a.drop.is_empty(), "--drop"), (!a.variants.is_empty(), "--variants"), (a.profile_step, "--profile-step")] {
        if on {
            bail!("--timeline replaces the rows with the laid-out step: it does not take {flag}");
        }
    }
    Ok(())
}

/// Opens the timeline build on the GPU, lays out the one-token step at every depth and a full
/// window of every size, and prints the tables.
pub(crate) fn run(a: &DecodeArgs, model: Arc<Model>, depths: &[usize], windows: &[usize], n_ctx: usize) -> anyhow::Result<()> {
    let gpu = strata_host::backends::cuda::open_traced(a.device, crate::ptx::IMAGES)?;
    let mut exec = GpuExecutor::new(gpu, model.clone(), n_ctx, true)?;
    exec.set_graphs(!a.no_graph);
    let header = [
        format!("strata bench decode --timeline: {}: {}", model.weights.file.path.display(), model.describe()),
        format!(
            "backend: cuda on {} (device {}), the timeline build of the {} kernels (each block's first thread stamps %globaltimer at its start, its release from the grid wait and its end), launches {}, {}",
            exec.backend().info().name,
            a.device,
            exec.backend().ptx_arch,
            if exec.backend().chained() { "chained" } else { "unchained" },
            if a.no_graph { "launched one by one" } else { "replayed from graphs" }
        ),
        format!(
            "{} rounds of a step, then the next laid out in a table reset between them (medians over the rounds; the first launch's gap is its own wait, the step before having ended): the one-token step at the next position; the second of two full windows of random tokens (seed {})",
            a.timeline, a.window_seed
        ),
    ];
    for line in &header {
        if a.json {
            eprintln!("strata: {line}");
        } else {
            println!("{line}");
        }
    }
    let ops = model.step_ops(Op::Pick(Pick::Greedy));
    let first = bd::PATTERN[0];
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(ProgressStyle::with_template("{spinner} bench decode --timeline: {msg} ({elapsed})").expect("a valid template"));
    spinner.enable_steady_tick(Duration::from_millis(200));
    spinner.set_message("warm-up");
    bd::warm_up(&mut exec, &ops, first)?;
    let show = |t: &Timeline| spinner.suspend(|| if a.json { print_json(t) } else { print_tables(t) });
    for &depth in depths {
        spinner.set_message(format!("the one-token step at depth {depth}, {} rounds", a.timeline));
        show(&timeline::one_token(&mut exec, &ops, first, depth, a.timeline)?);
    }
    for &t in windows {
        spinner.set_message(format!("a full window of {t}, {} rounds", a.timeline));
        let seq = bd::random_tokens(first, 2 * t, model.config.n_vocab, a.window_seed);
        show(&timeline::window(&mut exec, &ops, &seq, a.timeline)?);
    }
    spinner.finish_and_clear();
    Ok(())
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// `depth D` for a one-token step, `full windows of T` for a window's.
fn label(t: &Timeline) -> String {
    if !t.window {
        format!("depth {}", t.depth)
    } else {
        format!("full windows of {}", t.tokens)
    }
}

fn print_tables(t: &Timeline) {
    let (gaps, runs) = t.gaps_and_runs();
    let step = gaps + runs;
    println!();
    println!(
        "{}: a step {:.1} us (median of {} rounds, {:.1}..{:.1}); {} launches; their gaps {:.1} us ({:.1} %), their runs {:.1} us ({:.1} %); timer steps of {} seen",
        label(t),
        t.step_us.median,
        t.rounds,
        t.step_us.min,
        t.step_us.max,
        t.launches.len(),
        gaps,
        pct(gaps, step),
        runs,
        pct(runs, step),
        t.timer_step_ns.map_or("n/a".into(), |ns| format!("{ns} ns"))
    );
    println!(
        "| {:<32} | {:>8} | {:>13} | {:>13} | {:>15} | {:>15} | {:>16} | {:>15} | {:>9} |",
        "kernel", "launches", "gap us/launch", "run us/launch", "block us/launch", "early us/launch", "spread us/launch", "gap+run us/step", "% of step"
    );
    println!("|{:-<34}|{:->10}|{:->15}|{:->15}|{:->17}|{:->17}|{:->18}|{:->17}|{:->11}|", "", ":", ":", ":", ":", ":", ":", ":", ":");
    for f in &t.families {
        let n = f.launches as f64;
        let block = if f.block_launches > 0 { format!("{:.2}", f.block_us / f.block_launches as f64) } else { "-".into() };
        println!(
            "| {:<32} | {:>8} | {:>13.2} | {:>13.2} | {:>15} | {:>15.2} | {:>16.2} | {:>15.1} | {:>9.1} |",
            f.kernel,
            f.launches,
            f.gap_us / n,
            f.run_us / n,
            block,
            f.early_us / n,
            f.spread_us / n,
            f.gap_us + f.run_us,
            pct(f.gap_us + f.run_us, step)
        );
    }
    print_marks(t);
    println!("launches in order ({}; end: microseconds from the previous step's last launch's end):", label(t));
    println!(
        "| {:>4} | {:<32} | {:>6} | {:>8} | {:>7} | {:>7} | {:>8} | {:>9} | {:>8} |",
        "#", "kernel", "blocks", "early us", "gap us", "run us", "block us", "spread us", "end us"
    );
    println!("|{:->6}|{:-<34}|{:->8}|{:->10}|{:->9}|{:->9}|{:->10}|{:->11}|{:->10}|", ":", "", ":", ":", ":", ":", ":", ":", ":");
    let mut end = 0.0;
    for (i, l) in t.launches.iter().enumerate() {
        end += l.gap_us + l.run_us;
        let block = l.block_us.map_or("-".into(), |b| format!("{b:.2}"));
        println!(
            "| {:>4} | {:<32} | {:>6} | {:>8.2} | {:>7.2} | {:>7.2} | {:>8} | {:>9.2} | {:>8.1} |",
            i, l.kernel, l.blocks, l.early_us, l.gap_us, l.run_us, block, l.spread_us, end
        );
    }
}

/// The kernels with marks (`trace_mark!`): each mark's mean time from a block's release, then
/// the mean block run, over the kernel's launches that have them.
fn print_marks(t: &Timeline) {
    let marked: Vec<_> = t.families.iter().filter(|f| !f.marks.is_empty()).collect();
    if marked.is_empty() {
        return;
    }
    println!("inside the kernels (microseconds from a block's release to each of its kernel's marks, then to its end; means over the blocks, a launch):");
    println!("| {:<32} | {:>8} | {:>18} | {:>18} | {:>18} | {:>18} | {:>8} |", "kernel", "launches", "mark 1", "mark 2", "mark 3", "mark 4", "end");
    println!("|{:-<34}|{:->10}|{:->20}|{:->20}|{:->20}|{:->20}|{:->10}|", "", ":", ":", ":", ":", ":", ":");
    for f in marked {
        let mean = |sum: f64, n: usize| if n > 0 { format!("{:.2}", sum / n as f64) } else { "-".into() };
        let mut cells: Vec<String> = f.marks.iter().map(|(name, sum, n)| format!("{name} {}", mean(*sum, *n))).collect();
        cells.resize(strata_host::backends::trace::MARKS, String::new());
        println!(
            "| {:<32} | {:>8} | {:>18} | {:>18} | {:>18} | {:>18} | {:>8} |",
            f.kernel,
            f.launches,
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            mean(f.block_us, f.block_launches)
        );
    }
}

/// `null` for `None`.
fn json_opt(v: Option<f64>) -> String {
    v.map_or("null".into(), |v| v.to_string())
}

fn print_json(t: &Timeline) {
    let (gaps, runs) = t.gaps_and_runs();
    println!(
        "{{\"test\":\"timeline\",\"tokens\":{},\"depth\":{},\"rounds\":{},\"step_us\":{},\"step_us_min\":{},\"step_us_max\":{},\"launches\":{},\"gap_us\":{gaps},\"run_us\":{runs},\"timer_step_ns\":{}}}",
        t.tokens,
        t.depth,
        t.rounds,
        t.step_us.median,
        t.step_us.min,
        t.step_us.max,
        t.launches.len(),
        t.timer_step_ns.map_or("null".into(), |ns| ns.to_string())
    );
    for f in &t.families {
        println!(
            "{{\"test\":\"timeline kernel\",\"tokens\":{},\"depth\":{},\"kernel\":\"{}\",\"launches\":{},\"gap_us\":{},\"run_us\":{},\"early_us\":{},\"spread_us\":{},\"block_us\":{},\"block_launches\":{},\"marks\":[{}]}}",
            t.tokens,
            t.depth,
            f.kernel,
            f.launches,
            f.gap_us,
            f.run_us,
            f.early_us,
            f.spread_us,
            f.block_us,
            f.block_launches,
            f.marks.iter().map(|(name, us, n)| format!("{{\"name\":\"{name}\",\"us\":{us},\"launches\":{n}}}")).collect::<Vec<_>>().join(",")
        );
    }
    for (i, l) in t.launches.iter().enumerate() {
        println!(
            "{{\"test\":\"timeline launch\",\"tokens\":{},\"depth\":{},\"index\":{i},\"kernel\":\"{}\",\"blocks\":{},\"gap_us\":{},\"run_us\":{},\"early_us\":{},\"spread_us\":{},\"block_us\":{},\"marks\":{{{}}}}}",
            t.tokens,
            t.depth,
            l.kernel,
            l.blocks,
            l.gap_us,
            l.run_us,
            l.early_us,
            l.spread_us,
            json_opt(l.block_us),
            l.marks.iter().map(|(name, us)| format!("\"{name}\":{}", json_opt(*us))).collect::<Vec<_>>().join(",")
        );
    }
}
