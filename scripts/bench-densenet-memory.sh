#!/usr/bin/env bash
# DenseNet --memory-efficient: peak memory and step time of DenseNet training steps on CPU
# (synthetic tensors: forward, loss, backward, SGD), plain versus memory-efficient, tchrun
# (`tchrun-worker bench-step`) versus PyTorch (benches/reference/bench_step.py, torchvision's
# memory_efficient=False/True), the same batch.
#
#   scripts/bench-densenet-memory.sh [--arch densenet121] [--size 224] [--batch 32] [--steps 2]
#       [--warmup 1] [--threads N] [--repeats 1] [--no-python]
#
# Every configuration runs as its own process under `/usr/bin/time -f %M` (the child's peak
# RSS); ms/step is the tools' own timing of the --steps steps after --warmup. tchrun uses its
# training layout (channels-last), PyTorch its default (NCHW), as scripts/bench.sh does.
# --threads: intra-op threads of both (default: nproc). Prints a Markdown table (medians over
# --repeats). Needs the release build and the venv of scripts/setup.sh (or
# TCHRUN_BENCH_PYTHON, a Python with torch and torchvision).
set -euo pipefail
cd "$(dirname "$0")/.."
command_args="$*"
arch=densenet121 size=224 batch=32 steps=2 warmup=1 threads=$(nproc) repeats=1 python=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --arch) arch=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --batch) batch=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --repeats) repeats=$2; shift 2 ;;
        --no-python) python=0; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-densenet-memory.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
worker=target/release/tchrun-worker
py=${TCHRUN_BENCH_PYTHON:-.venv/bin/python}
if [[ ! -x $worker ]]; then
    echo "bench-densenet-memory.sh: $worker missing: cargo build --release first" >&2
    exit 2
fi
if [[ ! -x /usr/bin/time ]]; then
    echo "bench-densenet-memory.sh: needs /usr/bin/time (GNU time)" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--arch "$arch" --size "$size" --batch-size "$batch" --steps "$steps" --warmup "$warmup"
        --threads "$threads")

# measure NAME COMMAND...: one line "NAME PEAK_RSS_KIB JSON" in $tmp/results.
measure() {
    local name=$1
    shift
    if ! /usr/bin/time -f '%M' -o "$tmp/rss" "$@" >"$tmp/out" 2>"$tmp/err"; then
        echo "bench-densenet-memory.sh: failed: $*" >&2
        cat "$tmp/err" >&2
        exit 1
    fi
    echo "$name $(tail -1 "$tmp/rss") $(grep -o '{.*}' "$tmp/out" | tail -1)" >>"$tmp/results"
    echo "  $name: $(tail -1 "$tmp/rss") KiB" >&2
}

start=$(date +%s)
for _ in $(seq "$repeats"); do
    for me in plain memory_efficient; do
        flag=()
        [[ $me == memory_efficient ]] && flag=(--memory-efficient)
        measure "tchrun/$me" "$worker" bench-step "${common[@]}" "${flag[@]}"
        if [[ $python == 1 ]]; then
            measure "torch/$me" "$py" benches/reference/bench_step.py "${common[@]}" "${flag[@]}"
        fi
    done
done
took=$(($(date +%s) - start))

"$py" - "$tmp/results" "$took" "$command_args" <<'EOF'
import json
import statistics
import sys

path, took, args = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rss, ms, meta = {}, {}, {}
for line in open(path):
    name, kib, js = line.split(" ", 2)
    d = json.loads(js)
    rss.setdefault(name, []).append(int(kib) / 1024)
    ms.setdefault(name, []).append(d["ms_per_step"])
    meta = d
med = lambda v: statistics.median(v)
print(f"Command: `scripts/bench-densenet-memory.sh{' ' + args if args else ''}` (took {took} s); "
      f"{meta['arch']}, {meta['size']}x{meta['size']}, batch {meta['batch_size']}, CPU, "
      f"{meta['threads']} thread(s), {meta['steps']} timed step(s); peak RSS of each process "
      f"(/usr/bin/time %M); median of {len(ms['tchrun/plain'])} run(s)\n")
print("| tool | peak RSS plain (MiB) | peak RSS memory-efficient (MiB) | memory-efficient / plain "
      "| ms/step plain | ms/step memory-efficient | memory-efficient / plain |")
print("|---|---|---|---|---|---|---|")
tools = [t for t in ("tchrun", "torch") if f"{t}/plain" in rss]
for t in tools:
    rp, re_ = med(rss[f"{t}/plain"]), med(rss[f"{t}/memory_efficient"])
    mp, me = med(ms[f"{t}/plain"]), med(ms[f"{t}/memory_efficient"])
    label = "tchrun" if t == "tchrun" else "PyTorch (torchvision)"
    print(f"| {label} | {rp:.0f} | {re_:.0f} | {re_ / rp:.2f}x | {mp:.0f} | {me:.0f} | {me / mp:.2f}x |")
if len(tools) == 2:
    r = lambda d, k: med(d[f"tchrun/{k}"]) / med(d[f"torch/{k}"])
    print(f"| tchrun / PyTorch | {r(rss, 'plain'):.2f}x | {r(rss, 'memory_efficient'):.2f}x | "
          f"| {r(ms, 'plain'):.2f}x | {r(ms, 'memory_efficient'):.2f}x | |")
EOF
