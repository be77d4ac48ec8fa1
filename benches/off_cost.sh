#!/usr/bin/env bash
# What a feature that a variable switches off costs: the same training job with it on (the
# default), with VAR=VALUE (off), and the PyTorch reference (torchrun + DDP,
# benches/reference/train_ddp.py), alternating, ROUNDS times.
#
#   benches/off_cost.sh VAR=VALUE [ROUNDS] [RANKS] [SIZE]     (defaults 3, 2, 32)
#
#   TCHRUN_COLLECTIVE_TRACE=0   the collective trace (issue 28; benches/trace_cost.sh)
#   TCHRUN_LIVE_STATUS=0        status.json and the straggler windows (issue 29)
#   TCHRUN_PROMETHEUS_TEXTFILE= the Prometheus textfile (issue 50), with the variable set to a
#                               directory for the on side: VAR= runs the off side without VAR
#
# ResNet-18 at SIZE px on scikit-learn's digits (1,437 train images; small images make many
# steps, so the most collectives per second), 3 epochs, batch 32 per rank. Prints each run's
# images/s (mean of the epochs after the first) and, per round, on/off and on/reference
# ratios; then their medians. Needs the venv and build of scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
off_var=${1:?usage: benches/off_cost.sh VAR=VALUE [ROUNDS] [RANKS] [SIZE]}; shift
rounds=${1:-3}; ranks=${2:-2}; size=${3:-32}
T=target/release/tchrun
PY=.venv/bin/python
work=${TRACE_COST_OUT:-target/trace-cost}
mkdir -p "$work"
[[ -d $work/data/train ]] || "$PY" scripts/make_digits.py "$work/data" > /dev/null
model=$work/model-$size
[[ -f $model/model.json ]] || "$T" model init --arch resnet18 --input-size "$size" --output "$model" > /dev/null
mean_warm() {  # images/s of the epochs after the first, from metrics.jsonl
    "$PY" -c "import json,sys; v=[json.loads(l)['train_images_per_sec'] for l in open(sys.argv[1]) if l.strip()]; print(round(sum(v[1:])/len(v[1:]),2))" "$1"
}
tchrun_side() {  # $1 = on|off
    local o=$work/run-$1
    rm -rf "$o"
    local env=()
    # VAR= (empty): the off side runs without VAR (on: VAR as inherited, e.g.
    # TCHRUN_PROMETHEUS_TEXTFILE=DIR benches/off_cost.sh TCHRUN_PROMETHEUS_TEXTFILE=).
    if [[ $1 == off ]]; then
        if [[ $off_var == *= ]]; then env=(-u "${off_var%=}"); else env=("$off_var"); fi
    fi
    env "${env[@]}" timeout 900 "$T" train --model "$model" --train "$work/data/train" \
        --valid "$work/data/valid" --output "$o" --epochs 3 --batch-size 32 \
        --procs-per-node "$ranks" --launcher local --patience 100 > "$o.stdout" 2>&1 \
        || { echo "tchrun ($1) failed:" >&2; tail -5 "$o.stdout" >&2; exit 1; }
    mean_warm "$o/metrics.jsonl"
}
ref_side() {
    local o=$work/run-ref
    rm -rf "$o"
    OMP_NUM_THREADS=$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 )) timeout 900 .venv/bin/torchrun \
        --standalone --nproc-per-node "$ranks" benches/reference/train_ddp.py --arch resnet18 \
        --size "$size" --train "$work/data/train" --valid "$work/data/valid" --output "$o" \
        --epochs 3 --batch-size 32 --patience 100 > "$o.stdout" 2>&1 \
        || { echo "reference failed:" >&2; tail -5 "$o.stdout" >&2; exit 1; }
    "$PY" -c "
import json,sys
for l in open(sys.argv[1]):
    if l.startswith('RESULT '):
        v=json.loads(l[7:])['train_images_per_sec']; print(round(sum(v[1:])/len(v[1:]),2))
" "$o.stdout"
}
echo "cost of what $off_var switches off: resnet18 ${size}px, $ranks ranks, batch 32, 3 epochs, $rounds rounds ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD))"
ratios=()
for r in $(seq 1 "$rounds"); do
    if (( r % 2 )); then on=$(tchrun_side on); off=$(tchrun_side off); else off=$(tchrun_side off); on=$(tchrun_side on); fi
    ref=$(ref_side)
    line=$("$PY" -c "import sys; on,off,ref=map(float,sys.argv[1:]); print(f'{on/off:.3f} {on/ref:.3f} {off/ref:.3f}')" "$on" "$off" "$ref")
    echo "round $r: on $on images/s, off $off, reference $ref; on/off $(cut -d' ' -f1 <<<"$line"), on/reference $(cut -d' ' -f2 <<<"$line"), off/reference $(cut -d' ' -f3 <<<"$line")"
    ratios+=("$line")
done
"$PY" -c "
import statistics,sys
rows=[list(map(float,x.split())) for x in sys.argv[1:]]
m=[statistics.median(c) for c in zip(*rows)]
print(f'median of {len(rows)} rounds: on/off {m[0]:.3f}, on/reference {m[1]:.3f}, off/reference {m[2]:.3f}')
" "${ratios[@]}"
