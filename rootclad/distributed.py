"""Data-parallel training over ``torch.distributed``: see rootclad/torch/distributed.py and
docs/distributed_training.md."""

from rootclad.torch.distributed import (
    DataParallel,
    check_same_model,
    fingerprint,
    init,
    load_checkpoint,
    rank,
    save_checkpoint,
    spawn,
)

__all__ = ["DataParallel", "check_same_model", "fingerprint", "init", "load_checkpoint", "rank",
           "save_checkpoint", "spawn"]  # fmt: skip
