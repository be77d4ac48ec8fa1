"""`import tchrun` (issue 49, item 1): `tchrun.TorchDistributor` with real ranks started by the
`tchrun` binary ($TCHRUN_BIN), no mocks. Run by tests/distributor.rs, one case a test:

    python tests/python/distributor_check.py CASE   # seed-local, seed-mpirun, dict-local,
                                                    # dict-mpirun, rank-error, too-large,
                                                    # script, ctrl-c, caller-killed; or all

Each case works in a temp folder of its own (the job's log directory and the distributor's
private folders in it), prints `ok: CASE ...` and exits 0; a failed check raises.
"""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import tchrun

# ---- The seed's example (Databricks' TorchDistributor doc), unchanged but for the import
# ---- line (and `import torch`, which its sample data uses and its snippets leave out).
import torch
import torch.nn as nn


class SimpleModel(nn.Module):
    def __init__(self):
        super(SimpleModel, self).__init__()
        self.fc = nn.Linear(10, 1)

    def forward(self, x):
        return self.fc(x)


def train_model(dataloader):
    import torch
    import torch.nn as nn
    from torch.optim import SGD

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = SimpleModel().to(device)
    optimizer = SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    for epoch in range(10):
        for batch in dataloader:
            inputs, targets = batch
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = loss_fn(outputs, targets)
            loss.backward()
            optimizer.step()


def seed_example(launcher, work):
    # Sample data
    inputs = torch.randn(100, 10)
    targets = torch.randn(100, 1)

    # Create dataset and dataloader
    from torch.utils.data import DataLoader, TensorDataset

    dataset = TensorDataset(inputs, targets)
    dataloader = DataLoader(dataset, batch_size=10)

    from tchrun import TorchDistributor

    # Distribute the training
    # (The seed's num_workers=4 is 2 here; the launcher and log directory are the test's.)
    distributor = TorchDistributor(num_workers=2, launcher=launcher, log_dir=work / "logs")
    result = distributor.run(train_model, dataloader)
    # ---- (end of the seed's code)
    assert result is None, result
    logs = sorted(p.name for p in (work / "logs").iterdir())
    assert "70_driver_log_0" in logs and "70_driver_log_1" in logs, logs
    assert "failure.json" not in logs, logs
    for r in (0, 1):  # both ranks ran the function
        text = (work / "logs" / f"70_driver_log_{r}").read_text()
        assert "tchrun._rank" in text, text


# ---- A function that uses torch.distributed as under torchrun and returns a dict.


def all_reduce_ranks(scale, *, tag):
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group()  # torchrun's env:// contract, no arguments
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    value = {
        "rank": rank,
        "world_size": world,
        "sum": t.item() * scale,
        "tag": tag,
        "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")},
    }
    return value  # the group left up, as many torchrun scripts do: the rank destroys it


def dict_case(launcher, work):
    d = tchrun.TorchDistributor(2, use_gpu=False, launcher=launcher, log_dir=work / "logs")
    value = d.run(all_reduce_ranks, 10, tag="x")
    assert value["rank"] == 0 and value["world_size"] == 2, value
    assert value["sum"] == 30.0 and value["tag"] == "x", value
    assert value["env"]["RANK"] == "0" and value["env"]["WORLD_SIZE"] == "2", value


# ---- Failures.


def fails_on_rank_1():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("rank 1 cannot go on: bad shard 17")
    dist.barrier()  # rank 0 waits here until tchrun stops it
    return "never"


def rank_error(work):
    d = tchrun.TorchDistributor(2, use_gpu=False, launcher="local", log_dir=work / "logs")
    try:
        d.run(fails_on_rank_1)
    except tchrun.RankError as e:
        text = str(e)
        assert e.rank == 1, text
        assert e.type == "ValueError" and "bad shard 17" in e.message, text
        assert "rank 1 (host " in text, text
        assert "in fails_on_rank_1" in e.traceback and "raise ValueError" in e.traceback, text
        assert e.host, text
        # failure.json names the rank that ended first: rank 1, or rank 0 woken by its exit.
        assert isinstance(e.failure, dict) and e.failure.get("rank") in (0, 1), e.failure
        assert e.exit_code == 4, e.exit_code
        assert (work / "logs" / "failure.json").is_file()
        return
    raise AssertionError("no RankError")


def too_large(work):
    d = tchrun.TorchDistributor(
        2, use_gpu=False, launcher="local", log_dir=work / "logs", max_result_bytes=4096
    )
    assert d.run(lambda: b"x" * 1000) == b"x" * 1000  # under the bound: comes back
    try:
        d.run(lambda: b"x" * 10000)
    except tchrun.ResultTooLarge as e:
        text = str(e)
        assert e.rank == 0, text
        assert "over the bound of 4096 bytes" in text and "return a path" in text, text
        return
    raise AssertionError("no ResultTooLarge")


# ---- A script file.


def script(work):
    out = work / "out"
    out.mkdir()
    f = work / "train.py"
    f.write_text(
        textwrap.dedent(
            """
            import os, sys
            import torch.distributed as dist
            dist.init_process_group("gloo")
            rank = dist.get_rank()
            with open(os.path.join(sys.argv[1], f"rank-{rank}"), "w") as f:
                f.write(" ".join(sys.argv[2:]) + f" of {dist.get_world_size()}")
            dist.destroy_process_group()
            """
        )
    )
    d = tchrun.TorchDistributor(2, use_gpu=False, launcher="local", log_dir=work / "logs")
    assert d.run(str(f), out, "--lr", 0.5) is None
    for r in (0, 1):
        got = (out / f"rank-{r}").read_text()
        assert got == "--lr 0.5 of 2", got
    # A script that fails: the same RankError, its traceback from the file.
    bad = work / "bad.py"
    bad.write_text("import os\nif os.environ['RANK'] == '1':\n    raise KeyError('no such column')\n")
    try:
        d.run(bad)
    except tchrun.RankError as e:
        assert e.rank == 1 and e.type == "KeyError", str(e)
        assert str(bad) in e.traceback, e.traceback
        return
    raise AssertionError("no RankError from the failing script")


# ---- Ctrl-C: SIGINT to a caller whose ranks sleep.


def sleeper(folder):
    import os
    import time

    with open(os.path.join(folder, f"pid-{os.environ['RANK']}"), "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    time.sleep(600)


def sleeping_caller(work):
    d = tchrun.TorchDistributor(
        2, use_gpu=False, launcher="local", log_dir=work / "logs", grace_period=5
    )
    try:
        d.run(sleeper, str(work))
    except KeyboardInterrupt:
        print("child: KeyboardInterrupt", flush=True)
        sys.exit(130)
    print("child: run() returned", flush=True)
    sys.exit(1)


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def parent_of(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_for(limit, cond):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def ranks_stop_with_the_caller(work, sig):
    """A caller whose ranks sleep gets `sig`: SIGINT (Ctrl-C) must raise KeyboardInterrupt in
    it, and after either no rank, tchrun-worker or tchrun may be alive."""
    log = open(work / "child.log", "wb")
    child = subprocess.Popen(
        [sys.executable, __file__, "sleeping-caller", str(work)], stdout=log, stderr=log
    )
    try:
        pids = [work / f"pid-{r}" for r in (0, 1)]
        started = wait_for(120, lambda: all(p.is_file() and p.read_text() for p in pids))
        assert started, (work / "child.log").read_text()
        ranks = []
        for p in pids:
            pid, parent = p.read_text().split()
            ranks += [int(pid), int(parent)]  # the rank's Python and its tchrun-worker
        ranks.append(parent_of(ranks[1]))  # tchrun (the local launcher's ranks are its children)
        assert all(alive(p) for p in ranks), ranks
        t0 = time.monotonic()
        child.send_signal(sig)
        code = child.wait(timeout=60)
        text = (work / "child.log").read_text()
        if sig == signal.SIGINT:
            assert code == 130 and "child: KeyboardInterrupt" in text, (code, text)
        gone = wait_for(15, lambda: not any(alive(p) for p in ranks))
        took = time.monotonic() - t0
        assert gone, f"still alive after {sig!r}: {[p for p in ranks if alive(p)]}\n{text}"
        print(f"{sig!r} to the caller: ranks, workers, tchrun {ranks} gone in {took:.1f} s")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


CASES = {
    "seed-local": lambda w: seed_example("local", w),
    "seed-mpirun": lambda w: seed_example("mpirun", w),
    "dict-local": lambda w: dict_case("local", w),
    "dict-mpirun": lambda w: dict_case("mpirun", w),
    "rank-error": rank_error,
    "too-large": too_large,
    "script": script,
    "ctrl-c": lambda w: ranks_stop_with_the_caller(w, signal.SIGINT),
    "caller-killed": lambda w: ranks_stop_with_the_caller(w, signal.SIGKILL),
}


def main(argv):
    if len(argv) == 3 and argv[1] == "sleeping-caller":
        sleeping_caller(Path(argv[2]))
        return
    names = list(CASES) if argv[1:] == ["all"] else argv[1:]
    if not names or any(n not in CASES for n in names):
        sys.exit(f"usage: {argv[0]} all|{'|'.join(CASES)} ...")
    for name in names:
        with tempfile.TemporaryDirectory(prefix="tchrun-distributor-check-") as w:
            work = Path(w)
            # The distributor's private folders go here: none may be left behind.
            private = work / "tmp"
            private.mkdir()
            tempfile.tempdir = str(private)
            os.environ["TMPDIR"] = str(private)
            t0 = time.monotonic()
            CASES[name](work)
            left = [p.name for p in private.iterdir() if p.name.startswith("tchrun-distributor-")]
            # (A caller killed by SIGKILL cannot remove its folder; the others must.)
            assert not left or name == "caller-killed", f"private folders left behind: {left}"
            tempfile.tempdir = None
            print(f"ok: {name} ({time.monotonic() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv)
