#!/usr/bin/env bash
# tchrun for an older userland (issue 46): Debian 11 "bullseye" (glibc 2.31, GCC 10's
# libstdc++, Open MPI 4.1.0), as a root file system made with debootstrap from Debian's
# registry; needs root (debootstrap, chroot, mount namespaces).
#
#   scripts/bullseye.sh root                 # ROOTFS, made once (about 1 min, 600 MB)
#   scripts/bullseye.sh build                # the binaries built inside it, then the wheel
#   scripts/bullseye.sh run DIR ENV -- CMD...  # CMD inside ROOTFS (chroot, no network), ENV in DIR
#
# ROOTFS is $TCHRUN_BULLSEYE_ROOT (default target/bullseye/root): g++, libgloo-dev, binutils,
# openmpi-bin. `build` runs cargo from this machine's rustup toolchain inside ROOTFS (the
# repository, .venv's torch, CARGO_HOME and RUSTUP_HOME bound at their own paths in a private
# mount namespace), into target/bullseye/release: a build of its own (build scripts and proc
# macros built here need this machine's newer glibc, so target/release cannot seed it), with
# bullseye's headers, libstdc++ and linker, and every path of this machine mapped out of the
# binaries (CXXFLAGS/CFLAGS -ffile-prefix-map, RUSTFLAGS --remap-path-prefix). Then
# `scripts/wheel.sh --strict` packs it (tag from `objdump -T`; no path of this machine left). `run` binds DIR (holding ENV, an
# environment with torch and the wheel installed, and the job's files) at the same path inside
# ROOTFS, with a fresh /tmp, this machine's /etc/hosts and only the loopback, and runs CMD there
# as root with PATH=ENV/bin:/usr/bin:/bin; exit code: CMD's.
set -euo pipefail
# (Inner steps run from a copy outside the repository: they get both paths from the caller.)
ROOT="${TCHRUN_BULLSEYE_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)}"
FS="$(realpath -m "${TCHRUN_BULLSEYE_ROOT:-$ROOT/target/bullseye/root}")"
export TCHRUN_BULLSEYE_REPO="$ROOT" TCHRUN_BULLSEYE_ROOT="$FS"
OUT="$ROOT/target/bullseye"
MIRROR="${TCHRUN_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PKGS="g++,libgloo-dev,binutils,openmpi-bin,ca-certificates"
die() { echo "bullseye: $*" >&2; exit 2; }
log() { printf '[bullseye %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

make_root() {
    if [[ -f "$FS/.tchrun-bullseye" && "$(cat "$FS/.tchrun-bullseye")" == "$PKGS" ]]; then
        return 0
    fi
    command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
    rm -rf "$FS.partial"
    mkdir -p "$(dirname "$FS")"
    log "debootstrap bullseye ($PKGS) into $FS"
    debootstrap --variant=minbase --include="$PKGS" bullseye "$FS.partial" "$MIRROR" >"$OUT.debootstrap.log" 2>&1 \
        || die "debootstrap failed (see $OUT.debootstrap.log)"
    echo "$PKGS" >"$FS.partial/.tchrun-bullseye"
    rm -rf "$FS"
    mv -T "$FS.partial" "$FS"
}

# `bind DIR`: DIR (a real path) at the same path inside ROOTFS.
bind() {
    local d
    d="$(realpath "$1")"
    mkdir -p "$FS$d"
    mount --bind "$d" "$FS$d"
}

inner_build() {
    local cargo_home=$1 rustup_home=$2 torch
    mount --make-rprivate /
    mount -t proc proc "$FS/proc"
    mount --bind /dev "$FS/dev"
    torch="$(realpath "$ROOT/.venv/libtorch")"
    for d in "$ROOT" "$(realpath "$ROOT/.venv")" "$cargo_home" "$rustup_home"; do bind "$d"; done
    cp /etc/resolv.conf "$FS/etc/resolv.conf"
    # The torch headers' and the repository's paths are mapped out of the C++ code's strings.
    local map="-ffile-prefix-map=$torch=torch -ffile-prefix-map=$ROOT/.venv/libtorch=torch -ffile-prefix-map=$ROOT=."
    # And the Rust code's panic locations in cargo's registry and the repository.
    local remap="--remap-path-prefix=$cargo_home/registry/src=/cargo/registry/src --remap-path-prefix=$ROOT=."
    chroot "$FS" env -i PATH="$cargo_home/bin:/usr/bin:/bin" HOME=/root CARGO_HOME="$cargo_home" \
        RUSTUP_HOME="$rustup_home" CARGO_TARGET_DIR="$OUT" CXXFLAGS="$map" CFLAGS="$map" RUSTFLAGS="$remap" \
        TCHRUN_NO_NCCL="${TCHRUN_NO_NCCL:-}" \
        bash -c "cd '$ROOT' && cargo build --release --workspace --bins"
}

inner_run() {
    local dir=$1 env=$2
    shift 2
    mount --make-rprivate /
    ip link set lo up
    mount -t proc proc "$FS/proc"
    mount --bind /dev "$FS/dev"
    mount --bind /dev/shm "$FS/dev/shm" 2>/dev/null || true
    mount -t tmpfs -o size=512m tmpfs "$FS/tmp"
    bind "$dir"
    cp /etc/hosts "$FS/etc/hosts"
    exec chroot "$FS" env -i PATH="$env/bin:/usr/bin:/bin" HOME=/tmp LANG=C.UTF-8 "$@"
}

case "${1:-}" in
    root)
        make_root
        ;;
    build)
        make_root
        mkdir -p "$OUT"
        cargo_home="$(realpath "${CARGO_HOME:-$HOME/.cargo}")"
        rustup_home="$(realpath "${RUSTUP_HOME:-$HOME/.rustup}")"
        [[ -x "$cargo_home/bin/cargo" ]] || die "no cargo in $cargo_home/bin"
        log "cargo build inside bullseye into $OUT/release"
        copy="$(mktemp /tmp/bullseye.XXXXXX.sh)"
        cp "${BASH_SOURCE[0]}" "$copy"
        rc=0
        unshare -m bash "$copy" inner-build "$cargo_home" "$rustup_home" || rc=$?
        rm -f "$copy"
        [[ "$rc" == 0 ]] || die "the build inside bullseye failed ($rc)"
        TCHRUN_WHEEL_BIN_DIR="$OUT/release" "$ROOT/scripts/wheel.sh" --strict "$OUT/wheels"
        ;;
    run)
        [[ $# -ge 5 && "$4" == -- ]] || die "usage: run DIR ENV -- CMD..."
        [[ -f "$FS/.tchrun-bullseye" ]] || die "no bullseye root at $FS: scripts/bullseye.sh root"
        dir="$(realpath "$2")"; env="$(realpath "$3")"
        case "$env/" in "$dir/"*) ;; *) die "ENV $env is not inside DIR $dir" ;; esac
        shift 4
        copy="$(mktemp /tmp/bullseye.XXXXXX.sh)"
        cp "${BASH_SOURCE[0]}" "$copy"
        rc=0
        unshare -m -n bash "$copy" inner-run "$dir" "$env" "$@" || rc=$?
        rm -f "$copy"
        exit "$rc"
        ;;
    inner-build)
        shift
        inner_build "$@"
        ;;
    inner-run)
        shift
        inner_run "$@"
        ;;
    *) die "usage: root | build | run DIR ENV -- CMD... (see the header)" ;;
esac
