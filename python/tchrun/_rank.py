"""One rank of a `TorchDistributor` job: `python -m tchrun._rank FOLDER`, started on every rank
by `tchrun exec`, which has set torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT, ...). Calls the caller's function (or runs its script) with it; rank
0 writes the return value into FOLDER; a rank that fails writes its traceback there and exits
1. Knows nothing of launching: that is `tchrun`'s."""
import json
import os
import runpy
import socket
import sys
import time
import traceback

from . import _job_files as files
from . import _sources

#: Frames of these files are left out of a rank's traceback (they are this module's, not the
#: user's).
_OWN_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}


def _type_name(exc):
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _is_own(filename):
    return filename in _OWN_FILES or os.path.abspath(filename) in _OWN_FILES


def _user_traceback(exc):
    """The traceback text of `exc` from the first frame that is not this module's or runpy's."""
    tb = exc.__traceback__
    while tb is not None and _is_own(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _fail(folder, rank, kind, type_name, message, text, code=1):
    """Records this rank's failure for the caller, prints it, and ends the rank with `code`
    (at once: a process group or threads the function left must not hold the rank)."""
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    record = {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),
        "kind": kind,
        "type": type_name,
        "message": message,
        "traceback": text,
    }
    try:
        files.write_atomic(
            os.path.join(folder, files.error_file(rank)), json.dumps(record).encode()
        )
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _fail_with(folder, rank, spec, exc):
    text = _sources.with_sources(_user_traceback(exc), spec.get("sources"))
    _fail(folder, rank, "exception", _type_name(exc), str(exc), text)


def _end_process_group():
    """Destroys the process group the function (or file) left, as a torchrun script should: a
    rank once aborted at exit ("terminate called without an active exception") after its
    function returned with its Gloo group still up."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _run_function(folder, rank, spec):
    import cloudpickle

    try:
        with open(os.path.join(folder, files.PAYLOAD), "rb") as f:
            fn, args, kwargs = cloudpickle.load(f)
        value = fn(*args, **kwargs)
    except Exception as e:  # KeyboardInterrupt and SystemExit end the rank as they would
        _fail_with(folder, rank, spec, e)
    if rank != 0:
        _end_process_group()
        return
    try:
        data = cloudpickle.dumps(value)
    except Exception as e:
        _fail(
            folder,
            rank,
            "exception",
            _type_name(e),
            f"rank 0's return value cannot be pickled: {e}",
            _user_traceback(e),
        )
    bound = spec["max_result_bytes"]
    if len(data) > bound:
        message = (
            f"rank 0's return value is {len(data)} bytes pickled, over the bound of {bound} "
            f"bytes (max_result_bytes): return a path instead: save the result (a model's "
            f"state_dict, arrays) to a file the caller can read, e.g. torch.save(model."
            f"state_dict(), path), and return the path"
        )
        _fail(folder, rank, "result_too_large", "tchrun.ResultTooLarge", message, message)
    files.write_atomic(os.path.join(folder, files.RESULT), data)
    _end_process_group()


def _run_script(folder, rank, spec):
    path = spec["script"]
    sys.argv = [path, *spec["argv"]]
    # As `python file.py`: the script's folder first on sys.path.
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code is None or e.code == 0:
            _end_process_group()
            return
        code = e.code if isinstance(e.code, int) else 1
        _fail(
            folder,
            rank,
            "exit",
            "SystemExit",
            f"the script exited with {e.code!r}",
            _user_traceback(e),
            code=code if 0 < code < 256 else 1,
        )
    except Exception as e:
        _fail_with(folder, rank, spec, e)
    _end_process_group()


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: python -m tchrun._rank FOLDER (started by tchrun.TorchDistributor)")
    folder = argv[1]
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(folder, files.SPEC), "rb") as f:
        spec = json.load(f)
    # Before anything imports torch (the arguments may hold tensors).
    if spec.get("use_gpu") is False:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    # The caller's import path, after the rank's own: functions of modules beside the
    # caller's script are pickled by reference and imported here.
    for p in spec.get("sys_path", []):
        if p not in sys.path:
            sys.path.append(p)
    if spec["kind"] == "script":
        _run_script(folder, rank, spec)
    else:
        _run_function(folder, rank, spec)


if __name__ == "__main__":
    main(sys.argv)
