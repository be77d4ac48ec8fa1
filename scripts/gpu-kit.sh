#!/usr/bin/env bash
# The GPU kit (issue 26): one self-contained folder that runs every GPU check of tchrun on a
# machine that has nothing but a `python3` with torch 2.11 (no network, no compiler, no apt).
#
#   scripts/gpu-kit.sh [DIR]        # DIR defaults to target/gpu-kit
#
# Run here, on the build machine, after `cargo build --release --workspace --bins`. DIR gets:
#   run.sh             the one entry script (DIR/run.sh --help; source scripts/gpu-kit/run.sh)
#   wheel/             the wheel users install (scripts/wheel.sh): run.sh pip-installs it into
#                      an environment of that python3's torch and checks what it installed
#   env.sh, bin/       the kit's OpenMPI as `module load openmpi` would set it up, and wrappers
#                      bin/tchrun, bin/tchrun-worker (the installed programs), bin/mpirun
#   openmpi/           OpenMPI 4.1's runtime, relocated: mpirun (orterun), orted, ompi_info,
#                      libmpi and every library it needs that is not glibc/libstdc++/libgcc_s,
#                      the MCA plugins of OpenMPI and PMIx whose libraries are in the kit, the
#                      help and parameter files (share/, etc/)
#   scripts/           make_digits.py and scikit-learn's digits.csv.gz (no scikit-learn there)
#   benches/           bench.py, make_images.py and the PyTorch reference (benches/reference/)
#   MANIFEST           commit, torch version built against, every file with its size
# Carry DIR to the GPU machine and run `DIR/run.sh --out OUT` (docs/gpu-kit.md).
#
# Exit codes: 0 built; 2 missing binaries/tools, or the kit would exceed the size limit
# (TCHRUN_GPU_KIT_LIMIT_MIB, default 60; the message names the largest parts; DIR untouched).
# TCHRUN_GPU_KIT_BIN_DIR: where tchrun and tchrun-worker are (default target/release).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "gpu-kit: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac
[[ $# -le 1 ]] || { echo "gpu-kit: one directory at most (see --help)" >&2; exit 2; }
DIR="$(realpath -m "${1:-$ROOT/target/gpu-kit}")"
LIMIT_MIB="${TCHRUN_GPU_KIT_LIMIT_MIB:-60}"
BIN="${TCHRUN_GPU_KIT_BIN_DIR:-$ROOT/target/release}"
MARK=".tchrun-gpu-kit"
die() { echo "gpu-kit: $*" >&2; exit 2; }
log() { printf '[gpu-kit] %s\n' "$*" >&2; }

[[ "$LIMIT_MIB" =~ ^[0-9]+$ ]] || die "TCHRUN_GPU_KIT_LIMIT_MIB must be a whole number of MiB, not '$LIMIT_MIB'"
for b in tchrun tchrun-worker; do
    [[ -x "$BIN/$b" ]] || die "$BIN/$b is missing: cargo build --release --workspace --bins first"
done
for t in strip ldd; do
    command -v "$t" >/dev/null || die "'$t' is not installed (binutils, libc-bin)"
done
if [[ -e "$DIR" && ! -e "$DIR/$MARK" ]] && [[ -n "$(ls -A "$DIR" 2>/dev/null)" ]]; then
    die "$DIR exists and is not a kit (no $MARK in it): pick another DIR"
fi

# --- Where OpenMPI and PMIx are installed here --------------------------------------------------
# The libmpi the worker loads under mpirun (dlopen of libmpi.so.40: LD_LIBRARY_PATH, then the
# loader's cache), as the loader resolves it; the rest of OpenMPI relative to what it says.
ORTERUN="$(command -v orterun || true)"
ORTED="$(command -v orted || true)"
OMPI_INFO="$(command -v ompi_info || true)"
[[ -n "$ORTERUN" && -n "$ORTED" && -n "$OMPI_INFO" ]] || die "orterun, orted or ompi_info not on PATH (openmpi-bin)"
ompi_path() { "$OMPI_INFO" --path "$1" --parsable 2>/dev/null | awk -F: '{ print $NF }'; }
LIBMPI=""
LDP="${LD_LIBRARY_PATH:-}"
for d in ${LDP//:/ }; do [[ -f "$d/libmpi.so.40" ]] && { LIBMPI="$d/libmpi.so.40"; break; }; done
# awk reads to the end: an early exit would close the pipe on ldconfig, whose SIGPIPE (141)
# ends this script under pipefail when the cache's listing is longer than a pipe's buffer.
[[ -n "$LIBMPI" ]] || LIBMPI="$(PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | awk '!found && $1 == "libmpi.so.40" && $NF ~ /^\// { print $NF; found = 1 }')"
[[ -n "$LIBMPI" ]] || { d="$(ompi_path libdir)"; for f in "$d/libmpi.so.40" "$d/../libmpi.so.40"; do [[ -f "$f" ]] && { LIBMPI="$(realpath "$f")"; break; }; done; }
[[ -n "$LIBMPI" && -f "$LIBMPI" ]] || die "libmpi.so.40 not found (LD_LIBRARY_PATH, ldconfig -p, ompi_info's libdir): install OpenMPI (scripts/setup.sh)"
PKGLIBDIR="$(ompi_path pkglibdir)"
PKGDATADIR="$(ompi_path pkgdatadir)"
SYSCONFDIR="$(ompi_path sysconfdir)"
[[ -d "$PKGLIBDIR" && -d "$PKGDATADIR" ]] || die "ompi_info names no plugin/help directories ('$PKGLIBDIR', '$PKGDATADIR')"
EXT_PMIX="$(ls "$PKGLIBDIR"/mca_pmix_ext*.so 2>/dev/null | head -n 1 || true)"
LIBPMIX=""
if [[ -n "$EXT_PMIX" ]]; then
    LIBPMIX="$(ldd "$EXT_PMIX" | awk '$1 ~ /^libpmix\.so/ && $3 ~ /^\// { print $3 }')"
fi
PMIX_HOME=""
if [[ -n "$LIBPMIX" ]]; then
    # Debian: /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.x -> plugins in lib/pmix, share/
    PMIX_HOME="$(dirname "$(dirname "$(readlink -f "$LIBPMIX")")")"
fi

# --- The library closure ------------------------------------------------------------------------
# Left to the target machine: glibc, libstdc++, libgcc_s and the dynamic loader.
is_base() {
    case "$1" in
        linux-vdso.so*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|\
        libutil.so*|libanl.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) return 0 ;;
    esac
    return 1
}
# "soname path" of every library FILE needs (ldd: transitively); "soname -" when not found.
needs() {
    ldd "$1" 2>/dev/null | awk '$2 == "=>" { print $1, ($3 ~ /^\// ? $3 : "-") }'
}
declare -A LIB=()   # soname -> path: the libraries the kit carries
add_closure() {     # FILE: adds everything it needs; fails on a library not found
    local so path
    while read -r so path; do
        is_base "$so" && continue
        [[ "$path" != - ]] || die "$1 needs $so, which is not found here"
        LIB[$so]="$path"
    done < <(needs "$1")
}
add_closure "$LIBMPI"
LIB[libmpi.so.40]="$LIBMPI"
for f in "$ORTERUN" "$ORTED" "$OMPI_INFO" ${LIBPMIX:+"$LIBPMIX"}; do add_closure "$f"; done
[[ -n "$LIBPMIX" ]] && LIB[$(basename "$LIBPMIX" | sed 's/\(\.so\.[0-9]*\).*/\1/')]="$LIBPMIX"
# A plugin is carried when all it needs is in the kit, or is one of OpenMPI's own libmca_common_*
# libraries whose needs are; the others (UCX, libfabric, verbs, PSM: fabrics this kit's
# single-node runs do not use; OpenSHMEM) are left out and listed in the MANIFEST.
PLUGINS=()
LEFT_OUT=()
plugin_ok() {       # PLUGIN: 0 and the extra libmca_common_* libraries in EXTRA, or 1 and WHY
    local so path so2 path2
    EXTRA=()
    WHY=""
    while read -r so path; do
        is_base "$so" && continue
        [[ -n "${LIB[$so]:-}" ]] && continue
        if [[ "$so" == libmca_common_* && "$path" != - ]]; then
            while read -r so2 path2; do
                is_base "$so2" || [[ -n "${LIB[$so2]:-}" ]] || { WHY="$so2"; return 1; }
            done < <(needs "$path")
            EXTRA+=("$so=$path")
            continue
        fi
        WHY="$so"
        return 1
    done < <(needs "$1")
    return 0
}
for p in "$PKGLIBDIR"/*.so ${PMIX_HOME:+"$PMIX_HOME"/lib/pmix/*.so}; do
    [[ -f "$p" ]] || continue
    if plugin_ok "$p"; then
        PLUGINS+=("$p")
        for e in "${EXTRA[@]}"; do LIB[${e%%=*}]="${e#*=}"; done
    else
        LEFT_OUT+=("$(basename "$p") (needs $WHY)")
    fi
done

# --- Build it beside DIR, then swap -------------------------------------------------------------
NEW="$DIR.partial.$$"
rm -rf "$NEW"
trap 'rm -rf "$NEW"' EXIT
mkdir -p "$NEW"/{bin,wheel,openmpi/bin,openmpi/lib/openmpi,openmpi/lib/pmix,openmpi/lib/hwloc,openmpi/share,openmpi/etc,scripts,benches/reference}
log "the wheel (scripts/wheel.sh): what users pip install"
WHEEL="$(TCHRUN_WHEEL_BIN_DIR="$BIN" bash "$ROOT/scripts/wheel.sh" "$NEW/wheel")" \
    || die "scripts/wheel.sh failed (above)"
[[ -f "$WHEEL" ]] || die "scripts/wheel.sh named no wheel ('$WHEEL')"
log "OpenMPI: ${#LIB[@]} libraries, ${#PLUGINS[@]} plugins (${#LEFT_OUT[@]} left out) from $(dirname "$LIBMPI"), $PKGLIBDIR${PMIX_HOME:+, $PMIX_HOME}"
cp -L "$ORTERUN" "$NEW/openmpi/bin/orterun"
cp -L "$ORTED" "$NEW/openmpi/bin/orted"
cp -L "$OMPI_INFO" "$NEW/openmpi/bin/ompi_info"
# Copies, not links (14 KiB each): some ways of carrying a folder keep no links.
cp "$NEW/openmpi/bin/orterun" "$NEW/openmpi/bin/mpirun"
cp "$NEW/openmpi/bin/orterun" "$NEW/openmpi/bin/mpiexec"
for so in "${!LIB[@]}"; do cp -L "${LIB[$so]}" "$NEW/openmpi/lib/$so"; done
for p in "${PLUGINS[@]}"; do
    case "$p" in
        "$PKGLIBDIR"/*) cp -L "$p" "$NEW/openmpi/lib/openmpi/" ;;
        *) cp -L "$p" "$NEW/openmpi/lib/pmix/" ;;
    esac
done
cp -rL "$PKGDATADIR" "$NEW/openmpi/share/openmpi"
if [[ -n "$PMIX_HOME" && -d "$PMIX_HOME/share/pmix" ]]; then
    cp -rL "$PMIX_HOME/share/pmix" "$NEW/openmpi/share/pmix"
fi
for f in openmpi-mca-params.conf openmpi-default-hostfile; do
    [[ -f "$SYSCONFDIR/$f" ]] && cp -L "$SYSCONFDIR/$f" "$NEW/openmpi/etc/$f"
done
cat >>"$NEW/openmpi/etc/openmpi-mca-params.conf" <<'EOF'

# tchrun GPU kit: no single-copy transfers (CMA, process_vm_readv) between local ranks, which
# sandboxed runtimes (gVisor) refuse; MPI carries only the ranks' bootstrap here, the tensors
# go through NCCL or Gloo.
btl_vader_single_copy_mechanism = none
EOF
cat >"$NEW/openmpi/etc/pmix-mca-params.conf" <<'EOF'
# PMIx parameters of the tchrun GPU kit. The plugin path is set by env.sh
# (PMIX_MCA_mca_base_component_path), relative to wherever the kit is.
EOF

log "entry script, scripts, benchmark"
SRC="$ROOT/scripts/gpu-kit"
cp "$SRC/run.sh" "$SRC/env.sh" "$NEW/"
for w in tchrun tchrun-worker mpirun; do cp "$SRC/wrapper.sh" "$NEW/bin/$w"; done
chmod +x "$NEW/run.sh" "$NEW"/bin/*
cp "$ROOT/scripts/make_digits.py" "$NEW/scripts/"
DIGITS_CSV="$("$ROOT/.venv/bin/python" -c 'import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data", "digits.csv.gz"))' 2>/dev/null || true)"
[[ -f "$DIGITS_CSV" ]] || die "scikit-learn's digits.csv.gz not found (the .venv of scripts/setup.sh)"
cp "$DIGITS_CSV" "$NEW/scripts/digits.csv.gz"
cp "$ROOT/benches/bench.py" "$ROOT/benches/make_images.py" "$NEW/benches/"
cp "$ROOT"/benches/reference/*.py "$NEW/benches/reference/"

# --- MANIFEST and the size check ----------------------------------------------------------------
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$ROOT" diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+dirty"
TORCH_BUILT="$("$ROOT/.venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)"
{
    echo "tchrun GPU kit"
    echo "commit: $COMMIT"
    echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
    echo "torch: $TORCH_BUILT"
    echo "wheel: $(basename "$WHEEL")"
    echo "openmpi: $("$OMPI_INFO" --version 2>/dev/null | head -n 1)"
    echo "plugins left out: ${#LEFT_OUT[@]}"
    for l in "${LEFT_OUT[@]}"; do echo "  $l"; done
    echo "files (bytes):"
    (cd "$NEW" && find . -type f -printf '%s %P\n' | sort -k2)
} >"$NEW/MANIFEST"
touch "$NEW/$MARK"

total=$(du -sb "$NEW" | cut -f1)
limit=$((LIMIT_MIB * 1024 * 1024))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
if (( total > limit )); then
    echo "gpu-kit: the kit would be $(mib "$total") MiB, over the limit of $LIMIT_MIB MiB (TCHRUN_GPU_KIT_LIMIT_MIB); nothing written to $DIR. Largest parts:" >&2
    # `head` closes the pipe early: sort's SIGPIPE is expected here, not a failure (pipefail).
    { (cd "$NEW" && find . -type f -printf '%s %P\n') | sort -rn | head -n 8 \
        | while read -r s p; do echo "  $(mib "$s") MiB  $p" >&2; done; } || true
    exit 2
fi
rm -rf "$DIR"
mv "$NEW" "$DIR"
trap - EXIT
echo "gpu-kit: $DIR ($(mib "$total") MiB: wheel $(mib "$(du -sb "$DIR/wheel" | cut -f1)"), openmpi $(mib "$(du -sb "$DIR/openmpi" | cut -f1)")); on the GPU machine: $(basename "$DIR")/run.sh --out OUT"
