#!/usr/bin/env bash
# Issue 51: does the authenticated rendezvous slow a job's start? Paired runs, alternating:
# the same 2-rank `tchrun selftest` (start, bootstrap, store, Gloo group, one 4 KiB all-reduce,
# exit) with the binaries of BEFORE (no rendezvous) and AFTER (this tree), N times each.
# usage: scripts/bench-rendezvous.sh BEFORE_BIN_DIR AFTER_BIN_DIR [N] [LAUNCHER]
set -euo pipefail
before=$1 after=$2 n=${3:-10} launcher=${4:-local}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
extra=()
[ "$launcher" = mpirun ] && extra=(--oversubscribe)
one() {
  local s e
  s=$(date +%s.%N)
  "$1/tchrun" selftest --launcher "$launcher" --procs-per-node 2 "${extra[@]}" \
    --sizes 4096 --iters 1 --log-dir "$tmp/logs" >/dev/null 2>&1
  e=$(date +%s.%N)
  echo "$e - $s" | bc
}
for i in $(seq "$n"); do
  echo "before $(one "$before")"
  echo "after $(one "$after")"
done | awk '{ t[$1] += $2; t2[$1] += $2 * $2; c[$1]++; print }
  END { for (k in t) { m = t[k] / c[k]; sd = sqrt(t2[k] / c[k] - m * m);
        printf "%s: mean %.3f s, sd %.3f s over %d runs\n", k, m, sd, c[k] } }'
