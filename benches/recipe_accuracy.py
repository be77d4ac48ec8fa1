#!/usr/bin/env python3
"""Recipe accuracy (issue 32 item 5): the classic flags against `--recipe torchvision-v2`, under
tchrun and under the PyTorch reference, several seeds; top-1 (mean ± std over the seeds) and
training images/s side by side.

    benches/recipe_accuracy.py [--epochs 10] [--seeds 1,2,3,4,5,6] [--batch-size 32] [--lr 0.2]
                               [--recipes classic,torchvision-v2] [--extra FLAGS] [--out DIR]
                               [--table FILE]
    benches/recipe_accuracy.py --smoke        # 1 epoch, 1 seed: checks the wiring (~5 min here)

The job: the digits (scripts/make_digits.py: 1438 train / 359 valid images, 10 classes, 32 px),
resnet18 from scratch at 32 px, 2 ranks on this machine, `--batch-size` images per rank.
- tchrun: `tchrun model init --arch resnet18 --input-size 32`, then `tchrun train --launcher local
  --procs-per-node 2 ... --seed S` (the flags below); top-1 of the last epoch and the images/s
  from the output's `metrics.jsonl` (`top1`, `ema_top1`, `train_images_per_sec`).
- reference: `torchrun --standalone --nproc-per-node 2 benches/reference/train_ddp.py` (DDP +
  torchvision, the recipe through torchvision's own transforms, schedulers, RASampler, EMA);
  top-1 from its `RESULT` line. Its flags are the ones tchrun gives its ranks: the script asks
  `tchrun train ... --dry-run` for the worker's command line (the recipe already expanded) and
  passes each training flag on (a flag the reference does not know stops the run), so both sides
  train with the same values by construction.
- both recipes: `--epochs E --batch-size B --lr 0.2 --lr-reference-batch 1024 --patience 1000`:
  the LR is given for 1024 images per step (as torchvision-v2's 0.5), scaled by tchrun's rule to
  the 2 x B images of a step (0.0125 at B = 32), for the classic flags too (tchrun's default
  `--lr 0.001` is for fine-tuning, it barely moves a model from scratch in a few epochs); at the
  recipe's own 0.5 both sides blow up right after the warmup on this small problem, and the
  last epoch measures the recovery more than the training.
- classic: otherwise tchrun's defaults (SGD momentum 0.9, weight decay 1e-4, poly LR without
  warmup, RandomResizedCrop + flip, plain cross entropy).
- torchvision-v2: `--recipe torchvision-v2` (cosine LR with linear warmup, label smoothing 0.1,
  MixUp 0.2 / CutMix 1.0, random erasing 0.1, weight decay 2e-5 and none on batch norm, EMA,
  repeated augmentation x4, train crop 25 and validation resize 33 at 32 px), with
  `--warmup-epochs W` (default 2; the recipe's 5 is for 600 epochs) and `--model-ema-steps 1
  --model-ema-decay 0.99` (the recipe's EMA, 32 steps and 0.99998 adjusted for 600 ImageNet
  epochs, would average a handful of updates here: 20 steps per epoch). `--auto-augment
  ta_wide` is passed to tchrun only when `tchrun train --help` lists it; the reference always
  runs it. The table says which auto-augment each side ran; `--impls reference-no-aa` runs
  the reference with the recipe but no auto-augment (tchrun's recipe while it has none).
The runs interleave (per seed and recipe, tchrun and the reference alternate, the order flips).
Under the table, per recipe: tchrun minus the reference, the difference of the means with its 95 %
interval and Welch's two-sided p (scipy). TCHRUN_REF_AVERAGE_BN=1 makes the reference keep the
batch-norm running statistics as tchrun does (an ablation, train_ddp.py).
Every run's numbers go to OUT/runs.jsonl, the table to OUT/RECIPE.md, and with --table FILE
between the recipe markers of FILE (BENCHMARKS.md).
"""
import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the runner, the binaries' paths, the section writer)

BEGIN, END = "<!-- recipe:begin -->", "<!-- recipe:end -->"
RECIPES = ("classic", "torchvision-v2")
IMPLS = {"tchrun": "tchrun", "reference": "PyTorch (torchrun + DDP)",
         "reference-no-aa": "PyTorch, recipe without auto-augment"}
# tchrun-worker train's flags that train_ddp.py takes with the same name and meaning.
PASSED = {
    "epochs", "batch-size", "warmup-epochs", "lr", "seed", "patience", "print-freq", "momentum",
    "weight-decay", "lr-power", "min-crop-scale", "no-hflip", "lr-reference-batch",
    "lr-scheduler", "lr-step-size", "lr-gamma", "lr-min", "lr-warmup-method", "lr-warmup-decay",
    "label-smoothing", "mixup-alpha", "cutmix-alpha", "auto-augment", "ra-magnitude",
    "augmix-severity", "random-erase", "norm-weight-decay", "bias-weight-decay", "model-ema",
    "model-ema-steps", "model-ema-decay", "ra-sampler", "ra-reps", "train-crop-size",
    "val-resize-size", "val-crop-size", "interpolation",
}
# Flags that do not change what is trained, or that the reference sets itself.
NOT_TRAINING = {
    "model", "train", "valid", "output", "max-image-pixels", "bucket-cap-mb", "channels-last",
    "device", "backend", "timeout", "console", "log-dir", "threads", "loader-threads",
}
# Flags whose tchrun default the reference does (any other value has no reference equivalent).
DEFAULT_ONLY = {"amp": "off", "opt": "sgd", "lr-scaling": "linear", "early-stop-on": "raw"}


def worker_flags(dry_run_text):
    """[(flag, value or None)] of rank 0's `tchrun-worker train` line in a --dry-run's output."""
    for line in dry_run_text.splitlines():
        if not line.startswith("RANK=0 "):
            continue
        words = shlex.split(line)
        i = next(k for k, w in enumerate(words) if w.endswith("tchrun-worker"))
        words = words[i + 2:]  # after `tchrun-worker train`
        flags, k = [], 0
        while k < len(words):
            w = words[k]
            if not w.startswith("--"):
                raise SystemExit(f"unexpected word {w!r} in tchrun's worker command: {line}")
            if "=" in w:
                name, value = w[2:].split("=", 1)
                k += 1
            elif k + 1 < len(words) and not words[k + 1].startswith("--"):
                name, value = w[2:], words[k + 1]
                k += 2
            else:
                name, value = w[2:], None
                k += 1
            flags.append((name, value))
        return flags
    raise SystemExit(f"no `RANK=0 ... tchrun-worker train` line in tchrun's --dry-run output:\n{dry_run_text}")


def reference_flags(flags):
    """train_ddp.py's arguments for tchrun's worker flags; stops on a flag it cannot mirror."""
    out = []
    for name, value in flags:
        if name in NOT_TRAINING:
            continue
        if name in DEFAULT_ONLY:
            if value != DEFAULT_ONLY[name]:
                raise SystemExit(f"the reference has no --{name} {value} (only {DEFAULT_ONLY[name]})")
            continue
        if name not in PASSED:
            raise SystemExit(f"tchrun's worker got --{name} {value or ''}: the reference "
                             "(benches/reference/train_ddp.py) has no equivalent; add it there")
        out += [f"--{name}"] + ([value] if value is not None else [])
    return out


def has_auto_augment():
    text = subprocess.run([bench.TCHRUN, "train", "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    return "--auto-augment" in text


def tchrun_args(recipe, a, seed, auto_aug):
    args = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr),
            "--lr-reference-batch", str(a.lr_reference_batch), "--patience", "1000",
            "--seed", str(seed)]
    args += shlex.split(a.extra)
    if recipe == "torchvision-v2":
        args += ["--recipe", "torchvision-v2", "--warmup-epochs",
                 str(min(a.warmup_epochs, a.epochs - 1)), "--model-ema-steps", str(a.ema_steps),
                 "--model-ema-decay", str(a.ema_decay)]
        if auto_aug:
            args += ["--auto-augment", "ta_wide"]
    return args


def run_tchrun(model, data, out, args):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [bench.TCHRUN, "train", "--model", model, "--train", os.path.join(data, "train"),
           "--valid", os.path.join(data, "valid"), "--output", out, "--launcher", "local",
           "--procs-per-node", "2", *args]
    t = time.time()
    bench.run(cmd, bench.is_tchrun_rank, out + ".stdout", limit=3600, done_tag=None)
    wall = time.time() - t
    with open(os.path.join(out, "metrics.jsonl")) as f:
        epochs = [json.loads(l) for l in f if l.strip()]
    last = epochs[-1]
    return {"top1": last["top1"], "ema_top1": last.get("ema_top1"),
            "ips": bench.warm_mean([m["train_images_per_sec"] for m in epochs]),
            "epochs_run": len(epochs), "wall_s": wall}


def run_reference(data, out, args):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*bench.TORCHRUN, "--standalone", "--nproc-per-node", "2",
           os.path.join(bench.REF, "train_ddp.py"), "--arch", "resnet18", "--size", "32",
           "--train", os.path.join(data, "train"), "--valid", os.path.join(data, "valid"),
           "--output", out, *args]
    t = time.time()
    r = bench.run(cmd, bench.is_ref_rank, out + ".stdout", limit=3600)
    wall = time.time() - t
    res = json.loads(bench.result_line(r["text"], "RESULT"))
    return {"top1": res["final_top1"], "ema_top1": res.get("final_ema_top1"),
            "ips": bench.warm_mean(res["train_images_per_sec"]),
            "epochs_run": len(res["epochs"]), "wall_s": wall}


def pct(values):
    """mean ± std (sample, over the seeds) in %."""
    vals = [100 * v for v in values if v is not None]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.1f}"
    return f"{statistics.mean(vals):.1f} ± {statistics.stdev(vals):.1f}"


def welch(a, b):
    """tchrun minus reference: (difference of the means in points, its 95 % interval's half-width,
    Welch's two-sided p), or None with fewer than 2 runs a side."""
    a, b = [100 * v for v in a if v is not None], [100 * v for v in b if v is not None]
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats  # the reference's venv has scipy (torchvision's dependency chain)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.mean(a) - statistics.mean(b)
    if va + vb == 0:
        return diff, 0.0, 1.0 if diff == 0 else 0.0
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    se = math.sqrt(va + vb)
    p = 2 * stats.t.sf(abs(diff) / se, df)  # scipy's ttest_ind(equal_var=False), from the same df
    return diff, stats.t.ppf(0.975, df) * se, float(p)


def comparison(runs, recipes):
    """One line per recipe: tchrun against the reference, top-1 and the EMA's."""
    lines = []
    for recipe in recipes:
        t = [r for r in runs if r["impl"] == "tchrun" and r["recipe"] == recipe]
        for impl in ("reference", "reference-no-aa"):
            ref = [r for r in runs if r["impl"] == impl and r["recipe"] == recipe]
            parts = []
            for key, name in (("top1", "top-1"), ("ema_top1", "EMA top-1")):
                w = welch([r[key] for r in t], [r[key] for r in ref])
                if w is None:
                    continue
                diff, half, p = w
                verdict = ("no difference at these seeds" if p >= 0.05 else
                           "tchrun ahead" if diff > 0 else "tchrun behind")
                parts.append(f"{name} {diff:+.1f} ± {half:.1f} points (95 % interval), "
                             f"Welch's p = {p:.2f}: {verdict}")
            if parts:
                lines.append(f"- {recipe}, tchrun minus {IMPLS[impl]}: " + "; ".join(parts) + ".")
    return lines


def table(runs, a, seeds, auto_aug, minutes, loads):
    rows = ["| implementation | recipe | auto-augment | top-1 % (last epoch) | EMA top-1 % | "
            "train images/s | seeds |",
            "|---|---|---|---|---|---|---|"]
    for recipe in a.recipes:
        for impl in IMPLS:
            rs = [r for r in runs if r["impl"] == impl and r["recipe"] == recipe]
            if not rs:
                continue
            aa = "—" if recipe == "classic" else (
                "ta_wide" if impl == "reference" or (impl == "tchrun" and auto_aug) else
                "none (tchrun has no --auto-augment)" if impl == "tchrun" else "none")
            ips = statistics.mean(r["ips"] for r in rs)
            name = IMPLS[impl]
            rows.append(f"| {name} | {recipe} | {aa} | {pct([r['top1'] for r in rs])} | "
                        f"{pct([r['ema_top1'] for r in rs]) if recipe != 'classic' else '—'} | "
                        f"{ips:.0f} | {len(rs)} |")
    cmd = "benches/recipe_accuracy.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    return "\n".join([
        BEGIN,
        f"Command: `{cmd.strip()}` (took {minutes:.0f} min) · date: "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · commit: {bench.git_rev()} · "
        f"machine: {bench.machine()} · load average {min(loads):.1f}-{max(loads):.1f} · "
        f"reference: {bench.torch_version()}",
        "",
        f"digits (1438 train / 359 valid, 10 classes), resnet18 from scratch at 32 px, 2 ranks, "
        f"batch {a.batch_size} per rank, {a.epochs} epoch(s), `--lr {a.lr} --lr-reference-batch "
        f"{a.lr_reference_batch}` (effective LR {a.lr * 2 * a.batch_size / a.lr_reference_batch:g}), "
        f"{'every run with `' + a.extra + '`, ' if a.extra else ''}seeds {','.join(map(str, seeds))}; torchvision-v2 with `--warmup-epochs "
        f"{min(a.warmup_epochs, a.epochs - 1)} --model-ema-steps {a.ema_steps} --model-ema-decay "
        f"{a.ema_decay}`. top-1: the last epoch's, mean ± sample std over the seeds; images/s: "
        "mean over the runs of the epochs after the first.",
        "",
        *rows,
        "",
        *comparison(runs, a.recipes),
        END,
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", default="1,2,3,4,5,6")
    ap.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--lr-reference-batch", type=int, default=1024)
    ap.add_argument("--warmup-epochs", type=int, default=2, help="torchvision-v2's warmup (capped at epochs - 1)")
    ap.add_argument("--ema-steps", type=int, default=1)
    ap.add_argument("--ema-decay", type=float, default=0.99)
    ap.add_argument("--extra", default="", help="more `tchrun train` flags for every run (the reference "
                    "gets them through --dry-run), e.g. '--min-crop-scale 1 --no-hflip' (no augmentation)")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--impls", default="tchrun,reference",
                    help="of tchrun, reference, reference-no-aa (the reference without --auto-augment: "
                         "what tchrun runs while it has none)")
    ap.add_argument("--smoke", action="store_true", help="1 epoch, 1 seed")
    ap.add_argument("--out", default=os.path.join(bench.ROOT, "target", "bench-recipe"))
    ap.add_argument("--table", default=None, help="also write the table between the recipe markers of this file")
    a = ap.parse_args()
    if a.smoke:
        a.epochs, a.seeds = 1, "1"
    a.recipes = [r for r in a.recipes.split(",") if r]
    impls = [i for i in a.impls.split(",") if i]
    if set(a.recipes) - set(RECIPES) or set(impls) - set(IMPLS):
        raise SystemExit(f"--recipes: {', '.join(RECIPES)}; --impls: {', '.join(IMPLS)}")
    seeds = [int(s) for s in a.seeds.split(",") if s]
    for b in (bench.TCHRUN, bench.WORKER):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"missing {b}: run cargo build --release (or set TCHRUN_BENCH_TCHRUN/_WORKER)")
    work = os.path.abspath(a.out)
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "digits")
    if not os.path.isdir(os.path.join(data, "train")):
        subprocess.run([bench.PY, os.path.join(bench.ROOT, "scripts", "make_digits.py"), data],
                       check=True, timeout=600)
    model = os.path.join(work, "model-resnet18-32")
    if not os.path.isfile(os.path.join(model, "model.json")):
        subprocess.run([bench.TCHRUN, "model", "init", "--arch", "resnet18", "--input-size", "32",
                        "--output", model], check=True, timeout=300)
    auto_aug = has_auto_augment()
    bench.log(f"tchrun's auto-augment: {'ta_wide' if auto_aug else 'absent (tchrun train --help has no --auto-augment)'}; "
              "the reference's: ta_wide")
    runs, t_start, loads, order = [], time.time(), [os.getloadavg()[0]], 0
    log_path = os.path.join(work, "runs.jsonl")
    open(log_path, "w").close()
    for seed in seeds:
        for recipe in a.recipes:
            targs = tchrun_args(recipe, a, seed, auto_aug)
            dry = subprocess.run([bench.TCHRUN, "train", "--model", model, "--train",
                                  os.path.join(data, "train"), "--valid", os.path.join(data, "valid"),
                                  "--output", os.path.join(work, "dry"), "--launcher", "local",
                                  "--procs-per-node", "2", *targs, "--dry-run"],
                                 capture_output=True, text=True, timeout=300)
            if dry.returncode != 0:
                raise SystemExit(f"tchrun --dry-run failed:\n{dry.stdout}{dry.stderr}")
            rargs = reference_flags(worker_flags(dry.stdout))
            if recipe == "torchvision-v2" and "--auto-augment" not in rargs:
                rargs += ["--auto-augment", "ta_wide"]
            sides = impls if order % 2 == 0 else impls[::-1]
            order += 1
            for impl in sides:
                tag = f"{impl}-{recipe}-s{seed}"
                out = os.path.join(work, tag)
                if impl == "tchrun":
                    bench.log(f"{tag}: tchrun train ... {' '.join(targs)}")
                    r = run_tchrun(model, data, out, targs)
                else:
                    args = rargs
                    if impl == "reference-no-aa" and "--auto-augment" in rargs:
                        i = rargs.index("--auto-augment")
                        args = rargs[:i] + rargs[i + 2:]
                    bench.log(f"{tag}: train_ddp.py ... {' '.join(args)}")
                    r = run_reference(data, out, args)
                r.update(impl=impl, recipe=recipe, seed=seed)
                runs.append(r)
                loads.append(os.getloadavg()[0])
                with open(log_path, "a") as f:
                    f.write(json.dumps(r) + "\n")
                ema = f", EMA top-1 {100 * r['ema_top1']:.1f}%" if r["ema_top1"] is not None else ""
                bench.log(f"{tag}: top-1 {100 * r['top1']:.1f}%{ema}, {r['ips']:.0f} images/s, "
                          f"{r['wall_s']:.0f} s")
    md = table(runs, a, seeds, auto_aug, (time.time() - t_start) / 60, loads)
    with open(os.path.join(work, "RECIPE.md"), "w") as f:
        f.write(md + "\n")
    if a.table:
        bench.write_section(a.table, md, BEGIN, END)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
