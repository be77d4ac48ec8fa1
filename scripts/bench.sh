#!/usr/bin/env bash
# Side-by-side benchmark: tchrun versus torchrun + DDP + torchvision (issue 6).
#
#   scripts/bench.sh [--smoke] [--repeats N] [--out DIR] [--table FILE] [--build] [more]
#
# Runs tchrun and the PyTorch reference (benches/reference/) alternately, --repeats times
# (default 3; medians), on generated JPEG datasets, and prints a Markdown table with ratios
# tchrun / reference. A full run updates the generated section of BENCHMARKS.md; --smoke
# (1 repeat, tiny sizes, < 2 minutes) writes OUT/BENCHMARKS.md only.
#   --out DIR     work directory: datasets (kept between runs), outputs, logs (default target/bench)
#   --build       cargo build --release first (otherwise only when the binaries are missing)
#   --cases LIST  a subset of train1,train2,first2,step,loader,busbw (table to OUT only)
#   --gpu         the GPU mode (ResNet-50, bf16, channels-last; synthetic and decoded JPEGs)
#   --matrix      the step-overhead matrix instead (benches/matrix.py --help): the step alone and
#                 the whole trainer at 32/64/112/224 px, batch 16/64, 1 and 2 ranks, and the
#                 whole small job, each a ratio against PyTorch in the same run
#   more: --arch, --train-size, --train-images, --valid-images, --epochs, --batch-size,
#         --big-images, --loader-size, --loader-batch, --loader-epochs, --sizes, --iters,
#         --step-arch, --step-size, --step-batch, --step-steps
# TCHRUN_BENCH_PYTHON / TCHRUN_BENCH_TORCHRUN: another Python with torch (a GPU machine's).
# Needs the venv and build of scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build=0
matrix=0
args=()
for a in "$@"; do
    case "$a" in
        --build) build=1 ;;
        --matrix) matrix=1 ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) args+=("$a") ;;
    esac
done
if [[ -z "${TCHRUN_BENCH_PYTHON:-}" && ( ! -x .venv/bin/python || ! -x .venv/bin/torchrun ) ]]; then
    echo "bench.sh: .venv missing: run scripts/setup.sh first" >&2
    exit 2
fi
if [[ $build == 1 || ! -x target/release/tchrun || ! -x target/release/tchrun-worker ]]; then
    timeout 1800 cargo build --release
fi
export PYTHONUNBUFFERED=1
if [[ $matrix == 1 ]]; then
    exec "${TCHRUN_BENCH_PYTHON:-.venv/bin/python}" benches/matrix.py --command "scripts/bench.sh $*" "${args[@]}"
fi
exec "${TCHRUN_BENCH_PYTHON:-.venv/bin/python}" benches/bench.py --command "scripts/bench.sh $*" "${args[@]}"
