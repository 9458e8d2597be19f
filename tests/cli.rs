//! The `strata` binary as a user runs it.
mod common;

use std::process::Command;

use strata::host::gguf::Value;
use strata::host::model::synth::{build_in_memory, SynthSpec};

/// The binary under test: cargo's, or `STRATA_BIN` where the tests run away from the build
/// (the packaged GPU run sets it).
fn strata(args: &[&str]) -> (i32, String, String) {
    strata_env(args, &[])
}

/// As [`strata`], with extra environment variables.
fn strata_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let bin = std::env::var("STRATA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_strata").to_string());
    let mut cmd = Command::new(&bin);
    cmd.args(args).env_remove("STRATA_REQUIRE_GPU");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{bin}: {e}"));
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn help_explains_every_command() {
    let (code, out, _) = strata(&["--help"]);
    assert_eq!(code, 0);
    for cmd in ["info", "parity", "decode"] {
        assert!(out.contains(cmd), "--help lacks {cmd}:\n{out}");
        let (code, sub, _) = strata(&[cmd, "--help"]);
        assert_eq!(code, 0);
        assert!(sub.contains("--device"), "{cmd} --help:\n{sub}");
    }
}

#[test]
fn info_lists_every_backend() {
    let (code, out, err) = strata(&["info"]);
    assert_eq!(code, 0, "{err}");
    for b in ["cpu ", "cuda ", "hip ", "embedded PTX: sm_80"] {
        assert!(out.contains(b), "info lacks `{b}`:\n{out}");
    }
}

#[test]
fn parity_passes_and_prints_its_table() {
    let (code, out, err) = strata(&["parity", "--random", "1", "--seed", "7"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("seed 7"), "{out}");
    for k in ["quantize_q8_1", "mmvq_q8_0", "mmvq_iq4_nl"] {
        assert!(out.contains(k), "table lacks {k}:\n{out}");
    }
    assert!(out.lines().last().unwrap().contains(" passed, 0 failed"), "{out}");
}

#[test]
fn parity_requiring_a_missing_gpu_fails_clearly() {
    if strata::host::backends::gpu::probe().is_ok() {
        return eprintln!("SKIPPED: this machine has a GPU");
    }
    let (code, _, err) = strata(&["parity", "--require-gpu"]);
    assert_ne!(code, 0);
    assert!(err.contains("no GPU backend available"), "{err}");
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let (code, _, err) = strata(&["parity", "--random", "lots"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid value"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn expert_knobs_are_explained_and_bad_ones_refused() {
    let (code, out, _) = strata(&["knobs"]);
    assert_eq!(code, 0);
    for k in strata::host::backends::knobs::KNOBS {
        assert!(out.contains(&format!("{}={}", k.name, k.values)), "`strata knobs` lacks {}:\n{out}", k.name);
    }
    let (_, help, _) = strata(&["--help"]);
    assert!(help.lines().count() < 30 && !help.contains("EXPDEC_R"), "the top-level help lists knobs:\n{help}");
    let refused: [(&[&str], &[(&str, &str)], &str); 6] = [
        (&["--knob", "EXPDEC_R=3", "info"], &[], "STRATA_EXPDEC_R=\"3\": expected 0|1|2"),
        (&["--knob", "EXPDEC_Q=1", "info"], &[], "unknown kernel knob"),
        (&["--knob", "EXPDEC_R", "info"], &[], "expected NAME=VALUE"),
        (&["info"], &[("STRATA_EXPDEC_DRB", "48")], "STRATA_EXPDEC_DRB=\"48\": expected 0|16|32|64|128|256"),
        (&["--knob", "EXPDEC_DMINB=4", "--knob", "EXPDEC_DR=4", "info"], &[], "EXPDEC_DMINB=4 needs EXPDEC_DR<=2"),
        (&["info"], &[("STRATA_EXPDEC_WARPS", "16"), ("STRATA_EXPDEC_R", "2")], "EXPDEC_WARPS=16 needs EXPDEC_R=1"),
    ];
    for (args, env, want) in refused {
        let (code, _, err) = strata_env(args, env);
        assert_eq!(code, 2, "{args:?} {env:?}: {err}");
        assert!(err.contains(want) && !err.contains("panicked"), "{args:?} {env:?}: {err}");
    }
}

/// With `STRATA_LOG=info`, the first launch of each expert kernel logs one line naming it, its
/// launch bounds, rows per block and the knobs; knobs from the command line and the environment
/// both reach the kernels.
#[test]
fn first_expert_launch_is_logged_with_its_knobs() {
    if let Err(e) = strata::host::backends::gpu::probe() {
        return common::skip_or_fail(common::gpu_required(), "cli expert log", &e).unwrap_or(());
    }
    let (code, out, err) = strata_env(&["--knob", "EXPDEC_R=2", "parity", "--random", "0"], &[("STRATA_LOG", "info"), ("STRATA_EXPDEC_DR", "4"), ("STRATA_EXPDEC_DMINB", "2")]);
    assert_eq!(code, 0, "{out}\n{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("first launch of")).collect();
    for want in ["first launch of expdec_gu_iq3_xxs_r2_m2: 256 threads, min 2 blocks/SM, 32 rows/block", "first launch of expdec_down_q2_0_d4_m2: 256 threads, min 2 blocks/SM"] {
        for backend in ["cuda", "hip"] {
            let n = lines.iter().filter(|l| l.starts_with(&format!("strata: {backend}: {want}"))).count();
            assert_eq!(n, 1, "{backend} `{want}` logged {n} times:\n{}", lines.join("\n"));
        }
    }
    assert!(lines.iter().all(|l| l.contains("knobs EXPDEC=1 R=2 ") && l.contains(" DR=4 ")), "{}", lines.join("\n"));
}

/// A temporary file that is removed when dropped.
struct Temp(std::path::PathBuf);

impl Temp {
    fn new(name: &str) -> Temp {
        Temp(std::env::temp_dir().join(format!("strata-cli-{}-{name}", std::process::id())))
    }
    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temp path")
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The built-in model as a file, rewritten by `edit` (metadata, then tensors).
fn edited_model(name: &str, edit: impl Fn(&mut Vec<(String, Value)>, &mut Vec<common::TensorParts>)) -> Temp {
    let t = Temp::new(name);
    std::fs::write(&t.0, common::rewritten_tiny(true, edit)).expect("write the model");
    t
}

/// `strata decode` on the built-in model: says so first, streams text, reports tok/s, and
/// writes one row of logits per generated token.
#[test]
fn decode_runs_the_built_in_model() {
    let logits = Temp::new("logits.f32");
    let ids = Temp::new("ids.json");
    let (code, out, err) = strata(&["decode", "--backend", "cpu", "-n", "12", "--ignore-eos", "--logits-out", logits.path(), "--ids-out", ids.path()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.lines().next().unwrap_or("").contains("built-in random-weight qwen3moe"), "{err}");
    assert!(err.contains("tok/s") && !out.trim().is_empty(), "{out}\n{err}");
    let n_vocab = SynthSpec::tiny().config.n_vocab;
    assert_eq!(std::fs::metadata(&logits.0).unwrap().len() as usize, 12 * n_vocab * 4, "one row per generated token");
    let list = std::fs::read_to_string(&ids.0).unwrap();
    assert_eq!(list.trim().trim_matches(|c| c == '[' || c == ']').split(',').count(), 12, "{list}");
    // Greedy: each generated token is the argmax of the row it was chosen from.
    let raw = std::fs::read(&logits.0).unwrap();
    let rows: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let chosen: Vec<usize> = list.trim().trim_matches(|c| c == '[' || c == ']').split(',').map(|s| s.trim().parse().unwrap()).collect();
    for (row, &id) in rows.chunks_exact(n_vocab).zip(&chosen) {
        let best = row.iter().enumerate().fold(0, |b, (i, &v)| if v > row[b] { i } else { b });
        assert_eq!(best, id);
    }
}

/// Bad input: a clear one-line error naming what is wrong, exit status 2, never a panic.
#[test]
fn decode_refuses_bad_input_clearly() {
    let truncated = Temp::new("truncated.gguf");
    let full = build_in_memory(&SynthSpec::tiny());
    std::fs::write(&truncated.0, &full[..full.len() / 2]).unwrap();
    let wrong_arch = edited_model("arch.gguf", |meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("llama".into());
            }
        }
    });
    let missing = edited_model("missing.gguf", |_, t| t.retain(|x| x.0 != "blk.1.attn_k.weight"));
    let misshaped = edited_model("shape.gguf", |_, t| {
        let x = t.iter_mut().find(|x| x.0 == "blk.2.ffn_norm.weight").unwrap();
        x.1 = vec![128];
        x.3.truncate(128 * 4);
    });
    let zero_base = edited_model("base.gguf", |meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "qwen3moe.rope.freq_base" {
                *v = Value::F32(0.0);
            }
        }
    });
    let long_prompt: String = (0..40).map(|i| (i % 9).to_string()).collect::<Vec<_>>().join(",");
    let cases: [(Vec<&str>, &str); 10] = [
        (vec!["--model", zero_base.path()], "key qwen3moe.rope.freq_base: 0 must be positive"),
        (vec!["--chat"], "--chat wraps a text prompt"),
        (vec!["--prompt-ids", "99999"], "prompt token id 99999 is outside the vocabulary of 1248 tokens"),
        (vec!["--model", missing.path(), "--temp", "0.5", "--top-k", "0"], "top_k"),
        (vec!["--model", truncated.path()], "truncated"),
        (vec!["--model", wrong_arch.path()], "`llama` is not supported"),
        (vec!["--model", missing.path()], "tensor blk.1.attn_k.weight: missing"),
        (vec!["--model", misshaped.path()], "tensor blk.2.ffn_norm.weight: shape [128], expected [256]"),
        (vec!["--ctx", "16", "--prompt-ids", &long_prompt], "the prompt has 40 tokens; the context holds 16 positions"),
        (vec!["--ctx", "500000000"], "lower --ctx"),
    ];
    for (args, want) in cases {
        let mut all = vec!["decode", "--backend", "cpu", "-n", "2"];
        all.extend(args.iter().copied());
        if !all.contains(&"--prompt-ids") {
            all.extend(["--prompt-ids", "1,2"]);
        }
        let (code, _, err) = strata(&all);
        assert_eq!(code, 2, "{all:?}: {err}");
        assert!(err.contains(want) && !err.contains("panicked"), "{all:?}: want `{want}` in:\n{err}");
        assert_eq!(err.lines().filter(|l| l.starts_with("strata: error")).count(), 1, "{all:?}: {err}");
    }
}

/// A qwen35moe file the engine cannot mean is refused with the file and the key or tensor named,
/// status 2, no panic; `--draft mtp` on a file without an MTP block says so.
#[test]
fn qwen35moe_files_are_refused_clearly() {
    let hybrid = |name: &str, edit: &dyn Fn(&mut Vec<(String, Value)>, &mut Vec<common::TensorParts>)| {
        let t = Temp::new(name);
        std::fs::write(&t.0, common::rewritten(&SynthSpec::qwen35moe_tiny(), edit)).expect("write the model");
        t
    };
    let set = |key: &'static str, value: Value| {
        move |meta: &mut Vec<(String, Value)>, _: &mut Vec<common::TensorParts>| {
            for (k, v) in meta.iter_mut() {
                if k == key {
                    *v = value.clone();
                }
            }
        }
    };
    let positive_a = hybrid("a.gguf", &|_, t| {
        let a = t.iter_mut().find(|x| x.0 == "blk.0.ssm_a").unwrap();
        a.3[..4].copy_from_slice(&0.5f32.to_le_bytes());
    });
    let inner = hybrid("inner.gguf", &set("qwen35moe.ssm.inner_size", Value::U32(200)));
    let mtp2 = hybrid("mtp2.gguf", &set("qwen35moe.nextn_predict_layers", Value::U32(2)));
    let groups = hybrid("groups.gguf", &set("qwen35moe.ssm.group_count", Value::U32(3)));
    let state = hybrid("state.gguf", &set("qwen35moe.ssm.state_size", Value::U32(48)));
    let no_conv = hybrid("conv.gguf", &|_, t| t.retain(|x| x.0 != "blk.2.ssm_conv1d.weight"));
    let plain = Temp::new("plain.gguf");
    std::fs::write(&plain.0, build_in_memory(&SynthSpec::tiny())).unwrap();
    let cases: [(&Temp, &[&str], &str); 7] = [
        (&positive_a, &[], "tensor blk.0.ssm_a: holds 0.5: the decay's A (-exp(A_log)) must not be positive"),
        (&inner, &[], "key qwen35moe.ssm.inner_size: 200 is not state size 64 x 4 value heads"),
        (&mtp2, &[], "key qwen35moe.nextn_predict_layers: 2 MTP blocks: one is supported"),
        (&groups, &[], "4 value heads are not a multiple of 3 key heads"),
        (&state, &[], "key qwen35moe.ssm.state_size: 48: supported are multiples of 32"),
        (&no_conv, &[], "tensor blk.2.ssm_conv1d.weight: missing"),
        (&plain, &["--draft", "mtp", "--spec", "4"], "has no MTP block"),
    ];
    for (file, extra, want) in cases {
        let mut all = vec!["decode", "--backend", "cpu", "-n", "2", "--prompt-ids", "1,2", "--model", file.path()];
        all.extend(extra);
        let (code, _, err) = strata(&all);
        assert_eq!(code, 2, "{all:?}: {err}");
        assert!(err.contains(want) && err.contains(file.path()) && !err.contains("panicked"), "{all:?}: want `{want}` and the file in:\n{err}");
    }
}

/// `--chat` wraps the prompt in ChatML turns when the vocabulary has them; the text streams and
/// sampling with a seed is repeatable.
#[test]
fn decode_chat_and_sampling() {
    let run = || strata(&["decode", "--backend", "cpu", "--chat", "--prompt", "Hello there", "-n", "16", "--temp", "0.9", "--seed", "5", "--ignore-eos"]);
    let (code, out, err) = run();
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("decode 15 tokens"), "{err}");
    assert_eq!(run().1, out, "the same seed sampled other tokens");
    let (_, other, _) = strata(&["decode", "--backend", "cpu", "--chat", "--prompt", "Hello there", "-n", "16", "--temp", "0.9", "--seed", "6", "--ignore-eos"]);
    assert_ne!(other, out, "seeds 5 and 6 sampled the same 16 tokens");
}

/// Output into a pipe whose reader has gone (`strata info FILE | head`) ends the process
/// quietly, by SIGPIPE as Unix tools do, not with a panic.
#[test]
fn a_closed_pipe_is_no_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let path = std::env::temp_dir().join(format!("strata-cli-pipe-{}.gguf", std::process::id()));
    std::fs::write(&path, build_in_memory(&SynthSpec::tiny())).unwrap();
    let bin = std::env::var("STRATA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_strata").to_string());
    let mut child = Command::new(&bin).args(["info", path.to_str().unwrap()]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take()); // the reader goes before the first line is written
    let out = child.wait_with_output().unwrap();
    std::fs::remove_file(&path).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.signal() == Some(13) || out.status.success(), "{:?}: {err}", out.status);
}
