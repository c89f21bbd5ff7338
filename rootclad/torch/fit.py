"""``rootclad.fit``: the training loop of a compiled model, as Keras' ``fit`` and the loops of
torch users are written: epochs over batches, the validation loss after each, early stopping,
the best weights restored at the end, a ``torch.optim.lr_scheduler`` scheduler on a rootclad
optimizer, a tqdm progress bar, a hook after each epoch (a checkpoint) and resuming from what
it saved.

>>> result = rootclad.fit(cm, rootclad.optim.Adam(cm, lr=1e-3), train, epochs=20,
...                       validation=val, patience=3)
>>> result.history[-1]  # {"epoch": ..., "train_loss": ..., "val_loss": ..., "lr": ..., ...}

The batches are ``(x, y)`` or ``(x, y, w)`` (event weights), numpy arrays or torch tensors, from
any iterable that can be iterated once per epoch: the ``rootclad.data`` iterators (whose
shuffle follows ``set_epoch``, which ``fit`` calls, so a resumed run reads what an
uninterrupted one would), a list, a torch DataLoader. ``rootclad gw run`` trains with it; the C++
twin, ``rootclad/include/rootclad/fit.h``, runs the same loop for ``rootclad::Model`` and the
readers of ``tree_reader.h`` (the same batches: the same history, tested).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from rootclad.ir.graph import CLASS_INDEX_LOSSES

# the loss of each sample, (B,) in float64, as the compiled loss computes it (the mean over
# the sample's elements); cross_entropy and nll: class indices
_TERMS = {
    "bce_with_logits": F.binary_cross_entropy_with_logits,
    "mse": F.mse_loss,
    "huber": F.huber_loss,  # delta 1, as the compiled one (ops/loss.h)
    "cross_entropy": F.cross_entropy,
    "nll": F.nll_loss,
}


@dataclasses.dataclass
class FitState:
    """Where a fit stands after an epoch: what ``on_epoch_end`` receives (set ``stop`` to end
    the fit there) and what :meth:`checkpoint` saves."""

    model: object
    optimizer: object
    scheduler: object = None
    epoch: int = 0  # epochs done
    history: list = dataclasses.field(default_factory=list)
    best_loss: float = math.inf  # of the monitored loss: the validation loss, else the training
    best_epoch: int = 0  # 0: none yet
    best_weights: dict | None = None
    bad_epochs: int = 0  # epochs since the last improvement
    stop: bool = False

    def checkpoint(self) -> dict:
        """Everything a resumed fit needs, as tensors, numbers, strings and containers (what
        ``torch.load(..., weights_only=True)`` reads back): pass it as ``fit(resume=...)``."""
        out = {"epoch": self.epoch, "model": _weights(self.model),
               "optimizer": self.optimizer.state_dict(), "history": list(self.history),
               "bad_epochs": self.bad_epochs, "best_val": self.best_loss,
               "best_epoch": self.best_epoch, "best_model": self.best_weights}  # fmt: skip
        if hasattr(self.model, "_calls_made"):  # Dropout's masks: the seeds drawn so far
            out["calls"] = self.model._calls_made()
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.state_dict()
        return out

    def _resume(self, ckpt: dict) -> None:
        """Load a checkpoint that :func:`check_checkpoint` passed: all of it, or (should a
        load still fail) none of it."""
        model, opt, sched = self.model, self.optimizer, self.scheduler
        calls = hasattr(model, "_set_calls_made")
        before = (
            _weights(model),
            opt.state_dict(),
            None if sched is None else copy.deepcopy(sched.state_dict()),
            model._calls_made() if calls else None,
        )
        try:
            opt.load_state_dict(ckpt["optimizer"])  # its own checks first, before it changes
            model.load_state_dict(ckpt["model"])
            if sched is not None:
                sched.load_state_dict(ckpt["scheduler"])
            if calls and "calls" in ckpt:
                model._set_calls_made(ckpt["calls"])
        except BaseException:
            model.load_state_dict(before[0], check_finite=False)  # back as it was, NaN or not
            opt.load_state_dict(before[1])
            if sched is not None:
                sched.load_state_dict(before[2])
            if calls:
                model._set_calls_made(before[3])
            raise
        self.epoch, self.history = ckpt["epoch"], list(ckpt["history"])
        self.bad_epochs, self.best_epoch = ckpt["bad_epochs"], ckpt["best_epoch"]
        self.best_loss, self.best_weights = float(ckpt["best_val"]), ckpt["best_model"]


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` returns; the model holds the best epoch's weights (``restore_best``)."""

    history: list  # per epoch: epoch, train_loss, val_loss (None without validation), lr,
    # seconds, events_per_s
    best_epoch: int  # 1-based; 0 when no epoch had a finite monitored loss
    best_loss: float
    stopped_early: bool  # patience ran out (or on_epoch_end set stop) before the last epoch
    resumed_from: int | None  # the epochs the resumed checkpoint had done


def _weights(model) -> dict:
    """A copy of the weights: state_dict() views the arena, which later steps overwrite."""
    return {k: v.clone() for k, v in model.state_dict().items()}


def _tensor(model, a, cast: bool) -> torch.Tensor:
    """``a`` (numpy or torch) on the model's device; floating inputs in the model's dtype when
    ``cast``. A CPU numpy batch is not copied."""
    if isinstance(a, np.ndarray):
        t = torch.from_numpy(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    else:
        t = a
    if cast and t.dtype != model.dtype and t.is_floating_point():
        t = t.to(model.dtype)
    return t if t.device == model.device else t.to(model.device, non_blocking=True)


def _batch(model, batch, transform):
    """(x, y, w or None) of a batch ``(x, y)`` or ``(x, y, w)`` on the model's device."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise TypeError(f"a batch must be a tuple (x, y) or (x, y, w), got {type(batch).__name__}"
                        + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""))  # fmt: skip
    x, y, *w = batch
    if transform is not None:
        x = transform(x)
    x = (tuple(_tensor(model, t, True) for t in x) if isinstance(x, (tuple, list))
         else _tensor(model, x, True))  # fmt: skip
    return x, _tensor(model, y, False), (_tensor(model, w[0], False) if w else None)


def _weight_sum(w: torch.Tensor) -> torch.Tensor:
    return w.detach().double().sum()


def loss_terms(model, out, y) -> torch.Tensor:
    """Each sample's loss (B,) in float64 from the model's output ``out`` (its container for a
    model of several outputs: the one the loss reads), as the compiled loss computes it."""
    if model.output_parts:
        key = model.output_parts[model.graph.loss_part][0]
        out = out[key]
    B = out.shape[0]
    o = out.double().reshape(B, -1)
    if model.loss in CLASS_INDEX_LOSSES:
        return _TERMS[model.loss](o, y.reshape(B).long(), reduction="none")
    return _TERMS[model.loss](o, y.double().reshape(B, -1), reduction="none").mean(1)


def _check_ranks_agree(model, train, validation, refused: Exception | None) -> None:
    """Every rank must step as often as the others (a step is a collective call), validate the
    same way and resume: readers of other files, batch sizes or drop_last give other batch
    counts, and the ranks would wait for each other (or gloo abort). Refused on every rank, in
    one call, before the first step; ``refused``: this rank's checkpoint error."""
    from rootclad.torch.distributed import batch_counts_differ, known_len, per_rank_text

    def count(it) -> int:  # -1: no len() (a generator): dp.batches checks it at the end
        return -1 if it is None or callable(it) else known_len(it)

    kind = 0 if validation is None else 1 if callable(validation) else 2
    ranks = model.per_rank(count(train), kind, count(validation), refused is not None)
    if refused is not None:
        raise refused
    bad = [r for r, row in enumerate(ranks) if row[3]]
    if bad:
        raise ValueError(
            f"rank(s) {bad} refused the checkpoint (see the error there); no rank resumed"
        )
    kinds = [("none", "a function", "batches")[int(row[1])] for row in ranks]
    if len(set(kinds)) > 1:
        shown = [
            f"{int(row[2])} batches" if k == "batches" and row[2] >= 0 else k
            for k, row in zip(kinds, ranks, strict=True)
        ]
        raise ValueError(
            f"the ranks' validation differs ({per_rank_text(shown)}): give every "
            "rank its share of the validation batches, or every rank the same "
            "function"
        )
    for what, column in (("training", 0), ("validation", 2)):
        counts = [int(row[column]) for row in ranks]
        if min(counts) >= 0 and len(set(counts)) > 1:
            raise batch_counts_differ(what, counts)


def evaluate(model, batches: Iterable, *, transform=None, weight_norm: str = "mean") -> float:
    """The loss of ``batches`` as if they were one batch, in eval mode (Dropout off): the mean
    of each sample's loss, weighted by its event weight (``weight_norm="mean"``: divided by the
    events; ``"sum_w"``: by the sum of the weights), in float64."""
    was = model.training
    model.eval()
    total = norm = 0.0
    if hasattr(batches, "set_epoch"):  # the same order every time (and as fit.h reads it)
        batches.set_epoch(0)
    try:
        for batch in batches:
            x, y, w = _batch(model, batch, transform)
            if len(y) == 0:  # a rank's empty last share of a sharded reader
                continue
            terms = loss_terms(model, model.predict(x), y)
            if w is not None:
                terms = terms * w.double()
            total += float(terms.sum())
            norm += float(_weight_sum(w)) if (w is not None and weight_norm == "sum_w") else len(y)
    finally:
        model.train(was)
    if hasattr(model, "reduce_sums"):  # data-parallel: every rank's share of the batches
        total, norm = model.reduce_sums(total, norm)
    if norm == 0:
        raise ValueError("the validation batches hold no events (or weights summing to 0)")
    return total / norm


def _train_epoch(model, optimizer, batches, transform, weight_norm, bar) -> tuple:
    """One pass of training steps: (the epoch's loss as one batch's, events)."""
    total = norm = 0.0  # on a GPU a device tensor: read once at the end (and by the bar)
    seen = steps = 0
    t0 = time.perf_counter()
    parallel = hasattr(model, "reduce_sums")
    for i, batch in enumerate(model.batches(batches) if parallel else batches):
        x, y, w = _batch(model, batch, transform)
        loss = model.train_step(x, y, optimizer, weight=w, weight_norm=weight_norm)
        n = int(y.shape[0])
        # data-parallel: the loss is the global batch's, weighed by its global normaliser
        scale = getattr(model, "last_norm", None) or (
            _weight_sum(w) if (w is not None and weight_norm == "sum_w") else n
        )
        total = total + loss * scale
        norm = norm + scale
        seen += n
        steps += 1
        bar.update(1)
        if not bar.disable and i % 20 == 0:
            bar.set_postfix(loss=f"{float(total) / float(norm):.4f}",
                            ev_s=f"{seen / (time.perf_counter() - t0):.0f}")  # fmt: skip
    # data-parallel: a rank whose shares were all empty has seen none, the others some (every
    # rank made as many steps: dp.batches checked it)
    if (steps if parallel else seen) == 0:
        raise ValueError("the training batches of an epoch were empty (an iterator that can be "
                         "iterated once only? fit iterates it once per epoch)")  # fmt: skip
    return float(total) / float(norm), seen


def fit(model, optimizer, train: Iterable, *, epochs: int,
        validation: Iterable | Callable[[], float] | None = None, patience: int | None = None,
        min_delta: float = 0.0, restore_best: bool = True, scheduler=None,
        weight_norm: str = "mean", transform: Callable | None = None,
        progress: bool | None = None, log: Callable[[str], object] | None = None,
        on_epoch_end: Callable[[FitState], object] | None = None,
        resume: dict | None = None) -> FitResult:  # fmt: skip
    """Train ``model`` (a CompiledModel or DeviceModel) with ``optimizer`` (a
    ``rootclad.optim`` one) for up to ``epochs`` passes over ``train``.

    - ``validation``: batches whose loss (:func:`evaluate`) is computed after each epoch, or a
      function of no arguments returning the number to monitor instead; without it the
      training loss is monitored.
    - ``patience``: stop when the monitored loss has not improved for that many epochs (None:
      never); an improvement is a loss below the best by more than ``min_delta``.
    - ``restore_best``: end with the weights of the best epoch (the last epoch's otherwise).
    - ``scheduler``: a ``torch.optim.lr_scheduler`` scheduler made on ``optimizer``, stepped
      after each epoch (``ReduceLROnPlateau`` with the monitored loss).
    - ``weight_norm``: how event weights ``(x, y, w)`` normalise the loss (``train_step``'s).
    - ``transform``: applied to each batch's ``x`` first (e.g. a reshape).
    - ``progress``: a tqdm bar per epoch (default: when stderr is a terminal).
    - ``log``: called with one line per epoch (``print`` for a log).
    - ``on_epoch_end(state)``: called after each epoch's bookkeeping and log line (a
      checkpoint: ``state.checkpoint()``); setting ``state.stop`` ends the fit.
    - ``model`` may be a :class:`rootclad.distributed.DataParallel`: each rank passes its
      share of the batches, and the losses are the global ones on every rank.
    - ``resume``: a ``state.checkpoint()`` to continue from: the model, optimizer, scheduler,
      history and early-stopping count are restored, and the fit ends where an uninterrupted
      one would (with ``train``'s shuffle set by epoch, as rootclad.data's is). Every value is
      checked first (:func:`check_checkpoint`); a refused one leaves everything as it was.

    Returns a :class:`FitResult`; ``history[i]["val_loss"]`` is None without validation.
    """
    from tqdm.auto import tqdm

    from rootclad.torch.distributed import known_len

    if patience is not None and (isinstance(patience, bool) or int(patience) < 1):
        raise ValueError(f"patience={patience!r}: at least 1 epoch (None: no early stopping)")
    if weight_norm not in ("mean", "sum_w"):
        raise ValueError(f'weight_norm={weight_norm!r}; expected "mean" or "sum_w"')
    if not min_delta >= 0:
        raise ValueError(f"min_delta={min_delta!r}: must be >= 0")
    if scheduler is not None and getattr(scheduler, "optimizer", None) is not optimizer:
        raise ValueError("the scheduler was made on another optimizer")
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    refused = None
    if resume is not None:  # checked whole before anything is loaded
        try:
            check_checkpoint(resume, model, optimizer, scheduler)
        except (TypeError, ValueError) as err:
            refused = err
    if hasattr(model, "reduce_sums"):  # data-parallel: the ranks must agree on the batches
        _check_ranks_agree(model, train, validation, refused)
    elif refused is not None:
        raise refused
    state = FitState(model, optimizer, scheduler)
    resumed = None
    if resume is not None:
        state._resume(resume)
        resumed = state.epoch
    if progress is None:
        progress = sys.stderr.isatty()
    stopped = False
    model.train()
    for epoch in range(state.epoch, epochs):
        if patience is not None and state.bad_epochs >= patience:
            stopped = True
            break
        if hasattr(train, "set_epoch"):
            train.set_epoch(epoch)
        lr = optimizer.lr
        t0 = time.perf_counter()
        total = known_len(train)  # -1: none (a generator, a DataLoader over an IterableDataset)
        with tqdm(total=None if total < 0 else total, unit="batch",
                  disable=not progress, desc=f"epoch {epoch + 1}/{epochs}") as bar:  # fmt: skip
            train_loss, seen = _train_epoch(model, optimizer, train, transform, weight_norm, bar)
        seconds = time.perf_counter() - t0
        if hasattr(model, "reduce_sums"):  # data-parallel: the events of all ranks
            seen = int(model.reduce_sums(seen)[0])
        if validation is None:
            val = None
        elif callable(validation):
            val = float(validation())
            if hasattr(model, "broadcast_value"):  # every rank monitors rank 0's number
                val = model.broadcast_value(val)
        else:
            val = evaluate(model, validation, transform=transform, weight_norm=weight_norm)
        state.history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_loss": val,
                              "lr": lr, "seconds": seconds, "events_per_s": seen / seconds})  # fmt: skip
        monitored = train_loss if val is None else val
        if monitored < state.best_loss - min_delta:
            state.best_loss, state.best_epoch, state.bad_epochs = monitored, epoch + 1, 0
            if restore_best:
                state.best_weights = _weights(model)
        else:
            state.bad_epochs += 1
        if scheduler is not None:
            scheduler.step(monitored) if plateau else scheduler.step()
        state.epoch = epoch + 1
        if log is not None:
            log(_line(state.history[-1], scheduler is not None))
        if on_epoch_end is not None:
            on_epoch_end(state)
        if state.stop:
            stopped = epoch + 1 < epochs
            break
    if restore_best and state.best_weights is not None:
        model.load_state_dict(state.best_weights)
    return FitResult(state.history, state.best_epoch, state.best_loss, stopped, resumed)


def _line(h: dict, with_lr: bool) -> str:
    val = "" if h["val_loss"] is None else f", validation loss {h['val_loss']:.4f}"
    lr = f", lr {h['lr']:.3g}" if with_lr else ""
    return (f"epoch {h['epoch']}: train loss {h['train_loss']:.4f}{val}, "
            f"{h['events_per_s']:.0f} events/s{lr}")  # fmt: skip


# -- a checkpoint is data from a file: every value checked before anything is loaded ---------
_HISTORY_KEYS = ("epoch", "train_loss", "val_loss", "lr", "seconds", "events_per_s")
_KEYS = "epoch model optimizer history bad_epochs best_val best_epoch best_model".split()


def _bad(where: str, why: str, kind: type = ValueError) -> Exception:
    return kind(f"the checkpoint's {where} {why}; nothing was loaded")


def _whole(where: str, v, low: int = 0, high: int = 2**63 - 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(where, f"must be a whole number, got {type(v).__name__} {v!r}", TypeError)
    if not low <= v <= high:
        raise _bad(
            where, f"is {v}, must be >= {low}" + (f" and <= {high}" if high < 2**63 - 1 else "")
        )
    return v


def _real(where: str, v, low: float = -math.inf) -> float:
    """A finite number (int or float, not bool) >= ``low``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(where, f"must be a number, got {type(v).__name__} {v!r}", TypeError)
    if not (math.isfinite(v) and v >= low):
        raise _bad(where, f"is {v!r}, must be finite" + (f" and >= {low:g}" if low == 0 else ""))
    return float(v)


def _check_weights(key: str, weights, model) -> None:
    """The checks of ``model.check_state_dict`` (this model's tensors by name and shape, real
    and finite, running variances >= 0, batch counts whole numbers >= 0), named as the
    checkpoint's ``key``."""
    try:
        model.check_state_dict(weights, where=f"the checkpoint's {key}")
    except KeyError as err:  # names missing or unknown: a ValueError, as every refusal here
        raise ValueError(err.args[0]) from None


def _check_like(where: str, v, ref) -> None:
    """``v`` shaped as ``ref`` (a fresh scheduler's state): the same keys, lengths and kinds of
    value, the same strings; numbers finite unless ``ref`` holds the same infinity there."""
    if isinstance(ref, dict):
        if not isinstance(v, dict):
            raise _bad(where, f"must be a dict, got {type(v).__name__}", TypeError)
        for k in v:
            if k not in ref:
                raise _bad(f"{where}[{k!r}]", "is not in this scheduler's state")
        for k in ref:
            if k not in v:
                raise _bad(f"{where}[{k!r}]", "is missing")
            _check_like(f"{where}[{k!r}]", v[k], ref[k])
    elif isinstance(ref, (list, tuple)):
        if not isinstance(v, (list, tuple)) or len(v) != len(ref):
            raise _bad(where, f"must be a list of {len(ref)}, got {v!r}", TypeError)
        for i, (a, b) in enumerate(zip(v, ref, strict=True)):
            _check_like(f"{where}[{i}]", a, b)
    elif isinstance(ref, bool) or ref is None:
        if type(v) is not type(ref):
            raise _bad(where, f"must be {ref!r} or of its type, got {v!r}", TypeError)
    elif isinstance(ref, int):
        _whole(where, v, low=0 if ref >= 0 else -(2**63))
    elif isinstance(ref, float):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool)):
            raise _bad(where, f"must be a number, got {type(v).__name__} {v!r}", TypeError)
        if not math.isfinite(v) and v != ref:
            raise _bad(where, f"is {v!r}, must be finite")
    elif isinstance(ref, torch.Tensor):
        if not isinstance(v, torch.Tensor) or v.shape != ref.shape or v.dtype != ref.dtype:
            raise _bad(where, f"must be a {ref.dtype} tensor of shape {tuple(ref.shape)}")
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise _bad(where, "holds non-finite values")
    elif isinstance(ref, str):
        if v != ref:
            raise _bad(where, f"is {v!r}; this scheduler's is {ref!r}")
    else:
        raise _bad(where, f"is of a kind fit cannot check ({type(ref).__name__})", TypeError)


def check_checkpoint(ckpt, model, optimizer, scheduler=None) -> None:
    """Refuse (ValueError or TypeError naming the key) a checkpoint that ``fit(resume=...)``
    should not load into ``model``, ``optimizer`` and ``scheduler``; nothing is changed.

    Checked: every key :meth:`FitState.checkpoint` writes is there; the weights and best
    weights are this model's tensors (names, shapes), finite; the optimizer's state passes
    the optimizer's own check (:meth:`rootclad.optim.Optimizer.check_state_dict`: keys, kind,
    hyperparameters, finite moments, step counts, param group); the scheduler's has the keys,
    types and lengths of this scheduler's; the counts are whole numbers that agree with each
    other (``epoch`` is the history's length, the history numbers its epochs, the best epoch
    is one of them and ``best_val`` its monitored loss, ``bad_epochs`` counts the epochs
    since, the scheduler stepped at least once per epoch)."""
    if not isinstance(ckpt, dict):
        raise TypeError(f"a checkpoint is a dict (state.checkpoint()), got {type(ckpt).__name__}")
    for key in _KEYS:
        if key not in ckpt:
            raise _bad(repr(key), "is missing")
    if ("scheduler" in ckpt) != (scheduler is not None):
        has = "holds" if "scheduler" in ckpt else "holds no"
        raise ValueError(
            f"the checkpoint {has} a scheduler's state and this fit was given "
            f"{'none' if scheduler is None else 'one'}"
        )
    epoch = _whole("'epoch'", ckpt["epoch"])
    history = ckpt["history"]
    if not isinstance(history, list):
        raise _bad("'history'", f"must be a list, got {type(history).__name__}", TypeError)
    if len(history) != epoch:
        raise _bad("'epoch'", f"is {epoch} but 'history' holds {len(history)} epochs")
    for i, h in enumerate(history):
        at = f"'history'[{i}]"
        if not isinstance(h, dict) or set(h) != set(_HISTORY_KEYS):
            raise _bad(at, f"must be a dict of {', '.join(_HISTORY_KEYS)}")
        if _whole(f"{at}['epoch']", h["epoch"]) != i + 1:
            raise _bad(f"{at}['epoch']", f"is {h['epoch']}, expected {i + 1}")
        _real(f"{at}['train_loss']", h["train_loss"])
        if h["val_loss"] is not None:
            _real(f"{at}['val_loss']", h["val_loss"])
        for k in ("lr", "seconds", "events_per_s"):
            _real(f"{at}[{k!r}]", h[k], low=0)
    best = _whole("'best_epoch'", ckpt["best_epoch"], high=epoch)
    best_val = ckpt["best_val"]
    if best == 0:
        if best_val != math.inf or isinstance(best_val, bool):
            raise _bad("'best_val'", f"is {best_val!r}; with no best epoch yet it is inf")
    else:
        h = history[best - 1]
        monitored = h["train_loss"] if h["val_loss"] is None else h["val_loss"]
        if _real("'best_val'", best_val) != monitored:
            why = f"not the monitored loss of the best epoch, {best}, in 'history' ({monitored!r})"
            raise _bad("'best_val'", f"is {best_val!r}, {why}")
    _whole("'bad_epochs'", ckpt["bad_epochs"])
    if ckpt["bad_epochs"] != epoch - best:
        why = f"the epochs after the best ({best}) of {epoch} are {epoch - best}"
        raise _bad("'bad_epochs'", f"is {ckpt['bad_epochs']}; {why}")
    _check_weights("'model'", ckpt["model"], model)
    if ckpt["best_model"] is not None:
        if best == 0:
            raise _bad("'best_model'", "holds weights but 'best_epoch' is 0")
        _check_weights("'best_model'", ckpt["best_model"], model)
    optimizer.check_state_dict(ckpt["optimizer"], where="the checkpoint's 'optimizer'")
    if scheduler is not None:
        _check_like("'scheduler'", ckpt["scheduler"], scheduler.state_dict())
        last = ckpt["scheduler"].get("last_epoch")
        if last is not None and last < epoch:  # fit steps it once per epoch
            why = f"fit steps the scheduler once per epoch: after {epoch} it is >= {epoch}"
            raise _bad("'scheduler'['last_epoch']", f"is {last}; {why}")
    if "calls" in ckpt:
        _whole("'calls'", ckpt["calls"])
