#!/bin/sh
# A program of the tchrun GPU kit (bin/tchrun, bin/tchrun-worker, bin/mpirun are this file):
# sets the kit's environment (env.sh), then runs the program of the same name from libexec/
# or, for mpirun, from openmpi/bin/.
KIT="$(cd "$(dirname "$0")/.." && pwd -P)" || exit 2
. "$KIT/env.sh" || exit 2
name="$(basename "$0")"
if [ "$name" = mpirun ]; then
    exec "$KIT/openmpi/bin/mpirun" "$@"
fi
exec "$KIT/libexec/$name" "$@"
