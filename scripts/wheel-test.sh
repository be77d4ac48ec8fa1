#!/usr/bin/env bash
# The wheel as its users get it (issue 46), for tests/install.rs; needs root (useradd, mount
# and network namespaces).
#
#   scripts/wheel-test.sh env ENV USER          # USER (made once) and ENV, a venv of theirs
#   scripts/wheel-test.sh as ENV USER MPI -- CMD...   # CMD as USER, on a machine made to look
#                                                     # like a cluster's login node
#
# `env` adds the user (useradd, no password, no home of root's) and makes ENV: a venv of the
# system's Python of .venv's version, its site-packages hard links of .venv's (same filesystem:
# seconds, no space), owned by USER where pip writes (ENV, bin/, site-packages/), so the user
# can `pip install` into it; remade when ENV is missing.
# `as` starts a mount and network namespace (unshare -m -n) in which
#   - there is no network: only the loopback, brought up;
#   - the build machine is gone: the repository, the real .venv (and the libtorch it links),
#     cargo and rustup, libclang (LLVM) and the gloo headers are covered (empty tmpfs or
#     /dev/null), so any path into them fails;
#   - with MPI=none, Open MPI too (mpirun, orted, libmpi and the libraries and plugins that
#     only it uses), as on a node without `module load openmpi`; MPI=system keeps it;
# checks that (exit 3 when a control fails: that environment would prove nothing), then runs
# CMD as USER (runuser) with a login-like environment: PATH=ENV/bin and the system's bin
# folders, HOME a fresh folder of the user's, nothing else of the caller's. Exit code: CMD's.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
die() { echo "wheel-test: $*" >&2; exit 2; }

make_env() {
    local env=$1 user=$2 src home base ver site dst e new
    id -u "$user" >/dev/null 2>&1 || useradd --no-create-home --shell /bin/bash "$user"
    src="$(realpath "$ROOT/.venv")"
    [[ -x "$src/bin/python" ]] || die "no .venv (scripts/setup.sh)"
    home="$(awk -F ' = ' '$1 == "home" { print $2 }' "$src/pyvenv.cfg")"
    ver="$("$src/bin/python" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')"
    site="$src/lib/$ver/site-packages"
    # The system's Python of that version (the user can run it; .venv's base may lie in
    # root's home), else .venv's base.
    base="/usr/bin/$ver"
    [[ -x "$base" ]] || base="$home/python3"
    [[ -x "$base" ]] || die "no $ver for the user: neither /usr/bin/$ver nor .venv's base $home/python3"
    [[ -d "$env" ]] && return 0
    new="$env.partial.$$"
    rm -rf "$new"
    "$base" -m venv --without-pip "$new"
    dst="$new/lib/$ver/site-packages"
    for e in "$site"/*; do
        # Hard links where the filesystem allows (same device), a copy otherwise.
        cp -al "$e" "$dst/" 2>/dev/null || cp -a "$e" "$dst/"
    done
    # What the user's pip writes: new entries in these folders (never the linked files).
    chown "$user:" "$new" "$new/bin" "$dst"
    mv -T "$new" "$env" || { rm -rf "$new"; die "cannot move $new to $env"; }
}

# Inside the namespaces (this script runs from a copy outside the repository).
inner() {
    local env=$1 user=$2 mpi=$3 repo=$4 f r d
    shift 4
    mount --make-rprivate /
    ip link set lo up
    local files=() covers=()
    if [[ "$mpi" == none ]]; then
        for f in /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info \
                 /usr/lib/x86_64-linux-gnu/libmpi.so* /usr/lib/x86_64-linux-gnu/libopen-*.so* \
                 /usr/lib/x86_64-linux-gnu/libmca_common*; do
            r="$(readlink -f "$f" 2>/dev/null)" || continue
            [[ -f "$r" ]] && files+=("$r")
        done
        covers+=(/usr/lib/x86_64-linux-gnu/openmpi /usr/share/openmpi /etc/openmpi)
    fi
    # The build machine: compilers' inputs and the build tree.
    for f in /usr/lib/x86_64-linux-gnu/libclang*.so*; do
        r="$(readlink -f "$f" 2>/dev/null)" || continue
        [[ -f "$r" ]] && files+=("$r")
    done
    for f in $(printf '%s\n' "${files[@]}" | sort -u); do mount --bind /dev/null "$f"; done
    covers+=(/usr/lib/llvm-* /usr/include/gloo "$HOME/.cargo" "$HOME/.rustup" /usr/local/cargo /usr/local/rustup)
    [[ -n "${CARGO_HOME:-}" ]] && covers+=("$CARGO_HOME")
    [[ -n "${RUSTUP_HOME:-}" ]] && covers+=("$RUSTUP_HOME")
    covers+=("$(readlink -f "$repo/.venv/libtorch" 2>/dev/null || true)")
    covers+=("$(realpath "$repo/.venv" 2>/dev/null || echo "$repo/.venv")" "$repo")
    for d in "${covers[@]}"; do
        [[ -n "$d" ]] || continue
        d="$(realpath "$d" 2>/dev/null)" || continue
        [[ -d "$d" ]] && mount -t tmpfs -o size=1m,mode=755 tmpfs "$d"
    done
    local home
    home="$(mktemp -d /tmp/wheel-test-home.XXXXXX)"
    chown "$user:" "$home"
    local path="$env/bin:/usr/local/bin:/usr/bin:/bin"

    local bad=()
    [[ -e "$repo/Cargo.toml" ]] && bad+=("the repository is still visible")
    [[ -e /usr/include/gloo/context.h ]] && bad+=("the gloo headers are still visible")
    runuser -u "$user" -- env -i PATH="$path:$HOME/.cargo/bin" HOME="$home" sh -c 'command -v cargo rustc' >/dev/null 2>&1 \
        && bad+=("cargo is still runnable")
    runuser -u "$user" -- env -i PATH="$path" HOME="$home" python -c \
        'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' >/dev/null 2>&1 \
        || bad+=("$env/bin/python has no torch package")
    if [[ "$mpi" == none ]]; then
        mpirun --version >/dev/null 2>&1 && bad+=("mpirun still runs")
        [[ -f "$(readlink -f /usr/lib/x86_64-linux-gnu/libmpi.so.40 2>/dev/null || echo /nonexistent)" ]] \
            && bad+=("libmpi.so.40 is still a file")
    else
        runuser -u "$user" -- env -i PATH="$path" HOME="$home" mpirun --version >/dev/null 2>&1 \
            || bad+=("mpirun does not run")
    fi
    [[ "$(awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' /proc/net/dev | paste -sd, -)" == lo ]] \
        || bad+=("interfaces other than lo")
    if [[ ${#bad[@]} -gt 0 ]]; then
        printf 'wheel-test: control failed: %s\n' "${bad[@]}" >&2
        exit 3
    fi
    echo "wheel-test: controls hold (user $user, no network, no build tree, MPI $mpi)" >&2
    local rc=0
    runuser -u "$user" -- env -i PATH="$path" HOME="$home" LANG=C.UTF-8 USER="$user" "$@" || rc=$?
    rm -rf "$home"
    exit "$rc"
}

case "${1:-}" in
    env)
        [[ $# == 3 ]] || die "usage: env ENV USER"
        make_env "$(realpath -m "$2")" "$3"
        ;;
    as)
        [[ $# -ge 6 && "$5" == -- ]] || die "usage: as ENV USER MPI -- CMD..."
        env="$(realpath "$2")"; user=$3; mpi=$4
        shift 5
        [[ "$mpi" == none || "$mpi" == system ]] || die "MPI is none or system, not '$mpi'"
        case "$env/" in "$ROOT/"*) die "$env lies inside the repository, which the run hides" ;; esac
        copy="$(mktemp /tmp/wheel-test.XXXXXX.sh)"
        cp "${BASH_SOURCE[0]}" "$copy"
        rc=0
        unshare -m -n bash "$copy" inner "$env" "$user" "$mpi" "$ROOT" "$@" || rc=$?
        rm -f "$copy"
        exit "$rc"
        ;;
    inner)
        shift
        inner "$@"
        ;;
    *) die "usage: env ENV USER | as ENV USER MPI -- CMD... (see the header)" ;;
esac
