#!/usr/bin/env bash
# The collective trace's cost (issue 28): benches/off_cost.sh with TCHRUN_COLLECTIVE_TRACE=0.
#
#   benches/trace_cost.sh [ROUNDS] [RANKS] [SIZE]     (defaults 3, 2, 32)
exec "$(dirname "$0")/off_cost.sh" TCHRUN_COLLECTIVE_TRACE=0 "$@"
