"""`TorchDistributor`: Databricks' TorchDistributor API over the `tchrun` binary. The caller's
side: the function and its arguments pickled into a private folder, `tchrun exec` started with
the launch flags and `python -m tchrun._rank FOLDER` as the program, its output relayed, and
what the job came to turned into rank 0's value or an exception. Knows nothing of how ranks
are placed or supervised (that is `tchrun`'s) nor of what a rank does (`_rank`)."""
import collections
import ctypes
import datetime
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from . import _job_files as files
from . import _sources

#: Rank 0's return value, pickled, may be at most this large (64 MiB) unless
#: `max_result_bytes` says otherwise: a model or a data set goes into a file, and its path
#: comes back.
MAX_RESULT_BYTES = 64 * 1024 * 1024

#: The launch keyword arguments: `tchrun exec`'s flags (`hostfile="h"` is `--hostfile=h`;
#: True alone is the bare flag). `procs_per_node` comes from `num_processes`, `device` from
#: `use_gpu`.
LAUNCH_FLAGS = (
    "nodes",
    "hostfile",
    "hosts",
    "launcher",
    "log_dir",
    "oversubscribe",
    "worker",
    "grace_period",
    "hang_timeout",
    "mpirun_args",
    "ifname",
    "console",
)

#: tchrun's default `--grace-period` (seconds).
_GRACE_PERIOD = 30
#: What tchrun's exit statuses 130 and 143 mean: it was stopped by SIGINT or SIGTERM.
_INTERRUPTED = (130, 143)


class LaunchError(RuntimeError):
    """The job failed without a rank's exception to show: `tchrun` refused the job or could not
    start it, or a rank died without a word (killed, a crash). `exit_code` is tchrun's,
    `failure` the job's `failure.json` (a dict, or None), `log_dir` its log directory."""

    def __init__(self, message, exit_code=None, failure=None, log_dir=None):
        super().__init__(message)
        self.exit_code = exit_code
        self.failure = failure
        self.log_dir = log_dir


class TchrunNotFound(LaunchError):
    """No `tchrun` binary where `TorchDistributor` looks for one."""


class RankError(LaunchError):
    """A rank failed (the first: the one whose exception came first): `rank`, `host`, the
    exception's `type` and `message`, the rank's `traceback` text (a rank that died without an
    exception: `type` None, tchrun's words and its log's last lines), tchrun's `exit_code`,
    the job's `failure` (`failure.json`, a dict, or None) and `log_dir` (each rank's
    `70_driver_log_<rank>`)."""

    def __init__(
        self, rank, host, type, message, traceback, exit_code, failure, log_dir, log_tail=""
    ):
        self.rank = rank
        self.host = host
        self.type = type
        self.message = message
        self.traceback = traceback
        what = f"{type}: {message}" if type else message
        text = f"rank {rank} (host {host}) failed: {what}"
        if traceback and traceback.strip() != message.strip():
            text += "\n\nrank {}'s traceback:\n{}".format(rank, traceback.rstrip("\n"))
        if log_tail:
            text += f"\n\nthe last lines of its log:\n{log_tail.rstrip()}"
        if log_dir is not None:
            text += f"\n\nlogs: {log_dir} (failure.json, 70_driver_log_{rank})"
        super().__init__(text, exit_code, failure, log_dir)


class ResultTooLarge(RankError):
    """Rank 0's return value was over `max_result_bytes` pickled: return a path instead."""


def find_tchrun():
    """The `tchrun` binary: `$TCHRUN_BIN`, else the one beside this Python (where `pip install
    tchrun-*.whl` puts it), else `tchrun` on `PATH`."""
    looked = []
    given = os.environ.get("TCHRUN_BIN")
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given
        raise TchrunNotFound(
            f"TCHRUN_BIN={given} is not an executable file; point it at the tchrun binary "
            f"(e.g. target/release/tchrun) or unset it"
        )
    looked.append("$TCHRUN_BIN (unset)")
    beside = Path(sys.executable).parent / "tchrun"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    looked.append(f"{beside} (beside this Python)")
    on_path = shutil.which("tchrun")
    if on_path:
        return on_path
    looked.append("tchrun on PATH")
    raise TchrunNotFound(
        "the tchrun binary was not found; looked at "
        + ", ".join(looked)
        + ": install the tchrun wheel into this Python's environment (pip install "
        "tchrun-*.whl) or set TCHRUN_BIN to the binary"
    )


def _flag(name, value):
    """`--name=value` for one launch keyword argument (None when it says nothing)."""
    flag = "--" + name.replace("_", "-")
    if value is None or value is False:
        return None
    if value is True:
        return flag
    if name == "hosts" and not isinstance(value, str):
        value = ",".join(str(h) for h in value)
    return f"{flag}={os.fspath(value) if isinstance(value, os.PathLike) else value}"


def _new_log_dir():
    """A new job folder in ./tchrun-logs, named as tchrun names its own
    (`distributor-<UTC date>-<time>[-n]`, so `tchrun logs` finds the newest); created at once."""
    base = Path("tchrun-logs").absolute()
    base.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    n = 1
    while True:
        d = base / (f"distributor-{stamp}" if n == 1 else f"distributor-{stamp}-{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            n += 1


try:
    #: This process's C library (loaded before any fork: `_tchrun_child` runs in the child).
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None
_PR_SET_PDEATHSIG = 1


def _tchrun_child():
    """In the forked child, before it becomes tchrun: a process group of its own, so that a
    terminal's Ctrl-C reaches the caller alone, which passes it on once (a second one would
    kill the ranks at once); and SIGTERM when the caller dies (a killed notebook kernel), so
    that tchrun stops the ranks instead of leaving them running."""
    os.setpgid(0, 0)
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _relay(stream, to, tail):
    """Copies the lines of `stream` to `to` (the caller's sys.stdout or sys.stderr, wherever
    they are: a terminal, a notebook), keeping the last ones in `tail`."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        if tail is not None:
            tail.append(line)
        try:
            to.write(line)
            to.flush()
        except (OSError, ValueError):
            pass
    stream.close()


class TorchDistributor:
    """Runs a function, or a Python file, on `num_processes` ranks started by `tchrun exec`, as
    Databricks' `pyspark.ml.torch.distributor.TorchDistributor` does on a Spark cluster.

    `local_mode=True`: every rank on this node (`--procs-per-node num_processes`).
    `local_mode=False`: `nodes=N` nodes (from `hostfile`, `hosts`, or the Slurm allocation), with
    `num_processes / N` ranks on each; the log directory must then be on a file system every
    node sees (the ranks read the function there, and rank 0 writes its value there).
    `use_gpu`: True gives every rank one GPU (`--device cuda`: cuda:LOCAL_RANK, refused when a
    node has fewer GPUs than ranks), False hides the GPUs from the ranks (`--device cpu`,
    `CUDA_VISIBLE_DEVICES=""`), None leaves the device to the function.
    `num_workers` is accepted for `num_processes` (the name Databricks' page uses).
    `max_result_bytes`: the bound on rank 0's pickled return value (`MAX_RESULT_BYTES`).
    `**launch`: `tchrun exec`'s launch flags (`LAUNCH_FLAGS`), e.g. `launcher="mpirun"`,
    `hostfile="hosts.txt"`, `log_dir="logs"`, `grace_period=10`.
    """

    def __init__(
        self,
        num_processes=1,
        local_mode=True,
        use_gpu=None,
        *,
        num_workers=None,
        max_result_bytes=MAX_RESULT_BYTES,
        **launch,
    ):
        # `num_workers`: the name the seed's Databricks page uses for `num_processes`.
        if num_workers is not None:
            if num_processes not in (1, num_workers):
                raise TypeError(
                    f"num_processes={num_processes} and num_workers={num_workers} disagree; "
                    f"give one of them"
                )
            num_processes = num_workers
        if not isinstance(num_processes, int) or isinstance(num_processes, bool) or num_processes < 1:
            raise ValueError(f"num_processes must be a positive integer, not {num_processes!r}")
        unknown = sorted(set(launch) - set(LAUNCH_FLAGS))
        if unknown:
            hint = ""
            if "procs_per_node" in unknown:
                hint = " (the ranks per node come from num_processes / nodes)"
            elif "device" in unknown:
                hint = " (use use_gpu=True or False)"
            raise TypeError(
                f"TorchDistributor got unknown launch arguments {', '.join(unknown)}{hint}; "
                f"it takes {', '.join(LAUNCH_FLAGS)}"
            )
        nodes = launch.get("nodes")
        if local_mode:
            if nodes not in (None, 1) or launch.get("hostfile") or launch.get("hosts"):
                raise ValueError(
                    "local_mode=True runs every rank on this node: leave out nodes, hostfile "
                    "and hosts, or pass local_mode=False"
                )
            nodes = 1
        elif nodes is None:
            raise ValueError(
                "local_mode=False needs nodes=N: the node count; num_processes is split evenly "
                "over them"
            )
        if not isinstance(nodes, int) or nodes < 1 or num_processes % nodes:
            raise ValueError(
                f"num_processes={num_processes} cannot be split evenly over nodes={nodes!r}: "
                f"give a multiple of the node count"
            )
        if use_gpu not in (None, True, False):
            raise ValueError(f"use_gpu must be True, False or None, not {use_gpu!r}")
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.max_result_bytes = max_result_bytes
        self.nodes = nodes
        self.procs_per_node = num_processes // nodes
        self.launch = dict(launch)

    def run(self, main, *args, **kwargs):
        """Runs `main(*args, **kwargs)` on every rank and returns rank 0's return value; or,
        when `main` is a path, runs that Python file on every rank with `args` as its argv and
        returns None. An exception on a rank is raised here as `RankError` (the first failing
        rank's); Ctrl-C stops every rank and is raised again."""
        if isinstance(main, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(main))
            if kwargs:
                raise TypeError("a file takes its arguments as strings in *args, not keywords")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no such Python file: {path}")
            spec = {"kind": "script", "script": path, "argv": [str(a) for a in args]}
            payload = None
        elif callable(main):
            import cloudpickle

            try:
                payload = cloudpickle.dumps((main, args, kwargs))
            except Exception as e:
                raise TypeError(
                    f"cannot pickle the function or its arguments for the ranks: {e}; import "
                    f"inside the function what it needs, and pass data that pickles"
                ) from e
            # Where its code was written, for the ranks' tracebacks.
            spec = {"kind": "function", "sources": _sources.source_map(main)}
        else:
            raise TypeError(f"run() takes a function or a path to a Python file, not {main!r}")
        spec["use_gpu"] = self.use_gpu
        spec["max_result_bytes"] = self.max_result_bytes
        spec["sys_path"] = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        return self._run(spec, payload)

    def _command(self, tchrun, log_dir, folder):
        cmd = [tchrun, "exec", f"--nodes={self.nodes}", f"--procs-per-node={self.procs_per_node}"]
        for name in LAUNCH_FLAGS:
            if name in ("nodes", "log_dir"):
                continue
            f = _flag(name, self.launch.get(name))
            if f:
                cmd.append(f)
        cmd.append(f"--log-dir={log_dir}")
        if self.use_gpu is not None:
            cmd.append("--device=" + ("cuda" if self.use_gpu else "cpu"))
        cmd += ["--", sys.executable, "-m", "tchrun._rank", str(folder)]
        return cmd

    def _log_dir(self):
        given = self.launch.get("log_dir") or os.environ.get("TCHRUN_LOG_DIR")
        if given:
            d = Path(os.fspath(given)).absolute()
            d.mkdir(parents=True, exist_ok=True)
            return d, False
        return _new_log_dir(), True

    def _run(self, spec, payload):
        tchrun = find_tchrun()
        log_dir, made = self._log_dir()
        # Private to this user (0700); on a file system every node sees when ranks run
        # elsewhere.
        if self.local_mode:
            folder = Path(tempfile.mkdtemp(prefix="tchrun-distributor-"))
        else:
            folder = Path(tempfile.mkdtemp(prefix=".distributor-", dir=log_dir))
        try:
            files.write_atomic(str(folder / files.SPEC), json.dumps(spec).encode())
            if payload is not None:
                files.write_atomic(str(folder / files.PAYLOAD), payload)
            code, tail = self._launch(self._command(tchrun, log_dir, folder))
            if code == 0:
                if spec["kind"] == "script":
                    return None
                import cloudpickle

                try:
                    data = (folder / files.RESULT).read_bytes()
                except FileNotFoundError:
                    raise LaunchError(
                        f"the job ended well but rank 0 left no return value in {folder}",
                        code, None, log_dir,
                    ) from None
                return cloudpickle.loads(data)
            raise _failure(code, folder, log_dir, tail)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            if made:
                try:
                    log_dir.rmdir()  # only when tchrun left nothing in it
                except OSError:
                    pass

    def _launch(self, cmd):
        """Runs tchrun to its end, relaying its output; returns its exit code and the last
        lines of its stderr. Ctrl-C here stops the job (`_stop`) and is raised again."""
        env = dict(os.environ)
        # The ranks import this package, found where the caller found it (a site-packages
        # folder is on their path already, and must not go before the standard library).
        here = str(Path(__file__).resolve().parent.parent)
        sites = {str(Path(p).resolve()) for p in site.getsitepackages() + [site.getusersitepackages()]}
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if here not in paths and here not in sites:
            env["PYTHONPATH"] = os.pathsep.join([here, *paths])
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, preexec_fn=_tchrun_child,
        )
        tail = collections.deque(maxlen=40)
        relays = [
            threading.Thread(target=_relay, args=(proc.stdout, sys.stdout, None), daemon=True),
            threading.Thread(target=_relay, args=(proc.stderr, sys.stderr, tail), daemon=True),
        ]
        for t in relays:
            t.start()
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            self._stop(proc)
            raise
        finally:
            for t in relays:
                t.join(timeout=5)
        return code, list(tail)

    def _stop(self, proc):
        """Ctrl-C: SIGINT to tchrun (it asks the ranks to stop, waits its grace period, then
        kills them); a second Ctrl-C, or tchrun still running past its grace period and 15 s,
        sends another (tchrun kills the ranks at once); 10 s later tchrun's process group is
        killed (the ranks die with it: tchrun starts them with PDEATHSIG)."""
        grace = self.launch.get("grace_period")
        if grace is None:
            grace = int(os.environ.get("TCHRUN_GRACE_PERIOD", _GRACE_PERIOD))
        steps = [(signal.SIGINT, grace + 15), (signal.SIGINT, 10), (signal.SIGKILL, 10)]
        for sig, wait in steps:
            try:
                if sig == signal.SIGKILL:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
            except KeyboardInterrupt:
                continue


def _died_earlier(failure, errors, record):
    """Whether `failure.json`'s rank ended without an exception of its own before the earliest
    exception of any rank (`record`) was raised: then it is the root cause, and `record` a
    consequence (a peer's "Connection closed")."""
    if not isinstance(failure, dict) or failure.get("rank") is None or failure["rank"] in errors:
        return False
    try:
        at = datetime.datetime.fromisoformat(str(failure.get("time")).replace("Z", "+00:00"))
    except ValueError:
        return False
    return at.timestamp() < record.get("time", 0)


def _failure(code, folder, log_dir, tail):
    """The exception for a job that ended with tchrun's exit code `code`: the first failing
    rank's, with its traceback. The first is the rank whose exception came first (tchrun's
    `failure.json` names the rank that *ended* first, which may be a peer that its failure
    woke), unless `failure.json`'s rank died earlier without one; else what tchrun said."""
    failure = None
    try:
        failure = json.loads((log_dir / "failure.json").read_text())
    except (OSError, ValueError):
        pass
    errors = {}
    for name in os.listdir(folder):
        rank = files.error_rank(name)
        if rank is not None:
            try:
                errors[rank] = json.loads((folder / name).read_text())
            except (OSError, ValueError):
                pass
    record = min(errors.values(), key=lambda r: r.get("time", 0), default=None)
    if record is not None and _died_earlier(failure, errors, record):
        record = None  # the root cause left no exception (killed, crashed): failure.json's
    if record is not None:
        cls = ResultTooLarge if record.get("kind") == "result_too_large" else RankError
        return cls(
            record["rank"], record.get("host"), record.get("type"), record.get("message", ""),
            record.get("traceback", ""), code, failure, log_dir,
        )
    if code in _INTERRUPTED:
        return LaunchError(
            f"tchrun was stopped by a signal (exit {code}); logs: {log_dir}", code, failure, log_dir
        )
    if isinstance(failure, dict) and failure.get("rank") is not None:
        return RankError(
            failure["rank"], failure.get("host"), None, failure.get("message", ""), "", code,
            failure, log_dir, log_tail="\n".join(failure.get("tail") or []),
        )
    said = "".join(tail).rstrip("\n")
    logged = log_dir.is_dir() and any(log_dir.iterdir())
    return LaunchError(
        f"tchrun exited with {code} before any rank reported a failure"
        + (f":\n{said}" if said else "")
        + (f"\nlogs: {log_dir}" if logged else ""),
        code, failure, log_dir if logged else None,
    )

