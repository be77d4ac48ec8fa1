"""A stranger on the job's host (tests/security.rs): from before the job starts until STOP
exists (or LIMIT seconds), polls every 20 ms for new listening TCP ports and attacks each:
a real c10d TCPStore client without the secret (set and get a key, count keys; with --forge
KEY VALUE it sets that key too), connect-and-close floods, 4 KiB of random bytes, and a
connection that stays silent, once on each port as it appears. Writes
one JSON line per c10d attempt to OUT: {"port", "host", "joined", "error"}.

With --targets FILE (a stranger on another node, which cannot list the job's sockets) the
ports come from FILE instead, one "HOST PORT" line each as the test sees them appear.

usage: stranger.py OUT STOP LIMIT [--forge KEY VALUE] [--targets FILE]
"""
import datetime
import json
import os
import socket
import struct
import sys
import threading
import time

import torch.distributed as dist

out_path, stop_path, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
rest = sys.argv[4:]
forge = rest[1:3] if rest[:1] == ["--forge"] else None
targets_path = rest[rest.index("--targets") + 1] if "--targets" in rest else None
lock = threading.Lock()
out = open(out_path, "a")


def record(row):
    with lock:
        out.write(json.dumps(row) + "\n")
        out.flush()


def decode(hexaddr):
    raw = b"".join(struct.pack("<I", int(hexaddr[i:i + 8], 16)) for i in range(0, len(hexaddr), 8))
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, raw[12:])
    return socket.inet_ntop(socket.AF_INET6, raw)


def listening():
    if targets_path:
        try:
            lines = open(targets_path).read().split("\n")[:-1]  # whole lines only
        except OSError:
            return set()
        return {(h, int(p)) for h, p in (l.split() for l in lines if len(l.split()) == 2)}
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 3 and f[3] == "0A":
                ip, port = f[1].split(":")
                host = decode(ip)
                host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
                found.add((host, int(port, 16)))
    return found


def c10d(host, port):
    row = {"host": host, "port": port, "joined": False}
    try:
        s = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=2),
                          wait_for_workers=False)
        s.set("stranger/was/here", "1")
        row["joined"] = True
        row["keys"] = s.num_keys()
        if forge:
            s.set(forge[0], forge[1])
            row["forged"] = forge[0]
    except Exception as e:  # refused, reset, timed out: what the job should do to strangers
        row["error"] = str(e).splitlines()[0][:200]
    record(row)


def raw(host, port, payload, hold):
    """Whether the connection was made."""
    try:
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect((host, port))
            if payload:
                s.sendall(payload)
            time.sleep(hold)
        return True
    except OSError:
        return False


def attack(host, port):
    for _ in range(20):
        if not raw(host, port, b"", 0):
            break
    raw(host, port, os.urandom(4096), 0)
    threading.Thread(target=raw, args=(host, port, b"", 8), daemon=True).start()
    c10d(host, port)


before = listening()
record({"ready": True})
start = time.time()
seen = set()
attacks = []
while time.time() - start < limit and not os.path.exists(stop_path):
    for target in sorted(listening() - before - seen):
        seen.add(target)
        attacks.append(threading.Thread(target=attack, args=target, daemon=True))
        attacks[-1].start()
    time.sleep(0.02)
for a in attacks:  # each ends within its timeouts (2 s a connect, 2 s the c10d client)
    a.join(timeout=10)
record({"done": True, "ports": sorted(p for _, p in seen)})
