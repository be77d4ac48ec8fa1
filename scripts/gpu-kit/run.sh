#!/usr/bin/env bash
# The GPU check (issues 18, 26): the entry script of the tchrun GPU kit (scripts/gpu-kit.sh
# builds the kit; scripts/gpu-check.sh builds it and runs this). Needs nothing on the machine
# but bash, coreutils and a python3 with torch 2.11: no network, no compiler, nothing installed.
#
#   run.sh [--out OUT] [--work DIR] [--python PY] [--quick] [--no-bench | --bench-only]
#          [--budget SECONDS]
#   run.sh --cpu-smoke [--out OUT] [--work DIR] [--python PY]
#   run.sh --gpu-count
#
# Runs every CUDA path of tchrun once and writes one table (check | result | figure | seconds):
#   - the kit itself: PY's torch is the one the worker was built against; the kit's wheel
#     installs with pip (no network) into WORK/env, a venv of PY whose site-packages links
#     PY's, as a user installs it beside their torch; the installed tchrun-worker NEEDs
#     libtorch_cuda.so (CUDA visible at run time); tchrun, tchrun-worker and the kit's
#     OpenMPI load (libtorch through the wheel's RUNPATH from that environment, no
#     LD_LIBRARY_PATH; OpenMPI relocated to the kit); the GPUs (nvidia-smi)
#   - Gloo selftest on 2 CPU ranks through the kit's mpirun
#   - NCCL selftest, `tchrun selftest --device cuda --backend nccl --procs-per-node N`, at
#     world size 1 and at every GPU count 2..G of this machine (--quick: 1 and G)
#   - gradcheck on CUDA (`mpirun -np G tchrun-worker gradcheck --device cuda`)
#   - 30 training steps on the digits (scripts/make_digits.py) on G ranks with --amp off,
#     --amp bf16 and --amp fp16 (--quick: 10 steps, off and bf16)
#   - SIGTERM during training, then --resume, on CUDA
#   - `tchrun score --device cuda`
#   - the GPU benchmark against PyTorch eager on the same GPU (benches/bench.py --gpu, 2
#     repeats; --bench-only: the benchmark alone, 3 repeats; --quick and --no-bench skip it)
# --cpu-smoke runs the kit's CPU path instead, on any machine (no GPU check, no exit 77): the
# same kit checks, Gloo selftest and gradcheck on 2 CPU ranks, 5 training steps on 2 CPU
# ranks and a CPU score, all through the kit's mpirun (tests/gpu_kit.rs runs it offline, with
# the system OpenMPI hidden).
#
# OUT (default ./gpu-check) gets at most three files: gpu-check.md (the table, rewritten after
# every check), checks.log (every check's command and output, and the rank logs of a failed
# one) and bench-gpu.md (the benchmark's table). Work files (data, models, rank logs) go to
# --work DIR (default a new /tmp/tchrun-gpu-check.XXXXXX), never under OUT. Every command is
# bounded (`timeout`), and the whole run by --budget (default 540 s; --quick 170, --cpu-smoke
# 240, --bench-only 560): a check that would start too late is "not run" and the table is
# complete before a 10-minute limit.
#   --python PY   the Python with torch (default: TCHRUN_KIT_PYTHON, else python3)
#   --gpu-count   print the number of usable GPUs (exit 0), or exit 77 as below; nothing else
#
# Exit codes:
#   0   every check passed
#   1   at least one check failed or was not run (its row says which; see OUT/checks.log)
#   2   usage error, not a built kit, or no Python with torch
#   77  no NVIDIA GPU on this machine: `nvidia-smi -L` fails or lists none and the driver's
#       list (/proc/driver/nvidia/gpus) is empty. Decided first, before anything else;
#       nothing is run. (77 is the "skipped" code of automake and meson test harnesses.)
# TCHRUN_GPU_CHECK_PROC replaces /proc/driver/nvidia/gpus (tests).
set -uo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
CMDLINE="$(basename "$0")${*:+ $*}"
OUT="$PWD/gpu-check"
WORK=""
PY="${TCHRUN_KIT_PYTHON:-python3}"
mode=gpu
quick=0
bench=1
budget=""
usage() { echo "gpu-check: $* (see --help)" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) [[ $# -ge 2 ]] || usage "--out needs a directory"; OUT="$(realpath -m "$2")"; shift ;;
        --work) [[ $# -ge 2 ]] || usage "--work needs a directory"; WORK="$(realpath -m "$2")"; shift ;;
        --python) [[ $# -ge 2 ]] || usage "--python needs a program"; PY="$2"; shift ;;
        --budget) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || usage "--budget needs whole seconds"; budget="$2"; shift ;;
        --quick) quick=1 ;;
        --no-bench) bench=0 ;;
        --bench-only) mode=bench ;;
        --cpu-smoke) mode=cpu ;;
        --gpu-count) mode=count ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) usage "unknown argument '$1'" ;;
    esac
    shift
done
[[ $mode == bench && $bench == 0 ]] && usage "--bench-only and --no-bench contradict each other"

# --- 1. Is there a GPU? (first: nothing else runs before this) ---------------------------------
count_gpus() {
    local proc smi_gpus=0 proc_gpus visible e entries
    proc="${TCHRUN_GPU_CHECK_PROC:-/proc/driver/nvidia/gpus}"
    if command -v nvidia-smi >/dev/null 2>&1; then
        smi_gpus="$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU [0-9]' || true)"
        smi_gpus="${smi_gpus:-0}"
    fi
    proc_gpus="$(find "$proc" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
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
        echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi -L lists none, $proc is empty${CUDA_VISIBLE_DEVICES+, or CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES hides them}); nothing was run. Run it on a machine with NVIDIA GPUs (exit 77)."
        exit 77
    fi
}
GPUS=0
if [[ $mode != cpu ]]; then
    count_gpus
    if [[ $mode == count ]]; then echo "$GPUS"; exit 0; fi
fi

# --- 2. The kit, the Python, OUT and the work directory ------------------------------------------
WHEELS=("$KIT"/wheel/tchrun-*.whl)
[[ ${#WHEELS[@]} == 1 && -f "${WHEELS[0]}" && -f "$KIT/env.sh" ]] \
    || usage "$KIT is not a built kit (no wheel/tchrun-*.whl): build one with scripts/gpu-kit.sh DIR and run DIR/run.sh"
WHEEL="${WHEELS[0]}"
command -v "$PY" >/dev/null 2>&1 || usage "no Python '$PY': pass --python PATH (a Python with torch 2.11)"
PY="$(command -v "$PY")"
# Four lines after a marker (an import may print warnings first).
if ! pyinfo="$(timeout 120 "$PY" -c 'import os, sys, torch
print("tchrun-pyinfo")
print(torch.__version__)
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
print(torch.version.cuda or "none")
print(sys.version.split()[0])' 2>&1)" || [[ "$pyinfo" != *tchrun-pyinfo* ]]; then
    echo "gpu-check: '$PY' cannot import torch: ${pyinfo##*$'\n'}; pass --python PATH (a Python with torch 2.11)" >&2
    exit 2
fi
{ read -r PY_TORCH; read -r TORCH_LIB; read -r PY_CUDA; read -r PY_VERSION; } <<<"${pyinfo##*tchrun-pyinfo$'\n'}"
PY_MM="$(cut -d. -f1-2 <<<"$PY_VERSION")"
KIT_TORCH="$(awk '/^torch: / { print $2 }' "$KIT/MANIFEST" 2>/dev/null)"
KIT_COMMIT="$(awk '/^commit: / { print $2 }' "$KIT/MANIFEST" 2>/dev/null)"
export TCHRUN_KIT_PYTHON="$PY" PYTHONUNBUFFERED=1
mkdir -p "$OUT" || usage "cannot create $OUT"
if [[ -z "$WORK" ]]; then
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/tchrun-gpu-check.XXXXXX")" || usage "cannot create a work directory"
fi
case "$WORK/" in "$OUT/"*) usage "--work must not be inside --out (OUT keeps only the result files)" ;; esac
mkdir -p "$WORK/logs" || usage "cannot create $WORK"
rm -f "$OUT/gpu-check.md" "$OUT/checks.log" "$OUT/bench-gpu.md"
if [[ -z "$budget" ]]; then
    case "$mode/$quick" in cpu/*) budget=240 ;; bench/*) budget=560 ;; gpu/1) budget=170 ;; *) budget=540 ;; esac
fi
START=$(date +%s)
DEADLINE=$((START + budget))
say() { printf '[gpu-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# Where the wheel gets installed (section 4), as a user installs it: the bin/ of an
# environment that holds PY's torch.
ENVDIR="$WORK/env"
export TCHRUN_KIT_BIN="$ENVDIR/bin"
T="$KIT/bin/tchrun"
W="$KIT/bin/tchrun-worker"
MPIRUN=("$KIT/bin/mpirun" --allow-run-as-root --oversubscribe --bind-to none)
# The kit's environment for one command (bin/ wrappers do the same for their programs).
kit_env() { ( export KIT; . "$KIT/env.sh" && exec "$@" ); }
say "mode $mode$([[ $quick == 1 ]] && echo ' (quick)'); $GPUS GPU(s); $PY (torch $PY_TORCH); results in $OUT, work files in $WORK; budget ${budget} s"

# --- 3. Rows, the table, the log -----------------------------------------------------------------
ROWS=()
FAILED=0
SECS=0
SKIPPED=0
LASTCMD=""
table() {
    local state=$1
    {
        echo "Command: \`$CMDLINE\` · date: $(date -u '+%Y-%m-%d %H:%M UTC') · kit: commit ${KIT_COMMIT:-?}, built against torch ${KIT_TORCH:-?} · python: $PY (torch $PY_TORCH, CUDA $PY_CUDA, Python $PY_VERSION)"
        echo
        echo "| check | result | figure | seconds |"
        echo "|---|---|---|---|"
        printf '%s\n' "${ROWS[@]}"
        echo
        if [[ $state == running ]]; then
            echo "Still running ($(( $(date +%s) - START )) s so far); logs in checks.log."
        elif [[ $FAILED == 0 ]]; then
            echo "All ${#ROWS[@]} checks passed ($(( $(date +%s) - START )) s)."
        else
            echo "$FAILED of ${#ROWS[@]} checks failed or were not run ($(( $(date +%s) - START )) s); logs in checks.log."
        fi
    } >"$OUT/gpu-check.md"
}
# row NAME RESULT FIGURE SECONDS [LOG [RANK_LOG_DIR]]: one table row; the log into checks.log.
row() {
    local name=$1 result=$2 fig=${3//|//} secs=$4 logf=${5:-} rdir=${6:-} f lines=300
    if [[ $SKIPPED == 1 && $result != pass ]]; then
        result="not run"
        fig="out of time (--budget $budget s)"
    fi
    SKIPPED=0
    ROWS+=("| $name | $result | $fig | $secs |")
    [[ "$result" == pass ]] || { FAILED=$((FAILED + 1)); lines=2000; }
    say "$name: $result ($fig, $secs s)"
    {
        echo "======== $name: $result ($secs s)"
        echo "figure: $fig"
        [[ -n "$LASTCMD" ]] && echo "command: $LASTCMD"
        if [[ -n "$logf" && -f "$logf" ]]; then
            echo "-------- output (last $lines lines)"
            tail -n "$lines" "$logf"
        fi
        if [[ "$result" != pass && -n "$rdir" && -d "$rdir" ]]; then
            for f in "$rdir"/70_mpi_log "$rdir"/70_driver_log_* "$rdir"/logs/70_mpi_log "$rdir"/logs/70_driver_log_*; do
                [[ -f "$f" ]] || continue
                echo "-------- $f (last 200 lines)"
                tail -n 200 "$f"
            done
        fi
        echo
    } >>"$OUT/checks.log"
    LASTCMD=""
    table running
}
# left SECONDS_WANTED: the seconds a command may take now (the budget's rest, less a margin
# for the table), or fails when too little is left.
left() {
    local rest=$(( DEADLINE - $(date +%s) - 10 ))
    (( rest >= 15 )) || return 1
    echo $(( $1 < rest ? $1 : rest ))
}
not_run() { SKIPPED=1; row "$1" "not run" "" 0; }
# timed LIMIT LOG CMD...: CMD bounded by LIMIT (and the budget), output to LOG; SECS set; the
# command shown in checks.log is CMD unless LASTCMD was set before.
timed() {
    local want=$1 logf=$2 limit t0 rc
    shift 2
    LASTCMD="${LASTCMD:-$*}"
    limit="$(left "$want")" || { echo "not run: out of time" >"$logf"; SECS=0; SKIPPED=1; return 124; }
    t0=$(date +%s.%N)
    timeout --kill-after=20 "$limit" "$@" >"$logf" 2>&1
    rc=$?
    SECS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    [[ $rc == 124 || $rc == 137 ]] && echo "gpu-check: timed out after $limit s" >>"$logf"
    return $rc
}
# The last error line of a log, for a failed row's figure.
why() {
    local line
    line="$(grep -E 'error|Error|ERROR|failed|refused|timed out|not found' "$1" 2>/dev/null | tail -n 1 | cut -c1-160)"
    echo "exit $2: ${line:-see checks.log}"
}
# The last metrics.jsonl line of a model directory, summarized.
metrics() {
    "$PY" - "$1/metrics.jsonl" <<'PY' 2>/dev/null || echo "no metrics"
import json, sys
m = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"top1 {m['top1']:.3f}, loss {m['train_loss']:.3f}, {m['train_images_per_sec']:.0f} img/s")
PY
}
# NEEDED entries of an ELF file: readelf when installed, else a few lines of Python.
needed() {
    if command -v readelf >/dev/null 2>&1; then
        readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
        return
    fi
    "$PY" - "$1" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
assert d[:4] == b"\x7fELF" and d[4] == 2, "not a 64-bit ELF file"
shoff = struct.unpack_from("<Q", d, 0x28)[0]
shentsize, shnum = struct.unpack_from("<HH", d, 0x3A)
secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
for s in secs:
    if s[1] != 6:  # SHT_DYNAMIC
        continue
    strtab = secs[s[6]][4]
    for off in range(s[4], s[4] + s[5], 16):
        tag, val = struct.unpack_from("<qQ", d, off)
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            print(d[strtab + val:d.index(b"\0", strtab + val)].decode())
PY
}
finish() {
    # What comes back from a GPU machine is at most 16 MiB a file: keep checks.log's last 15.
    if [[ $(stat -c %s "$OUT/checks.log" 2>/dev/null || echo 0) -gt $((15 * 1024 * 1024)) ]]; then
        tail -c $((15 * 1024 * 1024)) "$OUT/checks.log" >"$WORK/checks.log.tail" \
            && mv "$WORK/checks.log.tail" "$OUT/checks.log"
    fi
    table done
    cat "$OUT/gpu-check.md"
    say "work files in $WORK"
    [[ $FAILED == 0 ]] || exit 1
    exit 0
}

# The wheel into ENVDIR as a user on a cluster installs it (`pip install` into the environment
# that has torch): a venv of PY whose site-packages links every entry of the folder holding
# PY's torch (PY itself is left untouched), then pip with --no-deps --no-index (no network).
install_wheel() {
    local site_src site e
    site_src="$(dirname "$(dirname "$TORCH_LIB")")"
    rm -rf "$ENVDIR"
    "$PY" -m venv --without-pip "$ENVDIR" || return 1
    site="$ENVDIR/lib/python$PY_MM/site-packages"
    [[ -d "$site" ]] || { echo "no $site in the new venv"; return 1; }
    for e in "$site_src"/*; do
        [[ -e "$site/$(basename "$e")" ]] || ln -s "$e" "$site/"
    done
    if "$ENVDIR/bin/python" -m pip --version >/dev/null 2>&1; then
        "$ENVDIR/bin/python" -m pip install --no-deps --no-index --no-cache-dir \
            --disable-pip-version-check "$WHEEL"
    else
        "$PY" -m pip --python "$ENVDIR/bin/python" install --no-deps --no-index \
            --no-cache-dir --disable-pip-version-check "$WHEEL"
    fi || return 1
    "$ENVDIR/bin/python" -c 'import importlib.metadata as m; print("installed tchrun", m.version("tchrun"))'
}

# --- 4. The kit ---------------------------------------------------------------------------------
if [[ -z "$KIT_TORCH" || "$PY_TORCH" == "$KIT_TORCH" ]]; then
    row "python and torch" pass "$PY: torch $PY_TORCH (CUDA $PY_CUDA), the worker's ${KIT_TORCH:-?}; Python $PY_VERSION" 0
else
    row "python and torch" fail "$PY has torch $PY_TORCH, the worker was built against $KIT_TORCH: use --python with torch $KIT_TORCH" 0
fi
logf="$WORK/logs/install.log"
LASTCMD="$PY -m venv --without-pip $ENVDIR; ln -s (PY's site-packages) $ENVDIR/lib/python$PY_MM/site-packages/; pip install --no-deps --no-index $(basename "$WHEEL")"
export -f install_wheel
export PY ENVDIR TORCH_LIB PY_MM WHEEL
if timed 180 "$logf" bash -c install_wheel; then
    row "pip install the wheel" pass "$(basename "$WHEEL") into $ENVDIR, beside $PY's torch" "$SECS" "$logf"
else
    row "pip install the wheel" fail "$(why "$logf" $?)" "$SECS" "$logf"
fi
logf="$WORK/logs/needed.log"
LASTCMD="readelf -d (or Python) $TCHRUN_KIT_BIN/tchrun-worker"
needed "$TCHRUN_KIT_BIN/tchrun-worker" >"$logf" 2>&1
if grep -qx 'libtorch_cuda.so' "$logf"; then
    row "tchrun-worker links libtorch_cuda.so" pass "NEEDED$(command -v readelf >/dev/null || echo ' (read by Python; no readelf)')" 0 "$logf"
else
    row "tchrun-worker links libtorch_cuda.so" fail "not NEEDED: CUDA invisible to the worker" 0 "$logf"
fi
logf="$WORK/logs/load.log"
LASTCMD="tchrun --version; tchrun-worker --version; mpirun --version; ompi_info --path prefix (bin/ wrappers, env.sh)"
if timed 60 "$logf" bash -c 'set -e -o pipefail; "$1" --version; "$2" --version; "$3" --version | head -n 1
        KIT="$4"; . "$KIT/env.sh"; ompi_info --path prefix --parsable' _ "$T" "$W" "$KIT/bin/mpirun" "$KIT"; then
    prefix="$(sed -n 's/^path:prefix://p' "$logf")"
    mpi="$(grep -o '^mpirun (Open MPI) [0-9.]*' "$logf" | head -n 1)"
    if [[ "$prefix" == "$KIT/openmpi" && -n "$mpi" ]]; then
        torch_loaded="$(ldd "$TCHRUN_KIT_BIN/tchrun-worker" 2>/dev/null | awk '$1 == "libtorch_cpu.so" { print $3 }')"
        row "the kit's programs load" pass "$(head -n 1 "$logf"), OpenMPI ${mpi#mpirun (Open MPI) } at kit/openmpi, libtorch (RUNPATH, no LD_LIBRARY_PATH) from $(dirname "$(readlink -f "${torch_loaded:-?}")")" "$SECS" "$logf"
    else
        row "the kit's programs load" fail "mpirun --version: '${mpi:-no version}', OpenMPI's prefix: '$prefix' (expected $KIT/openmpi)" "$SECS" "$logf"
    fi
else
    rc=$?
    kit_env ldd "$TCHRUN_KIT_BIN/tchrun-worker" 2>&1 | grep -E 'not found|mpi|torch' >>"$logf"
    row "the kit's programs load" fail "$(why "$logf" $rc)" "$SECS" "$logf"
fi
if [[ $mode != cpu ]]; then
    names="$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//; s/|/\//g' | paste -sd ';' -)"
    row "GPUs (nvidia-smi)" pass "$GPUS visible: ${names:-nvidia-smi gave no details}" 0
fi

# --- 5. The GPU benchmark alone -----------------------------------------------------------------
# run_bench ROW_NAME [bench.py args]: benches/bench.py --gpu, its table to OUT/bench-gpu.md.
run_bench() {
    local name=$1 logf="$WORK/logs/bench-gpu.log" torchrun
    shift
    torchrun="$(printf '%q' "$(dirname "$PY")/torchrun")"
    [[ -x "$(dirname "$PY")/torchrun" ]] || torchrun="$(printf '%q' "$PY") -m torch.distributed.run"
    if timed 3600 "$logf" env TCHRUN_BENCH_PYTHON="$PY" TCHRUN_BENCH_TORCHRUN="$torchrun" \
            TCHRUN_BENCH_TCHRUN="$T" TCHRUN_BENCH_WORKER="$W" TCHRUN_BENCH_COMMIT="${KIT_COMMIT:-?}" \
            "$PY" "$KIT/benches/bench.py" --gpu --out "$WORK/bench" --table "$OUT/bench-gpu.md" \
            --command "$CMDLINE" "$@"; then
        fig="$(grep -E '^\| (Synthetic tensors|Small images[^|]*|Decoded JPEGs): throughput' "$OUT/bench-gpu.md" \
            | awk -F'|' '{ gsub(/ /, "", $6); printf "%s%s %s", (n++ ? "; " : ""), ($2 ~ /Synthetic/ ? "tensors" : ($2 ~ /Small/ ? "small fp16" : "JPEGs")), $6 }')"
        row "$name" pass "tchrun / PyTorch images/s: ${fig:-?} (bench-gpu.md)" "$SECS" "$logf"
    else
        row "$name" fail "$(why "$logf" $?); a longer run: run.sh --bench-only" "$SECS" "$logf"
    fi
}
if [[ $mode == bench ]]; then
    run_bench "GPU benchmark (bench.py --gpu)"
    finish
fi

# --- 6. Collectives -----------------------------------------------------------------------------
logf="$WORK/logs/selftest-gloo.log"
if timed 180 "$logf" "$T" selftest --device cpu --backend gloo --procs-per-node 2 --launcher mpirun \
        --oversubscribe --log-dir "$WORK/selftest-gloo" \
    && grep -q "selftest: 2 ranks on cpu (gloo): all_reduce, broadcast, all_gather, barrier correct" "$logf"; then
    row "Gloo selftest, 2 CPU ranks (the kit's mpirun)" pass "collectives correct" "$SECS" "$logf"
else
    row "Gloo selftest, 2 CPU ranks (the kit's mpirun)" fail "$(why "$logf" $?)" "$SECS" "$logf" "$WORK/selftest-gloo"
fi
if [[ $mode == gpu ]]; then
    counts="$(seq 1 "$GPUS")"
    [[ $quick == 1 ]] && counts="$(printf '%s\n' 1 "$GPUS" | sort -un)"
    for n in $counts; do
        name="NCCL selftest, $n rank(s)"
        logf="$WORK/logs/selftest-$n.log"
        if timed 300 "$logf" "$T" selftest --device cuda --backend nccl --procs-per-node "$n" \
                --launcher mpirun --log-dir "$WORK/selftest-$n" \
            && grep -q "selftest: $n ranks on cuda:0 (nccl): all_reduce, broadcast, all_gather, barrier correct" "$logf"; then
            bw="$(awk '/busbw GB\/s/ { t = 1; next } t && NF == 6 { s = $1 " " $2; b = $6 } END { if (s != "") print "busbw " b " GB/s at " s }' "$logf")"
            row "$name" pass "collectives correct${bw:+; $bw}" "$SECS" "$logf"
        else
            row "$name" fail "$(why "$logf" $?)" "$SECS" "$logf" "$WORK/selftest-$n"
        fi
    done
fi

# gradcheck: distributed gradient = combined-batch gradient (the kit's mpirun, by hand).
if [[ $mode == gpu ]]; then dev=cuda; ranks=$GPUS; else dev=cpu; ranks=2; fi
name="gradcheck on ${dev^^}, $ranks rank(s)"
logf="$WORK/logs/gradcheck.log"
if timed 300 "$logf" "${MPIRUN[@]}" -np "$ranks" "$W" gradcheck --device "$dev" --log-dir "$WORK/gradcheck"; then
    row "$name" pass "$(grep -o 'max |distributed - combined batch| = [^ ;]*' "$logf" | head -n 1 | tr '|' '/')" "$SECS" "$logf"
else
    row "$name" fail "$(why "$logf" $?)" "$SECS" "$logf" "$WORK/gradcheck"
fi

# --- 7. Training ---------------------------------------------------------------------------------
DATA="$WORK/digits"
logf="$WORK/logs/data.log"
if [[ -d "$DATA/train" ]] || timed 120 "$logf" "$PY" "$KIT/scripts/make_digits.py" "$DATA"; then
    MODEL="$WORK/untrained"
    rm -rf "$MODEL"
    LASTCMD=""
    logf="$WORK/logs/model-init.log"
    if ! timed 120 "$logf" "$T" model init --arch resnet18 --input-size 32 --output "$MODEL"; then
        row "model init (resnet18, 32 px)" fail "$(why "$logf" $?)" "$SECS" "$logf"
        finish
    fi
else
    row "digits dataset (make_digits.py)" fail "$(why "$logf" $?)" "$SECS" "$logf"
    finish
fi
images="$(find "$DATA/train" -type f | wc -l)"
if [[ $mode == gpu ]]; then
    ranks=$GPUS
    wanted=30
    amps="off bf16 fp16"
    [[ $quick == 1 ]] && { wanted=10; amps="off bf16"; }
else
    ranks=2
    wanted=5
    amps="off"
fi
# `wanted` steps in one epoch on `ranks` ranks: per-rank batch ceil(images / (wanted * ranks)).
batch=$(( (images + wanted * ranks - 1) / (wanted * ranks) ))
steps=$(( (images + batch * ranks - 1) / (batch * ranks) ))
TRAIN=("$T" train --model "$MODEL" --train "$DATA/train" --valid "$DATA/valid"
       --procs-per-node "$ranks" --device "$dev" --launcher mpirun --oversubscribe
       --lr 0.025 --min-crop-scale 0.5 --no-hflip)
for amp in $amps; do
    name="train $steps steps, --amp $amp, $ranks ${dev^^} rank(s)"
    out="$WORK/train-$amp"
    rm -rf "$out"
    logf="$WORK/logs/train-$amp.log"
    if timed 300 "$logf" "${TRAIN[@]}" --output "$out" --amp "$amp" --epochs 1 --batch-size "$batch" \
        && [[ -f "$out/model.json" ]]; then
        row "$name" pass "$(metrics "$out")" "$SECS" "$logf"
    else
        row "$name" fail "$(why "$logf" $?)" "$SECS" "$logf" "$out"
    fi
done

# SIGTERM during training, then --resume.
if [[ $mode == gpu ]]; then
    name="SIGTERM, then --resume, $ranks rank(s)"
    out="$WORK/resume"
    rm -rf "$out"
    logf="$WORK/logs/resume.log"
    rbatch=8
    [[ $quick == 1 ]] && rbatch=32
    if limit="$(left 300)"; then
        LASTCMD="${TRAIN[*]} --output $out --epochs 3 --batch-size $rbatch --print-freq 1; SIGTERM in epoch 2; the same with --resume"
        t0=$(date +%s.%N)
        timeout --kill-after=20 "$limit" "${TRAIN[@]}" --output "$out" --epochs 3 --batch-size "$rbatch" \
            --print-freq 1 >"$logf" 2>&1 &
        pid=$!
        signalled=0
        for _ in $(seq 1 $((limit * 10))); do
            if grep -q "epoch 2/3 iter " "$out/logs/70_driver_log_0" 2>/dev/null; then
                # timeout forwards the signal to tchrun.
                kill -TERM "$pid" 2>/dev/null && signalled=1
                break
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        [[ $signalled == 1 ]] || kill -TERM "$pid" 2>/dev/null
        wait "$pid"
        code=$?
        secs() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
        if [[ $signalled == 1 && $code == 143 ]] && grep -q "checkpoint written" "$logf"; then
            echo "--- resume" >>"$logf"
            if limit="$(left 300)" && timeout --kill-after=20 "$limit" "${TRAIN[@]}" --output "$out" --epochs 3 \
                    --batch-size "$rbatch" --resume >>"$logf" 2>&1 \
                && grep -q "resuming from" "$logf" && [[ -f "$out/model.json" ]]; then
                row "$name" pass "exit 143 with a checkpoint, resumed to a model; $(metrics "$out")" "$(secs)" "$logf"
            else
                row "$name" fail "$(why "$logf" "resume")" "$(secs)" "$logf" "$out"
            fi
        else
            row "$name" fail "stop: exit $code (expected 143 and a checkpoint; signalled: $signalled)" "$(secs)" "$logf" "$out"
        fi
    else
        not_run "$name"
    fi
fi

# Score.
name="score on ${dev^^}"
logf="$WORK/logs/score.log"
if [[ ! -f "$WORK/train-off/model.json" ]]; then
    row "$name" fail "no model: the --amp off training failed" 0
elif timed 300 "$logf" "$T" score --model "$WORK/train-off" --images "$DATA/valid" \
        --output "$WORK/scores.csv" --device "$dev"; then
    n=$(( $(wc -l <"$WORK/scores.csv") - 1 ))
    row "$name" pass "$n images, $(awk -v n="$n" -v s="$SECS" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }') img/s incl. start" "$SECS" "$logf"
else
    row "$name" fail "$(why "$logf" $?)" "$SECS" "$logf" "$WORK/train-off"
fi

# --- 8. The GPU benchmark (2 repeats here; --bench-only: bench.py's 3) ---------------------------
if [[ $mode == gpu && $quick == 0 && $bench == 1 ]]; then
    if left 120 >/dev/null; then
        run_bench "GPU benchmark (bench.py --gpu --repeats 2)" --repeats 2
    else
        not_run "GPU benchmark (bench.py --gpu --repeats 2)"
    fi
fi
finish
