#!/usr/bin/env python3
"""A torch.distributed program that knows nothing of tchrun: torchrun's environment contract
only. All-reduces (rank + 1) and checks the sum."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
expected = world * (world + 1) / 2
assert torch.all(t == expected), (t, expected)
print(f"python rank {rank}/{world} local {os.environ['LOCAL_RANK']} all_reduce ok sum={int(t[0])}", flush=True)
dist.destroy_process_group()
