#!/usr/bin/env bash
# Installs everything the device build and the CPU-side checks need on a fresh Debian 12 machine.
# Idempotent: each step checks first and skips what is already there. Run as root.
#
#   - Debian's newer Rust (rustc-web, cargo-web, rust-web-src: rustc 1.96 with the library source,
#     which -Zbuild-std=core needs for nvptx64) and LLVM/clang 22 (llc, opt, llvm-link for the
#     bitcode linker; clang-22 for the AMD build of the HIP sources).
#   - llvm-bitcode-linker, built from the source that rust-web-src ships.
#   - A project-local Python venv (.venv/) with pinned packages: gguf (the format reference),
#     nvidia-cuda-nvcc (ptxas, checks PTX without a GPU), nvidia-cuda-nvrtc (compiles the HIP
#     sources for NVIDIA without a GPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
say() { printf 'setup-toolchain: %s\n' "$*"; }
die() { printf 'setup-toolchain: error: %s\n' "$*" >&2; exit 1; }

apt_pkgs=(rustc-web cargo-web rust-web-src llvm-22 clang-22 lld-22 python3-venv)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "need root to install: ${missing[*]}"
  command -v apt-get >/dev/null || die "apt-get not found: install ${missing[*]} by hand (Debian 12 package names)"
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  say "Debian packages present"
fi

linker_src=/usr/lib/rustlib/src/rust/src/tools/llvm-bitcode-linker
bin_dir="$root/.toolchain/bin"
if [ -x "$bin_dir/llvm-bitcode-linker" ]; then
  say "llvm-bitcode-linker present"
else
  [ -d "$linker_src" ] || die "$linker_src missing: is rust-web-src installed?"
  say "building llvm-bitcode-linker from $linker_src"
  # Its own target dir so a half-finished build is resumed, not restarted.
  env -u RUSTFLAGS -u CARGO_TARGET_DIR CARGO_TARGET_DIR="$root/.toolchain/linker-build" \
    RUSTC=/usr/bin/rustc /usr/bin/cargo install --quiet --locked --path "$linker_src" \
    --root "$root/.toolchain" 2>&1 | grep -v '^warning' || true
  [ -x "$bin_dir/llvm-bitcode-linker" ] || die "llvm-bitcode-linker build failed"
fi

venv="$root/.venv"
pins="$root/scripts/requirements.txt"
stamp="$venv/.pins"
if [ -f "$stamp" ] && cmp -s "$stamp" "$pins"; then
  say "python venv present"
else
  say "creating python venv $venv with $(tr '\n' ' ' < "$pins")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$pins"
  cp "$pins" "$stamp"
fi
say "ready"
