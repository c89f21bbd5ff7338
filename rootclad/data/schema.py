"""What a model reads, stored with it: :class:`Schema` (the input columns, their lengths and
order, the target, weight and class names) and :class:`Standardize`, a preprocessing stage
compiled into the model.

>>> it = from_rdataframe(df, features=["pt", "eta", "jets"], target="label", weight="w")
>>> net = nn.Sequential(Standardize.fit(it), nn.Linear(it.length, 16), ...)
>>> cm = rootclad.compile(net, torch.zeros(1, it.length))
>>> cm.export("build/net", schema=it.schema.replace(classes=["background", "signal"]))
>>> rootclad.root.define_score(df, "build/net")   # the columns come from the export

``cm.export(stem, schema=...)`` writes the schema into ``STEM.root``'s metadata; then
``define_score``, ``define_saliency``, ``score_tree`` and ``rootclad::Model::input_columns()``
read it, and columns given to them anyway are checked against it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

# A column a Define expression may name (RDataFrame finds the columns in the text): C++ names,
# or such names joined by dots (``a.b``). Anything else could be read as code.
COLUMN_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", re.ASCII)


def check_column_name(name, what: str = "column") -> str:
    if not isinstance(name, str) or not COLUMN_NAME.fullmatch(name):
        raise ValueError(
            f"{what} {name!r} is not a C++ name (letters, digits and _, or such names joined by "
            "dots); RDataFrame finds a Define's columns in the expression's text, so it cannot "
            "be used there safely: rename the branch"
        )
    return name


@dataclasses.dataclass(frozen=True)
class Schema:
    """The input of a model as columns of a TTree or RDataFrame, in order.

    ``columns``: a mapping ``{name: values per event}``, a list of ``(name, length)`` pairs, or
    a list of names (one number each). ``target`` and ``weight`` name the columns training
    read; ``classes`` name the output's classes (``["noise", "signal"]``: class 0, 1)."""

    columns: tuple[tuple[str, int], ...]
    target: str | None = None
    weight: str | None = None
    classes: tuple[str, ...] | None = None

    def __init__(self, columns, *, target=None, weight=None, classes=None):
        if isinstance(columns, Mapping):
            pairs = list(columns.items())
        elif isinstance(columns, str):
            pairs = [(columns, 1)]
        else:
            pairs = [(c, 1) if isinstance(c, str) else tuple(c) for c in columns]
        if not pairs:
            raise ValueError("a schema needs at least one input column")
        cols = []
        for pair in pairs:
            if len(pair) != 2:
                raise ValueError(f"schema column {pair!r}: expected (name, length)")
            name, length = pair
            check_column_name(name, "input column")
            if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
                raise ValueError(f"input column {name!r}: length {length!r} is not a count >= 1")
            cols.append((name, int(length)))
        names = [n for n, _ in cols]
        if len(set(names)) != len(names):
            raise ValueError(f"input columns repeat: {names}")
        for what, name in (("target", target), ("weight", weight)):
            if name is not None:
                check_column_name(name, f"{what} column")
        if classes is not None:
            if isinstance(classes, str) or not all(isinstance(c, str) for c in classes):
                raise ValueError(f"classes must be a list of names, got {classes!r}")
            classes = tuple(classes)
        object.__setattr__(self, "columns", tuple(cols))
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "classes", classes)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.columns]

    @property
    def lengths(self) -> list[int]:
        return [k for _, k in self.columns]

    @property
    def size(self) -> int:
        """Values per event: the model's input size."""
        return sum(self.lengths)

    def replace(self, **changes) -> Schema:
        """A copy with some fields changed: ``it.schema.replace(classes=["bkg", "sig"])``."""
        fields = {"columns": self.columns, "target": self.target, "weight": self.weight,
                  "classes": self.classes} | changes  # fmt: skip
        return Schema(fields.pop("columns"), **fields)

    def to_json(self) -> dict:
        return {
            "input_columns": self.names,
            "input_lengths": self.lengths,
            "target": self.target,
            "weight": self.weight,
            "classes": None if self.classes is None else list(self.classes),
        }

    @classmethod
    def from_json(cls, meta: dict) -> Schema | None:
        """The schema in an export's metadata, or None for an export written without one."""
        if not meta.get("input_columns"):
            return None
        return cls(list(zip(meta["input_columns"], meta["input_lengths"], strict=True)),
                   target=meta.get("target"), weight=meta.get("weight"),
                   classes=meta.get("classes"))  # fmt: skip

    @classmethod
    def of(cls, source) -> Schema:
        """``source`` itself, or the schema of a reader (``from_rdataframe``, the iterators)."""
        if isinstance(source, Schema):
            return source
        schema = getattr(source, "schema", None)
        if isinstance(schema, Schema):
            return schema
        raise TypeError(
            f"expected a rootclad.data.Schema or a reader with .schema, got {type(source).__name__}"
        )


class Standardize(nn.Module):
    """``(x - mean) / std``, a first layer whose constants are frozen parameters (``mean`` and
    ``std``: not trained, stored in the export's weights like any tensor), so the compiled
    model applies it in forward and its input gradients account for it.

    ``mean`` and ``std`` are a number or one value per input feature (the per-sample input
    shape). A feature that never varies (std 0) is divided by 1, as scikit-learn's
    StandardScaler does. Fit them with :meth:`fit` on the training data."""

    def __init__(self, mean, std):
        super().__init__()
        mean = torch.as_tensor(mean, dtype=torch.float64)
        std = torch.as_tensor(std, dtype=torch.float64)
        if mean.shape != std.shape:
            raise ValueError(f"mean {tuple(mean.shape)} and std {tuple(std.shape)} differ in shape")
        if not torch.isfinite(mean).all() or not torch.isfinite(std).all() or (std < 0).any():
            raise ValueError("mean and std must be finite, std not negative")
        std = torch.where(std == 0, torch.ones_like(std), std)
        dtype = torch.get_default_dtype()
        self.mean = nn.Parameter(mean.to(dtype), requires_grad=False)
        self.std = nn.Parameter(std.to(dtype), requires_grad=False)

    def forward(self, x):
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"features={self.mean.numel()}"

    @classmethod
    def fit(cls, data, features: Iterable[str] | None = None) -> Standardize:
        """Means and standard deviations (population: divided by N) of each input value, over
        ``data``:

        - a reader (``from_rdataframe``, ``TableIterator``, ``BatchIterator``...): one pass
          over its entries (its split: fit on the training split), summed in float64;
        - an RDataFrame and ``features`` (the readers' feature list): its filtered entries;
        - an array ``(N, *shape)`` (numpy or torch).

        The shape of the statistics is a batch's per-sample shape."""
        if features is not None:
            data = _rdataframe_reader(data, features)
        elif hasattr(data, "GetColumnNames"):
            raise TypeError("Standardize.fit(df, features=[...]): name the RDataFrame's columns")
        if isinstance(data, (np.ndarray, torch.Tensor)):
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
        if not n:
            raise ValueError("Standardize.fit: the data hold no entries")
        mean = total / n
        var = (sq / n - mean * mean).clamp_min(0)
        return cls(shift + mean, var.sqrt())


_NO_TARGET = "rootclad_no_target_"


def _rdataframe_reader(df, features):
    """A reader of ``features`` from the RDataFrame ``df`` (its filters and defines applied),
    one pass in order; the target is a constant column defined here (not the user's)."""
    from rootclad.data.rdataframe import from_rdataframe

    feats = [features] if isinstance(features, str) else list(features)
    return from_rdataframe(df.Define(_NO_TARGET, "0"), features=feats, target=_NO_TARGET,
                           shuffle=False, batch_size=4096)  # fmt: skip


def check_schema(schema: Schema, input_size: int, what: str) -> Schema:
    if schema.size != input_size:
        detail = ", ".join(f"{n} ({k})" for n, k in schema.columns)
        raise ValueError(f"{what}: the columns {detail} hold {schema.size} values per event; "
                         f"the model takes {input_size}")  # fmt: skip
    return schema


__all__ = ["Schema", "Standardize", "check_column_name", "check_schema"]
