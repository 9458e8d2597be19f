//! The `strata` binary as a user runs it.
mod common;

use std::process::Command;

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
    for cmd in ["info", "parity"] {
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
    if strata::host::gpu::probe().is_ok() {
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
    let (code, out, _) = strata(&["--help"]);
    assert_eq!(code, 0);
    for k in strata::host::knobs::KNOBS {
        assert!(out.contains(&format!("{}={}", k.name, k.values)), "--help lacks {}:\n{out}", k.name);
    }
    let refused: [(&[&str], &[(&str, &str)], &str); 5] = [
        (&["--knob", "EXPDEC_R=3", "info"], &[], "STRATA_EXPDEC_R=\"3\": expected 1|2"),
        (&["--knob", "EXPDEC_Q=1", "info"], &[], "unknown expert knob"),
        (&["--knob", "EXPDEC_R", "info"], &[], "expected NAME=VALUE"),
        (&["info"], &[("STRATA_EXPDEC_DRB", "48")], "STRATA_EXPDEC_DRB=\"48\": expected 0|16|32|64|128|256"),
        (&["--knob", "EXPDEC_DMINB=4", "--knob", "EXPDEC_DR=4", "info"], &[], "EXPDEC_DMINB=4 needs EXPDEC_DR<=2"),
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
    if let Err(e) = strata::host::gpu::probe() {
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
