#!/usr/bin/env bash
# One-command, idempotent setup for tchrun on Debian 12 (x86-64).
#   apt: OpenMPI (the ranks load it at run time under mpirun; the build needs neither its headers
#        nor libclang), gloo headers (c10d shim), Slurm + munge (tests),
#        iproute2 (network-namespace tests), strace (tests/index.rs counts system calls),
#        elfutils (eu-stack: the native stacks of a hung rank, crates/stacks/src/lib.rs), debootstrap
#        (scripts/bullseye.sh: the Debian 11 build and run of tests/install.rs)
#   venv: .venv with torch==2.11.0 (libtorch for tch 0.24), torchvision, test/bench deps, and
#         python/ on its path (`import tchrun`, tchrun-dev.pth)
# Second run is fast: every step checks before it installs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# libpmix-dev: Debian's Slurm (mpi/pmix_v4) dlopens the unversioned pmix2/lib/libpmix.so, which
# only the dev package ships; without it every `srun --mpi=pmix` fails with "can not load PMIx
# library" (openmpi-bin brings libpmix2 alone).
# prometheus, prometheus-node-exporter: tests/prometheus.rs starts both itself on loopback (no
# service is needed).
APT_PKGS=(openmpi-bin libgloo-dev g++ pkg-config debootstrap libpmix-dev
          slurmctld slurmd slurm-client munge iproute2 procps util-linux fonts-dejavu-core strace elfutils
          prometheus prometheus-node-exporter)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "apt packages present"
fi

VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  "$PY" -m venv "$VENV"
fi
# Pinned Python requirements (torch 2.11.0 pairs with tch 0.24; torchvision 0.26.0 pairs with torch 2.11).
REQ="$ROOT/scripts/requirements.txt"
STAMP="$VENV/.tchrun-req.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  log "pip install -r scripts/requirements.txt (torch is ~4.6 GB on first install)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  echo "$want" > "$STAMP"
else
  log "python requirements present"
fi
"$VENV/bin/python" -c 'import torch; assert torch.__version__.startswith("2.11.0"), torch.__version__'
# `import tchrun` (python/tchrun: TorchDistributor, issue 49) in .venv, from this checkout: a .pth
# naming python/ (the wheel installs the package itself instead).
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ "$(cat "$SITE/tchrun-dev.pth" 2>/dev/null)" != "$ROOT/python" ]; then
  log "import tchrun: $SITE/tchrun-dev.pth -> $ROOT/python"
  printf '%s\n' "$ROOT/python" > "$SITE/tchrun-dev.pth"
fi
(cd / && "$VENV/bin/python" -c 'import tchrun, cloudpickle')

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust with rustup (https://rustup.rs) and re-run" >&2
  exit 1
fi
ln -sfn "$("$VENV/bin/python" -c "import torch, os; print(os.path.dirname(torch.__file__))")" "$VENV/libtorch"
log "setup done (cargo finds libtorch through .cargo/config.toml; no variables to export)"
