#!/usr/bin/env bash
# A real single-node Slurm for tests and demos, without systemd:
#   scripts/slurm-cluster.sh start DIR   # munged + slurmctld + slurmd, state and config in DIR
#   scripts/slurm-cluster.sh stop DIR    # kills exactly what `start` started (pid files)
# `start` prints `export SLURM_CONF=DIR/slurm.conf`; export it before any Slurm command (without
# it a Slurm client looks its controller up by DNS). Idempotent: `start` on a running cluster
# only checks it; `stop` on a stopped one does nothing.
#
# Everything is private to DIR: its own munged (own key, socket, pid and log files), non-default
# ports (SLURM_CLUSTER_PORT, default 16817, and +1 for slurmd), spool and state directories.
# The node is this host with 4 CPUs (config_overrides: more CPUs than cores) reached on
# 127.0.0.1. MpiDefault is pmix; SLURM_CLUSTER_MPI=none gives clusters whose srun default does
# not start PMIx (then `srun --mpi=pmix` must be asked for).
# Needs root and the Debian packages slurmctld slurmd slurm-client munge (scripts/setup.sh).
set -euo pipefail

usage() { echo "usage: $0 start DIR | stop DIR | status DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd="$1"
mkdir -p "$2"
DIR="$(cd "$2" && pwd)"
CONF="$DIR/slurm.conf"
PORT="${SLURM_CLUSTER_PORT:-16817}"
MPI="${SLURM_CLUSTER_MPI:-pmix}"
HOST="$(hostname -s)"
export SLURM_CONF="$CONF"

log() { printf '[slurm-cluster] %s\n' "$*" >&2; }

alive() { # alive PIDFILE: the pid in it runs
  local p
  [ -s "$1" ] || return 1
  p="$(cat "$1" 2>/dev/null)" || return 1
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null
}

node_state() {
  timeout 5 sinfo -h -N -o '%t' -n "$HOST" 2>/dev/null | head -n1 | tr -d '* '
}

wait_idle() { # at most ~15 s
  local i s=""
  for i in $(seq 1 150); do
    s="$(node_state || true)"
    case "$s" in
      idle|mix|alloc) return 0 ;;
    esac
    sleep 0.1
  done
  log "node $HOST not idle after 15 s (state '${s:-none}'); logs in $DIR/*.log"
  return 1
}

write_conf() {
  cat >"$CONF" <<EOF
# Written by scripts/slurm-cluster.sh: a single-node test cluster, everything under $DIR.
ClusterName=tchrun
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SrunPortRange=$((PORT + 100))-$((PORT + 400))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=$MPI
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=300
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start() {
  for b in munged slurmctld slurmd sinfo; do
    command -v "$b" >/dev/null || { log "$b not found: run scripts/setup.sh"; exit 1; }
  done
  if alive "$DIR/munged.pid" && alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
    wait_idle
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  # Half-started (or stale pid files): start from scratch.
  stop_all quiet
  mkdir -p "$DIR/state" "$DIR/spool/slurmd-$HOST" "$DIR/munge"
  write_conf

  # munged: private key, socket, pid and log, run as the munge user (its dirs must be its own).
  if [ ! -s "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chown -R munge:munge "$DIR/munge"
  chmod 700 "$DIR/munge"
  chmod 400 "$DIR/munge/munge.key"
  runuser -u munge -- munged --force \
    --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
    --seed-file="$DIR/munge/munged.seed" --origin=127.0.0.1
  local i
  for i in $(seq 1 50); do [ -s "$DIR/munge/munged.pid" ] && break; sleep 0.1; done
  cp "$DIR/munge/munged.pid" "$DIR/munged.pid"
  alive "$DIR/munged.pid" || { log "munged did not start: $DIR/munge/munged.log"; exit 1; }

  # -c: clear state (a fresh cluster); -D: foreground, setsid detaches it from our session.
  setsid slurmctld -D -c -i -f "$CONF" </dev/null >>"$DIR/slurmctld.out" 2>&1 &
  echo $! >"$DIR/slurmctld.pid"
  setsid slurmd -D -f "$CONF" </dev/null >>"$DIR/slurmd.out" 2>&1 &
  echo $! >"$DIR/slurmd.pid"
  if ! wait_idle; then
    tail -n 5 "$DIR/slurmctld.log" "$DIR/slurmd.log" "$DIR"/*.out >&2 2>/dev/null || true
    exit 1
  fi
  log "up: node $HOST idle, ports $PORT/$((PORT + 1)), MpiDefault=$MPI, files in $DIR"
  echo "export SLURM_CONF=$CONF"
}

# kill_pidfiles NAME...: TERM to each DIR/NAME.pid that still runs NAME, wait up to 1 s for all
# (slurmd lingers ~5 s on TERM), then KILL the rest; removes the pid files.
kill_pidfiles() {
  local n p i pids=()
  for n in "$@"; do
    p="$(cat "$DIR/$n.pid" 2>/dev/null || true)"
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null && grep -q "$n" "/proc/$p/comm" 2>/dev/null; then
      kill -TERM "$p" 2>/dev/null || true
      pids+=("$p")
    fi
    rm -f "$DIR/$n.pid"
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  for i in $(seq 1 10); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}

stop_all() {
  local i
  [ -f "$CONF" ] && [ -s "$DIR/slurmctld.pid" ] && alive "$DIR/slurmctld.pid" &&
    { timeout 5 scancel --quiet --full -u root >/dev/null 2>&1 || true
      # Let slurmd end the job steps (their slurmstepd outlive slurmd): at most ~5 s.
      for i in $(seq 1 50); do
        [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1
      done; }
  kill_pidfiles slurmd slurmctld munged
  rm -f "$DIR/munge/munged.pid" "$DIR/munge/munge.socket" "$DIR/munge/munge.socket.lock"
  [ "${1:-}" = quiet ] || log "stopped (files kept in $DIR)"
}

case "$cmd" in
  start) start ;;
  stop) stop_all; rm -rf "$DIR/state" "$DIR/spool" ;;
  status)
    for d in munged slurmctld slurmd; do
      if alive "$DIR/$d.pid"; then echo "$d: running ($(cat "$DIR/$d.pid"))"; else echo "$d: stopped"; fi
    done
    alive "$DIR/slurmctld.pid" && echo "node: $(node_state)"
    ;;
  *) usage ;;
esac
