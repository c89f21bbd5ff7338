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
        if ("scheduler" in ckpt) != (self.scheduler is not None):
            has = "holds" if "scheduler" in ckpt else "holds no"
            raise ValueError(f"the checkpoint {has} a scheduler's state and this fit was given "
                             f"{'none' if self.scheduler is None else 'one'}")  # fmt: skip
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(ckpt["scheduler"])
        self.epoch, self.history = int(ckpt["epoch"]), list(ckpt["history"])
        self.bad_epochs, self.best_epoch = int(ckpt["bad_epochs"]), int(ckpt["best_epoch"])
        self.best_loss, self.best_weights = float(ckpt["best_val"]), ckpt["best_model"]
        if "calls" in ckpt and hasattr(self.model, "_set_calls_made"):
            self.model._set_calls_made(int(ckpt["calls"]))


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


def _check_ranks_agree(model, train, validation) -> None:
    """Every rank must step as often as the others (a step is a collective call): readers of
    other files, batch sizes or drop_last give other batch counts, and the ranks would wait
    for each other forever. Refused on every rank, before the first step."""
    for what, it in (("training", train), ("validation", validation)):
        if it is None or callable(it) or not hasattr(it, "__len__"):
            continue
        n = float(len(it))
        total, squares = model.reduce_sums(n, n * n)
        if squares * model.world_size != total * total:  # not all equal
            raise ValueError(f"the ranks' {what} readers give different numbers of batches "
                             f"(rank {model.rank}: {int(n)}, {int(total)} over "
                             f"{model.world_size} ranks): give every rank the same files, "
                             "batch size and drop_last, with its rank and world_size")  # fmt: skip


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
    seen = 0
    t0 = time.perf_counter()
    for i, batch in enumerate(batches):
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
        bar.update(1)
        if not bar.disable and i % 20 == 0:
            bar.set_postfix(loss=f"{float(total) / float(norm):.4f}",
                            ev_s=f"{seen / (time.perf_counter() - t0):.0f}")  # fmt: skip
    if seen == 0:
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
      one would (with ``train``'s shuffle set by epoch, as rootclad.data's is).

    Returns a :class:`FitResult`; ``history[i]["val_loss"]`` is None without validation.
    """
    from tqdm.auto import tqdm

    if patience is not None and (isinstance(patience, bool) or int(patience) < 1):
        raise ValueError(f"patience={patience!r}: at least 1 epoch (None: no early stopping)")
    if weight_norm not in ("mean", "sum_w"):
        raise ValueError(f'weight_norm={weight_norm!r}; expected "mean" or "sum_w"')
    if not min_delta >= 0:
        raise ValueError(f"min_delta={min_delta!r}: must be >= 0")
    if scheduler is not None and getattr(scheduler, "optimizer", None) is not optimizer:
        raise ValueError("the scheduler was made on another optimizer")
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if hasattr(model, "reduce_sums"):  # data-parallel: the ranks must agree on the batches
        _check_ranks_agree(model, train, validation)
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
        with tqdm(total=len(train) if hasattr(train, "__len__") else None, unit="batch",
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
