#!/usr/bin/env bash
# An ssh stand-in for mpirun (`--mca plm_rsh_agent scripts/netns-rsh.sh`) that "logs in" to a
# simulated node of scripts/netns-nodes.sh: called like ssh (`[options] HOST command...`), it
# skips the options, maps HOST (tchrun-nodeK or 10.250.0.(10+K)) to its network namespace and
# runs the command there under the node's own hostname (a private UTS namespace). PIDs, files
# and /dev/shm stay shared with the machine. Like ssh, the command words are joined with spaces
# and run by a shell.
set -euo pipefail

while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    # ssh options that take a value
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -[bcDEeFIiJLlmOopQRSWw]?*) shift ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "netns-rsh: usage: netns-rsh.sh [ssh options] HOST command..." >&2; exit 255; }
host="${1#*@}"
shift
case "$host" in
  tchrun-node[0-9]*) ns="$host" ;;
  10.250.0.*) k=$(( ${host##*.} - 10 )); ns="tchrun-node$k"; host="$ns" ;;
  *) echo "netns-rsh: unknown host '$host' (expected tchrun-nodeK from scripts/netns-nodes.sh)" >&2; exit 255 ;;
esac
if ! ip netns list | awk '{print $1}' | grep -qx "$ns"; then
  echo "netns-rsh: no network namespace $ns (run scripts/netns-nodes.sh up N)" >&2
  exit 255
fi
[ $# -ge 1 ] || { echo "netns-rsh: no command for $host (interactive login is not supported)" >&2; exit 255; }
# "$*": the words joined with spaces, as ssh hands them to the remote shell.
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1"; shift; eval "$*"' sh "$host" "$*"
