"""Batches of any numeric TTree columns: features, a target and optional event weights.

:class:`TableIterator` reads with uproot, with the plan, shuffle, splits and multi-file
guarantees of :class:`rootclad.data.BatchIterator` (the same :mod:`rootclad.data.schedule`).
Features are scalar branches of any numeric type, fixed-size arrays and ``vector``/``RVec``
branches whose entries all have the same length, concatenated in the order given into one
float32 row per entry. The target is one number per entry: int32 if the branch holds
integers, float32 otherwise. ``from_rdataframe`` (:mod:`rootclad.data.rdataframe`) takes an
RDataFrame with its filters and defines, writes the columns it needs to a temporary file
(RDataFrame's Snapshot) and reads it with this.

>>> it = TableIterator("ttbar.root", tree="t", features=["jet_pt", "jet_eta", "met"],
...                    target="is_signal", weight="w", batch_size=512)
>>> for x, y, w in it: ...
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rootclad.data.columns import open_columns
from rootclad.data.columns import why as _why
from rootclad.data.errors import DataError
from rootclad.data.loader import _BatchIteratorBase


class TableIterator(_BatchIteratorBase):
    """Shuffled batches ``(x, y)`` or ``(x, y, w)`` from numeric columns of a TTree or an RNTuple, via uproot.

    ``x`` float32 (B, F), F the summed lengths of ``features``; ``y`` (B,) int32 or float32;
    ``w`` float32 (B,) when ``weight`` names a column. Other arguments as
    :class:`rootclad.data.BatchIterator`'s (``tree`` defaults to ``"events"``).
    """

    def __init__(self, files, *, features: str | Sequence[str], target: str,
                 weight: str | None = None, **kwargs):  # fmt: skip
        self.features = [features] if isinstance(features, str) else list(features)
        if not self.features:
            raise DataError("no feature columns given")
        if len(set(self.features)) != len(self.features):
            raise DataError(f"feature columns repeat: {self.features}")
        self.target = target
        self.weight = weight
        for bad in ("strain", "label", "length"):
            if bad in kwargs:
                raise TypeError(f"TableIterator takes features= and target=, not {bad}=")
        super().__init__(files, **kwargs)

    @property
    def schema(self):
        """The feature columns and their lengths, the target and the weight, for
        ``cm.export(stem, schema=...)``."""
        from rootclad.data.schema import Schema

        return Schema(list(zip(self.features, self._widths, strict=True)), target=self.target,
                      weight=self.weight)  # fmt: skip

    # -- the columns of a batch ------------------------------------------------------------
    def _columns(self):
        cols = [((self.length,), np.float32), ((), self._target_dtype)]
        if self.weight:
            cols.append(((), np.float32))
        return cols

    def _shape_batch(self, arrays):
        return arrays

    # -- opening -----------------------------------------------------------------------------
    def _open(self):
        self._trees, offsets, entries = [], [], []
        self._widths: list[int] | None = None
        self._target_dtype = None
        for path in self.files:
            tree = open_columns(path, self.tree)
            names = [*self.features, self.target, *([self.weight] if self.weight else [])]
            for name in names:
                if name not in tree.keys():
                    raise DataError("no such branch", file=path, tree=self.tree, branch=name)
            widths = [self._width(path, tree, name) for name in self.features]
            if self._widths is None:
                self._widths = widths
            elif widths != self._widths:
                raise DataError(
                    f"feature lengths {dict(zip(self.features, widths, strict=True))} differ "
                    f"from the first file's {dict(zip(self.features, self._widths, strict=True))}",
                    file=path, tree=self.tree,
                )  # fmt: skip
            kind = self._scalar_kind(path, tree, self.target)
            dtype = np.int32 if kind in "biu" else np.float32
            if self._target_dtype not in (None, dtype):
                raise DataError(
                    "the target is integral in one file and floating-point in another",
                    file=path, tree=self.tree, branch=self.target,
                )  # fmt: skip
            self._target_dtype = dtype
            if self.weight:
                self._scalar_kind(path, tree, self.weight)
            self._trees.append(tree)
            offsets.append(tree.offsets(self.features[0]))
            entries.append(tree.num_entries)
        self.length = sum(self._widths)
        self._starts = np.cumsum([0, *self._widths])
        return offsets, entries

    def _scalar_kind(self, path, tree, name) -> str:
        lay = tree.layout(name)
        if lay.dtype is None or not lay.scalar:
            raise DataError(
                f"expected one number per entry, found {lay.text}",
                file=path, tree=self.tree, branch=name,
            )  # fmt: skip
        return lay.dtype.kind

    def _width(self, path, tree, name) -> int:
        """Values per entry of a feature; a vector's from its first entry (checked per entry
        when read)."""
        lay = tree.layout(name)
        if lay.dtype is not None and lay.dims == 1:
            if lay.width is not None:
                return lay.width
            if tree.num_entries == 0:
                return 0
            return len(tree.array(name, 0, 1)[0])
        raise DataError(
            f"expected numbers: a scalar, a fixed-size array or a vector per entry, found "
            f"{lay.text}",
            file=path, tree=self.tree, branch=name,
        )  # fmt: skip

    # -- reading -----------------------------------------------------------------------------
    def _read_block(self, block, x, y, w=None):
        path = self.files[block.file]
        tree = self._trees[block.file]
        k = block.size

        def read(name):
            try:
                arr = tree.array(name, block.start, block.stop)
            except Exception as err:
                raise DataError(
                    f"cannot read the data ({_why(err)}); the file may be truncated or corrupt",
                    file=path, tree=self.tree, branch=name, entry=block.start,
                ) from err  # fmt: skip
            if len(arr) != k:
                raise DataError(f"read {len(arr)} entries where {k} were expected",
                                file=path, tree=self.tree, branch=name)  # fmt: skip
            return arr

        import awkward as ak

        for name, lo, width in zip(self.features, self._starts[:-1], self._widths, strict=True):
            arr = read(name)
            if arr.ndim > 1:
                counts = ak.to_numpy(ak.num(arr))
                wrong = np.flatnonzero(counts != width)
                if wrong.size:
                    raise DataError(
                        f"{counts[wrong[0]]} values where the first entry had {width}",
                        file=path, tree=self.tree, branch=name, entry=block.start + int(wrong[0]),
                    )  # fmt: skip
                arr = ak.flatten(arr)
            x[:, lo : lo + width] = ak.to_numpy(arr).reshape(k, width)
        self._check_finite(x, path, block, "a feature", self.features)
        target = ak.to_numpy(read(self.target))
        if self._target_dtype == np.int32:
            self._check_block(block, x[:, :0], target, branch=self.target)
        y[...] = target
        if not np.isfinite(y.astype(np.float64)).all():
            row = int(np.flatnonzero(~np.isfinite(y))[0])
            raise DataError(f"non-finite target ({y[row]})", file=path, tree=self.tree,
                            branch=self.target, entry=block.start + row)  # fmt: skip
        if w is not None:
            w[...] = ak.to_numpy(read(self.weight))
            if not np.isfinite(w).all():
                row = int(np.flatnonzero(~np.isfinite(w))[0])
                raise DataError(f"non-finite weight ({w[row]})", file=path, tree=self.tree,
                                branch=self.weight, entry=block.start + row)  # fmt: skip

    def _check_finite(self, x, path, block, what, names):
        if not self.check_finite or np.isfinite(x.sum(axis=1)).all() and np.isfinite(x).all():
            return
        row, col = (int(v[0]) for v in np.nonzero(~np.isfinite(x)))
        name = self.features[int(np.searchsorted(self._starts, col, side="right")) - 1]
        raise DataError(f"non-finite value ({x[row, col]}) in {what}", file=path,
                        tree=self.tree, branch=name, entry=block.start + row)  # fmt: skip
