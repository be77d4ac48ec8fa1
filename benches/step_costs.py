#!/usr/bin/env python3
"""What each per-step addition of the trainer costs (issue 30, item 1), measured on its own.

    .venv/bin/python benches/step_costs.py [--sizes 32,112] [--batch 16] [--steps 20]
                                           [--rounds 3] [--threads 1] [--device cpu]

Runs `tchrun-worker bench-step --with ...` (the trainer's step function on synthetic tensors)
with one addition more at a time, the variants interleaved round by round (this machine is
noisy), and prints a Markdown table of the median ms/step of each variant and its difference
from the one before it:

- bare: the step alone (forward, loss, backward, the fused SGD update);
- + group: a 1-rank process group (the replicator's begin and end of a step, its stats tensor);
- + guard: the divergence guard's total after every update (one fused pass over the weights);
- + read-back: the stats and the guard read to the host every step (the trainer before issue 30);
- + window: instead of the read-back, the step's row in the device window, read when full (4
  rows on CPU, 32 on CUDA) or every 10 steps (the trainer now);
- + timers: the time split's clocks;
- + fp16 loss scaler: `--amp fp16`'s dynamic loss scaling (on the device: scale, unscale and
  check, the fused SGD kernel's skip, the scale's update; its flags in the window's row), which
  a CUDA fp16 run adds to every step.
The replica hooks of 2 or more ranks and the progress line are not per-step costs of one
process; the whole trainer at 1 and 2 ranks is `scripts/bench.sh --matrix --parts train`.
"""
import argparse
import json
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.environ.get("TCHRUN_WORKER", os.path.join(ROOT, "target/release/tchrun-worker"))
VARIANTS = [
    ("bare", ""),
    ("+ group", "group"),
    ("+ guard", "group,guard"),
    ("+ read-back (before)", "group,guard,read-back"),
    ("+ window (now)", "group,guard,window"),
    ("+ timers", "group,guard,window,timers"),
    ("+ fp16 loss scaler", "group,guard,window,timers,scaler"),
]
# Which variant each one is measured against.
BASE = {"+ group": "bare", "+ guard": "+ group", "+ read-back (before)": "+ guard",
        "+ window (now)": "+ guard", "+ timers": "+ window (now)",
        "+ fp16 loss scaler": "+ timers"}


def one(size, batch, steps, threads, device, with_):
    cmd = [WORKER, "bench-step", "--size", str(size), "--batch-size", str(batch), "--steps",
           str(steps), "--warmup", "3", "--threads", str(threads), "--device", device]
    if with_:
        cmd += ["--with", with_]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900).stdout
    return json.loads(out.strip().splitlines()[-1])["ms_per_step"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="32,112")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default=None,
                    help="a comma-separated subset of the variants' --with lists' last parts, "
                         "e.g. timers,scaler: those variants alone (more rounds in less time)")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    variants = VARIANTS
    if a.only:
        keep = set(a.only.split(","))
        variants = [(n, w) for n, w in VARIANTS if (w.split(",")[-1] if w else "bare") in keep]
        if len(variants) != len(keep):
            ap.error(f"--only {a.only}: expected some of bare,"
                     + ",".join(w.split(",")[-1] for _, w in VARIANTS if w))
    ms = {(s, name): [] for s in sizes for name, _ in variants}
    for r in range(a.rounds):
        order = variants if r % 2 == 0 else list(reversed(variants))
        for s in sizes:
            for name, with_ in order:
                ms[(s, name)].append(one(s, a.batch, a.steps, a.threads, a.device, with_))
    med = {k: statistics.median(v) for k, v in ms.items()}
    head = "| ms/step (median of %d) | " % a.rounds + " | ".join(
        f"{s} px | Δ at {s} px" for s in sizes) + " |"
    print(head)
    print("|---" * (1 + 2 * len(sizes)) + "|")
    for name, _ in variants:
        cells = []
        for s in sizes:
            v = med[(s, name)]
            base = BASE.get(name) if (s, BASE.get(name)) in med else None
            delta = "" if base is None else "%+.2f (%+.1f %%)" % (
                v - med[(s, base)], 100 * (v - med[(s, base)]) / med[(s, base)])
            cells += ["%.2f" % v, delta]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print("runs:", json.dumps({f"{s}:{n}": ms[(s, n)] for (s, n) in ms}))


if __name__ == "__main__":
    main()
