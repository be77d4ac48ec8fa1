#!/usr/bin/env python3
"""Time to first step at dataset scale (issue 16, item 5): tchrun against torchrun + DDP +
torchvision's ImageFolder on generated sets of tiny JPEGs (so that only the number of files
matters), 2 ranks, first job (no dataset index yet) and second job (the index reused), warm and
cold page cache; peak memory (VmHWM) of the launcher and of a rank.

    benches/scale.py [--sizes 10000,300000,1000000] [--image-size 24] [--out DIR] [--repeats 1]

Each size N is N training images plus N/20 validation images in 10 classes
(`benches/make_images.py`, kept between runs in OUT). "Cold" drops the page cache, dentries and
inodes first (`echo 3 > /proc/sys/vm/drop_caches`, root only); "first" removes tchrun's index
cache (TCHRUN_DATA_CACHE=OUT/index-cache) first. The reference has no index: each of its jobs is
a first job. The table goes to OUT/scale.md and stdout.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the runner, the reference and the first-step probes)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def tchrun_job(c, data, work, tag, cache):
    out = os.path.join(work, f"out-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    log0 = os.path.join(out, "logs", "70_driver_log_0")
    cmd = [bench.TCHRUN, "train", "--model", c["model_dir"], "--train",
           os.path.join(data, "train"), "--valid", os.path.join(data, "valid"), "--output", out,
           "--epochs", "1", "--batch-size", "16", "--procs-per-node", "2", "--launcher", "local"]
    env = dict(os.environ, TCHRUN_DATA_CACHE=cache)
    r = bench.run(cmd, bench.is_tchrun_rank, out + ".stdout", env=env,
                  stop=lambda: bench.tchrun_first_step(log0) is not None)
    fs = bench.tchrun_first_step(log0)
    return {"first_step": fs - r["t0"] if fs else None, "launcher": r["launcher_hwm_mib"],
            "rank": r["hwm_mib"]}


def ref_job(c, data, work, tag):
    out = os.path.join(work, f"ref-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    path = out + ".stdout"
    cmd = [*bench.TORCHRUN, "--standalone", "--nproc-per-node", "2",
           os.path.join(bench.REF, "train_ddp.py"), "--arch", "resnet18", "--size",
           str(c["train_size"]), "--train", os.path.join(data, "train"), "--valid",
           os.path.join(data, "valid"), "--output", out, "--epochs", "1", "--batch-size", "16"]
    r = bench.run(cmd, bench.is_ref_rank, path,
                  stop=lambda: "FIRST_STEP " in (bench._read(path) or b"").decode(errors="replace"))
    return {"first_step": float(bench.result_line(r["text"], "FIRST_STEP")) - r["t0"],
            "launcher": r["launcher_hwm_mib"], "rank": r["hwm_mib"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,300000,1000000")
    ap.add_argument("--image-size", type=int, default=24)
    ap.add_argument("--train-size", type=int, default=64, help="model input size")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(bench.ROOT, "target", "bench-scale"))
    ap.add_argument("--no-cold", action="store_true", help="skip the cold page-cache runs")
    a = ap.parse_args()
    work = os.path.abspath(a.out)
    os.makedirs(work, exist_ok=True)
    cold = not a.no_cold
    if cold and os.geteuid() != 0:
        raise SystemExit("cold runs drop the page cache: run as root, or pass --no-cold")
    c = {"train_size": a.train_size,
         "model_dir": os.path.join(work, f"model-resnet18-{a.train_size}")}
    if not os.path.isfile(os.path.join(c["model_dir"], "model.json")):
        subprocess.run([bench.TCHRUN, "model", "init", "--arch", "resnet18", "--input-size",
                        str(a.train_size), "--output", c["model_dir"]], check=True, timeout=300)
    cache = os.path.join(work, "index-cache")
    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        data = os.path.join(work, f"data-big-full-{n}")
        subprocess.run([bench.PY, os.path.join(bench.ROOT, "benches", "make_images.py"), data,
                        "--train", str(n), "--valid", str(max(n // 20, 10)), "--size",
                        str(a.image_size)], check=True, timeout=7200)
        files = n + max(n // 20, 10)
        res = {}
        temps = (["cold"] if cold else []) + ["warm"]
        for rep in range(a.repeats):
            for temp in temps:
                for case in ("reference", "first", "second"):
                    if case == "first":
                        shutil.rmtree(cache, ignore_errors=True)
                    if temp == "cold":
                        drop_caches()
                    tag = f"{n}-{temp}-{case}-{rep}"
                    if case == "reference":
                        r = ref_job(c, data, work, tag)
                    else:
                        r = tchrun_job(c, data, work, tag, cache)
                    res.setdefault((temp, case), []).append(r)
                    bench.log(f"{files} files, {temp}, {case}: {r}")
        for temp in temps:
            med = {case: {k: statistics.median(x[k] for x in res[(temp, case)])
                          for k in ("first_step", "launcher", "rank")}
                   for case in ("reference", "first", "second")}
            ref = med["reference"]
            for case in ("first", "second"):
                t = med[case]
                rows.append(f"| {files:,} | {temp} | {case} job | {t['first_step']:.2f} s | "
                            f"{ref['first_step']:.2f} s | **{t['first_step'] / ref['first_step']:.2f}x** | "
                            f"{t['launcher']:.0f} / {ref['launcher']:.0f} | "
                            f"{t['rank']:.0f} / {ref['rank']:.0f} |")
    md = "\n".join([
        f"`benches/scale.py --sizes {a.sizes} --image-size {a.image_size} --repeats {a.repeats}` "
        f"({os.cpu_count()} cores; 2 ranks; images of ~{a.image_size} px; medians of "
        f"{a.repeats})", "",
        "| files (train + valid) | page cache | tchrun | tchrun first step | reference first step "
        "| ratio | launcher peak MiB (tchrun / torchrun) | rank peak MiB (tchrun / reference) |",
        "|---|---|---|---|---|---|---|---|", *rows])
    with open(os.path.join(work, "scale.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
