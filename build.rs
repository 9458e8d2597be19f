//! Builds `device/` to PTX for every architecture in `ARCHS`, writes the launch bounds from
//! `strata_gpu_shared::launch::BOUNDS` into each entry header, and leaves the results in
//! `$OUT_DIR/strata_<arch>.ptx` for `src/ptx.rs` to embed.
//!
//! The device build needs unstable Rust (nvptx64 target, `-Zbuild-std=core`). The toolchain is
//! found in this order: `STRATA_DEVICE_CARGO` + `STRATA_DEVICE_RUSTC`; Debian's `rustc-web`
//! (/usr/bin/rustc with its library source) plus `llvm-bitcode-linker` from
//! scripts/setup-toolchain.sh; a rustup `nightly` with `rust-src` and `llvm-bitcode-linker`.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use strata_gpu_shared::launch::{cluster_blocks, image_bounds, Bounds};

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];
const SETUP: &str = "scripts/setup-toolchain.sh";

struct Toolchain {
    cargo: PathBuf,
    rustc: PathBuf,
    /// Prepended to PATH: where `llvm-bitcode-linker` and the `llvm-link`/`opt`/`llc` it calls live.
    path: Vec<PathBuf>,
    /// Extra rustc flags (the explicit linker path, when it is not in the sysroot).
    rustflags: Vec<String>,
    how: &'static str,
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}

fn find_toolchain(root: &Path) -> Result<Toolchain, String> {
    let linker_dir = root.join(".toolchain/bin");
    let llvm = PathBuf::from("/usr/lib/llvm-22/bin");
    if let (Ok(cargo), Ok(rustc)) = (env::var("STRATA_DEVICE_CARGO"), env::var("STRATA_DEVICE_RUSTC")) {
        return Ok(Toolchain {
            cargo: cargo.into(),
            rustc: rustc.into(),
            path: vec![linker_dir, llvm],
            rustflags: vec![],
            how: "STRATA_DEVICE_CARGO/STRATA_DEVICE_RUSTC",
        });
    }
    let debian_src = Path::new("/usr/lib/rustlib/src/rust/library/core");
    let linker = linker_dir.join("llvm-bitcode-linker");
    if Path::new("/usr/bin/rustc").exists() && debian_src.exists() && linker.exists() && llvm.join("llc").exists() {
        return Ok(Toolchain {
            cargo: "/usr/bin/cargo".into(),
            rustc: "/usr/bin/rustc".into(),
            rustflags: vec![format!("-Clinker={}", linker.display())],
            path: vec![linker_dir, llvm],
            how: "Debian rustc-web + llvm-22",
        });
    }
    let nightly = Command::new("rustup").args(["which", "--toolchain", "nightly", "rustc"]).output();
    if let Ok(out) = nightly {
        if out.status.success() {
            let rustc = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            let bin = rustc.parent().unwrap_or(Path::new("/")).to_path_buf();
            let sysroot = bin.parent().unwrap_or(Path::new("/"));
            if sysroot.join("lib/rustlib/src/rust/library/core").exists() {
                return Ok(Toolchain {
                    cargo: bin.join("cargo"),
                    rustc,
                    path: vec![],
                    rustflags: vec![],
                    how: "rustup nightly",
                });
            }
        }
    }
    Err(format!(
        "device toolchain not found (Debian rustc-web + rust-web-src + llvm-22 + llvm-bitcode-linker, \
         or a rustup nightly with rust-src): run `{SETUP}` (as root) or `make setup`"
    ))
}

/// Inserts `.maxntid` / `.minnctapersm` after each entry's parameter list (and
/// `.reqnctapercluster` for the cluster entries), and checks that the PTX's entries and the
/// bounds tables name the same kernels: `BOUNDS` in every image, `SM90_BOUNDS` (the cluster
/// entries and the lean attention entry) in the `SM90_ARCHS` images only.
fn add_launch_bounds(ptx: &str, arch: &str) -> Result<String, String> {
    let table = || image_bounds(arch);
    let mut out = String::with_capacity(ptx.len() + 1024);
    let mut entries = Vec::new();
    let mut pending: Option<&Bounds> = None;
    for line in ptx.lines() {
        if let Some(rest) = line.trim_start().strip_prefix(".visible .entry ") {
            let name = rest.split('(').next().unwrap_or("").trim();
            pending = Some(table().find(|b| b.kernel == name).ok_or_else(|| {
                format!("kernel `{name}` has no launch bounds for {arch} in gpu-shared/src/launch.rs BOUNDS or CLUSTER_BOUNDS")
            })?);
            entries.push(name.to_string());
        }
        if let (Some(b), "{") = (pending, line.trim()) {
            out.push_str(&format!(".maxntid {}, 1, 1\n.minnctapersm {}\n", b.threads, b.min_blocks));
            let cluster = cluster_blocks(b.kernel);
            if cluster > 1 {
                out.push_str(&format!(".reqnctapercluster {cluster}, 1, 1\n"));
            }
            pending = None;
        }
        out.push_str(line);
        out.push('\n');
    }
    for b in table() {
        if !entries.iter().any(|e| e == b.kernel) {
            return Err(format!("launch bounds name `{}`, which the device crate does not export for {arch}", b.kernel));
        }
    }
    Ok(out)
}

/// Architectures whose launches the host chains by programmatic dependent launch
/// (`host/src/backends/launch.rs`): every entry of their image must run `griddepcontrol.wait`
/// (`device/src/arch/sync.rs` `chain_grids`) before it touches memory an earlier grid writes
/// (only L2 prefetches of weights and the staging of module constants come before it).
const CHAINED: [&str; 1] = ["sm_90"];

/// Checks that every entry of `ptx` waits for the previous grid (its text up to the next entry
/// holds `griddepcontrol.wait`).
fn check_chained(ptx: &str) -> Result<(), String> {
    for entry in ptx.split(".visible .entry ").skip(1) {
        if !entry.contains("griddepcontrol.wait") {
            let name = entry.split('(').next().unwrap_or("").trim();
            return Err(format!(
                "kernel `{name}` never calls `crate::arch::sync::chain_grids()`: its launches are chained, so it must wait for the previous grid"
            ));
        }
    }
    Ok(())
}

fn build_arch(tc: &Toolchain, root: &Path, target_dir: &Path, arch: &str) -> Result<String, String> {
    let mut path = tc.path.clone();
    path.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    let mut flags = vec![format!("-Ctarget-cpu={arch}")];
    flags.extend(tc.rustflags.iter().cloned());
    // A clean environment: none of the outer build's CARGO_*, RUSTFLAGS, RUSTC_WRAPPER or
    // jobserver variables may leak into the nested nvptx build.
    let mut cmd = Command::new(&tc.cargo);
    cmd.env_clear()
        .env("PATH", env::join_paths(path).map_err(|e| e.to_string())?)
        .env("HOME", env::var_os("HOME").unwrap_or_else(|| "/root".into()))
        .env("RUSTC", &tc.rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .env("CARGO_TARGET_DIR", target_dir.join(arch))
        .args(["build", "--release", "--locked", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .arg("--manifest-path")
        .arg(root.join("device/Cargo.toml"));
    for var in ["CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"] {
        if let Some(v) = env::var_os(var) {
            cmd.env(var, v);
        }
    }
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", tc.cargo.display()))?;
    if !out.status.success() {
        return Err(format!(
            "device build for {arch} failed ({}):\n{}",
            tc.how,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // The nested build's warnings would otherwise vanish: pass them on.
    for line in String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("warning")) {
        println!("cargo:warning=device ({arch}): {line}");
    }
    let ptx = target_dir.join(arch).join("nvptx64-nvidia-cuda/release/strata_device.ptx");
    std::fs::read_to_string(&ptx).map_err(|e| format!("device build left no {}: {e}", ptx.display()))
}

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for dir in ["device/src", "device/Cargo.toml", "device/Cargo.lock", "gpu-shared/src", "gpu-shared/Cargo.toml"] {
        println!("cargo:rerun-if-changed={dir}");
    }
    for var in ["STRATA_DEVICE_CARGO", "STRATA_DEVICE_RUSTC"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let tc = find_toolchain(&root).unwrap_or_else(|e| fail(&e));
    let target_dir = root.join("target/device");
    for arch in ARCHS {
        let ptx = build_arch(&tc, &root, &target_dir, arch).unwrap_or_else(|e| fail(&e));
        let ptx = add_launch_bounds(&ptx, arch).unwrap_or_else(|e| fail(&e));
        if CHAINED.contains(&arch) {
            check_chained(&ptx).unwrap_or_else(|e| fail(&e));
        }
        std::fs::write(out_dir.join(format!("strata_{arch}.ptx")), ptx).unwrap_or_else(|e| fail(&e.to_string()));
    }
}
