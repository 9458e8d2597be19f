# The two commands of the README, and the steps they are made of.
#   make run    install what is missing, build, decode the built-in random model, show the backends
#   make test   install what is missing, build, run every test that this machine can run
SHELL := /bin/bash
VENV_LIB = $(firstword $(wildcard .venv/lib/python3*/site-packages/nvidia/cu13/lib))
# NVRTC (compiles the HIP sources for NVIDIA, no GPU needed) comes from the pinned pip wheel.
export LD_LIBRARY_PATH := $(VENV_LIB)$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH))

.PHONY: setup build run test reports gpu-pack clean

setup:
	bash scripts/setup-toolchain.sh
	bash scripts/setup-llama.sh

build: setup
	cargo build --release

run: build
	$(MAKE) --no-print-directory -s _run
_run:
	./target/release/strata decode -n 48
	./target/release/strata info

# The compiler reports (ptxas for the Rust PTX and the NVRTC-compiled HIP, clang-22 for AMD)
# print in full; then every test. STRATA_REQUIRE_TOOLS=1: a missing compiler fails, not skips.
test: setup
	$(MAKE) --no-print-directory _test
_test:
	STRATA_REQUIRE_TOOLS=1 cargo test --workspace --test toolchain_reports -- --nocapture --test-threads=1
	STRATA_REQUIRE_TOOLS=1 cargo test --workspace

# Build the test binaries and the CLI for a GPU machine without Rust (see docs/gpu-runs.md).
gpu-pack: setup
	bash scripts/package-gpu.sh

clean:
	cargo clean
