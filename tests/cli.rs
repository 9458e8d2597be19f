//! The `strata` binary as a user runs it.
mod common;

use std::process::Command;

/// The binary under test: cargo's, or `STRATA_BIN` where the tests run away from the build
/// (the packaged GPU run sets it).
fn strata(args: &[&str]) -> (i32, String, String) {
    let bin = std::env::var("STRATA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_strata").to_string());
    let out = Command::new(&bin).args(args).env_remove("STRATA_REQUIRE_GPU").output().unwrap_or_else(|e| panic!("{bin}: {e}"));
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
