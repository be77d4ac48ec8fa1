#!/usr/bin/env python3
"""tchrun versus torchrun + DDP + torchvision, side by side, in one invocation (issue 6).

Called by scripts/bench.sh (see there for the flags). Every case runs tchrun and the PyTorch
reference alternately (the order flips every repeat), `--repeats` times; the table shows medians
and ratios tchrun / reference. Memory is measured the same way for both: the runner samples
/proc of every rank process (VmHWM, the kernel's peak RSS) and the PSS of the rank plus its
descendants (the reference's DataLoader worker processes) while the job runs.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A machine with its own torch (the GPU machine) points these at its Python and torchrun
# (TCHRUN_BENCH_TORCHRUN is a command line: `python3 -m torch.distributed.run` works), and the
# GPU kit (scripts/gpu-kit.sh) at its own tchrun and tchrun-worker and its commit.
PY = os.environ.get("TCHRUN_BENCH_PYTHON", os.path.join(ROOT, ".venv", "bin", "python"))
TORCHRUN = (shlex.split(os.environ["TCHRUN_BENCH_TORCHRUN"]) if os.environ.get("TCHRUN_BENCH_TORCHRUN")
            else [os.path.join(ROOT, ".venv", "bin", "torchrun")])
TCHRUN = os.environ.get("TCHRUN_BENCH_TCHRUN", os.path.join(ROOT, "target", "release", "tchrun"))
WORKER = os.environ.get("TCHRUN_BENCH_WORKER", os.path.join(ROOT, "target", "release", "tchrun-worker"))
REF = os.path.join(ROOT, "benches", "reference")
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
GPU_BEGIN, GPU_END = "<!-- bench-gpu:begin -->", "<!-- bench-gpu:end -->"

FULL = dict(repeats=3, arch="resnet18", train_size=112, train_images=256, valid_images=64,
            epochs=2, batch_size=16, big_images=10000, loader_size=224, loader_batch=32,
            loader_epochs=1, sizes="4096,65536,1048576,16777216", iters=100,
            step_arch="resnet18", step_size=112, step_batch=16, step_steps=20)
SMOKE = dict(repeats=1, arch="resnet18", train_size=64, train_images=32, valid_images=16,
             epochs=2, batch_size=8, big_images=64, loader_size=224, loader_batch=16,
             loader_epochs=1, sizes="4096,65536", iters=5,
             step_arch="resnet18", step_size=64, step_batch=4, step_steps=3)
# --gpu: the GPU mode (issue 6): ResNet-50, 224 x 224, bf16 autocast, channels-last and cudnn
# benchmark on both sides, synthetic tensors; images/s and GPU memory (nvidia-smi, per process).
GPU = dict(repeats=3, step_arch="resnet50", step_size=224, step_batch=128, step_steps=50,
           arch="resnet50", train_size=224, train_images=2560, valid_images=256, epochs=3,
           batch_size=64)


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------
# process sampling
# ------------------------------------------------------------------------------------------

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        st = _read(f"/proc/{d}/stat")
        if not st:
            continue
        try:
            ppid = int(st.rsplit(b")", 1)[1].split()[1])
        except (IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _subtree(root, kids):
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _cmdline(pid):
    c = _read(f"/proc/{pid}/cmdline")
    return [a.decode(errors="replace") for a in c.split(b"\0") if a] if c else []


def _status_kb(pid, field):
    s = _read(f"/proc/{pid}/status")
    m = re.search(rb"^" + field.encode() + rb":\s+(\d+) kB", s or b"", re.M)
    return int(m.group(1)) if m else 0


def _pss_kb(pid):
    s = _read(f"/proc/{pid}/smaps_rollup")
    m = re.search(rb"^Pss:\s+(\d+) kB", s or b"", re.M)
    return int(m.group(1)) if m else 0


def is_tchrun_rank(cmd):
    return bool(cmd) and os.path.basename(cmd[0]) == "tchrun-worker"


def is_ref_rank(cmd):
    return len(cmd) > 1 and "torchrun" not in " ".join(cmd[:2]) and any(
        a.endswith(("train_ddp.py", "allreduce.py")) for a in cmd[1:3])


def _gpu_mem_mib():
    """{pid: used MiB} of every compute process nvidia-smi lists ({} without a GPU)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10).stdout
    except Exception:
        return {}
    mem = {}
    for line in out.splitlines():
        try:
            pid, used = (int(x) for x in line.split(","))
            mem[pid] = used
        except ValueError:
            continue
    return mem


def run(cmd, is_rank, stdout_path, stop=None, limit=1800, env=None, done_tag="RESULT ",
        gpu=False):
    """Runs cmd in its own session, sampling its rank processes; returns a dict. `stop()`
    true: the job is ended (SIGTERM) and that is no failure; once `done_tag` is in the output,
    a job that does not end within 30 s is stopped the same way (a hang at shutdown)."""
    t0 = time.time()
    done_at = None

    def done():
        return done_tag is not None and done_tag.encode() in (_read(stdout_path) or b"")

    with open(stdout_path, "w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                             start_new_session=True, env=env)
        hwm, pss, rank_pids, stopped, tick = {}, {}, set(), False, 0
        top_hwm = 0  # the launcher (tchrun, torchrun): the process started here
        gpu_peak = 0
        while p.poll() is None:
            tick += 1
            kids = _children_map()
            tree = _subtree(p.pid, kids)
            top_hwm = max(top_hwm, _status_kb(p.pid, "VmHWM"))
            cmds = {pid: _cmdline(pid) for pid in tree}
            for pid in tree:
                if not is_rank(cmds[pid]):
                    continue
                parent_is_rank = any(pid in kids.get(q, []) and is_rank(cmds.get(q, []))
                                     for q in tree)
                if parent_is_rank:
                    continue  # a DataLoader worker of a rank
                rank_pids.add(pid)
                hwm[pid] = max(hwm.get(pid, 0), _status_kb(pid, "VmHWM"))
                if tick % 2 == 0:
                    total = sum(_pss_kb(q) for q in _subtree(pid, kids))
                    pss[pid] = max(pss.get(pid, 0), total)
            if gpu:
                mem = _gpu_mem_mib()
                gpu_peak = max([gpu_peak] + [mem[q] for q in tree if q in mem])
            if done and done_at is None and done():
                done_at = time.time()
            if done_at is not None and time.time() - done_at > 30 and not stopped:
                log(f"results are out but the job has not ended 30 s later: stopping it")
                stop = lambda: True  # noqa: E731
            if stop and not stopped and stop():
                stopped = True
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
            if time.time() - t0 > limit:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                raise SystemExit(f"timed out after {limit}s: {' '.join(cmd)}")
            time.sleep(0.25)
        wall = time.time() - t0
    text = open(stdout_path, errors="replace").read()
    if p.returncode != 0 and not stopped:
        raise SystemExit(f"failed (exit {p.returncode}): {' '.join(cmd)}\n{text[-3000:]}")
    return {"t0": t0, "wall": wall, "rc": p.returncode, "text": text,
            "hwm_mib": max(hwm.values(), default=0) / 1024,
            "pss_mib": max(pss.values(), default=0) / 1024, "ranks": len(rank_pids),
            "launcher_hwm_mib": top_hwm / 1024,
            "gpu_mib": gpu_peak}


def result_line(text, tag):
    for line in text.splitlines():
        if line.startswith(tag + " "):
            return line[len(tag) + 1:]
    return None


def tchrun_first_step(log_path):
    """Unix time of rank 0's 'first optimizer step done' line, or None."""
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                if "first optimizer step done" in line:
                    ts = line.split()[0].rstrip("Z")
                    dt = datetime.datetime.fromisoformat(ts[:26]).replace(tzinfo=datetime.timezone.utc)
                    return dt.timestamp()
    except OSError:
        pass
    return None


# ------------------------------------------------------------------------------------------
# cases
# ------------------------------------------------------------------------------------------

def warm_mean(values):
    vals = values[1:] if len(values) > 1 else values
    return sum(vals) / len(vals)


def train_tchrun(c, data, nproc, work, tag, extra=(), gpu=False):
    out = os.path.join(work, f"out-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [TCHRUN, "train", "--model", c["model_dir"], "--train", os.path.join(data, "train"),
           "--valid", os.path.join(data, "valid"), "--output", out, "--epochs", str(c["epochs"]),
           "--batch-size", str(c["batch_size"]), "--procs-per-node", str(nproc),
           "--launcher", "local", "--patience", "100", *extra]
    r = run(cmd, is_tchrun_rank, out + ".stdout", gpu=gpu)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        ips = [json.loads(l)["train_images_per_sec"] for l in f if l.strip()]
    fs = tchrun_first_step(os.path.join(out, "logs", "70_driver_log_0"))
    return {"ips": warm_mean(ips), "first_step": fs - r["t0"] if fs else None,
            "hwm": r["hwm_mib"], "pss": r["pss_mib"], "ranks": r["ranks"], "gpu_mib": r["gpu_mib"]}


def train_ref(c, data, nproc, work, tag, extra=(), gpu=False):
    out = os.path.join(work, f"ref-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc),
           os.path.join(REF, "train_ddp.py"), "--arch", c["arch"], "--size", str(c["train_size"]),
           "--train", os.path.join(data, "train"), "--valid", os.path.join(data, "valid"),
           "--output", out, "--epochs", str(c["epochs"]), "--batch-size", str(c["batch_size"]),
           "--patience", "100", *extra]
    r = run(cmd, is_ref_rank, out + ".stdout", gpu=gpu)
    res = json.loads(result_line(r["text"], "RESULT"))
    return {"ips": warm_mean(res["train_images_per_sec"]),
            "first_step": res["first_step_unix"] - r["t0"], "hwm": r["hwm_mib"],
            "pss": r["pss_mib"], "ranks": r["ranks"], "gpu_mib": r["gpu_mib"]}


def first_step_tchrun(c, data, nproc, work, tag):
    out = os.path.join(work, f"out-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    log0 = os.path.join(out, "logs", "70_driver_log_0")
    cmd = [TCHRUN, "train", "--model", c["model_dir"], "--train", os.path.join(data, "train"),
           "--valid", os.path.join(data, "valid"), "--output", out, "--epochs", "1",
           "--batch-size", str(c["batch_size"]), "--procs-per-node", str(nproc),
           "--launcher", "local"]
    r = run(cmd, is_tchrun_rank, out + ".stdout", stop=lambda: tchrun_first_step(log0) is not None)
    return {"first_step": tchrun_first_step(log0) - r["t0"]}


def first_step_ref(c, data, nproc, work, tag):
    out = os.path.join(work, f"ref-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    path = out + ".stdout"
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc),
           os.path.join(REF, "train_ddp.py"), "--arch", c["arch"], "--size", str(c["train_size"]),
           "--train", os.path.join(data, "train"), "--valid", os.path.join(data, "valid"),
           "--output", out, "--epochs", "1", "--batch-size", str(c["batch_size"])]
    r = run(cmd, is_ref_rank, path,
            stop=lambda: "FIRST_STEP " in (_read(path) or b"").decode(errors="replace"))
    return {"first_step": float(result_line(r["text"], "FIRST_STEP")) - r["t0"]}


def step_tchrun(c, device, threads, work, tag, amp="bf16", extra=()):
    """`extra`: more bench-step flags (`--with ...`: the trainer's per-step additions)."""
    cmd = [WORKER, "bench-step", "--arch", c["step_arch"], "--size", str(c["step_size"]),
           "--batch-size", str(c["step_batch"]), "--steps", str(c["step_steps"]),
           "--device", device, *extra]
    if device == "cuda":
        cmd += ["--amp", amp]
    else:
        cmd += ["--threads", str(threads), "--classes", "10"]
    r = run(cmd, is_tchrun_rank, os.path.join(work, f"step-{tag}.stdout"), done_tag=None,
            gpu=device == "cuda")
    res = json.loads(r["text"].strip().splitlines()[-1])
    return {"ips": res["images_per_sec"], "hwm": r["hwm_mib"], "gpu_mib": r["gpu_mib"]}


def step_ref(c, device, threads, work, tag, amp="bf16"):
    cmd = [PY, os.path.join(REF, "bench_step.py"), "--arch", c["step_arch"], "--size",
           str(c["step_size"]), "--batch-size", str(c["step_batch"]), "--steps",
           str(c["step_steps"]), "--device", device]
    if device == "cuda":
        # The GPU mode: channels-last and bf16 on both sides (fp16: GradScaler).
        cmd += ["--amp", amp, "--channels-last"]
    else:
        # PyTorch's default layout, as a user's script runs (tchrun's default is channels-last).
        cmd += ["--threads", str(threads), "--classes", "10"]
    r = run(cmd, lambda cm: len(cm) > 1 and cm[1].endswith("bench_step.py"),
            os.path.join(work, f"refstep-{tag}.stdout"), gpu=device == "cuda")
    res = json.loads(result_line(r["text"], "RESULT"))
    return {"ips": res["images_per_sec"], "hwm": r["hwm_mib"], "gpu_mib": r["gpu_mib"]}


def loader_tchrun(c, images, threads, work, tag):
    cmd = [WORKER, "bench-loader", "--images", images, "--size", str(c["loader_size"]),
           "--threads", str(threads), "--batch-size", str(c["loader_batch"]),
           "--epochs", str(c["loader_epochs"])]
    r = run(cmd, is_tchrun_rank, os.path.join(work, f"loader-{tag}.stdout"))
    return {"ips": warm_mean(json.loads(r["text"].strip().splitlines()[-1])["images_per_sec"]),
            "pss": r["pss_mib"]}


def loader_ref(c, images, threads, work, tag):
    cmd = [PY, os.path.join(REF, "bench_loader.py"), "--images", images, "--size",
           str(c["loader_size"]), "--threads", str(threads), "--batch-size",
           str(c["loader_batch"]), "--epochs", str(c["loader_epochs"])]
    r = run(cmd, lambda cm: len(cm) > 1 and cm[1].endswith("bench_loader.py"),
            os.path.join(work, f"refloader-{tag}.stdout"))
    return {"ips": warm_mean(json.loads(r["text"].strip().splitlines()[-1])["images_per_sec"]),
            "pss": r["pss_mib"]}


def busbw_tchrun(c, nproc, work, tag):
    logs = os.path.join(work, f"selftest-{tag}")
    cmd = [TCHRUN, "selftest", "--procs-per-node", str(nproc), "--launcher", "local",
           "--sizes", c["sizes"], "--iters", str(c["iters"]), "--log-dir", logs]
    r = run(cmd, is_tchrun_rank, logs + ".stdout")
    rows = []
    for line in r["text"].splitlines():
        tok = line.split()
        if len(tok) == 6 and tok[1] in ("B", "KiB", "MiB", "GiB") and tok[2].isdigit():
            rows.append(float(tok[5]))
    return {"busbw": rows}


def busbw_ref(c, nproc, work, tag):
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc),
           os.path.join(REF, "allreduce.py"), "--sizes", c["sizes"], "--iters", str(c["iters"])]
    r = run(cmd, is_ref_rank, os.path.join(work, f"refallreduce-{tag}.stdout"))
    return {"busbw": [row["busbw_gbs"] for row in json.loads(result_line(r["text"], "RESULT"))["rows"]]}


# ------------------------------------------------------------------------------------------
# table
# ------------------------------------------------------------------------------------------

def human(b):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:g} {unit}"
        b /= 1024


def machine():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 1024 ** 2:.0f} GiB RAM"
    except OSError:
        pass
    return f"`nproc` = {os.cpu_count()}, {model}, {mem}, {platform.platform()}"


def git_rev():
    if os.environ.get("TCHRUN_BENCH_COMMIT"):
        return os.environ["TCHRUN_BENCH_COMMIT"]
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except Exception:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="1 repeat, tiny sizes (CI)")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU mode: ResNet-50 training steps on CUDA (bf16, channels-last), "
                         "images/s and GPU memory; writes the GPU section of BENCHMARKS.md")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench"),
                    help="work directory (datasets, outputs, logs, BENCHMARKS.md copy)")
    ap.add_argument("--table", default=None,
                    help="Markdown file to update (default: BENCHMARKS.md in the repository for a "
                         "full run, OUT/BENCHMARKS.md for --smoke)")
    ap.add_argument("--command", default="scripts/bench.sh", help="command line shown in the table")
    ap.add_argument("--cases", default=None,
                    help="comma-separated subset of train1,train2,first2,loader,busbw (for "
                         "measuring one change; the table goes to OUT/BENCHMARKS.md only)")
    for k, v in FULL.items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=None)
    a = ap.parse_args()
    if a.gpu:
        return gpu_main(a)
    c = dict(SMOKE if a.smoke else FULL)
    for k in FULL:
        if getattr(a, k) is not None:
            c[k] = getattr(a, k)
    work = os.path.abspath(a.out)
    os.makedirs(work, exist_ok=True)
    cores = os.cpu_count() or 1
    for b in (TCHRUN, WORKER):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"missing {b}: run cargo build --release")

    # datasets: a small training set and a large one (the data path, not a cached toy)
    tag = "smoke" if a.smoke else "full"
    small = os.path.join(work, f"data-train-{tag}-{c['train_images']}")
    big = os.path.join(work, f"data-big-{tag}-{c['big_images']}")
    gen = os.path.join(ROOT, "benches", "make_images.py")
    t = time.time()
    subprocess.run([PY, gen, small, "--train", str(c["train_images"]), "--valid",
                    str(c["valid_images"]), "--size", "256"], check=True, timeout=1800)
    subprocess.run([PY, gen, big, "--train", str(c["big_images"]), "--valid",
                    str(max(c["big_images"] // 20, 10)), "--size", "256"], check=True, timeout=1800)
    log(f"datasets ready in {time.time() - t:.0f}s")
    c["model_dir"] = os.path.join(work, f"model-{c['arch']}-{c['train_size']}")
    if not os.path.isfile(os.path.join(c["model_dir"], "model.json")):
        subprocess.run([TCHRUN, "model", "init", "--arch", c["arch"], "--input-size",
                        str(c["train_size"]), "--output", c["model_dir"]], check=True, timeout=300)

    cases = [
        ("train1", lambda tool, r: (train_tchrun if tool == "t" else train_ref)(c, small, 1, work, f"1-{r}")),
        ("train2", lambda tool, r: (train_tchrun if tool == "t" else train_ref)(c, small, 2, work, f"2-{r}")),
        ("first2", lambda tool, r: (first_step_tchrun if tool == "t" else first_step_ref)(c, big, 2, work, f"first-{r}")),
        ("step", lambda tool, r: (step_tchrun if tool == "t" else step_ref)(c, "cpu", cores, work, str(r))),
        ("loader", lambda tool, r: (loader_tchrun if tool == "t" else loader_ref)(c, os.path.join(big, "train"), cores, work, str(r))),
        ("busbw", lambda tool, r: (busbw_tchrun if tool == "t" else busbw_ref)(c, 2, work, str(r))),
    ]
    if a.cases:
        want = set(a.cases.split(","))
        unknown = want - {name for name, _ in cases}
        if unknown:
            raise SystemExit(f"--cases: unknown case(s) {sorted(unknown)}")
        cases = [(name, fn) for name, fn in cases if name in want]
    res = {(name, tool): [] for name, _ in cases for tool in "tr"}
    t_start = time.time()
    loads = [os.getloadavg()[0]]
    for r in range(c["repeats"]):
        order = "tr" if r % 2 == 0 else "rt"
        for name, fn in cases:
            for tool in order:
                t = time.time()
                res[(name, tool)].append(fn(tool, r))
                loads.append(os.getloadavg()[0])
                log(f"repeat {r + 1}/{c['repeats']} {name} {'tchrun' if tool == 't' else 'reference'}: "
                    f"{json.dumps(res[(name, tool)][-1])} ({time.time() - t:.0f}s)")

    def med(name, tool, key, idx=None):
        vals = [x[key] if idx is None else x[key][idx] for x in res.get((name, tool), [])]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else float("nan")

    rows = []  # (row, unit, tchrun, reference, target text, higher_is_better, target ratio)

    def paired(name, key, idx=None):
        """Median over repeats of tchrun / reference, each from adjacent runs (same load)."""
        out = []
        for t, r in zip(res.get((name, "t"), []), res.get((name, "r"), [])):
            tv, rv = (t[key], r[key]) if idx is None else (t[key][idx], r[key][idx])
            if tv is not None and rv:
                out.append(tv / rv)
        return statistics.median(out) if out else float("nan")

    def row(label, unit, tv, rv, target, higher, ratio):
        if tv != tv and rv != rv:  # both NaN: the case did not run (--cases)
            return
        if target is None:
            met = ""
        else:
            met = "yes" if (ratio >= target if higher else ratio <= target) else "**no**"
        tgt = "" if target is None else (f">= {target:.2f}x" if higher else f"<= {target:.2f}x")
        rows.append(f"| {label} | {unit} | {tv:.4g} | {rv:.4g} | {ratio:.2f}x | {tgt} | {met} |")

    row("Training throughput, 1 rank", "images/s", med("train1", "t", "ips"), med("train1", "r", "ips"), 1.10, True, paired("train1", "ips"))
    row("Training throughput, 2 ranks", "images/s", med("train2", "t", "ips"), med("train2", "r", "ips"), 1.10, True, paired("train2", "ips"))
    row("Time to first step, 1 rank, small set", "s", med("train1", "t", "first_step"), med("train1", "r", "first_step"), 0.5, False, paired("train1", "first_step"))
    row("Time to first step, 2 ranks, small set", "s", med("train2", "t", "first_step"), med("train2", "r", "first_step"), 0.5, False, paired("train2", "first_step"))
    row(f"Time to first step, 2 ranks, {c['big_images']}-image set", "s", med("first2", "t", "first_step"), med("first2", "r", "first_step"), 0.5, False, paired("first2", "first_step"))
    row(f"Training step alone, synthetic tensors, 1 process ({c['step_arch']} {c['step_size']}px, "
        f"batch {c['step_batch']}; tchrun channels-last, reference PyTorch's default NCHW)",
        "images/s", med("step", "t", "ips"), med("step", "r", "ips"), None, True, paired("step", "ips"))
    row(f"Input pipeline, {c['loader_size']}x{c['loader_size']}, {cores} threads/workers", "images/s", med("loader", "t", "ips"), med("loader", "r", "ips"), 2.0, True, paired("loader", "ips"))
    row("Peak RSS per rank (VmHWM), 1 rank", "MiB", med("train1", "t", "hwm"), med("train1", "r", "hwm"), 1.0, False, paired("train1", "hwm"))
    row("Peak RSS per rank (VmHWM), 2 ranks", "MiB", med("train2", "t", "hwm"), med("train2", "r", "hwm"), 1.0, False, paired("train2", "hwm"))
    row("Peak PSS per rank incl. loader processes, 2 ranks", "MiB", med("train2", "t", "pss"), med("train2", "r", "pss"), None, False, paired("train2", "pss"))
    sizes = [int(s) for s in c["sizes"].split(",") if s]
    for i, s in enumerate(sizes):
        row(f"All-reduce busbw, 2 ranks, {human(s)}", "GB/s", med("busbw", "t", "busbw", i), med("busbw", "r", "busbw", i), 0.95 if i == len(sizes) - 1 else None, True, paired("busbw", "busbw", i))

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cfg = (f"CPU, Gloo; training: {c['arch']} at {c['train_size']}x{c['train_size']}, "
           f"{c['train_images']} train / {c['valid_images']} valid JPEGs (~256 px), batch "
           f"{c['batch_size']} per rank, {c['epochs']} epochs (images/s: mean of the epochs after "
           f"the first); large set: {c['big_images']} JPEGs (~256 px); input pipeline: batch "
           f"{c['loader_batch']}, {c['loader_epochs']} epoch(s); all-reduce: {c['iters']} iterations; "
           f"median of {c['repeats']} repeat(s), tchrun and reference alternating")
    md = "\n".join([
        BEGIN,
        f"Command: `{a.command}` (took {(time.time() - t_start) / 60:.1f} min) · date: {when} · "
        f"commit: {git_rev()}",
        "",
        f"Machine: {machine()}; 1-minute load average sampled after each run: "
        f"{min(loads):.1f} .. {max(loads):.1f} (other work shares the machine)",
        "",
        f"Setup: {cfg}. Reference: torchrun + DDP + torchvision ImageFolder/DataLoader "
        f"(benches/reference/), torch {torch_version()}.",
        "",
        "| benchmark | unit | tchrun | reference | tchrun / reference | target | met |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "tchrun and reference columns: medians over the repeats; ratio: median over the repeats of "
        "tchrun / reference from the two adjacent runs of that repeat (paired, so load from other "
        "work on the machine cancels as far as it can).",
        END,
    ])
    print(md)
    table = a.table or (os.path.join(work, "BENCHMARKS.md") if (a.smoke or a.cases)
                        else os.path.join(ROOT, "BENCHMARKS.md"))
    write_section(table, md)
    if os.path.abspath(table) != os.path.join(work, "BENCHMARKS.md"):
        write_section(os.path.join(work, "BENCHMARKS.md"), md)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump({f"{k[0]}/{'tchrun' if k[1] == 't' else 'reference'}": v for k, v in res.items()}, f, indent=1)
    log(f"table written to {table}")
    return 0


def gpu_main(a) -> int:
    """The GPU mode: synthetic-tensor training steps on CUDA, tchrun versus PyTorch."""
    c = dict(GPU)
    for k in GPU:
        if getattr(a, k, None) is not None:
            c[k] = getattr(a, k)
    work = os.path.abspath(a.out)
    os.makedirs(work, exist_ok=True)
    try:
        device = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        device = ""
    if not device:
        raise SystemExit("--gpu: nvidia-smi lists no GPU on this machine")
    # Decoded JPEGs: the whole trainer (loader, bf16, channels-last) on one GPU.
    data = os.path.join(work, f"data-gpu-{c['train_images']}")
    subprocess.run([PY, os.path.join(ROOT, "benches", "make_images.py"), data, "--train",
                    str(c["train_images"]), "--valid", str(c["valid_images"]), "--size", "256"],
                   check=True, timeout=1800)
    c["model_dir"] = os.path.join(work, f"model-{c['arch']}-{c['train_size']}")
    if not os.path.isfile(os.path.join(c["model_dir"], "model.json")):
        subprocess.run([TCHRUN, "model", "init", "--arch", c["arch"], "--input-size",
                        str(c["train_size"]), "--output", c["model_dir"]], check=True, timeout=300)
    # Small images in fp16 (issue 30): a step of a few ms, where a fixed cost per step shows.
    # tchrun with the trainer's per-step additions (group, guard, window, timers, the loss
    # scaler on the device) against PyTorch's loop with GradScaler (which reads its overflow
    # flag on the host every step with a non-fused SGD).
    small = dict(c, step_arch="resnet18", step_size=32, step_batch=64, step_steps=200)
    trainer_step = ["--with", "group,guard,window,timers,scaler"]
    cases = {
        "step": (lambda r: step_tchrun(c, "cuda", 0, work, f"gpu-{r}"),
                 lambda r: step_ref(c, "cuda", 0, work, f"gpu-{r}")),
        "small": (lambda r: step_tchrun(small, "cuda", 0, work, f"gpu-small-{r}", "fp16",
                                        trainer_step),
                  lambda r: step_ref(small, "cuda", 0, work, f"gpu-small-{r}", "fp16")),
        "train": (lambda r: train_tchrun(c, data, 1, work, f"gpu-{r}",
                                         ["--device", "cuda", "--amp", "bf16"], gpu=True),
                  lambda r: train_ref(c, data, 1, work, f"gpu-{r}",
                                      ["--device", "cuda", "--amp", "bf16", "--channels-last"],
                                      gpu=True)),
    }
    res = {(k, t): [] for k in cases for t in "tr"}
    t_start = time.time()
    for r in range(c["repeats"]):
        for name, fns in cases.items():
            for tool in ("tr" if r % 2 == 0 else "rt"):
                res[(name, tool)].append(fns[0 if tool == "t" else 1](r))
                log(f"repeat {r + 1}/{c['repeats']} gpu {name} "
                    f"{'tchrun' if tool == 't' else 'reference'}: {json.dumps(res[(name, tool)][-1])}")
    med = lambda name, tool, k: statistics.median(x[k] for x in res[(name, tool)])  # noqa: E731

    def pair(name, k):
        """Median of tchrun / reference over the repeats; None when no reference value (a GPU
        memory that nvidia-smi did not report)."""
        v = [t[k] / r[k] for t, r in zip(res[(name, "t")], res[(name, "r")]) if r[k]]
        return statistics.median(v) if v else None

    def rows_for(name, label):
        ratio = pair(name, "ips")
        mem = pair(name, "gpu_mib")
        return [
            f"| {label}: throughput | images/s | {med(name, 't', 'ips'):.1f} | "
            f"{med(name, 'r', 'ips'):.1f} | {ratio:.2f}x | >= 1.00x | "
            f"{'yes' if ratio >= 1.0 else '**no**'} |",
            f"| {label}: GPU memory per process (nvidia-smi peak) | MiB | "
            f"{med(name, 't', 'gpu_mib'):.0f} | {med(name, 'r', 'gpu_mib'):.0f} | "
            f"{'n/a' if mem is None else f'{mem:.2f}x'} |  |  |",
        ]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = "\n".join([
        GPU_BEGIN,
        f"Command: `{a.command}` (took {(time.time() - t_start) / 60:.1f} min) · date: {when} · "
        f"commit: {git_rev()}",
        "",
        f"Device: {device}. bf16 autocast, channels-last and cudnn benchmark on both sides. "
        f"Synthetic tensors: {c['step_arch']} at {c['step_size']}x{c['step_size']}, batch "
        f"{c['step_batch']}, {c['step_steps']} timed steps (tchrun-worker bench-step versus "
        f"benches/reference/bench_step.py). Decoded JPEGs: `tchrun train --device cuda --amp bf16` "
        f"versus train_ddp.py under torchrun, {c['arch']} at {c['train_size']}x{c['train_size']}, "
        f"{c['train_images']} JPEGs (~256 px), batch {c['batch_size']}, {c['epochs']} epochs, 1 "
        f"rank. Median of {c['repeats']} repeat(s), alternating; torch {torch_version()}.",
        "",
        "| benchmark | unit | tchrun | reference | tchrun / reference | target | met |",
        "|---|---|---|---|---|---|---|",
        *rows_for("step", "Synthetic tensors"),
        *rows_for("small", "Small images, fp16 (resnet18, 32 px, batch 64, 200 steps; "
                           "tchrun with the trainer's per-step additions and the loss scaler)"),
        *rows_for("train", "Decoded JPEGs"),
        GPU_END,
    ])
    print(md)
    table = a.table or os.path.join(ROOT, "BENCHMARKS.md")
    write_section(table, md, GPU_BEGIN, GPU_END)
    log(f"GPU table written to {table}")
    return 0


def torch_version():
    try:
        return subprocess.run([PY, "-c", "import torch, torchvision; print(torch.__version__, '/ torchvision', torchvision.__version__)"],
                              capture_output=True, text=True, timeout=120).stdout.strip()
    except Exception:
        return "?"


def write_section(path, md, begin=BEGIN, end=END):
    """Replaces the generated section of `path` (between the markers), keeping the rest."""
    old = open(path).read() if os.path.exists(path) else ""
    if begin in old and end in old:
        new = old[:old.index(begin)] + md + old[old.index(end) + len(end):]
    elif old:
        new = old.rstrip() + "\n\n" + md + "\n"
    else:
        new = "# Benchmarks: tchrun versus torchrun + DDP\n\n" + md + "\n"
    with open(path, "w") as f:
        f.write(new)


if __name__ == "__main__":
    sys.exit(main())
