#!/usr/bin/env python3
"""The step-overhead matrix (issue 30): tchrun against the PyTorch reference in the same run, at
every size and batch, as ratios.

    scripts/bench.sh --matrix [--parts step,train,job] [--sizes 32,64,112,224] [--batches 16,64]
                     [--ranks 1,2] [--repeats N] [--smoke] [--out DIR] [--table FILE]

- step: the training step alone, one process, one intra-op thread, synthetic tensors:
  `tchrun-worker bench-step` (the trainer's step and default memory format) against
  `benches/reference/bench_step.py` (torchvision's model, torch.optim.SGD, PyTorch's NCHW).
- train: the whole trainer on generated JPEGs (`tchrun train --launcher local`, 2 epochs) against
  `torchrun` + DDP + torchvision's ImageFolder/DataLoader (`benches/reference/train_ddp.py`),
  warm epochs' training images/s, at 1 and 2 ranks.
- job: the whole small job of the README (the digits, 32 px, 2 ranks, 2 epochs, batch 16): wall
  time of the whole command, tchrun against torchrun.
tchrun and the reference alternate (the order flips every repeat); medians of the repeats, each
ratio is tchrun / reference (higher is better for tchrun). Targets: step >= 1.0, train >= 1.1,
job >= 1.2. A full run rewrites the part of BENCHMARKS.md between the matrix markers; --smoke
(tiny, for CI) and a run with --table write only where told (default OUT/MATRIX.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the runner, the cases and the table writer)

BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
TARGETS = {"step": 1.0, "train": 1.1, "job": 1.2}


def step_cell(tool, size, batch, steps, work, tag):
    c = {"step_arch": "resnet18", "step_size": size, "step_batch": batch, "step_steps": steps}
    fn = bench.step_tchrun if tool == "t" else bench.step_ref
    return fn(c, "cpu", 1, work, f"m{size}-{batch}-{tag}")["ips"]


def train_cell(tool, size, batch, ranks, data, work, tag, epochs):
    model = os.path.join(work, f"model-resnet18-{size}")
    if not os.path.isfile(os.path.join(model, "model.json")):
        subprocess.run([bench.TCHRUN, "model", "init", "--arch", "resnet18", "--input-size",
                        str(size), "--output", model], check=True, timeout=300)
    c = {"model_dir": model, "arch": "resnet18", "train_size": size, "epochs": epochs,
         "batch_size": batch}
    fn = bench.train_tchrun if tool == "t" else bench.train_ref
    return fn(c, data, ranks, work, f"m{size}-{batch}-{ranks}-{tag}")["ips"]


def job_cell(tool, digits, work, tag, epochs):
    """Wall seconds of the whole command (start-up, training, validation, outputs)."""
    out = os.path.join(work, f"job-{tool}-{tag}")
    subprocess.run(["rm", "-rf", out], check=True)
    tr, va = os.path.join(digits, "train"), os.path.join(digits, "valid")
    if tool == "t":
        model = os.path.join(work, "model-digits-32")
        if not os.path.isfile(os.path.join(model, "model.json")):
            subprocess.run([bench.TCHRUN, "model", "init", "--arch", "resnet18", "--input-size",
                            "32", "--output", model], check=True, timeout=300)
        cmd = [bench.TCHRUN, "train", "--model", model, "--train", tr, "--valid", va, "--output",
               out, "--procs-per-node", "2", "--launcher", "local", "--epochs", str(epochs),
               "--batch-size", "16", "--patience", "100"]
        rank = bench.is_tchrun_rank
    else:
        cmd = [*bench.TORCHRUN, "--standalone", "--nproc-per-node", "2",
               os.path.join(bench.REF, "train_ddp.py"), "--arch", "resnet18", "--size", "32",
               "--train", tr, "--valid", va, "--output", out, "--epochs", str(epochs),
               "--batch-size", "16", "--patience", "100"]
        rank = bench.is_ref_rank
    t = time.time()
    bench.run(cmd, rank, out + ".stdout")
    return time.time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="step,train,job")
    ap.add_argument("--sizes", default="32,64,112,224")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="timed steps of the step cells")
    ap.add_argument("--train-images", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--smoke", action="store_true",
                    help="1 repeat, one small cell per part, tiny sets (CI)")
    ap.add_argument("--out", default=os.path.join(bench.ROOT, "target", "bench-matrix"))
    ap.add_argument("--table", default=None,
                    help="file to update between the matrix markers (default: BENCHMARKS.md for "
                         "a full run, OUT/MATRIX.md otherwise)")
    ap.add_argument("--command", default="scripts/bench.sh --matrix")
    a = ap.parse_args()
    parts = [p for p in a.parts.split(",") if p]
    unknown = set(parts) - set(TARGETS)
    if unknown:
        raise SystemExit(f"--parts: unknown part(s) {sorted(unknown)}; use step, train, job")
    sizes = [int(s) for s in a.sizes.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    ranks = [int(r) for r in a.ranks.split(",")]
    if a.smoke:
        a.repeats, a.steps, a.train_images, a.epochs = 1, 2, 32, 2
        sizes, batches, ranks = [32], [4], [2]
    work = os.path.abspath(a.out)
    os.makedirs(work, exist_ok=True)
    for b in (bench.TCHRUN, bench.WORKER):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"missing {b}: run cargo build --release")
    data = digits = None
    if "train" in parts:
        data = os.path.join(work, f"data-{a.train_images}")
        subprocess.run([bench.PY, os.path.join(bench.ROOT, "benches", "make_images.py"), data,
                        "--train", str(a.train_images), "--valid", str(max(a.train_images // 8, 20)),
                        "--size", "256"], check=True, timeout=1800)
    if "job" in parts:
        digits = os.path.join(work, "digits")
        if not os.path.isdir(os.path.join(digits, "train")):
            subprocess.run([bench.PY, os.path.join(bench.ROOT, "scripts", "make_digits.py"), digits],
                           check=True, timeout=600)
    cells = []  # (part, label, fn(tool, repeat) -> value, higher_is_better, unit)
    if "step" in parts:
        for s in sizes:
            for b in batches:
                cells.append(("step", f"{s} px, batch {b}, 1 process",
                              lambda tool, r, s=s, b=b: step_cell(tool, s, b, a.steps, work, r),
                              True, "images/s"))
    if "train" in parts:
        for s in sizes:
            for b in batches:
                for k in ranks:
                    cells.append(("train", f"{s} px, batch {b}, {k} rank(s)",
                                  lambda tool, r, s=s, b=b, k=k: train_cell(tool, s, b, k, data, work, r, a.epochs),
                                  True, "images/s"))
    if "job" in parts:
        cells.append(("job", f"digits, 32 px, batch 16, 2 ranks, {a.epochs} epochs",
                      lambda tool, r: job_cell(tool, digits, work, r, a.epochs), False, "s"))
    res = {i: {"t": [], "r": []} for i in range(len(cells))}
    t_start = time.time()
    loads = [os.getloadavg()[0]]
    for r in range(a.repeats):
        for i, (part, label, fn, _, _) in enumerate(cells):
            for tool in ("tr" if (r + i) % 2 == 0 else "rt"):
                v = fn(tool, r)
                res[i][tool].append(v)
                loads.append(os.getloadavg()[0])
                bench.log(f"repeat {r + 1}/{a.repeats} {part} {label} "
                          f"{'tchrun' if tool == 't' else 'reference'}: {v:.2f}")
    rows = ["| part | cell | unit | tchrun | PyTorch | tchrun / PyTorch | target | met |",
            "|---|---|---|---|---|---|---|---|"]
    for i, (part, label, _, higher, unit) in enumerate(cells):
        t, ref = statistics.median(res[i]["t"]), statistics.median(res[i]["r"])
        ratio = t / ref if higher else ref / t
        target = TARGETS[part]
        rows.append(f"| {part} | {label} | {unit} | {t:.1f} | {ref:.1f} | {ratio:.2f}x | "
                    f">= {target:.1f}x | {'yes' if ratio >= target else 'no'} |")
    minutes = (time.time() - t_start) / 60
    md = "\n".join([
        BEGIN,
        f"Command: `{a.command}` (took {minutes:.1f} min) · date: "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · commit: {bench.git_rev()} · "
        f"machine: {bench.machine()} · load average {min(loads):.1f}-{max(loads):.1f}",
        "",
        f"resnet18, CPU; medians of {a.repeats} repeat(s), tchrun and PyTorch alternating; "
        f"reference: {bench.torch_version()}. step: one intra-op thread; train: "
        f"{a.train_images} generated JPEGs, {a.epochs} epochs, warm epochs' images/s; job: wall "
        "time of the whole command (the ratio is PyTorch's time / tchrun's).",
        "",
        *rows,
        END,
    ])
    table = a.table or (os.path.join(work, "MATRIX.md") if a.smoke or a.parts != "step,train,job"
                        or a.sizes != "32,64,112,224" or a.batches != "16,64" or a.ranks != "1,2"
                        else os.path.join(bench.ROOT, "BENCHMARKS.md"))
    bench.write_section(table, md, BEGIN, END)
    print(md)
    bench.log(f"table written to {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
