"""The files a TorchDistributor job's caller and its ranks share, in the job's private folder
(mode 0700): their names, written once here, and the one way to write them (atomic, 0600).
Knows nothing of launching or of pickling."""
import os
import tempfile

#: What to run: JSON (`kind`, the script and its argv, the caller's `sys.path`, `use_gpu`,
#: `max_result_bytes`); written by the caller.
SPEC = "spec.json"
#: The function and its arguments, `cloudpickle`d by the caller.
PAYLOAD = "payload.pkl"
#: Rank 0's return value, `cloudpickle`d by rank 0.
RESULT = "result.pkl"


def error_file(rank):
    """A failed rank's record (JSON: rank, host, pid, time, type, message, traceback)."""
    return f"error-{rank}.json"


def error_rank(name):
    """The rank of an `error_file` name, or None."""
    if name.startswith("error-") and name.endswith(".json"):
        middle = name[len("error-") : -len(".json")]
        if middle.isdigit():
            return int(middle)
    return None


def write_atomic(path, data):
    """Writes `data` (bytes) to `path` whole or not at all: a 0600 temp file in the same
    folder, fsync, rename."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
