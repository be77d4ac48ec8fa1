#!/usr/bin/env bash
# The GPU kit's CPU path on a machine made to look like the GPU machine (issue 26), for
# tests/gpu_kit.rs; needs root (mount and network namespaces).
#
#   scripts/gpu-kit-cpu-test.sh python VENV        # the second Python (made once, then reused)
#   scripts/gpu-kit-cpu-test.sh run KIT VENV TMP   # KIT/run.sh --cpu-smoke, hidden; OUT TMP/out
#
# `python` makes VENV: a venv of the Python that .venv was made from, its site-packages
# hard links of .venv's (same filesystem: seconds, no space), less scikit-learn (the kit must
# not need it). `run` starts a mount and network namespace (unshare -m -n) in which
#   - there is no network: a fresh network namespace with only the loopback, brought up;
#   - the system OpenMPI is hidden: its folders (openmpi, pmix2, hwloc plugins, share, /etc)
#     under empty tmpfs, its programs and libraries (mpirun, orterun, orted, ompi_info,
#     libmpi, libopen-*, libpmix, libhwloc, libevent, libmca_common_*, libmunge) under
#     /dev/null;
#   - the build tree is gone: VENV is bound at TMP/py, then the repository (its target/ with
#     it) and the real .venv are covered by empty tmpfs, so any path into them fails;
#   - PATH is TMP/py/bin and the system's bin folders: `python3` is VENV's, as on the GPU
#     machine, where a plain python3 holds torch;
# checks that (the build's worker is gone, mpirun and scikit-learn are gone, the repository is
# empty; exit 3 when a control fails), and runs KIT/run.sh
# --cpu-smoke --out TMP/out --work TMP/work (its exit code is this script's). KIT, VENV and TMP
# must lie outside the repository.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
die() { echo "gpu-kit-cpu-test: $*" >&2; exit 2; }

make_python() {
    local venv=$1 src home base ver site dst stamp e name new
    src="$(realpath "$ROOT/.venv")"
    [[ -x "$src/bin/python" ]] || die "no .venv (scripts/setup.sh)"
    home="$(awk -F ' = ' '$1 == "home" { print $2 }' "$src/pyvenv.cfg")"
    base="$home/python3"
    [[ -x "$base" ]] || die ".venv's base Python $base is missing"
    ver="$("$src/bin/python" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')"
    site="$src/lib/$ver/site-packages"
    stamp="$site $(stat -c %Y "$site/torch/version.py" 2>/dev/null)"
    if [[ -f "$venv/.tchrun-python" && "$(cat "$venv/.tchrun-python")" == "$stamp" ]]; then
        echo "$venv: reused"
        return
    fi
    new="$venv.partial.$$"
    rm -rf "$venv" "$new"
    "$base" -m venv --without-pip "$new"
    dst="$new/lib/$ver/site-packages"
    for e in "$site"/*; do
        name="$(basename "$e")"
        case "$name" in sklearn|scikit_learn*) continue ;; esac
        # Hard links where the filesystem allows (same device), a copy otherwise.
        cp -al "$e" "$dst/" 2>/dev/null || cp -a "$e" "$dst/"
    done
    echo "$stamp" >"$new/.tchrun-python"
    mv -T "$new" "$venv" || { rm -rf "$new"; die "cannot move $new to $venv"; }
    echo "$venv: made from $base with $site"
}

# Inside the namespaces (this script runs from a copy in TMP: the repository gets covered).
inner() {
    local kit=$1 venv=$2 tmp=$3 repo=$4 f r d
    mount --make-rprivate /
    ip link set lo up
    mkdir -p "$tmp/py"
    mount --bind "$venv" "$tmp/py"
    # The system OpenMPI: files first (their folders are covered next).
    local files=()
    for f in /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info \
             /usr/lib/x86_64-linux-gnu/libmpi.so* /usr/lib/x86_64-linux-gnu/libopen-*.so* \
             /usr/lib/x86_64-linux-gnu/libpmix* /usr/lib/x86_64-linux-gnu/libhwloc* \
             /usr/lib/x86_64-linux-gnu/libevent* /usr/lib/x86_64-linux-gnu/libmca_common* \
             /usr/lib/x86_64-linux-gnu/libmunge*; do
        r="$(readlink -f "$f" 2>/dev/null)" || continue
        [[ -f "$r" ]] && files+=("$r")
    done
    for f in $(printf '%s\n' "${files[@]}" | sort -u); do mount --bind /dev/null "$f"; done
    for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 \
             /usr/lib/x86_64-linux-gnu/hwloc /usr/share/openmpi /etc/openmpi; do
        [[ -d "$d" ]] && mount -t tmpfs -o size=1m,mode=755 tmpfs "$d"
    done
    # The build tree: the real .venv, the repository (the build's target/ with it).
    local covers=()
    covers+=("$(realpath "$repo/.venv" 2>/dev/null || echo "$repo/.venv")" "$repo")
    for d in "${covers[@]}"; do
        d="$(realpath "$d" 2>/dev/null)" || continue
        [[ -d "$d" ]] && mount -t tmpfs -o size=1m,mode=755 tmpfs "$d"
    done
    # Only the system's programs and the second Python; nothing of the caller's environment
    # that points at libraries or the build tree.
    export PATH="$tmp/py/bin:/usr/local/bin:/usr/bin:/bin"
    unset LD_LIBRARY_PATH LIBTORCH LIBTORCH_CXX11_ABI PYTHONPATH PYTHONHOME VIRTUAL_ENV \
          TCHRUN_KIT_PYTHON TCHRUN_KIT_BIN TCHRUN_KIT_ENV TCHRUN_GPU_CHECK_PROC
    for v in $(compgen -e | grep -E '^(OMPI|OPAL|PMIX|HWLOC)_' || true); do unset "$v"; done

    # Controls: each must hold, or this environment proves nothing.
    local bad=()
    [[ -e "$repo/Cargo.toml" ]] && bad+=("the repository is still visible")
    [[ -e "$repo/target/release/tchrun-worker" ]] && bad+=("the build's tchrun-worker is still visible")
    mpirun --version >/dev/null 2>&1 && bad+=("the system mpirun still runs")
    python3 -c 'import sklearn' >/dev/null 2>&1 && bad+=("python3 has scikit-learn")
    python3 -c 'import torch' >/dev/null 2>&1 || bad+=("python3 ($(command -v python3)) has no torch")
    [[ "$(awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' /proc/net/dev | paste -sd, -)" == lo ]] \
        || bad+=("interfaces other than lo: $(awk -F: 'NR > 2 { print $1 }' /proc/net/dev | paste -sd, -)")
    if [[ ${#bad[@]} -gt 0 ]]; then
        printf 'gpu-kit-cpu-test: control failed: %s\n' "${bad[@]}" >&2
        exit 3
    fi
    echo "gpu-kit-cpu-test: controls hold (no network, no system OpenMPI, no build tree; python3 is $(command -v python3))"
    exec timeout --kill-after=10 400 "$kit/run.sh" --cpu-smoke --out "$tmp/out" --work "$tmp/work"
}

case "${1:-}" in
    python)
        [[ $# == 2 ]] || die "usage: python VENV"
        make_python "$(realpath -m "$2")"
        ;;
    run)
        [[ $# == 4 ]] || die "usage: run KIT VENV TMP"
        kit="$(realpath "$2")"; venv="$(realpath "$3")"; tmp="$(realpath "$4")"
        for p in "$kit" "$tmp"; do
            case "$p/" in "$ROOT/"*) die "$p lies inside the repository, which the run hides" ;; esac
        done
        cp "${BASH_SOURCE[0]}" "$tmp/gpu-kit-cpu-test.sh"
        exec unshare -m -n bash "$tmp/gpu-kit-cpu-test.sh" inner "$kit" "$venv" "$tmp" "$ROOT"
        ;;
    inner)
        shift
        inner "$@"
        ;;
    *) die "usage: python VENV | run KIT VENV TMP (see the header)" ;;
esac
