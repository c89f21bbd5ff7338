"""``Standardize``: ``(x - mean) / std`` as the model's first layer, its constants frozen
parameters, so that the compiled model applies it wherever it runs (Python, macros, RDataFrame,
ONNX) and input gradients account for it; fitted on a reader, an RDataFrame or an array."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn


class Standardize(nn.Module):
    """``(x - mean) / std``, a first layer whose constants are frozen parameters (``mean`` and
    ``std``: not trained, stored in the export's weights like any tensor), so the compiled
    model applies it in forward and its input gradients account for it.

    ``mean`` and ``std`` are a number or one value per input feature (the per-sample input
    shape). A feature that never varies (std 0) is divided by 1, as scikit-learn's
    StandardScaler does. Fit them with :meth:`fit` on the training data."""

    def __init__(self, mean, std, dtype: torch.dtype | None = None):
        super().__init__()
        mean = torch.as_tensor(mean, dtype=torch.float64)
        std = torch.as_tensor(std, dtype=torch.float64)
        if mean.shape != std.shape:
            raise ValueError(f"mean {tuple(mean.shape)} and std {tuple(std.shape)} differ in shape")
        if not torch.isfinite(mean).all() or not torch.isfinite(std).all() or (std < 0).any():
            raise ValueError("mean and std must be finite, std not negative")
        std = torch.where(std == 0, torch.ones_like(std), std)
        dtype = dtype or torch.get_default_dtype()
        self.mean = nn.Parameter(mean.to(dtype), requires_grad=False)
        self.std = nn.Parameter(std.to(dtype), requires_grad=False)
        # the values as given: .double() on a float32 stage restores them, not their rounding
        self._exact = (mean, std)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        exact = getattr(self, "_exact", None)
        if exact is not None and self.mean.dtype == torch.float64:
            with torch.no_grad():
                for p, v in zip((self.mean, self.std), exact, strict=True):
                    if torch.equal(p.to(torch.float32), v.to(torch.float32)):  # not changed since
                        p.copy_(v.to(p.device))
        return out

    def forward(self, x):
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"features={self.mean.numel()}"

    @classmethod
    def fit(cls, data, features: Iterable[str] | None = None,
            dtype: torch.dtype | None = None) -> Standardize:  # fmt: skip
        """Means and standard deviations (population: divided by N) of each input value, over
        ``data``:

        - a reader (``from_rdataframe``, ``TableIterator``, ``BatchIterator``...): one pass
          over its entries (its split: fit on the training split), summed in float64. A
          reader sharded for data-parallel training (``rank``, ``world_size``) is read whole,
          as the same reader without them (:meth:`unsharded`): every rank gets the constants
          one process gets, bit for bit, whatever the number of ranks. A DataLoader whose
          DistributedSampler gives one rank's share is refused;
        - an RDataFrame and ``features`` (the readers' feature list): its filtered entries;
        - an array ``(N, *shape)`` (numpy or torch).

        The shape of the statistics is a batch's per-sample shape; their dtype ``dtype``
        (default torch's default dtype; ``.double()`` on the model later restores the float64
        values, not their float32 rounding). A reader's epoch counter is left as it was, so
        that the training's first epoch shuffles as it would have without the fit."""
        if features is not None:
            data = _rdataframe_reader(data, features)
        elif hasattr(data, "GetColumnNames"):
            raise TypeError("Standardize.fit(df, features=[...]): name the RDataFrame's columns")
        _refuse_a_share(data)
        reader, epoch = data, getattr(data, "epoch", None)
        if hasattr(data, "unsharded"):  # a rank's reader: the whole split, as one process's
            data = data.unsharded()
        if isinstance(data, (np.ndarray, torch.Tensor)):
            if data.ndim < 2:
                raise ValueError(
                    f"Standardize.fit: an array of shape {tuple(data.shape)}; expected "
                    "(N, *per-sample shape), e.g. x[:, None] for N values of one feature"
                )
            batches: Iterable = [(data,)]
        else:
            batches = data
        n, total, sq, shift = 0, None, None, None
        for batch in batches:
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
            x = x.detach().to("cpu", torch.float64)
            if x.ndim < 2 or not x.shape[0]:
                continue
            if shift is None:  # sums about the first batch's mean: no cancellation
                shift = x.mean(0)
                total = torch.zeros_like(shift)
                sq = torch.zeros_like(shift)
            elif x.shape[1:] != shift.shape:
                raise ValueError(f"batches of per-sample shape {tuple(x.shape[1:])} and "
                                 f"{tuple(shift.shape)}")  # fmt: skip
            d = x - shift
            total += d.sum(0)
            sq += (d * d).sum(0)
            n += x.shape[0]
        if epoch is not None:
            reader.epoch = epoch
        if not n:
            raise ValueError("Standardize.fit: the data hold no entries")
        mean = total / n
        var = (sq / n - mean * mean).clamp_min(0)
        return cls(shift + mean, var.sqrt(), dtype=dtype)


def _refuse_a_share(data) -> None:
    """A torch DataLoader over a DistributedSampler holds one rank's share: fitted on it, the
    constants would depend on the rank and the number of ranks."""
    sampler = getattr(data, "sampler", None)
    replicas = getattr(sampler, "num_replicas", 1)
    if isinstance(replicas, int) and replicas > 1:
        raise ValueError(
            f"Standardize.fit: this DataLoader's {type(sampler).__name__} gives rank "
            f"{getattr(sampler, 'rank', '?')} of {replicas} its share only: fit on the whole "
            "training data (a DataLoader without it, or a rootclad.data reader, whose rank and "
            "world_size Standardize.fit reads past), so that every rank gets the same constants"
        )


_NO_TARGET = "rootclad_no_target_"


def _rdataframe_reader(df, features):
    """A reader of ``features`` from the RDataFrame ``df`` (its filters and defines applied),
    one pass in order; the target is a constant column defined here (not the user's)."""
    from rootclad.data.rdataframe import from_rdataframe

    feats = [features] if isinstance(features, str) else list(features)
    return from_rdataframe(df.Define(_NO_TARGET, "0"), features=feats, target=_NO_TARGET,
                           shuffle=False, batch_size=4096)  # fmt: skip
