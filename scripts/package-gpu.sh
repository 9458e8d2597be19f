#!/usr/bin/env bash
# Builds the test binaries and the CLI here (the GPU machine has no Rust) and collects them in
# gpu-pack/ (git-ignored) with run-gpu.sh, the one command that runs them on a GPU machine:
#
#   scripts/package-gpu.sh            # here
#   bash gpu-pack/run-gpu.sh          # there, from the repository root; logs in $OUT or gpu-pack/
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pack=gpu-pack
rm -rf "$pack"
mkdir -p "$pack/tests" "$pack/bin"
echo "package-gpu: building the CLI and the test binaries (release)"
cargo build --release --bin strata
cargo build --release --workspace --tests --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"] + "-" + m["target"]["kind"][0] + "\t" + m["executable"])
' | while IFS=$'\t' read -r name exe; do
  cp "$exe" "$pack/tests/$name"
done
cp target/release/strata "$pack/bin/strata"
# Debug info is most of a test binary's size; the device tool carries at most 64 MiB.
strip --strip-debug "$pack"/tests/* "$pack/bin/strata"
cp scripts/run-gpu.sh "$pack/run-gpu.sh"
ls -la "$pack/tests" "$pack/bin"
du -sh "$pack"
