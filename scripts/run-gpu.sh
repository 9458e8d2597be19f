#!/usr/bin/env bash
# Runs the packaged test binaries and the CLI on a GPU machine with no Rust (see
# scripts/package-gpu.sh). Every GPU test is required to find its GPU (STRATA_REQUIRE_GPU=1).
# Prints the summary last; full logs go to $OUT (or gpu-pack/logs).
set -uo pipefail
pack=$(cd "$(dirname "$0")" && pwd)
logs=${OUT:-$pack/logs}
mkdir -p "$logs"
export STRATA_REQUIRE_GPU=1
export STRATA_BIN="$pack/bin/strata"   # the CLI the tests in tests/cli.rs run
# NVRTC for the hip backend: the CUDA toolkit's, or a pip wheel's.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13/lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -e "$d/libnvrtc.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
summary=()
fail=0
if [ "${STRATA_BIG:-0}" = 1 ]; then
  # The Qwen3-30B-A3B-shaped synthetic model (about 15 GB), written on the CPU while the tests
  # run on the GPU, decoded at the end.
  big=${STRATA_BIG_DIR:-/tmp}/strata-30b-a3b.gguf
  "$pack/bin/strata" synth --preset 30b-a3b --out "$big" > "$logs/big-synth.log" 2>&1 &
  synth_pid=$!
fi
for t in "$pack"/tests/*; do
  name=$(basename "$t")
  timeout 300 "$t" --test-threads=1 --nocapture > "$logs/test-$name.log" 2>&1
  rc=$?
  line=$(grep -E "^test result:" "$logs/test-$name.log" | tail -1)
  summary+=("$(printf '%-24s rc=%d %s' "$name" "$rc" "$line")")
  [ $rc -ne 0 ] && fail=1
done
"$pack/bin/strata" info > "$logs/strata-info.log" 2>&1 || fail=1
"$pack/bin/strata" parity --require-gpu --random 6 > "$logs/strata-parity.log" 2>&1 || fail=1
if [ "${STRATA_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  # The default knobs (R=1, DR=2, Q2_0 down), then the other EXPDEC code paths: IQ4_NL down,
  # R=2, DR=4, the largest rows per block (MINB and DMINB change only the launch bounds).
  other="--knob EXPDEC_DOWN=1 --knob EXPDEC_R=2 --knob EXPDEC_DR=4 --knob EXPDEC_DMINB=2 --knob EXPDEC_RB=128 --knob EXPDEC_DRB=256"
  for tool in memcheck racecheck; do
    for knobs in default other; do
      args=""; [ $knobs = other ] && args=$other
      # shellcheck disable=SC2086
      compute-sanitizer --tool $tool --error-exitcode 9 "$pack/bin/strata" $args parity --require-gpu --random 0 \
        > "$logs/sanitizer-$tool-$knobs.log" 2>&1 || fail=1
      summary+=("$(printf '%-24s %s' "sanitizer $tool $knobs" "$(grep -E "(ERROR|RACECHECK) SUMMARY" "$logs/sanitizer-$tool-$knobs.log" | tail -1)")")
    done
  done
fi
if command -v compute-sanitizer >/dev/null; then
  # Every kernel of the decode step, on both GPU backends, greedy and sampled: greedy one-token
  # steps chained on the device from captured graphs, then sampled verify windows of up to 4.
  for b in cuda hip; do
    for pick in "--spec 1" "--spec 4 --temp 0.8 --seed 3"; do
      tag=$(echo "$pick" | tr -d ' -')
      # shellcheck disable=SC2086
      compute-sanitizer --tool memcheck --error-exitcode 9 "$pack/bin/strata" decode --backend $b -n 24 --window 5 --prompt "Hello there, Hello there, Hello there" $pick \
        > "$logs/sanitizer-decode-$b-$tag.log" 2>&1 || fail=1
      summary+=("$(printf '%-24s %s' "sanitizer decode $b $pick" "$(grep -E "ERROR SUMMARY" "$logs/sanitizer-decode-$b-$tag.log" | tail -1)")")
    done
  done
fi
if [ "${STRATA_BIG:-0}" = 1 ]; then
  wait "$synth_pid" || fail=1
  for b in cuda hip; do
    "$pack/bin/strata" decode --model "$big" --backend $b --prompt-ids 1,2,3,4,5,6,7,8 -n 128 --ignore-eos --print-ids > "$logs/big-decode-$b.log" 2>&1 || fail=1
    "$pack/bin/strata" decode --model "$big" --backend $b --prompt-ids 1,2,3,4,5,6,7,8 -n 32 --ignore-eos --print-ids --profile > "$logs/big-profile-$b.log" 2>&1 || fail=1
  done
  "$pack/bin/strata" bench decode "$big" --backend cuda --runs 3 > "$logs/big-bench-decode.log" 2>&1 || fail=1
  "$pack/bin/strata" bench mmvq --formats Q8_0 --shapes 151936x2048 --rows 1 --backends cuda > "$logs/big-bench-mmvq.log" 2>&1 || fail=1
fi
echo "==== strata info"; cat "$logs/strata-info.log"
echo "==== strata parity (tail)"; tail -n 30 "$logs/strata-parity.log"
echo "==== test binaries"; printf '%s\n' "${summary[@]}"
for f in "$logs"/big-*.log; do [ -e "$f" ] && { echo "==== $(basename "$f")"; grep -E "^strata|^\||tok/s|GB/s|copy|error" "$f" | tail -n 40; }; done
[ $fail -eq 0 ] && echo "GPU RUN: PASS" || echo "GPU RUN: FAIL"
exit $fail
