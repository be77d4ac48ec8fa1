#!/usr/bin/env bash
# The GPU check (issues 18, 26): the one command to run on a machine with NVIDIA GPUs that
# has this repository and its build. A machine without them (no network, only a python3 with
# torch) gets the GPU kit instead: scripts/gpu-kit.sh DIR, carried there, DIR/run.sh.
#
#   scripts/gpu-check.sh [--out DIR] [--build] [--no-bench] [--quick] [--bench-only]
#                        [--python PY] [--work DIR] [--budget SECONDS]
#
# Decides first whether there is a GPU, then builds what is missing (scripts/setup.sh when
# .venv is missing, `cargo build --release` when the binaries are, or with --build), builds the
# kit into target/gpu-kit (scripts/gpu-kit.sh) and runs its run.sh, so the checks are one
# set wherever they run (scripts/gpu-kit/run.sh --help lists them): the kit's own loading,
# Gloo and NCCL selftests, gradcheck on CUDA, 30 training steps with --amp off|bf16|fp16,
# SIGTERM then --resume, score on CUDA and the GPU benchmark against PyTorch eager.
# OUT (default target/gpu-check) gets gpu-check.md (the table), checks.log (every check's
# output) and bench-gpu.md (the benchmark's table; BENCHMARKS.md is not rewritten); work files
# go to target/gpu-check-work (--work). --python defaults to .venv/bin/python. The other
# flags are run.sh's: --no-bench, --quick (under 3 minutes), --bench-only, --budget.
#
# Exit codes:
#   0   every check passed
#   1   at least one check failed (its row says which; see OUT/checks.log)
#   2   usage error, or setup/build failed
#   77  no NVIDIA GPU on this machine: `nvidia-smi -L` fails or lists none and the driver's
#       list (/proc/driver/nvidia/gpus) is empty. Decided first, before any setup or build;
#       nothing is run. (77 is the "skipped" code of automake and meson test harnesses.)
# TCHRUN_GPU_CHECK_PROC replaces /proc/driver/nvidia/gpus (tests).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/gpu-check"
WORK="$ROOT/target/gpu-check-work"
PY=""
build=0
pass=()
usage() { echo "gpu-check: $* (see --help)" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) [[ $# -ge 2 ]] || usage "--out needs a directory"; OUT="$(realpath -m "$2")"; shift ;;
        --work) [[ $# -ge 2 ]] || usage "--work needs a directory"; WORK="$(realpath -m "$2")"; shift ;;
        --python) [[ $# -ge 2 ]] || usage "--python needs a program"; PY="$2"; shift ;;
        --budget) [[ $# -ge 2 ]] || usage "--budget needs seconds"; pass+=(--budget "$2"); shift ;;
        --build) build=1 ;;
        --no-bench|--quick|--bench-only) pass+=("$1") ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) usage "unknown argument '$1'" ;;
    esac
    shift
done

# --- 1. Is there a GPU? (first: no setup, no build, nothing else; the kit's own test) ----------
said="$(bash "$ROOT/scripts/gpu-kit/run.sh" --gpu-count)"
code=$?
if [[ $code != 0 ]]; then
    echo "$said"
    exit "$code"
fi

# --- 2. Setup, build, the kit ------------------------------------------------------------------
cd "$ROOT"
log() { printf '[gpu-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
if [[ ! -x .venv/bin/python || ! -e .venv/libtorch ]]; then
    log "scripts/setup.sh"
    scripts/setup.sh || { echo "gpu-check: scripts/setup.sh failed" >&2; exit 2; }
fi
if [[ $build == 1 || ! -x target/release/tchrun || ! -x target/release/tchrun-worker ]]; then
    log "cargo build --release --workspace --bins"
    timeout 3600 cargo build --release --workspace --bins \
        || { echo "gpu-check: the release build failed" >&2; exit 2; }
fi
scripts/gpu-kit.sh "$ROOT/target/gpu-kit" || { echo "gpu-check: scripts/gpu-kit.sh failed" >&2; exit 2; }

# --- 3. The checks: the kit's ------------------------------------------------------------------
exec "$ROOT/target/gpu-kit/run.sh" --out "$OUT" --work "$WORK" --python "${PY:-$ROOT/.venv/bin/python}" "${pass[@]}"
