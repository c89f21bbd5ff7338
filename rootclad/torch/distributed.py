"""Data-parallel training of a compiled model over ``torch.distributed``.

Each rank runs the compiled forward and backward on its own share of a global batch, the
gradient block of the model (the arena's, parameters first) is summed over the ranks in one
``all_reduce`` call per step, and every rank then runs the fused optimizer update
(``optim_update`` of the model's C API, train_step's last part) on the same numbers, so the
ranks' parameters stay equal without being sent again.

The global result equals one process training on the union of the ranks' batches: a rank
sends its gradient times its own normaliser share (``n_r * g_r``, with ``g_r`` its batch's
mean-normalised gradient), the loss likewise, and the global normaliser (the events, or the
event weights' sum with ``weight_norm="sum_w"``) in the same buffer; after the sum each rank
divides by that normaliser. Unequal batch sizes, and an empty batch on a rank (the last step
of an epoch that does not split evenly), are therefore exact.

BatchNorm: each rank normalises with its own batch's statistics and updates its own running
statistics, as torch's DistributedDataParallel without SyncBatchNorm (and with
``broadcast_buffers=False``); rank 0's are those a checkpoint saves. Dropout masks repeat across
ranks (the same seed and call count; docs/distributed_training.md).

Launch: under ``torchrun`` call :func:`init` (env://); on one machine :func:`spawn` starts N
processes joined on loopback. Checkpoints: :func:`save_checkpoint` writes on rank 0 only,
atomically; a checkpoint holds no rank count, so a run resumes with any number of ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from rootclad.torch.base import ModelBase


def _dist():
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("this torch was built without torch.distributed")
    return dist


def _require_group(group=None):
    dist = _dist()
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed's process group is not initialised: call "
            "rootclad.distributed.init() in each process (under torchrun), or start the "
            "processes with rootclad.distributed.spawn(fn, nprocs)"
        )
    return dist


def init(backend: str | None = None) -> tuple[int, int]:
    """Join the process group that ``torchrun`` describes in the environment (env://) unless
    this process has joined one already; returns ``(rank, world_size)``. ``backend``: "gloo"
    (the CPU, the default) or "nccl" (a DeviceModel on a GPU per rank)."""
    dist = _dist()
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]  # fmt: skip
        if missing:
            raise RuntimeError(f"rootclad.distributed.init: {', '.join(missing)} not set; "
                               "launch with torchrun, or use rootclad.distributed.spawn")  # fmt: skip
        dist.init_process_group(backend or "gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def rank() -> int:
    """This process's rank (0 without a process group)."""
    dist = _dist()
    return dist.get_rank() if dist.is_initialized() else 0


def fingerprint(model) -> dict:
    """What every rank's model must agree on: its graph (the compiled code), dtype, loss,
    parameter layout, buffers and frozen flags."""
    return {
        "graph": model.graph.fingerprint(),
        "dtype": str(model.dtype),
        "loss": model.loss,
        "parameters": [list(t) for t in model.param_layout()],
        "buffers": [[k, list(v.shape)] for k, v in model.named_buffers()],
        "frozen": [name for name, p in model.named_parameters() if not p.requires_grad],
    }


def check_same_model(model, group=None) -> None:
    """Refuse (RuntimeError, the same on every rank) ranks whose models differ."""
    dist = _require_group(group)
    mine = fingerprint(model)
    digest = hashlib.sha256(json.dumps(mine, sort_keys=True).encode()).digest()
    local = torch.tensor(list(digest[:8]), dtype=torch.int64)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    differ = [r for r, g in enumerate(gathered) if not torch.equal(g, gathered[0])]
    if differ:
        raise RuntimeError(
            f"rank(s) {differ} hold another model than rank 0 (the compiled graph, dtype, loss, "
            "parameter layout, buffers or frozen parameters differ): every rank must compile "
            f"the same module and freeze the same parameters; this is rank "
            f"{dist.get_rank(group)}, whose model is {mine['graph']} with "
            f"{len(mine['parameters'])} parameter tensors, frozen {mine['frozen']}"
        )


class DataParallel:
    """A compiled model (CompiledModel, or DeviceModel with NCCL) trained data-parallel.

    ``dp = rootclad.distributed.DataParallel(cm)`` checks that every rank holds the same model
    and copies rank 0's parameters and buffers to the others; then ``dp.train_step(x, y, opt,
    weight=w)`` on each rank's share of a global batch (any size, 0 included) makes the step
    one process would make on the whole global batch and returns the global loss.
    ``rootclad.fit(dp, opt, train, ...)`` trains with it: the epoch's loss and the validation
    loss are then summed over the ranks, so every rank monitors (and stops on) the same number.

    ``timings``: seconds spent in the compiled forward/backward, the all-reduce and the
    update, summed over the steps (for benchmarks)."""

    def __init__(self, model, *, group=None, broadcast: bool = True):
        if not isinstance(model, ModelBase) or not hasattr(model, "_loss_into_grads"):
            raise TypeError(f"DataParallel takes a rootclad CompiledModel or DeviceModel, got "
                            f"{type(model).__name__}")  # fmt: skip
        dist = _require_group(group)
        backend = dist.get_backend(group)
        if model.device.type == "cpu" and backend == "nccl":
            raise ValueError("a CPU model needs the gloo backend (NCCL all-reduces GPU memory)")
        self.model, self.group = model, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        check_same_model(model, group)
        if broadcast:
            src = dist.get_global_rank(group, 0) if group is not None else 0
            for t in [*model._views.values(), *model._buffer_views.values()]:
                dist.broadcast(t.detach(), src, group=group)
        P = model.n_param_values
        # the gradient block times this rank's normaliser, the loss times it, the normaliser
        # gradients | loss | normaliser | failed ranks (a count, and the sum of 2**rank)
        self._comm = torch.zeros(P + 4, dtype=model.dtype, device=model.device)
        self.last_norm = 0.0  # the last step's global normaliser (events or sum of weights)
        self.timings = {"compute": 0.0, "all_reduce": 0.0, "update": 0.0, "steps": 0}

    # what fit, evaluate and users read pass through to the model
    def __getattr__(self, name):
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def train_step(self, x, y, opt, weight=None, *, weight_norm: str = "mean",
                   check_finite: bool = True) -> float:  # fmt: skip
        """One data-parallel step on this rank's share ``(x, y, weight)`` of the global batch;
        returns the global batch's loss (the same float on every rank). Every rank must call
        it the same number of times (a rank with no events passes a batch of 0 samples)."""
        import time

        dist = _dist()
        model, P, comm = self.model, self.model.n_param_values, self._comm
        if weight_norm not in ("mean", "sum_w"):
            raise ValueError(f'weight_norm={weight_norm!r}; expected "mean" or "sum_w"')
        if self.model.graph.buffers and not model.training:
            raise ValueError("train_step runs BatchNorm on the batch's statistics: call "
                             "train() first")  # fmt: skip
        t0 = time.perf_counter()
        xs = x if isinstance(x, (tuple, list)) else (x,)
        n = int(xs[0].shape[0])
        comm.zero_()
        error = None
        try:
            if n:
                if check_finite:
                    _refuse_non_finite(model, x, y, opt)
                loss = model._loss_into_grads(x, y, weight)
                norm = n
                if weight is not None and weight_norm == "sum_w":
                    norm = torch.as_tensor(weight).double().sum().item()
                torch.mul(model._grads[:P], n, out=comm[:P])
                comm[P] = loss * n
                comm[P + 1] = norm
        except Exception as err:  # the other ranks must not wait in all_reduce for this one
            error = err
            comm.zero_()
            comm[P + 2], comm[P + 3] = 1, 2.0 ** min(self.rank, 52)
        t1 = time.perf_counter()
        dist.all_reduce(comm, group=self.group)
        if float(comm[P + 2]) > 0:  # every rank raises, this one its own error
            if error is not None:
                raise error
            bits, failed = int(float(comm[P + 3])), int(float(comm[P + 2]))
            ranks = [r for r in range(min(self.world_size, 53)) if bits >> r & 1]
            raise RuntimeError(f"train_step failed on rank(s) {ranks or failed} (see its error "
                               "there); no rank updated its parameters")  # fmt: skip
        total = float(comm[P + 1])  # the same on every rank: all raise or none does
        if total == 0:
            raise ValueError("the global batch holds no events (or its weights sum to 0)")
        torch.div(comm[:P], total, out=model._grads[:P])
        t2 = time.perf_counter()
        model.apply_grads(opt)
        t3 = time.perf_counter()
        loss = float(comm[P]) / total
        if loss != loss or abs(loss) == float("inf"):
            opt._suspect = True  # the next step scans the optimizer's state
        self.last_norm = total
        tm = self.timings
        tm["compute"] += t1 - t0
        tm["all_reduce"] += t2 - t1
        tm["update"] += t3 - t2
        tm["steps"] += 1
        return loss

    def reduce_sums(self, *values: float) -> tuple[float, ...]:
        """``values`` summed over the ranks (float64, one all-reduce)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.model.device)
        _dist().all_reduce(t, group=self.group)
        return tuple(float(v) for v in t)

    def broadcast_value(self, value: float) -> float:
        """Rank 0's ``value`` on every rank."""
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.model.device)
        dist = _dist()
        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        dist.broadcast(t, src, group=self.group)
        return float(t[0])


def _refuse_non_finite(model, x, y, opt) -> None:
    from rootclad.ir.graph import CLASS_INDEX_LOSSES
    from rootclad.torch.base import refuse_non_finite

    xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    yy = None if model.loss in CLASS_INDEX_LOSSES else torch.as_tensor(y)
    if model.device.type == "cpu":
        refuse_non_finite(xs, yy, int(xs[0].shape[0]), opt)
    else:
        refuse_non_finite(xs, yy, int(xs[0].shape[0]), opt, scan_state=True)


# -- checkpoints ---------------------------------------------------------------------------
def save_checkpoint(obj: dict, path: str | os.PathLike, *, group=None) -> bool:
    """Write ``obj`` (a ``FitState.checkpoint()``) to ``path`` on rank 0 only, whole or not at
    all (a temporary file in the same directory, then renamed); every rank then waits for it
    (a barrier), so none reads a checkpoint that is still being written. Without a process
    group it simply writes. Returns whether this process wrote."""
    dist = _dist()
    active = dist.is_initialized()
    wrote = False
    error = None
    if not active or dist.get_rank(group) == 0:
        path = Path(path)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    torch.save(obj, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            wrote = True
        except Exception as err:
            if not active:
                raise
            error = err
    if active:  # rank 0 says whether it wrote: no rank waits for one that failed
        on = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
        ok = torch.tensor([0.0 if error is not None else 1.0], dtype=torch.float64, device=on)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        if error is not None:
            raise error
        if ok.item() < 1:
            raise RuntimeError(f"rank 0 could not write the checkpoint {path}")
    return wrote


def load_checkpoint(path: str | os.PathLike) -> dict:
    """A checkpoint written by :func:`save_checkpoint` (tensors, numbers and containers only:
    ``torch.load(weights_only=True)``), for ``rootclad.fit(..., resume=...)`` on any number of
    ranks."""
    return torch.load(path, map_location="cpu", weights_only=True)


# -- local processes -------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(local_rank, fn, nprocs, port, backend, threads, out_dir, args):
    dist = _dist()
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(local_rank), "WORLD_SIZE": str(nprocs),
                       "LOCAL_RANK": str(local_rank)})  # fmt: skip
    if threads is not None:  # before a model library starts its thread pool
        os.environ["ROOTCLAD_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    dist.init_process_group(backend, init_method="env://", rank=local_rank, world_size=nprocs)
    try:
        result = fn(local_rank, nprocs, *args)
        final = Path(out_dir) / f"rank{local_rank}.pt"
        tmp = final.with_suffix(".tmp")
        torch.save(result, tmp)
        os.replace(tmp, final)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, nprocs: int, *args, backend: str = "gloo",
          threads: int | None = None) -> list:  # fmt: skip
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` new local processes joined in one
    process group on loopback (``backend`` "gloo"); returns their results in rank order
    (tensors, numbers, strings and containers of them). ``fn`` must be importable by name (a
    module-level function). ``threads``: rootclad's and torch's threads per process (default:
    the cores shared out). An exception in a process is raised here with its traceback."""
    import torch.multiprocessing as mp

    if nprocs < 1:
        raise ValueError(f"nprocs={nprocs}: at least 1")
    if threads is None and "ROOTCLAD_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // nprocs)
    with tempfile.TemporaryDirectory(prefix="rootclad-spawn-") as out:
        mp.spawn(_spawned, args=(fn, nprocs, _free_port(), backend, threads, out, args),
                 nprocs=nprocs, join=True)  # fmt: skip
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=True) for r in range(nprocs)]
