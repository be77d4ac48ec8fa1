#!/usr/bin/env python3
"""torch.distributed all-reduce bandwidth over Gloo, measured like `tchrun selftest`.

    torchrun --standalone --nproc-per-node N benches/reference/allreduce.py --sizes 4096,65536 --iters 20

Per size: float32 tensor of ones, 2 warm-up all-reduces, barrier, `iters` timed all-reduces
(sum); time = slowest rank's mean; algbw = bytes / time; busbw = algbw * 2(n-1)/n.
Rank 0 prints `RESULT {json}` with the rows.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,65536,1048576,16777216")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(len(os.sched_getaffinity(0)) // local_world, 1))
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    rows = []
    for size in [int(s) for s in args.sizes.split(",") if s]:
        elems = max(size // 4, 1)
        t = torch.ones(elems, dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t)
        mine = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        secs = mine.item()
        algbw = elems * 4 / secs / 1e9
        busbw = algbw * 2 * (n - 1) / n if n > 1 else algbw
        rows.append({"bytes": elems * 4, "iters": args.iters, "time_us": secs * 1e6,
                     "algbw_gbs": algbw, "busbw_gbs": busbw})
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"tool": "torch.distributed", "world_size": n, "rows": rows}),
              flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # destroy_process_group() can hang in Gloo after a peer has left


if __name__ == "__main__":
    sys.exit(main())
