#!/usr/bin/env bash
# Sets up everything (apt packages, venv with torch, release build) and runs the demo job.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
cargo build --release --workspace --bins
OUT="${1:-$ROOT/demo-out}"
mkdir -p "$OUT"
# The process-group self-test on 2 local ranks: collectives checked, bandwidth measured.
target/release/tchrun selftest --procs-per-node 2 --log-dir "$OUT/selftest-logs"
echo "demo: driver logs in $OUT/selftest-logs"
