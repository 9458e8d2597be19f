#!/usr/bin/env bash
# Makes llama.cpp (through llama-cpp-python, CPU build) importable from the project venv: the
# independent reference that tests/llama_reference.rs compares Strata's logits with
# (docs/reference.md). Idempotent; run after scripts/setup-toolchain.sh, which creates .venv with
# llama-cpp-python's runtime dependencies (pinned in scripts/requirements.txt).
#
# PyPI has only llama-cpp-python's source, and compiling it takes about 12 minutes on 2 cores, so
# the built wheel is cached OUTSIDE the repository, in $STRATA_CACHE/wheels (default
# /root/.cache/strata): a fresh clone on the same machine (CI) installs it in seconds. The wheel is
# built only when the cache has none that installs; an flock keeps two setups from building it
# at once.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
say() { printf 'setup-llama: %s\n' "$*"; }
die() { printf 'setup-llama: error: %s\n' "$*" >&2; exit 1; }

version=0.3.36
# Build-time only, in a build venv inside the cache (the project venv keeps to its pins).
build_pins=(scikit-build-core==1.1.2 packaging==26.4 pathspec==1.1.1)
cmake_args="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
cache=${STRATA_CACHE:-/root/.cache/strata}
wheels="$cache/wheels"
venv="$root/.venv"
py="$venv/bin/python"

have_llama() {
  "$py" -c "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null
}

[ -x "$py" ] || die "$py missing: run scripts/setup-toolchain.sh first"
if have_llama; then
  say "llama-cpp-python $version present in .venv"
  exit 0
fi

# pip picks a cached wheel that fits this venv (the build is tagged py3-none-linux_x86_64: the
# bindings load the library through ctypes); --no-deps: the runtime dependencies come pinned from
# scripts/requirements.txt (setup-toolchain.sh).
install_cached() {
  "$venv/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$wheels" --no-deps \
    --force-reinstall "llama-cpp-python==$version" 2>/dev/null
}

mkdir -p "$wheels"
exec 9>"$cache/llama-build.lock"
flock 9
if install_cached; then
  say "installed llama-cpp-python $version into .venv from the cached wheel in $wheels"
else
  say "no cached llama-cpp-python $version wheel for this venv in $wheels"
  apt_pkgs=(cmake ninja-build)
  missing=()
  for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "need root to install: ${missing[*]}"
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "cmake and ninja-build present"
  fi
  build_venv="$cache/build-venv"
  if [ ! -x "$build_venv/bin/pip" ]; then
    say "creating build venv $build_venv"
    "$(readlink -f "$py")" -m venv "$build_venv"
  fi
  say "installing ${build_pins[*]} into the build venv"
  "$build_venv/bin/pip" install -q --disable-pip-version-check "${build_pins[@]}"
  jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
  tmp=$(mktemp -d "$cache/wheel-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  say "building llama-cpp-python $version for the CPU ($jobs jobs, about 12 minutes on 2 cores) into $wheels"
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$build_venv/bin/pip" wheel -q \
    --disable-pip-version-check --no-deps --no-build-isolation "llama-cpp-python==$version" -w "$tmp" \
    || die "building the llama-cpp-python wheel failed"
  mv "$tmp"/llama_cpp_python-*.whl "$wheels/"
  install_cached || die "the wheel built into $wheels does not install into $venv"
  say "built, cached and installed llama-cpp-python $version"
fi
have_llama || die "llama_cpp $version still not importable from $py (are the runtime dependencies in scripts/requirements.txt installed? run scripts/setup-toolchain.sh)"
say "llama-cpp-python $version ready"
