#!/usr/bin/env bash
# The GPU check (issue 18): the one command to run on a machine with NVIDIA GPUs.
#
#   scripts/gpu-check.sh [--out DIR] [--build] [--no-bench]
#
# Runs every CUDA path of tchrun once and prints one table (check | result | figure | seconds),
# also written to OUT/gpu-check.md (OUT defaults to target/gpu-check; each check's output is in
# OUT/<check>.log):
#   - tchrun-worker NEEDs libtorch_cuda.so (CUDA visible at run time); the GPUs (nvidia-smi)
#   - NCCL selftest, `tchrun selftest --device cuda --backend nccl --procs-per-node N`, at
#     world size 1 and at every GPU count 2..G of this machine
#   - gradcheck on CUDA (`mpirun -np G tchrun-worker gradcheck --device cuda`)
#   - 30 training steps on the digits (scripts/make_digits.py) on G ranks with --amp off,
#     --amp bf16 and --amp fp16
#   - SIGTERM during training, then --resume, on CUDA
#   - `tchrun score --device cuda`
#   - `scripts/bench.sh --gpu` (rewrites the GPU section of BENCHMARKS.md; --no-bench skips it)
# Runs scripts/setup.sh first when .venv is missing, and `cargo build --release` when the
# binaries are missing (or with --build).
#
# Exit codes:
#   0   every check passed
#   1   at least one check failed (its row says which; see OUT/<check>.log)
#   2   usage error, or setup/build failed
#   77  no NVIDIA GPU on this machine: `nvidia-smi -L` fails or lists none and the driver's
#       list (/proc/driver/nvidia/gpus) is empty. Decided first, before any setup or build;
#       nothing is run. (77 is the "skipped" code of automake and meson test harnesses.)
# TCHRUN_GPU_CHECK_PROC replaces /proc/driver/nvidia/gpus (tests).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/gpu-check"
build=0
bench=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) [[ $# -ge 2 ]] || { echo "gpu-check: --out needs a directory" >&2; exit 2; }
               OUT="$(realpath -m "$2")"; shift ;;
        --build) build=1 ;;
        --no-bench) bench=0 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

# --- 1. Is there a GPU? (first: no setup, no build, nothing else) ---------------------------
PROC="${TCHRUN_GPU_CHECK_PROC:-/proc/driver/nvidia/gpus}"
smi_gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    smi_gpus="$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU [0-9]' || true)"
    smi_gpus="${smi_gpus:-0}"
fi
proc_gpus="$(find "$PROC" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
GPUS=$(( smi_gpus > proc_gpus ? smi_gpus : proc_gpus ))
if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then
    # CUDA counts the entries up to the first empty or -1 one.
    visible=0
    IFS=',' read -ra entries <<< "$CUDA_VISIBLE_DEVICES"
    for e in "${entries[@]}"; do
        e="${e// /}"
        [[ -z "$e" || "$e" == "-1" ]] && break
        visible=$((visible + 1))
    done
    GPUS=$(( visible < GPUS ? visible : GPUS ))
fi
if [[ "$GPUS" -lt 1 ]]; then
    echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi -L lists none, $PROC is empty${CUDA_VISIBLE_DEVICES+, or CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES hides them}); nothing was run. Run scripts/gpu-check.sh on a machine with GPUs (exit 77)."
    exit 77
fi

# --- 2. Setup and build ------------------------------------------------------------------------
cd "$ROOT"
mkdir -p "$OUT" || exit 2
log() { printf '[gpu-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
log "$GPUS GPU(s); results in $OUT"
if [[ ! -x .venv/bin/python || ! -e .venv/libtorch ]]; then
    log "scripts/setup.sh"
    scripts/setup.sh || { echo "gpu-check: scripts/setup.sh failed" >&2; exit 2; }
fi
T="$ROOT/target/release/tchrun"
W="$ROOT/target/release/tchrun-worker"
if [[ $build == 1 || ! -x "$T" || ! -x "$W" ]]; then
    log "cargo build --release --workspace --bins"
    timeout 3600 cargo build --release --workspace --bins \
        || { echo "gpu-check: the release build failed" >&2; exit 2; }
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

# --- 3. The checks ----------------------------------------------------------------------------
ROWS=()
FAILED=0
SECS=0
# row CHECK RESULT FIGURE SECONDS
row() {
    ROWS+=("| $1 | $2 | $3 | $4 |")
    [[ "$2" == pass ]] || FAILED=$((FAILED + 1))
    log "$1: $2 ($3, $4 s)"
}
# timed LIMIT LOG CMD...: runs CMD bounded by LIMIT seconds, output to LOG; SECS set.
timed() {
    local limit=$1 logf=$2 t0 rc
    shift 2
    t0=$(date +%s.%N)
    timeout --kill-after=30 "$limit" "$@" >"$logf" 2>&1
    rc=$?
    SECS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    return $rc
}
# The last error line of a log, for a failed row's figure.
why() {
    local line
    line="$(grep -E 'error|Error|ERROR|failed|refused' "$1" 2>/dev/null | tail -n 1 | cut -c1-140)"
    line="${line//|//}"
    echo "exit $2: ${line:-see $1}"
}
# The last metrics.jsonl line of a model directory, summarized.
metrics() {
    .venv/bin/python - "$1/metrics.jsonl" <<'PY' 2>/dev/null || echo "no metrics"
import json, sys
m = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"top1 {m['top1']:.3f}, loss {m['train_loss']:.3f}, {m['train_images_per_sec']:.0f} img/s")
PY
}

# Linking: CUDA must be visible to the worker (worker/build.rs).
if readelf -d "$W" 2>/dev/null | grep -q 'NEEDED.*\[libtorch_cuda\.so\]'; then
    row "tchrun-worker links libtorch_cuda.so" pass "NEEDED" 0
else
    row "tchrun-worker links libtorch_cuda.so" fail "not NEEDED: CUDA invisible to the worker" 0
fi
names="$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//; s/|/\//g' | paste -sd ';' -)"
row "GPUs (nvidia-smi)" pass "$GPUS visible: ${names:-nvidia-smi gave no details}" 0

# NCCL selftest at world size 1 and at every GPU count.
for n in $(seq 1 "$GPUS"); do
    name="NCCL selftest, $n rank(s)"
    logf="$OUT/selftest-$n.log"
    if timed 600 "$logf" "$T" selftest --device cuda --backend nccl --procs-per-node "$n" \
            --log-dir "$OUT/selftest-$n" \
        && grep -q "selftest: $n ranks on cuda:0 (nccl): all_reduce, broadcast, all_gather, barrier correct" "$logf"; then
        bw="$(awk '/busbw GB\/s/ { t = 1; next } t && NF == 6 { s = $1 " " $2; b = $6 } END { if (s != "") print "busbw " b " GB/s at " s }' "$logf")"
        row "$name" pass "collectives correct${bw:+; $bw}" "$SECS"
    else
        row "$name" fail "$(why "$logf" $?)" "$SECS"
    fi
done

# gradcheck: distributed gradient = combined-batch gradient, on CUDA.
logf="$OUT/gradcheck.log"
if timed 600 "$logf" "${MPIRUN[@]}" -np "$GPUS" "$W" gradcheck --device cuda --log-dir "$OUT/gradcheck"; then
    row "gradcheck on CUDA, $GPUS rank(s)" pass "$(grep -o 'max |distributed - combined batch| = [^ ;]*' "$logf" | head -n 1 | tr '|' '/')" "$SECS"
else
    row "gradcheck on CUDA, $GPUS rank(s)" fail "$(why "$logf" $?)" "$SECS"
fi

# Training data and model.
DATA="$OUT/digits"
if [[ ! -d "$DATA/train" ]]; then
    .venv/bin/python scripts/make_digits.py "$DATA" >"$OUT/make_digits.log" 2>&1 \
        || { echo "gpu-check: scripts/make_digits.py failed (see $OUT/make_digits.log)" >&2; exit 2; }
fi
MODEL="$OUT/untrained"
rm -rf "$MODEL"
"$T" model init --arch resnet18 --input-size 32 --output "$MODEL" >"$OUT/model_init.log" 2>&1 \
    || { echo "gpu-check: tchrun model init failed (see $OUT/model_init.log)" >&2; exit 2; }
images="$(find "$DATA/train" -type f | wc -l)"
# 30 steps in one epoch on GPUS ranks: per-rank batch ceil(images / (30 * GPUS)).
batch=$(( (images + 30 * GPUS - 1) / (30 * GPUS) ))
steps=$(( (images + batch * GPUS - 1) / (batch * GPUS) ))
TRAIN=("$T" train --model "$MODEL" --train "$DATA/train" --valid "$DATA/valid"
       --procs-per-node "$GPUS" --device cuda --lr 0.025 --min-crop-scale 0.5 --no-hflip)
for amp in off bf16 fp16; do
    name="train $steps steps, --amp $amp, $GPUS rank(s)"
    out="$OUT/train-$amp"
    rm -rf "$out"
    logf="$OUT/train-$amp.log"
    if timed 900 "$logf" "${TRAIN[@]}" --output "$out" --amp "$amp" --epochs 1 --batch-size "$batch" \
        && [[ -f "$out/model.json" ]]; then
        row "$name" pass "$(metrics "$out")" "$SECS"
    else
        row "$name" fail "$(why "$logf" $?)" "$SECS"
    fi
done

# SIGTERM during training, then --resume.
name="SIGTERM, then --resume, $GPUS rank(s)"
out="$OUT/resume"
rm -rf "$out"
logf="$OUT/resume.log"
t0=$(date +%s.%N)
"${TRAIN[@]}" --output "$out" --epochs 3 --batch-size 8 --print-freq 1 >"$logf" 2>&1 &
pid=$!
signalled=0
for _ in $(seq 1 3000); do # 300 s
    if grep -q "epoch 2/3 iter " "$out/logs/70_driver_log_0" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null && signalled=1
        break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [[ $signalled == 0 ]]; then kill -TERM "$pid" 2>/dev/null; fi
for _ in $(seq 1 1200); do # 120 s for the checkpoint and the stop
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
wait "$pid"
code=$?
if [[ $signalled == 1 && $code == 143 ]] && grep -q "checkpoint written" "$logf"; then
    echo "--- resume" >>"$logf"
    if timeout --kill-after=30 900 "${TRAIN[@]}" --output "$out" --epochs 3 --batch-size 8 --resume >>"$logf" 2>&1 \
        && grep -q "resuming from" "$logf" && [[ -f "$out/model.json" ]]; then
        SECS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        row "$name" pass "exit 143 with a checkpoint, resumed to a model; $(metrics "$out")" "$SECS"
    else
        SECS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        row "$name" fail "$(why "$logf" "resume")" "$SECS"
    fi
else
    SECS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    row "$name" fail "stop: exit $code (expected 143 and a checkpoint; signalled: $signalled)" "$SECS"
fi

# Score on CUDA.
logf="$OUT/score.log"
if [[ -f "$OUT/train-off/model.json" ]] && timed 600 "$logf" "$T" score --model "$OUT/train-off" \
        --images "$DATA/valid" --output "$OUT/scores.csv" --device cuda; then
    rows=$(( $(wc -l <"$OUT/scores.csv") - 1 ))
    row "score on CUDA" pass "$rows images, $(awk -v n="$rows" -v s="$SECS" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }') img/s incl. start" "$SECS"
else
    row "score on CUDA" fail "$(why "$logf" "${?}") (needs the --amp off model)" "${SECS:-0}"
fi

# The GPU benchmark (rewrites the GPU section of BENCHMARKS.md).
if [[ $bench == 1 ]]; then
    logf="$OUT/bench-gpu.log"
    if timed 3600 "$logf" scripts/bench.sh --gpu; then
        row "scripts/bench.sh --gpu" pass "table in BENCHMARKS.md (GPU section)" "$SECS"
    else
        row "scripts/bench.sh --gpu" fail "$(why "$logf" $?)" "$SECS"
    fi
fi

# --- 4. The table -----------------------------------------------------------------------------
{
    echo "Command: \`scripts/gpu-check.sh\` · date: $(date -u '+%Y-%m-%d %H:%M UTC') · commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "| check | result | figure | seconds |"
    echo "|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    if [[ $FAILED == 0 ]]; then echo "All ${#ROWS[@]} checks passed."; else echo "$FAILED of ${#ROWS[@]} checks failed (logs in $OUT)."; fi
} | tee "$OUT/gpu-check.md"
[[ $FAILED == 0 ]] || exit 1
exit 0
