#!/bin/sh
# A program of the tchrun GPU kit (bin/tchrun, bin/tchrun-worker, bin/mpirun are this file):
# sets the kit's OpenMPI environment (env.sh, what `module load openmpi` does on a cluster),
# then runs mpirun from openmpi/bin/ or tchrun/tchrun-worker as the wheel installed them
# (TCHRUN_KIT_BIN: the environment's bin/, set by run.sh after `pip install`).
KIT="$(cd "$(dirname "$0")/.." && pwd -P)" || exit 2
. "$KIT/env.sh" || exit 2
name="$(basename "$0")"
if [ "$name" = mpirun ]; then
    exec "$KIT/openmpi/bin/mpirun" "$@"
fi
if [ -z "${TCHRUN_KIT_BIN:-}" ] || [ ! -x "$TCHRUN_KIT_BIN/$name" ]; then
    echo "tchrun kit: $name is not installed: run.sh installs the kit's wheel and sets TCHRUN_KIT_BIN" >&2
    exit 2
fi
exec "$TCHRUN_KIT_BIN/$name" "$@"
