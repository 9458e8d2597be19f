//! `strata bench decode`: the measuring functions on the CPU executor (and, where there is a GPU,
//! the profiled phases), and the CLI on the built-in model: every row, the JSON figures, and
//! clear refusals. GPU cases skip without a GPU unless `STRATA_REQUIRE_GPU=1`.
mod common;

use std::process::Command;
use std::sync::Arc;

use strata::host::bench::decode::{self as bd, Kind, Launch, Row, Run, Spread};
use strata::host::bench::timeline;
use strata::host::generate::{generate, Draft, Request};
use strata::host::gguf::GgufFile;
use strata::host::model::synth::{build_in_memory, SynthSpec};
use strata::host::model::Model;
use strata::host::step::cpu::CpuExecutor;
use strata::host::step::gpu::GpuExecutor;
use strata::host::step::{Op, Pick};

fn tiny() -> Arc<Model> {
    let file = GgufFile::from_bytes(build_in_memory(&SynthSpec::tiny()), "<built-in model>").expect("the built-in model parses");
    Arc::new(Model::load(Arc::new(file)).expect("the built-in model loads"))
}

/// The binary under test: cargo's, or `STRATA_BIN` where the tests run away from the build.
fn strata(args: &[&str]) -> (i32, String, String) {
    let bin = std::env::var("STRATA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_strata").to_string());
    let out = Command::new(&bin).args(args).env_remove("STRATA_REQUIRE_GPU").env_remove("STRATA_BENCH_MODEL").output().unwrap_or_else(|e| panic!("{bin}: {e}"));
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The small, fast bench every CLI test runs, on `backend`.
fn small(backend: &str) -> Vec<&str> {
    vec!["bench", "decode", "--builtin", "--backend", backend, "-n", "16", "--depths", "0,300", "--windows", "2,4", "--spec", "4,8", "--prefill", "32", "--runs", "2"]
}

/// The number after `"key":` in a JSON line (`None` when the key is absent or null).
fn figure(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn check_row(r: &Row, runs: usize, tokens: usize) {
    assert_eq!(r.runs.len(), runs, "{}: one timing per run", r.name());
    for run in &r.runs {
        assert!(run.secs > 0.0, "{}: {run:?}", r.name());
        assert_eq!(run.tokens, tokens, "{}: {run:?}", r.name());
    }
    assert!(r.tok_s().min > 0.0 && r.tok_s().min <= r.tok_s().median && r.tok_s().median <= r.tok_s().max, "{}: {:?}", r.name(), r.tok_s());
}

#[test]
fn the_measurements_on_the_cpu_executor_time_every_run() {
    let model = tiny();
    let ops = model.step_ops(Op::Pick(Pick::Greedy));
    let (n, runs) = (12, 3);
    let n_ctx = bd::context_for(&[0, 200], n, 24, model.config.n_ctx_train).expect("fits the model");
    let mut exec = CpuExecutor::new(model.clone(), n_ctx).expect("cpu executor");
    let first = bd::PATTERN[0];
    bd::warm_up(&mut exec, &ops, first).unwrap();
    for depth in [0, 200] {
        let r = bd::tg(&mut exec, &ops, first, depth, n, runs).unwrap();
        assert_eq!((r.kind, r.depth, r.window), (Kind::Tg, depth, 1));
        check_row(&r, runs, n);
        assert!(r.runs.iter().all(|x| x.steps == n && x.drafted == 0));
        assert_eq!(r.tokens_per_step(), Spread { median: 1.0, min: 1.0, max: 1.0 });
    }
    // The window inputs are the tokens a greedy decode chooses: generate's, after `first`.
    let seq = bd::greedy_tokens(&mut exec, &ops, first, n).unwrap();
    let mut chosen = Vec::new();
    let req = Request { prompt: vec![first], n_predict: n - 1, window: 1, spec: 1, stop: Vec::new(), ignore_eos: true, want_logits: false, draft: Draft::Lookup };
    generate(&mut exec, &ops, &req, |id, _| {
        chosen.push(id);
        Ok(())
    })
    .unwrap();
    assert_eq!(seq[0], first);
    assert_eq!(seq[1..], chosen[..]);
    for t in [2, 4, 5] {
        let r = bd::windows(&mut exec, &ops, &seq, t, runs).unwrap();
        check_row(&r, runs, n / t * t);
        // Every draft is the model's own choice: all accepted (window invariance).
        for run in &r.runs {
            assert_eq!((run.steps, run.drafted, run.accepted), (n / t, n / t * (t - 1), n / t * (t - 1)), "window {t}");
        }
        assert_eq!(r.acceptance().unwrap().min, 1.0);
    }
    // The random input: the seed's tokens alone, whatever the model computes.
    let n_vocab = model.config.n_vocab;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("a clock after 1970").as_nanos() as u64;
    println!("random window input: seed {seed:#x}");
    let random = bd::random_tokens(first, n, n_vocab, seed);
    assert_eq!((random.len(), random[0]), (n, first));
    assert!(random.iter().all(|&id| (id as usize) < n_vocab), "{random:?}");
    assert_eq!(random, bd::random_tokens(first, n, n_vocab, seed), "the seed fixes the tokens");
    assert_ne!(random, bd::random_tokens(first, n, n_vocab, seed.wrapping_add(1)), "another seed, other tokens");
    assert_ne!(random, seq, "not the greedy text");
    for t in [2, 4] {
        let r = bd::windows(&mut exec, &ops, &random, t, runs).unwrap();
        check_row(&r, runs, n / t * t);
        for run in &r.runs {
            assert_eq!((run.steps, run.drafted), (n / t, n / t * (t - 1)), "window {t}");
            assert!(run.accepted <= run.drafted, "window {t}: {run:?}");
        }
    }
    let prompt = bd::pattern(bd::SPEC_PROMPT);
    assert_eq!(&prompt[..9], &[11, 12, 13, 14, 15, 16, 17, 18, 11]);
    for s in [1, 4, 8] {
        let r = bd::spec(&mut exec, &ops, &Draft::Lookup, &prompt, n, s, runs).unwrap();
        check_row(&r, runs, n);
        let a = r.acceptance().unwrap();
        assert!((0.0..=1.0).contains(&a.min) && (0.0..=1.0).contains(&a.max), "spec {s}: {a:?}");
        let per = r.tokens_per_step();
        assert!(per.min >= 1.0 && per.max <= s as f64, "spec {s}: {per:?}");
        for run in &r.runs {
            assert_eq!(run.steps + run.accepted, n, "spec {s}: each step emits its accepted drafts and one token: {run:?}");
        }
        if s == 1 {
            assert_eq!(r.runs[0].drafted, 0);
        }
    }
    let r = bd::prefill(&mut exec, &ops, &bd::pattern(24), 8, runs).unwrap();
    check_row(&r, runs, 24);
    assert!(r.runs.iter().all(|x| x.steps == 3));
    assert!(bd::phases(&mut exec, &ops, first, n, runs).unwrap().is_none(), "the cpu executor has no phase timers");
    // Refusals, not panics.
    assert!(bd::tg(&mut exec, &ops, first, n_ctx, 1, 1).is_err());
    assert!(bd::tg(&mut exec, &ops, first, 0, 1, 0).is_err());
    assert!(bd::windows(&mut exec, &ops, &seq, 9, 1).is_err());
    assert!(bd::windows(&mut exec, &ops, &seq[..1], 2, 1).is_err());
}

/// The test column fits the longest row the run will print: 20 characters at least, a
/// variant's last round of the widest window or deepest one-token row, a `--drop` group's row.
#[test]
fn the_test_column_fits_the_longest_row() {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(bd::test_column_width(128, &[0, 32768], &[2, 4, 8], &[], 3, &[]), 20);
    // `tg128 win8 [ATTN_FUSE=0 #3]` and `tg128 @ d32768 [ATTN_FUSE=0 #3]`.
    assert_eq!(bd::test_column_width(128, &[0], &[4, 8], &v(&["knobs", "ATTN_FUSE=0"]), 3, &[]), "tg128 win8 [ATTN_FUSE=0 #3]".len());
    assert_eq!(bd::test_column_width(128, &[0, 32768], &[], &v(&["ATTN_FUSE=0"]), 3, &[]), "tg128 @ d32768 [ATTN_FUSE=0 #3]".len());
    assert_eq!(bd::test_column_width(128, &[0], &[], &[], 2, &v(&["moe_down + moe_combine"])), "tg128 w/o moe_down+moe_combine".len());
}

#[test]
fn spreads_and_contexts() {
    assert_eq!(Spread::of([3.0, 1.0, 2.0]), Spread { median: 2.0, min: 1.0, max: 3.0 });
    assert_eq!(Spread::of([4.0, 1.0, 2.0, 10.0]), Spread { median: 3.0, min: 1.0, max: 10.0 });
    assert_eq!(bd::context_for(&[0, 8192, 32768], 128, 512, 40960).unwrap(), 32768 + 128 + 8);
    assert_eq!(bd::context_for(&[0], 16, 512, 4096).unwrap(), 512 + 8);
    assert_eq!(bd::context_for(&[], 16, 0, 4096).unwrap(), bd::SPEC_PROMPT + 17 + 8);
    let e = bd::context_for(&[0, 8192], 128, 512, 4096).unwrap_err().to_string();
    assert!(e.contains("8328-position context") && e.contains("4096"), "{e}");
}

#[test]
fn the_cli_prints_every_row() {
    let (code, out, err) = strata(&small("cpu"));
    assert_eq!(code, 0, "{out}\n{err}");
    for want in [
        "strata bench decode: <built-in model>: qwen3moe, 4 layers, 8 experts top-2",
        "formats: embedding",
        "backend: cpu",
        "| test ",
        "tok/s median",
        "| tg16  ",
        "| tg16 @ d300 ",
        "| tg16 win2 ",
        "| tg16 win4 ",
        "| tg16 spec4 ",
        "| tg16 spec8 ",
        "| pp32 win8 ",
        "per phase: n/a",
    ] {
        assert!(out.contains(want), "no `{want}` in:\n{out}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn the_cli_json_has_every_figure() {
    let mut args = small("cpu");
    args.push("--json");
    let (code, out, err) = strata(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    let names = ["tg16", "tg16 @ d300", "tg16 win2", "tg16 win4", "tg16 spec4", "tg16 spec8", "pp32 win8", "tg16 phases"];
    assert_eq!(lines.len(), names.len(), "{out}");
    for (line, name) in lines.iter().zip(names) {
        assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
        assert!(line.contains(&format!("\"test\":\"{name}\"")), "{line}");
        assert!(line.contains("\"backend\":\"cpu\""), "{line}");
        if name.ends_with("phases") {
            assert!(line.contains("\"phases\":null"), "{line}");
            continue;
        }
        for key in ["tok_s", "ms_per_step", "tokens_per_step", "gbps"] {
            for k in [key.to_string(), format!("{key}_min"), format!("{key}_max")] {
                let v = figure(line, &k).unwrap_or_else(|| panic!("no {k} in {line}"));
                assert!(v > 0.0 && v.is_finite(), "{k} = {v} in {line}");
            }
        }
        for k in ["n", "window", "runs", "tokens", "steps", "weight_bytes_per_token"] {
            assert!(figure(line, k).is_some_and(|v| v > 0.0), "{k} in {line}");
        }
        assert!(line.contains("\"pct_copy\":null") && line.contains("\"copy_gbps\":null"), "{line}");
        let input = if line.contains("\"kind\":\"window\"") { "\"window_input\":\"greedy\"" } else { "\"window_input\":null" };
        assert!(line.contains(input), "{line}");
        let (per, window) = (figure(line, "tokens_per_step").unwrap(), figure(line, "window").unwrap());
        let kind = ["tg", "window", "spec", "prefill"].into_iter().find(|k| line.contains(&format!("\"kind\":\"{k}\""))).expect("a kind");
        assert_eq!(line.contains("\"gbps_upper_bound\":true"), kind != "tg", "{line}");
        match kind {
            "spec" => {
                let a = figure(line, "acceptance").unwrap_or_else(|| panic!("no acceptance in {line}"));
                assert!((0.0..=1.0).contains(&a), "{line}");
                assert!((1.0..=window).contains(&per), "{line}");
            }
            // Every draft of a full window is the model's own choice.
            "window" => assert_eq!((per, figure(line, "acceptance")), (window, Some(1.0)), "{line}"),
            _ => {
                assert_eq!(per, window, "{line}");
                assert!(line.contains("\"acceptance\":null"), "{line}");
            }
        }
    }
}

/// `--window-input random`: the header names the input and its seed, the window rows run all
/// their steps, and their acceptance is a fraction (not every draft is the model's choice).
#[test]
fn the_cli_verifies_random_windows() {
    let args = ["bench", "decode", "--builtin", "--backend", "cpu", "-n", "16", "--depths", "0", "--windows", "2,4", "--spec", "", "--prefill", "0", "--runs", "1", "--window-input", "random", "--window-seed", "7"];
    let (code, out, err) = strata(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("full windows verify 16 tokens drawn uniformly from the") && out.contains("(seed 7)"), "{out}");
    let (code, json, err) = strata(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 0, "{json}\n{err}");
    let windows: Vec<&str> = json.lines().filter(|l| l.contains("\"kind\":\"window\"")).collect();
    assert_eq!(windows.len(), 2, "{json}");
    for (line, t) in windows.iter().zip([2.0, 4.0]) {
        assert_eq!(figure(line, "window"), Some(t), "{line}");
        assert_eq!(figure(line, "steps"), Some(16.0 / t), "{line}");
        assert!(figure(line, "acceptance").is_some_and(|a| (0.0..=1.0).contains(&a)), "{line}");
        assert!(line.contains("\"window_input\":\"random\",\"window_seed\":7"), "{line}");
    }
    // The greedy default says so.
    let (_, out, _) = strata(&["bench", "decode", "--builtin", "--backend", "cpu", "-n", "8", "--depths", "0", "--windows", "2", "--spec", "", "--prefill", "0", "--runs", "1"]);
    assert!(out.contains(&format!("full windows verify the model's greedy text from token {}", bd::PATTERN[0])), "{out}");
}

#[test]
fn the_cli_refuses_clearly() {
    let mut deep = small("cpu");
    let at = deep.iter().position(|a| *a == "--depths").unwrap() + 1;
    deep[at] = "0,5000";
    for (args, says) in [
        (deep, "the model's context is 4096 positions"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--windows", "2,nine"], "bad --windows item (1..8 tokens) `nine`"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--spec", "4,9"], "bad --spec item (1..8 tokens) `9`"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--depths", "0,-1"], "bad --depths item `-1`"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "-n", "4", "--depths", "0", "--windows", "8"], "--windows 8: more tokens than the 4 of -n"),
        (vec!["bench", "decode", "--builtin", "--backend", "tpu"], "invalid value 'tpu' for '--backend"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--window-input", "typed"], "invalid value 'typed' for '--window-input"),
        (vec!["bench", "decode"], "strata synth --preset 30b-a3b --out F"),
        (vec!["bench", "decode", "/nonexistent/strata-bench.gguf"], "/nonexistent/strata-bench.gguf"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "-n", "16", "--depths", "0", "--profile-step"], "--profile-step brackets a step for a GPU profiler: it needs --backend cuda or hip"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "-n", "16", "--depths", "0", "--drop", "moe_down"], "--drop leaves kernel launches out of the step: it needs --backend cuda or hip"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "-n", "16", "--depths", "0", "--variants", "knobs,EXPDEC_WARP_ROWS=0"], "--variants sets the GPU's kernel knobs: it needs --backend cuda or hip"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--variants", "knobs,EXPDEC_R=3"], "--variants: STRATA_EXPDEC_R=\"3\": expected 0|1|2"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--variants", "EXPDEC_WARP_ROWS"], "variant \"EXPDEC_WARP_ROWS\": expected plain, knobs or KNOB=VALUE"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--variants", "EXPDEC_MINB=4+EXPDEC_R=2"], "EXPDEC_MINB=4 needs EXPDEC_R<=1"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--variants", "knobs", "--variant-rounds", "0"], "--variant-rounds"),
        (vec!["bench", "decode", "--builtin", "--backend", "cpu", "--timeline", "2"], "--timeline runs the timeline build of the Rust kernels: it needs --backend cuda, not cpu"),
        (vec!["bench", "decode", "--builtin", "--backend", "hip", "--timeline", "2"], "it needs --backend cuda, not hip"),
        (vec!["bench", "decode", "--builtin", "--backend", "cuda", "--timeline", "2", "--drop", "moe_down"], "--timeline replaces the rows with the laid-out step: it does not take --drop"),
        (vec!["bench", "decode", "--builtin", "--backend", "cuda", "--timeline", "2", "--variants", "knobs"], "it does not take --variants"),
        (vec!["bench", "decode", "--builtin", "--timeline", "two"], "invalid value 'two' for '--timeline"),
    ] {
        let (code, out, err) = strata(&args);
        assert_eq!(code, 2, "{args:?}:\n{out}\n{err}");
        assert!(err.contains(says), "{args:?}: no `{says}` in:\n{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A `--drop` group: prefixes matched against a step's kernels and counted; refused where a
/// prefix is empty, matches nothing (the error lists the step's kernels) or matches a kernel the
/// timed loop needs; its cost the difference of the two rows' median steps.
#[test]
fn drop_groups_count_their_launches_and_refuse_what_the_loop_needs() {
    let step = ["rms_norm_q8_1", "mmvq_q8_0t", "attn_prep", "attn_chunk_two_128", "mmvq_q8_0t", "moe_down_iq4_nlt", "moe_combine", "mmvq1_q8_0t", "argmax_rows_split", "argmax_rows_final", "spec_accept"];
    let g = bd::DropGroup::parse("mmvq_q8_0t", &step).unwrap();
    assert_eq!((g.launches, g.label()), (2, "mmvq_q8_0t".to_string()));
    // A prefix takes every kernel it begins (`mmvq` both matvec families), `+` joins prefixes.
    assert_eq!(bd::DropGroup::parse("mmvq", &step).unwrap().launches, 3);
    let g = bd::DropGroup::parse("attn_chunk+moe_down + moe_combine", &step).unwrap();
    assert_eq!((g.launches, g.prefixes.len(), g.label()), (3, 3, "attn_chunk+moe_down+moe_combine".to_string()));
    let e = bd::DropGroup::parse("expdec_gu", &step).unwrap_err().to_string();
    assert!(e.contains("--drop expdec_gu: no kernel") && e.contains("argmax_rows_final, argmax_rows_split, attn_chunk_two_128, attn_prep,"), "{e}");
    for keep in ["argmax", "spec_accept", "moe_down+spec"] {
        let e = bd::DropGroup::parse(keep, &step).unwrap_err().to_string();
        assert!(e.contains("picks or emits the step's tokens"), "{keep}: {e}");
    }
    assert!(bd::DropGroup::parse("moe_down+", &step).unwrap_err().to_string().contains("an empty kernel prefix"));
    // Steps of 2.0 and 2.2 ms with everything (median 2.1, the mean of the middle two) and of
    // 1.5 without: 0.6 ms a step over 2 launches.
    let row = |ms: &[f64]| Row {
        launch: Launch::Default,
        kind: Kind::Tg,
        n: 10,
        depth: 0,
        window: 1,
        dropped: None,
        variant: None,
        runs: ms.iter().map(|&m| Run { secs: m * 10.0 / 1e3, tokens: 10, steps: 10, ..Run::default() }).collect(),
    };
    let (step_us, launch_us) = bd::DropGroup::parse("mmvq_q8_0t", &step).unwrap().cost_us(&row(&[2.0, 2.2]), &row(&[1.5]));
    assert!((step_us - 600.0).abs() < 1e-6 && (launch_us - 300.0).abs() < 1e-6, "{step_us} {launch_us}");
    let without = Row { dropped: Some("mmvq_q8_0t".into()), ..row(&[1.5]) };
    assert_eq!(without.name(), "tg10 w/o mmvq_q8_0t");
    assert!(!without.reads_every_weight() && row(&[1.0]).reads_every_weight());
}

/// `--variants`' rows are named by variant and round, and the summary pools each variant's runs
/// over its rounds, per test, with its median over the first variant's.
#[test]
fn variant_rows_pool_their_rounds_against_the_first_variant() {
    // Runs of 10 tokens in `secs`: 10 / secs tok/s.
    let row = |kind: Kind, window: usize, v: &str, round: usize, secs: &[f64]| Row {
        launch: Launch::Default,
        kind,
        n: 10,
        depth: 0,
        window,
        dropped: None,
        variant: Some((v.to_string(), round)),
        runs: secs.iter().map(|&s| Run { secs: s, tokens: 10, steps: 10, ..Run::default() }).collect(),
    };
    let rows = [
        row(Kind::Tg, 1, "knobs", 1, &[1.0, 0.5]),
        row(Kind::Window, 4, "knobs", 1, &[0.25]),
        row(Kind::Tg, 1, "EXPDEC_WARP_ROWS=1", 1, &[0.5]),
        row(Kind::Window, 4, "EXPDEC_WARP_ROWS=1", 1, &[0.2]),
        row(Kind::Tg, 1, "knobs", 2, &[0.25]),
        row(Kind::Window, 4, "knobs", 2, &[0.25]),
        row(Kind::Tg, 1, "EXPDEC_WARP_ROWS=1", 2, &[0.4]),
        row(Kind::Window, 4, "EXPDEC_WARP_ROWS=1", 2, &[0.1]),
    ];
    assert_eq!(rows[2].name(), "tg10 [EXPDEC_WARP_ROWS=1 #1]");
    assert_eq!((rows[7].name(), rows[7].test()), ("tg10 win4 [EXPDEC_WARP_ROWS=1 #2]".to_string(), "tg10 win4".to_string()));
    let f = bd::variant_figures(&rows);
    let got: Vec<(&str, &str, usize)> = f.iter().map(|f| (f.test.as_str(), f.variant.as_str(), f.rounds)).collect();
    assert_eq!(got, [("tg10", "knobs", 2), ("tg10", "EXPDEC_WARP_ROWS=1", 2), ("tg10 win4", "knobs", 2), ("tg10 win4", "EXPDEC_WARP_ROWS=1", 2)]);
    // tg10: knobs 10, 20 and 40 tok/s (median 20), EXPDEC_WARP_ROWS=1 20 and 25 (median 22.5).
    assert_eq!(f[0].tok_s, Spread { median: 20.0, min: 10.0, max: 40.0 });
    assert!((f[0].ratio - 1.0).abs() < 1e-12 && (f[1].ratio - 22.5 / 20.0).abs() < 1e-12, "{f:?}");
    // win4: knobs 40 and 40, EXPDEC_WARP_ROWS=1 50 and 100 (median 75).
    assert!((f[3].tok_s.median - 75.0).abs() < 1e-9 && (f[3].ratio - 75.0 / 40.0).abs() < 1e-12, "{f:?}");
    // Rows without a variant take no part.
    let plain = Row { variant: None, ..rows[0].clone() };
    assert!(bd::variant_figures(&[plain]).is_empty());
}

#[test]
fn gpu_phases_and_copy_bandwidth() {
    for name in ["cuda", "hip"] {
        let Some(gpu) = common::open_gpu(name) else { continue };
        let model = tiny();
        let ops = model.step_ops(Op::Pick(Pick::Greedy));
        let mut exec = GpuExecutor::new(gpu, model, 256, false).expect("the built-in model fits the GPU");
        assert!(bd::phases(&mut exec, &ops, bd::PATTERN[0], 4, 2).unwrap().is_none(), "{name}: profiling is off");
        exec.set_profiling(true);
        let rows = bd::phases(&mut exec, &ops, bd::PATTERN[0], 4, 2).unwrap().expect("profiled phases");
        exec.set_profiling(false);
        for want in ["attention", "router", "experts", "head", "sampling", "other"] {
            let row = rows.iter().find(|r| r.phase == want).unwrap_or_else(|| panic!("{name}: no phase {want}: {rows:?}"));
            assert_eq!(row.us_per_step.len(), 2, "{name}: {row:?}");
            assert!(row.us_per_step.iter().all(|&us| us > 0.0), "{name}: {row:?}");
        }
        // One step between cuProfilerStart and cuProfilerStop (no profiler attached: both are
        // no-ops that must succeed), and the executor's queue intact after it.
        let profiled = exec.profiled(|e| bd::tg(e, &ops, bd::PATTERN[0], 0, 1, 1)).expect("a profiled step");
        check_row(&profiled, 1, 1);
        check_row(&bd::tg(&mut exec, &ops, bd::PATTERN[0], 0, 4, 2).unwrap(), 2, 4);
        let mut args = small(name);
        args.push("--profile-step");
        args.push("--json");
        let (code, out, err) = strata(&args);
        assert_eq!(code, 0, "{out}\n{err}");
        let rows: Vec<&str> = out.lines().collect();
        assert!(rows.iter().all(|l| figure(l, "copy_gbps").is_some_and(|c| c > 0.0)), "{out}");
        // Graphs by default, and the same one-token steps launched eagerly beside them.
        assert!(rows.iter().any(|l| l.contains("\"test\":\"tg16 eager\"")), "{name}: no eager row in {out}");
        assert!(rows.iter().filter(|l| !l.contains("phases")).all(|l| figure(l, "pct_copy").is_some_and(|p| p > 0.0)), "{out}");
        assert!(rows.iter().filter(|l| l.contains("\"phase\":")).count() >= 6, "{out}");
        assert!(rows.iter().filter(|l| l.contains("\"phase\":")).all(|l| figure(l, "us_per_step").is_some_and(|u| u > 0.0)), "{out}");
    }
}

/// `--drop` on a GPU: a row of one-token steps without each group (no weight bandwidth: it did
/// not read them all), then the chained-cost table: the step with everything and its launch
/// count, each group's launches and its cost a step and a launch. A prefix matching no kernel
/// of the step is refused, naming it.
#[test]
fn gpu_drop_rows_and_chained_costs() {
    for name in ["cuda", "hip"] {
        if common::open_gpu(name).is_none() {
            continue;
        }
        let args = ["bench", "decode", "--builtin", "--backend", name, "-n", "16", "--depths", "0", "--windows", "", "--spec", "", "--prefill", "0", "--runs", "2"];
        let mut json = args.to_vec();
        json.extend(["--drop", "moe_down,attn_chunk+attn_prep", "--json"]);
        let (code, out, err) = strata(&json);
        assert_eq!(code, 0, "{out}\n{err}");
        for dropped in ["moe_down", "attn_chunk+attn_prep"] {
            let row = out.lines().find(|l| l.contains(&format!("\"test\":\"tg16 w/o {dropped}\""))).unwrap_or_else(|| panic!("{name}: no row without {dropped}: {out}"));
            assert!(figure(row, "tok_s").is_some_and(|t| t > 0.0) && row.contains("\"gbps\":null"), "{name}: {row}");
            let cost = out.lines().find(|l| l.contains("chained cost") && l.contains(&format!("\"dropped\":\"{dropped}\""))).unwrap_or_else(|| panic!("{name}: no cost of {dropped}: {out}"));
            // The built-in model has 4 layers: one down launch each, and one chunk and one prep.
            assert_eq!(figure(cost, "launches"), Some(if dropped == "moe_down" { 4.0 } else { 8.0 }), "{name}: {cost}");
            assert!(figure(cost, "us_per_step").is_some() && figure(cost, "ms_per_step").is_some_and(|m| m > 0.0), "{name}: {cost}");
        }
        let all = out.lines().find(|l| l.contains("chained cost") && l.contains("\"dropped\":null")).unwrap_or_else(|| panic!("{name}: no step with everything: {out}"));
        assert!(figure(all, "launches").is_some_and(|n| n > 8.0), "{name}: {all}");
        let mut table = args.to_vec();
        table.extend(["--drop", "moe_combine"]);
        let (code, out, err) = strata(&table);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("tg16 w/o moe_combine") && out.contains("| moe_combine "), "{name}: {out}");
        let mut bad = args.to_vec();
        bad.extend(["--drop", "expdec_nothing"]);
        let (code, _, err) = strata(&bad);
        assert!(code == 2 && err.contains("--drop expdec_nothing: no kernel of the one-token step starts with it"), "{name}: {err}");
    }
}

/// `--variants` on a GPU: each variant's one-token and window rows in every round, named by
/// variant and round, then the summary (ratio 1 for the first variant); the knobs in force
/// again afterwards (the speculation rows run). `EXPDEC=0` takes the default expert kernels,
/// so the graphs must be captured again for it.
#[test]
fn gpu_variants_run_in_turn_round_after_round() {
    for name in ["cuda", "hip"] {
        if common::open_gpu(name).is_none() {
            continue;
        }
        let args = [
            "bench", "decode", "--builtin", "--backend", name, "-n", "16", "--depths", "0", "--windows", "4", "--spec", "4", "--prefill", "0", "--runs", "2", "--variants",
            "knobs,EXPDEC=0,EXPDEC_WARP_ROWS=1", "--variant-rounds", "2", "--json",
        ];
        let (code, out, err) = strata(&args);
        assert_eq!(code, 0, "{out}\n{err}");
        let tests: Vec<&str> = out.lines().filter_map(|l| l.split("\"test\":\"").nth(1)?.split('"').next()).collect();
        let mut want = Vec::new();
        for round in 1..=2 {
            for v in ["knobs", "EXPDEC=0", "EXPDEC_WARP_ROWS=1"] {
                want.push(format!("tg16 [{v} #{round}]"));
                want.push(format!("tg16 win4 [{v} #{round}]"));
            }
        }
        let got: Vec<&str> = tests.iter().copied().filter(|t| t.contains(" #")).collect();
        assert_eq!(got, want, "{name}: {out}");
        assert!(tests.contains(&"tg16 spec4"), "{name}: no speculation row after the variants: {out}");
        for v in ["knobs", "EXPDEC=0", "EXPDEC_WARP_ROWS=1"] {
            for test in ["tg16 variants", "tg16 win4 variants"] {
                let line = out.lines().find(|l| l.contains(&format!("\"test\":\"{test}\"")) && l.contains(&format!("\"variant\":\"{v}\""))).unwrap_or_else(|| panic!("{name}: no {test} of {v}: {out}"));
                assert_eq!(figure(line, "rounds"), Some(2.0), "{name}: {line}");
                assert!(figure(line, "tok_s").is_some_and(|t| t > 0.0), "{name}: {line}");
                let ratio = figure(line, "ratio").unwrap();
                assert!(if v == "knobs" { ratio == 1.0 } else { ratio > 0.0 }, "{name}: {line}");
            }
        }
        let table = strata(&args[..args.len() - 1]);
        assert_eq!(table.0, 0, "{}\n{}", table.1, table.2);
        assert!(table.1.contains("| tg16 win4 [EXPDEC_WARP_ROWS=1 #2]") && table.1.contains("variants (2 rounds"), "{name}: {}", table.1);
    }
}

/// `strata bench attention`'s measurement: one row per (depth, window, band), in order, each
/// with a positive time and the GB/s of the keys and values it must read (positions
/// `0..depth + T` of every KV head, f16, K and V) over that time; the rule's band is marked, a
/// band asked for twice (the rule's and the same count) measured once, one that does not divide
/// the group skipped.
#[test]
fn attention_bench_measures_every_depth_and_window() {
    for name in ["cuda", "hip"] {
        let Some(g) = common::open_gpu(name) else { continue };
        let rows = strata::host::bench::kernels::attention(&g, (8, 2, 64), &[0, 1000], &[1, 3], &[0, 1, 3, 4], 1, 7).expect("bench");
        let got: Vec<(usize, usize)> = rows.iter().map(|r| (r.depth, r.tokens)).collect();
        // At these small grids (at most 24 blocks) the rule takes the narrowest band above one,
        // 2 heads of the group's 4; 3 does not divide the group.
        assert!(rows.iter().all(|r| r.rule == (r.band == 2)), "{name}: {rows:?}");
        assert_eq!(got, [(0, 1), (0, 1), (0, 1), (0, 3), (0, 3), (0, 3), (1000, 1), (1000, 1), (1000, 1), (1000, 3), (1000, 3), (1000, 3)], "{name}");
        assert!(rows.iter().map(|r| r.band).eq([2, 1, 4, 2, 1, 4, 2, 1, 4, 2, 1, 4]), "{name}: {rows:?}");
        for r in &rows {
            let bytes = ((r.depth + r.tokens) * 2 * 64 * 2 * 2) as f64;
            assert!(r.us > 0.0 && (r.gbps - bytes / (r.us * 1e-6) / 1e9).abs() < 1e-6 * r.gbps, "{name}: {r:?}");
        }
    }
}

/// `--timeline` on a GPU (cuda, where its image chains launches): the timeline build decodes the
/// same tokens as the plain kernels (its stamps change no value), and lays out every launch of
/// the one-token step (graphs or not, one-chunk or split attention) and of a full window, each
/// launch once in the step's order with its blocks, a run and non-negative early and spread
/// parts; the CLI prints the summary, the kernels and the launches.
#[test]
fn gpu_timeline_lays_out_every_launch_of_the_step() {
    let Some(plain) = common::open_gpu("cuda") else { return };
    let traced = match strata::host::backends::cuda::open_traced(0, strata::ptx::IMAGES) {
        Ok(g) => g,
        Err(e) => {
            assert!(!plain.chained() && e.to_string().contains("does not chain them"), "{e}");
            return;
        }
    };
    let model = tiny();
    let ops = model.step_ops(Op::Pick(Pick::Greedy));
    let first = bd::PATTERN[0];
    let mut a = GpuExecutor::new(plain, model.clone(), 512, false).expect("the built-in model fits the GPU");
    let mut b = GpuExecutor::new(traced, model.clone(), 512, false).expect("the built-in model fits the GPU");
    assert_eq!(bd::greedy_tokens(&mut b, &ops, first, 24).unwrap(), bd::greedy_tokens(&mut a, &ops, first, 24).unwrap(), "the stamps change no value");
    assert!(timeline::one_token(&mut a, &ops, first, 0, 1).unwrap_err().to_string().contains("not the timeline build"));
    let seq = bd::random_tokens(first, 8, model.config.n_vocab, 1);
    for (graphs, depth, window) in [(true, 0, 0), (true, 300, 0), (false, 0, 0), (true, 0, 4)] {
        b.set_graphs(graphs);
        let (step, t) = if window == 0 {
            (b.step_kernels(&ops, &[first], depth + 1).unwrap(), timeline::one_token(&mut b, &ops, first, depth, 3).unwrap())
        } else {
            (b.step_kernels(&ops, &seq[window..], window).unwrap(), timeline::window(&mut b, &ops, &seq, 3).unwrap())
        };
        let what = format!("graphs {graphs}, depth {depth}, window {window}");
        assert_eq!((t.window, t.tokens), (window > 0, window.max(1)), "{what}");
        assert_eq!(t.launches.iter().map(|l| l.kernel.as_str()).collect::<Vec<_>>(), step, "{what}");
        assert_eq!(t.families.iter().map(|f| f.launches).sum::<usize>(), step.len(), "{what}");
        for l in &t.launches {
            assert!(l.blocks > 0 && l.run_us > 0.0 && l.early_us >= 0.0 && l.spread_us >= 0.0, "{what}: {l:?}");
            // No block runs longer than its launch: the mean block run is within the launch's.
            assert!(l.block_us.is_none_or(|b| b > 0.0 && b <= l.run_us + 1e-9), "{what}: {l:?}");
        }
        // A mark's mean comes before the blocks' mean end; where every context is one chunk,
        // each attention block passes its `queries` mark once.
        for l in &t.launches {
            for (name, us) in &l.marks {
                assert!(us.is_none_or(|us| us >= 0.0 && l.block_us.is_none_or(|b| us <= b + 1e-9)), "{what}: mark {name} of {l:?}");
            }
        }
        if depth == 0 {
            let chunks = t.launches.iter().filter(|l| l.kernel.starts_with("attn_chunk")).collect::<Vec<_>>();
            assert!(!chunks.is_empty() && chunks.iter().all(|l| l.marks.first().is_some_and(|(n, us)| n == "queries" && us.is_some())), "{what}: {chunks:?}");
        }
        // Every kernel waits for the grid once: its blocks' releases and ends pair up.
        assert!(2 * t.launches.iter().filter(|l| l.block_us.is_some()).count() > t.launches.len(), "{what}: {:?}", t.launches);
        assert!(t.rounds == 3 && 0.0 < t.step_us.min && t.step_us.min <= t.step_us.median && t.step_us.median <= t.step_us.max, "{what}: {:?}", t.step_us);
        assert!(t.timer_step_ns.is_some_and(|ns| ns > 0), "{what}: {:?}", t.timer_step_ns);
    }
    assert!(timeline::window(&mut b, &ops, &seq[..7], 1).is_err(), "two windows of one size");
    let (code, out, err) = strata(&["bench", "decode", "--builtin", "--backend", "cuda", "--timeline", "2", "--depths", "0", "--windows", "", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let summary = out.lines().find(|l| l.contains("\"test\":\"timeline\"")).unwrap_or_else(|| panic!("no summary: {out}"));
    let launches = figure(summary, "launches").expect("a launch count") as usize;
    assert!(launches > 8 && figure(summary, "step_us").is_some_and(|us| us > 0.0), "{summary}");
    assert_eq!(out.lines().filter(|l| l.contains("\"test\":\"timeline launch\"")).count(), launches, "{out}");
    assert!(
        out.lines().filter(|l| l.contains("\"test\":\"timeline kernel\"")).all(|l| figure(l, "run_us").is_some_and(|us| us > 0.0) && figure(l, "spread_us").is_some_and(|us| us >= 0.0)),
        "{out}"
    );
    let (code, out, err) = strata(&["bench", "decode", "--builtin", "--backend", "cuda", "--timeline", "1", "--depths", "0", "-n", "16", "--windows", "2"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("depth 0: a step ") && out.contains("| gap us/launch |") && out.contains("| spread us/launch |") && out.contains("launches in order (depth 0;"), "{out}");
    assert!(out.contains("full windows of 2: a step ") && out.contains("launches in order (full windows of 2;"), "{out}");
    assert!(out.contains("inside the kernels (") && out.contains(" queries "), "{out}");
}
