"""tchrun's Python API: `TorchDistributor`, Databricks' TorchDistributor call over the `tchrun`
binary (`tchrun exec`), and the exceptions a job raises in its caller.

    from tchrun import TorchDistributor
    TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train_fn, *args)
"""
from ._distributor import (
    LAUNCH_FLAGS,
    MAX_RESULT_BYTES,
    LaunchError,
    RankError,
    ResultTooLarge,
    TchrunNotFound,
    TorchDistributor,
    find_tchrun,
)

__all__ = [
    "LAUNCH_FLAGS",
    "MAX_RESULT_BYTES",
    "LaunchError",
    "RankError",
    "ResultTooLarge",
    "TchrunNotFound",
    "TorchDistributor",
    "find_tchrun",
]
