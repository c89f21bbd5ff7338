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

Ranks that disagree: every collective call rootclad makes on a DataParallel's ranks carries, in
the same buffer, what each rank is doing (a train_step, the end of its batches, a sum, a
checkpoint) and a count, so that ranks making different calls (readers that give other numbers
of batches) all raise an error naming each rank's call, where gloo would abort the process on
an all-reduce of another size or the ranks would wait for each other forever.

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
import weakref
from collections.abc import Callable, Iterable, Iterator
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


# What a rank is doing at one of rootclad's collective calls on a DataParallel's ranks
_STEP, _STEP_FAILED, _BEGIN, _END, _SUM, _BROADCAST, _CHECKPOINT = range(1, 8)
_MAX_COUNT = 2**24  # counts travel in the model's dtype: float32 holds them exactly to here


def _doing(code: int, count: int, size: int) -> str:
    n = f"{count}" if count < _MAX_COUNT else f"{_MAX_COUNT} or more"
    return {
        _STEP: f"makes train_step {n}",
        _STEP_FAILED: f"makes train_step {n}",
        _BEGIN: "starts its batches",
        _END: f"has no batch after {n}",
        _SUM: f"sums {size} value(s) (fit's epoch, evaluate) after {n} train_steps",
        _BROADCAST: f"takes rank 0's validation value after {n} train_steps",
        _CHECKPOINT: f"saves a checkpoint after {n} train_steps",
    }.get(code, f"makes an unknown call ({code})")


def per_rank_text(values: list, unit: str = "") -> str:
    """``rank 0: 2, rank 1: 3`` (ranks with the same value together: ``ranks [0, 2]: 2``)."""
    groups: dict = {}
    for r, v in enumerate(values):
        groups.setdefault(v, []).append(r)
    parts = [
        (f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}") + f": {v}{unit}"
        for v, rs in groups.items()
    ]
    return ", ".join(parts)


def known_len(batches) -> int:
    """``len(batches)``, or -1 where it has none (a generator, a DataLoader over an
    IterableDataset, whose len() raises)."""
    try:
        return len(batches)
    except TypeError:
        return -1


def batch_counts_differ(what: str, counts: list[int]) -> ValueError:
    return ValueError(
        f"the ranks' {what + ' ' if what else ''}readers give different numbers of batches "
        f"({per_rank_text(counts)}): every rank must step as often as the others; give every "
        "rank the same files, batch size and drop_last, with its rank and world_size"
    )


class _Calls:
    """The buffer of a DataParallel's collective calls and the agreement it carries.

    Layout: the gradient block (P values), the loss and the normaliser, then per rank the call
    it makes (a code), a count and a size, each rank writing only its own slots. train_step
    all-reduces it with its gradients (the agreement costs no extra message); rootclad's other
    calls on these ranks (reduce_sums, broadcast_value, the start and end of ``batches``,
    save_checkpoint) all-reduce it alone first. After the sum every rank sees every rank's
    call, and ranks whose calls differ all raise, naming each rank's, where gloo would abort
    the process on an all-reduce of another size or the ranks would wait forever."""

    def __init__(self, model, group, rank: int, world_size: int):
        self.P, self.W, self.rank, self.group = model.n_param_values, world_size, rank, group
        self.buf = torch.zeros(self.P + 2 + 3 * world_size, dtype=model.dtype, device=model.device)
        self.steps = 0  # train_steps since this rank's last call of another kind

    def mark(self, code: int, count: int, size: int = 0) -> None:
        W, at = self.W, self.P + 2 + self.rank
        self.buf[at], self.buf[at + W] = code, min(count, _MAX_COUNT)
        self.buf[at + 2 * W] = size

    def calls(self) -> list[tuple[int, int, int]]:
        """Each rank's (code, count, size), read after the all-reduce."""
        W = self.W
        tail = [int(v) for v in self.buf[self.P + 2 :].cpu().tolist()]
        return [(tail[r], tail[W + r], tail[2 * W + r]) for r in range(W)]

    def check(self, calls) -> None:
        """Refuse (RuntimeError, the same on every rank) calls that differ."""
        kinds = {(_STEP if c == _STEP_FAILED else c, size) for c, _, size in calls}
        if len(kinds) > 1:
            doing = "; ".join(f"rank {r} {_doing(*c)}" for r, c in enumerate(calls))
            raise RuntimeError(
                f"the ranks are not making the same call: {doing} (train_steps counted since "
                "each rank's last call of another kind). Every rank must call train_step as "
                "often as the others: give each rank a reader with as many batches (rootclad.data's "
                "readers with rank and world_size do), and iterate it with dp.batches(reader), "
                "which checks the counts before the first step"
            )

    def agree(self, code: int, count: int | None = None, size: int = 0):
        """A call other than a step: all ranks must make this one now."""
        self.buf.zero_()
        self.mark(code, self.steps if count is None else count, size)
        _dist().all_reduce(self.buf, group=self.group)
        self.steps = 0  # on every rank: the call was made, whether it matched or not
        calls = self.calls()
        self.check(calls)
        return calls


# each process group's latest DataParallel's calls, for save_checkpoint
_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class DataParallel:
    """A compiled model (CompiledModel, or DeviceModel with NCCL) trained data-parallel.

    ``dp = rootclad.distributed.DataParallel(cm)`` checks that every rank holds the same model
    and copies rank 0's parameters and buffers to the others; then ``dp.train_step(x, y, opt,
    weight=w)`` on each rank's share of a global batch (any size, 0 included) makes the step
    one process would make on the whole global batch and returns the global loss.
    ``rootclad.fit(dp, opt, train, ...)`` trains with it: the epoch's loss and the validation
    loss are then summed over the ranks, so every rank monitors (and stops on) the same number.

    Every rank must call ``train_step`` as often as the others: ``for batch in
    dp.batches(reader)`` checks that (the readers' ``len()`` before the first step, and at the
    end that no rank has a batch more); rootclad's other calls on the ranks (``reduce_sums``,
    ``broadcast_value``, :func:`save_checkpoint`) check that every rank makes them, so ranks
    out of step raise, each naming every rank's call, instead of waiting or aborting.

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
        # the gradient block times this rank's normaliser, the loss times it, the normaliser,
        # then what each rank is doing (see _Calls)
        self._calls = _Calls(model, group, self.rank, self.world_size)
        _CALLS[group if group is not None else dist.group.WORLD] = self._calls
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
        calls = self._calls
        model, P, comm = self.model, calls.P, calls.buf
        if weight_norm not in ("mean", "sum_w"):
            raise ValueError(f'weight_norm={weight_norm!r}; expected "mean" or "sum_w"')
        if self.model.graph.batch_statistics and not model.training:
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
        calls.mark(_STEP if error is None else _STEP_FAILED, calls.steps + 1)
        t1 = time.perf_counter()
        dist.all_reduce(comm, group=self.group)
        calls.steps = 0
        done = calls.calls()
        try:  # every rank in a train_step (not at its end of batches, a sum...)
            calls.check(done)
        except RuntimeError as out_of_step:
            raise out_of_step from error
        failed = [r for r, (code, _, _) in enumerate(done) if code == _STEP_FAILED]
        if failed:  # every rank raises, this one its own error
            if error is not None:
                raise error
            raise RuntimeError(f"train_step failed on rank(s) {failed} (see its error "
                               "there); no rank updated its parameters")  # fmt: skip
        calls.steps = done[self.rank][1]
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

    def batches(self, batches: Iterable) -> Iterator:
        """Yield ``batches`` (this rank's share of an epoch) after checking with the other ranks
        that theirs give as many (``len()``, where every rank's has one), and at the end that
        no rank has a batch more: ranks whose counts differ raise, every one, naming each
        rank's count, before the first step or at the first step one rank cannot match.
        ``rootclad.fit`` iterates a DataParallel's batches with it."""
        counts = [count for _, count, _ in self._calls.agree(_BEGIN, known_len(batches))]
        if min(counts) >= 0 and len(set(counts)) > 1:
            raise batch_counts_differ("", counts)
        yield from batches
        self._calls.agree(_END)

    def reduce_sums(self, *values: float) -> tuple[float, ...]:
        """``values`` summed over the ranks (float64, one all-reduce after the agreement that
        every rank sums as many values now)."""
        self._calls.agree(_SUM, size=len(values))
        t = torch.tensor(values, dtype=torch.float64, device=self.model.device)
        _dist().all_reduce(t, group=self.group)
        return tuple(float(v) for v in t)

    def per_rank(self, *values: float) -> list[tuple[float, ...]]:
        """Each rank's ``values``, in rank order (every rank passes as many)."""
        k, W = len(values), self.world_size
        mine = [0.0] * (k * W)
        mine[self.rank * k : (self.rank + 1) * k] = [float(v) for v in values]
        sums = self.reduce_sums(*mine)
        return [tuple(sums[r * k : (r + 1) * k]) for r in range(W)]

    def broadcast_value(self, value: float) -> float:
        """Rank 0's ``value`` on every rank."""
        self._calls.agree(_BROADCAST)
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
    group it simply writes. Returns whether this process wrote. Where a DataParallel trains on
    the group, every rank must be here (not in a train_step): nothing is written otherwise."""
    dist = _dist()
    active = dist.is_initialized()
    wrote = False
    error = None
    if active:
        calls = _CALLS.get(group if group is not None else dist.group.WORLD)
        if calls is not None:
            calls.agree(_CHECKPOINT)
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
