#!/usr/bin/env python3
"""Training images/s and peak memory per architecture family on CPU (issue 34, item 5): tchrun
against PyTorch eager on the same machine, side by side.

    .venv/bin/python benches/families.py [--archs resnet50,convnext_tiny,...] [--size 64]
                                         [--batch 16] [--steps 5] [--warmup 2] [--rounds 2]
                                         [--threads 1] [--opt sgd|adamw]

For each architecture, `tchrun-worker bench-step` (the trainer's step on synthetic tensors:
forward, cross-entropy, backward, SGD with momentum) and `benches/reference/bench_step.py` (the
same loop in PyTorch: torchvision.models.<arch>, SGD momentum 0.9, weight decay 1e-4), both in
their default memory format (tchrun's `--channels-last auto` choice, PyTorch's NCHW), one
intra-op thread each, alternating round by round (this machine is noisy). `--opt adamw`: both
sides step AdamW instead (weight decay 0.05; tchrun's fused kernel, torch.optim.AdamW's default
on CPU, the single-tensor loop). Prints a Markdown
table: the median images/s of each side and their ratio (the median of the rounds' paired
ratios), and each side's peak RSS (VmHWM of the process: weights, gradients, momentum and the
step's activations).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.environ.get("TCHRUN_WORKER", os.path.join(ROOT, "target/release/tchrun-worker"))
PYTHON = os.path.join(ROOT, ".venv/bin/python")
REFERENCE = os.path.join(ROOT, "benches/reference/bench_step.py")
# One size of every family.
DEFAULT_ARCHS = [
    "resnet50",
    "densenet121",
    "convnext_tiny",
    "efficientnet_b0",
    "efficientnet_v2_s",
    "mobilenet_v3_large",
    "regnet_y_400mf",
    "regnet_x_1_6gf",
    "vit_b_32",
    "swin_t",
]


def result(cmd: list) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    for line in reversed(out.stdout.splitlines()):
        line = line.strip()
        if line.startswith("RESULT "):
            line = line[len("RESULT "):]
        if line.startswith("{"):
            return json.loads(line)
    sys.exit(f"no result from: {' '.join(cmd)}\n{out.stdout[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", default=",".join(DEFAULT_ARCHS))
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--opt", default="sgd", choices=["sgd", "adamw"])
    a = ap.parse_args()
    common = ["--size", str(a.size), "--batch-size", str(a.batch), "--steps", str(a.steps),
              "--warmup", str(a.warmup), "--threads", str(a.threads), "--opt", a.opt]
    started = time.time()
    rows = []
    for arch in a.archs.split(","):
        ours, theirs, ratios = [], [], []
        for _ in range(a.rounds):
            t = result([WORKER, "bench-step", "--arch", arch] + common)
            r = result([PYTHON, REFERENCE, "--arch", arch] + common)
            ours.append(t)
            theirs.append(r)
            ratios.append(t["images_per_sec"] / r["images_per_sec"])
        med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
        rows.append((arch, med(ours, "images_per_sec"), med(theirs, "images_per_sec"),
                     statistics.median(ratios), max(x["peak_rss_mib"] for x in ours),
                     max(x["peak_rss_mib"] for x in theirs),
                     "channels-last" if ours[0]["channels_last"] else "NCHW"))
        print(f"# {arch} done", file=sys.stderr, flush=True)
    load = os.getloadavg()
    print(f"Command: `benches/families.py {' '.join(sys.argv[1:])}` (took "
          f"{(time.time() - started) / 60:.1f} min) · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f" · `nproc` = {os.cpu_count()}, {platform.processor() or platform.machine()} · load "
          f"average {load[0]:.1f} at the end · {a.size} px, batch {a.batch}, {a.threads} "
          f"intra-op thread(s), {a.steps} timed steps after {a.warmup}, {a.rounds} round(s)")
    print()
    print("| architecture | tchrun images/s | PyTorch images/s | tchrun / PyTorch | tchrun peak RSS MiB "
          "| PyTorch peak RSS MiB | tchrun layout |")
    print("|---|---|---|---|---|---|---|")
    for arch, t, r, ratio, tm, rm, layout in rows:
        print(f"| {arch} | {t:.1f} | {r:.1f} | {ratio:.2f}x | {tm:.0f} | {rm:.0f} | {layout} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
