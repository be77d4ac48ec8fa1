#!/usr/bin/env bash
# The test command: one release build shared by every test, then the whole suite.
# Integration tests spawn the real binaries under real mpirun (and Slurm where they need it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Idempotent: a few seconds when everything is installed already.
scripts/setup.sh
cargo build --release --workspace --bins --examples
cargo test --release --workspace -- --test-threads="${TCHRUN_TEST_THREADS:-2}" "$@"
