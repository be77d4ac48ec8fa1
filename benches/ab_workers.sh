#!/usr/bin/env bash
# A/B of two builds on the same training job, alternating (for measuring one change).
#
#   benches/ab_workers.sh OLD_BIN_DIR NEW_BIN_DIR [RANKS] [ROUNDS] [EXTRA TRAIN FLAGS...]
#
# *_BIN_DIR hold `tchrun` and `tchrun-worker` (e.g. a copy of target/release of each commit).
# Uses the small training set and model of scripts/bench.sh (run it once first; BENCH_OUT,
# default target/bench). Prints, per run: the images/s of the epochs after the first (mean) and
# rank 0's summary (compute seconds, communication not hidden by backward, images/s).
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?OLD_BIN_DIR}; new=${2:?NEW_BIN_DIR}; ranks=${3:-2}; rounds=${4:-4}
shift $(( $# < 4 ? $# : 4 ))
out=${BENCH_OUT:-target/bench}
data=$(ls -d "$out"/data-train-full-* 2>/dev/null | head -1)
model=$(ls -d "$out"/model-* 2>/dev/null | head -1)
if [[ -z "$data" || -z "$model" ]]; then
    echo "ab_workers.sh: no dataset/model in $out: run scripts/bench.sh first" >&2
    exit 2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/tchrun-ab-XXXXXX")
trap 'rm -rf "$work"' EXIT
for r in $(seq 1 "$rounds"); do
    for side in old new; do
        bin=$old; [[ $side == new ]] && bin=$new
        o="$work/$side-$r"
        timeout 600 "$bin/tchrun" train --model "$model" --train "$data/train" --valid "$data/valid" \
            --output "$o" --epochs 3 --batch-size 16 --procs-per-node "$ranks" --launcher local \
            --patience 100 --worker "$bin/tchrun-worker" "$@" > "$o.stdout" 2>&1 || {
            echo "round $r $side: failed (see below)"; tail -5 "$o.stdout"; exit 1; }
        ips=$(.venv/bin/python -c "import json,sys; v=[json.loads(l)['train_images_per_sec'] for l in open(sys.argv[1])]; print(round(sum(v[1:])/len(v[1:]),2))" "$o/metrics.jsonl")
        summary=$(grep -h "rank summary" "$o/logs/70_driver_log_0" | sed 's/.*rank summary: //')
        echo "round $r $side: images/s $ips | $summary"
    done
done
