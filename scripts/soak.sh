#!/usr/bin/env bash
# Fault soak: N times, train on 2 ranks (mpirun and local launchers alternate), kill -9 a
# random rank at a random step of epoch 2, and check: exit code 4 within 10 s, the summary
# names that rank, no process of the job is left, and the epoch-1 checkpoint resumes to a
# complete model. Prints one line per run and a summary (the figures in RELIABILITY.md).
#   scripts/soak.sh [RUNS=50]
# Restart mode: N times, train 3 epochs on 2 ranks with --max-restarts 1 while the worker's test
# hook (TCHRUN_TEST_KILL_AT_STEP) kills a random rank at a random step of epoch 2 or 3 in the
# first attempt; check exit 0 after one restart, a model bit-identical to an uninterrupted
# run's, and no process left.
#   scripts/soak.sh --restart [RUNS=20]
set -uo pipefail
MODE=kill
if [ "${1:-}" = "--restart" ]; then MODE=restart; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
T="$ROOT/target/release/tchrun"
RUNS="${1:-$([ "$MODE" = restart ] && echo 20 || echo 50)}"
WORK="$(mktemp -d /tmp/tchrun-soak.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
"$ROOT/.venv/bin/python" "$ROOT/scripts/make_digits.py" "$WORK/full" >/dev/null
mkdir -p "$WORK/data"
for s in train valid; do
  n=$([ "$s" = train ] && echo 40 || echo 10)
  for c in 0 1 2 3 4 5 6 7 8 9; do
    mkdir -p "$WORK/data/$s/$c"
    ls "$WORK/full/$s/$c" | head -"$n" | while read -r f; do cp "$WORK/full/$s/$c/$f" "$WORK/data/$s/$c/"; done
  done
done
"$T" model init --arch resnet18 --input-size 32 --output "$WORK/model" >/dev/null
if [ "$MODE" = restart ]; then
  common=(--model "$WORK/model" --train "$WORK/data/train" --valid "$WORK/data/valid"
          --procs-per-node 2 --epochs 3 --batch-size 20 --lr 0.05 --print-freq 5)
  env -u TCHRUN_TEST_KILL_AT_STEP "$T" train "${common[@]}" --launcher local --output "$WORK/reference" >/dev/null 2>&1 \
    || { echo "soak: the reference run failed"; exit 1; }
  ok=0; equal=0; clean=0; restarted=0
  for i in $(seq 1 "$RUNS"); do
    launcher=$([ $((i % 2)) = 0 ] && echo local || echo mpirun)
    victim=$((RANDOM % 2)); step=$((RANDOM % 20 + 10))   # 10 steps an epoch: epoch 2 or 3
    out="$WORK/run$i"
    TCHRUN_TEST_KILL_AT_STEP="$victim:$step" "$T" train "${common[@]}" --launcher "$launcher" \
      --oversubscribe --max-restarts 1 --output "$out" >"$WORK/out$i" 2>"$WORK/err$i"
    code=$?
    sleep 0.5
    left=$(pgrep -f "$out" | wc -l)
    [ "$code" = 0 ] && ok=$((ok + 1))
    grep -q "recovered after 1 restart" "$WORK/out$i" && restarted=$((restarted + 1))
    same=no
    cmp -s "$out/model.safetensors" "$WORK/reference/model.safetensors" && { equal=$((equal + 1)); same=yes; }
    [ "$left" = 0 ] && clean=$((clean + 1))
    printf 'run %2d %-6s rank %d killed before step %2d: exit %s, model equal %s, leftovers %s\n' \
      "$i" "$launcher" "$victim" "$step" "$code" "$same" "$left"
    rm -rf "$out"
  done
  echo "soak restart: $RUNS runs; exit 0: $ok; restarted once: $restarted; model equal to the uninterrupted run: $equal; no leftovers: $clean"
  exit 0
fi
ok=0; named=0; fast=0; clean=0; resumed=0; worst=0
for i in $(seq 1 "$RUNS"); do
  launcher=$([ $((i % 2)) = 0 ] && echo local || echo mpirun)
  victim=$((RANDOM % 2)); step=$((RANDOM % 10 + 1))
  out="$WORK/run$i"
  args=(train --model "$WORK/model" --train "$WORK/data/train" --valid "$WORK/data/valid" --output "$out"
        --procs-per-node 2 --launcher "$launcher" --epochs 2 --batch-size 20 --lr 0.05
        --min-crop-scale 0.5 --no-hflip --print-freq 1)
  setsid "$T" "${args[@]}" >"$WORK/out$i" 2>"$WORK/err$i" &
  pid=$!
  for _ in $(seq 1 1200); do
    grep -q "epoch 2/2 iter $step/" "$out/logs/70_driver_log_0" 2>/dev/null && break
    sleep 0.1
  done
  rpid=$(sed -n 's/^pid: //p' "$out/logs/70_driver_log_$victim" 2>/dev/null)
  t0=$(date +%s.%N)
  kill -9 "$rpid" 2>/dev/null
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  t1=$(date +%s.%N)
  wait "$pid"; code=$?
  secs=$(echo "$t1 - $t0" | bc)
  worst=$(echo "if ($secs > $worst) $secs else $worst" | bc)
  sleep 0.5
  left=$(pgrep -f "$out" | wc -l)
  r_ok=no
  [ "$code" = 4 ] && ok=$((ok + 1))
  grep -q "rank $victim failed first" "$WORK/err$i" && named=$((named + 1))
  [ "$(echo "$secs < 10" | bc)" = 1 ] && fast=$((fast + 1))
  [ "$left" = 0 ] && clean=$((clean + 1))
  if "$T" "${args[@]}" --resume >/dev/null 2>&1 && [ -f "$out/model.json" ]; then resumed=$((resumed + 1)); r_ok=yes; fi
  printf 'run %2d %-6s rank %d at epoch 2 step %2d: exit %s after %.2fs, leftovers %s, resumed %s\n' \
    "$i" "$launcher" "$victim" "$step" "$code" "$secs" "$left" "$r_ok"
  rm -rf "$out"
done
echo "soak: $RUNS runs; exit 4: $ok; right rank named: $named; ended < 10 s: $fast (worst ${worst}s); no leftovers: $clean; resumed: $resumed"
