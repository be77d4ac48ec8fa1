#!/usr/bin/env bash
# Simulated cluster nodes on one machine, as network namespaces (needs root / CAP_NET_ADMIN):
#   scripts/netns-nodes.sh up N   # namespaces tchrun-node1..N, each with its own address
#   scripts/netns-nodes.sh down   # removes them, their links and their /etc/hosts lines
# Layout: bridge tchrun-br0 (10.250.0.1/24) in the root namespace; per node a veth pair
# tchrun-vK (root side, on the bridge) / eth0 (inside) with 10.250.0.(10+K)/24; lo up.
# The names tchrun-nodeK go into /etc/hosts (marked lines, removed by `down`), so no lookup
# ever leaves the machine. mpirun reaches the nodes through scripts/netns-rsh.sh:
#   mpirun --mca plm_rsh_agent scripts/netns-rsh.sh \
#          --mca btl_tcp_if_include 10.250.0.0/24 --mca oob_tcp_if_include 10.250.0.0/24 ...
# Idempotent: `up` first removes what an earlier `up` left.
set -euo pipefail

PREFIX=tchrun-node
BRIDGE=tchrun-br0
NET=10.250.0
MARK="# tchrun-netns"

usage() { echo "usage: $0 up N | down" >&2; exit 2; }
log() { printf '[netns-nodes] %s\n' "$*" >&2; }

hosts_remove() {
  local tmp
  grep -q "$MARK" /etc/hosts 2>/dev/null || return 0
  tmp="$(mktemp)"
  grep -v "$MARK" /etc/hosts >"$tmp" || true
  # Rewrite in place (/etc/hosts may be a bind mount: no rename).
  cat "$tmp" >/etc/hosts
  rm -f "$tmp"
}

# hosts_add IP NAME: the IPv4 line and its IPv4-mapped IPv6 form. c10d's sockets are dual-stack
# and getnameinfo() of ::ffff:a.b.c.d otherwise asks DNS (a 10 s timeout per connection).
hosts_add() {
  printf '%s %s %s\n::ffff:%s %s %s\n' "$1" "$2" "$MARK" "$1" "$2" "$MARK" >>/etc/hosts
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX[0-9]*$" || true); do
    ip netns del "$ns" 2>/dev/null || true # its veth end goes with it, and the pair with that
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  # A namespace that a leftover process still holds outlives `ip netns del`, and so does its
  # veth pair: remove our veth ends explicitly, so that the next `up` does not collide.
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep '^tchrun-v[0-9]*$' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  hosts_remove
}

up() {
  local n="$1" k ns ip
  case "$n" in ''|*[!0-9]*) usage ;; esac
  [ "$n" -ge 1 ] && [ "$n" -le 50 ] || { log "N must be 1..50"; exit 2; }
  command -v ip >/dev/null || { log "ip not found: install iproute2 (scripts/setup.sh)"; exit 1; }
  down
  if ! ip link add "$BRIDGE" type bridge 2>/dev/null; then
    log "cannot create a bridge: needs root / CAP_NET_ADMIN"
    exit 3
  fi
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for k in $(seq 1 "$n"); do
    ns="$PREFIX$k"
    ip="$NET.$((10 + k))"
    ip netns add "$ns"
    ip link add "tchrun-v$k" type veth peer name eth0 netns "$ns"
    ip link set "tchrun-v$k" master "$BRIDGE" up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # No default route: nothing from a node can reach beyond 10.250.0.0/24 (a stray DNS
    # query fails at once instead of timing out).
    hosts_add "$ip" "$ns"
  done
  # The root namespace (where mpirun runs) under a name too.
  hosts_add "$NET.1" tchrun-head
  log "up: $n node(s) ${PREFIX}1..${PREFIX}$n on $NET.0/24 (bridge $BRIDGE, $NET.1)"
}

case "${1:-}" in
  up) [ $# -eq 2 ] || usage; up "$2" ;;
  down) [ $# -eq 1 ] || usage; down ;;
  *) usage ;;
esac
