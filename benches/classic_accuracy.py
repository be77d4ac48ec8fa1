#!/usr/bin/env python3
"""Classic-settings accuracy (issue 52 item 1): tchrun against the PyTorch reference on the job a
user compares first: no warmup, the default augmentation, the README's kind of flags; 1 and 2
ranks, several seeds; per epoch the training loss, and the last epoch's top-1, mean ± std over
the seeds, with Welch's test of tchrun minus the reference.

    benches/classic_accuracy.py [--epochs 10] [--seeds 1,2,3,4] [--ranks 1,2] [--lr 0.05]
                                [--batch-size 32] [--extra FLAGS] [--out DIR] [--table FILE]

The job: the digits (scripts/make_digits.py: 1438 train / 359 valid, 10 classes, 32 px), resnet18
from scratch at 32 px, `--epochs E --batch-size B --lr LR --seed S` and tchrun's defaults
otherwise (SGD momentum 0.9, weight decay 1e-4, poly LR without warmup, RandomResizedCrop from
8 % of the image + horizontal flips, plain cross entropy), on R local ranks (effective LR = LR x R).
- tchrun: `tchrun model init --arch resnet18 --input-size 32`, then `tchrun train --launcher local
  --procs-per-node R ...`; the numbers from the output's `metrics.jsonl`.
- reference: `torchrun --standalone --nproc-per-node R benches/reference/train_ddp.py` (DDP +
  torchvision) with the same flags; the numbers from its `RESULT` line.
The runs interleave (per seed and rank count, tchrun and the reference alternate, the order
flips). Every run's numbers go to OUT/runs.jsonl, the table to OUT/CLASSIC.md, and with --table
FILE between the classic markers of FILE (BENCHMARKS.md). The spread of the first epoch's
training loss over the seeds is what tests/trainer.rs's first-epoch comparison allows.
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from recipe_accuracy import welch  # noqa: E402

BEGIN, END = "<!-- classic:begin -->", "<!-- classic:end -->"


def flags(a, seed):
    return ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr),
            "--seed", str(seed), "--patience", "1000", *shlex.split(a.extra)]


def run_tchrun(model, data, out, ranks, args):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [bench.TCHRUN, "train", "--model", model, "--train", os.path.join(data, "train"),
           "--valid", os.path.join(data, "valid"), "--output", out, "--launcher", "local",
           "--procs-per-node", str(ranks), *args]
    bench.run(cmd, bench.is_tchrun_rank, out + ".stdout", limit=7200, done_tag=None)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        epochs = [json.loads(line) for line in f if line.strip()]
    return {"losses": [m["train_loss"] for m in epochs], "top1": epochs[-1]["top1"],
            "ips": bench.warm_mean([m["train_images_per_sec"] for m in epochs])}


def run_reference(data, out, ranks, args):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*bench.TORCHRUN, "--standalone", "--nproc-per-node", str(ranks),
           os.path.join(bench.REF, "train_ddp.py"), "--arch", "resnet18", "--size", "32",
           "--train", os.path.join(data, "train"), "--valid", os.path.join(data, "valid"),
           "--output", out, *args]
    r = bench.run(cmd, bench.is_ref_rank, out + ".stdout", limit=7200)
    res = json.loads(bench.result_line(r["text"], "RESULT"))
    return {"losses": [e["train_loss"] for e in res["epochs"]], "top1": res["final_top1"],
            "ips": bench.warm_mean(res["train_images_per_sec"])}


def ms(values, scale=1.0, digits=2):
    vals = [scale * v for v in values]
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def table(runs, a, seeds, minutes):
    names = {"tchrun": "tchrun", "reference": "PyTorch (torchrun + DDP)"}
    rows = ["| implementation | ranks | train loss, epoch 1 | train loss, last epoch | "
            "top-1 % (last epoch) | train images/s | seeds |", "|---|---|---|---|---|---|---|"]
    lines = []
    for ranks in a.ranks:
        for impl in names:
            rs = [r for r in runs if r["impl"] == impl and r["ranks"] == ranks]
            if rs:
                rows.append(f"| {names[impl]} | {ranks} | {ms([r['losses'][0] for r in rs])} | "
                            f"{ms([r['losses'][-1] for r in rs])} | "
                            f"{ms([r['top1'] for r in rs], 100, 1)} | "
                            f"{statistics.mean(r['ips'] for r in rs):.0f} | {len(rs)} |")
        t = [r for r in runs if r["impl"] == "tchrun" and r["ranks"] == ranks]
        ref = [r for r in runs if r["impl"] == "reference" and r["ranks"] == ranks]
        w = welch([r["top1"] for r in t], [r["top1"] for r in ref])
        wl = welch([r["losses"][0] / 100 for r in t], [r["losses"][0] / 100 for r in ref])
        if w and wl:
            lines.append(f"- {ranks} rank(s), tchrun minus the reference: top-1 {w[0]:+.1f} ± "
                         f"{w[1]:.1f} points (95 % interval), Welch's p = {w[2]:.2f}; first "
                         f"epoch's training loss {wl[0]:+.2f} ± {wl[1]:.2f}, p = {wl[2]:.2f}.")
    cmd = "benches/classic_accuracy.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    return "\n".join([
        BEGIN,
        f"Command: `{cmd.strip()}` (took {minutes:.0f} min) · date: "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · commit: {bench.git_rev()} · "
        f"machine: {bench.machine()} · reference: {bench.torch_version()}",
        "",
        f"digits (1438 train / 359 valid, 10 classes), resnet18 from scratch at 32 px, batch "
        f"{a.batch_size} per rank, {a.epochs} epoch(s), `--lr {a.lr}` (x ranks), no warmup, the "
        f"default augmentation{', `' + a.extra + '`' if a.extra else ''}; seeds "
        f"{','.join(map(str, seeds))}. Mean ± sample std over the seeds.",
        "",
        *rows,
        "",
        *lines,
        END,
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--extra", default="", help="more training flags for both sides")
    ap.add_argument("--out", default=os.path.join(bench.ROOT, "target", "bench-classic"))
    ap.add_argument("--table", default=None)
    a = ap.parse_args()
    a.ranks = [int(r) for r in a.ranks.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(a.out, "digits")
    if not os.path.isdir(os.path.join(data, "train")):
        bench.run([bench.PY, os.path.join(bench.ROOT, "scripts", "make_digits.py"), data],
                  lambda c: False, os.path.join(a.out, "digits.stdout"), done_tag=None)
    model = os.path.join(a.out, "resnet18-32")
    bench.run([bench.TCHRUN, "model", "init", "--arch", "resnet18", "--input-size", "32",
               "--output", model, "--force"], lambda c: False,
              os.path.join(a.out, "init.stdout"), done_tag=None)
    t0, runs = time.time(), []
    with open(os.path.join(a.out, "runs.jsonl"), "w") as log:
        k = 0
        for seed in seeds:
            for ranks in a.ranks:
                order = ["tchrun", "reference"][:: 1 if k % 2 == 0 else -1]
                k += 1
                for impl in order:
                    out = os.path.join(a.out, f"{impl}-r{ranks}-s{seed}")
                    bench.log(f"{impl}, {ranks} rank(s), seed {seed}")
                    r = (run_tchrun(model, data, out, ranks, flags(a, seed)) if impl == "tchrun"
                         else run_reference(data, out, ranks, flags(a, seed)))
                    r.update(impl=impl, ranks=ranks, seed=seed)
                    runs.append(r)
                    log.write(json.dumps(r) + "\n")
                    log.flush()
    md = table(runs, a, seeds, (time.time() - t0) / 60)
    with open(os.path.join(a.out, "CLASSIC.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    if a.table:
        bench.write_section(a.table, md, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
