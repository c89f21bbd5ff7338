"""What the uproot readers need of a TTree or an RNTuple: its columns' names and layouts,
its entry count, the entries where its baskets (TTree) or clusters (RNTuple) start, and a
column's values for a range of entries. ``tree=`` of every reader names either; errors
still say ``tree '<name>'`` (the one format of :class:`rootclad.data.DataError`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rootclad.data.errors import DataError


@dataclass(frozen=True)
class Layout:
    """What one column holds per entry: numbers of ``dtype`` (None: not numbers), ``width``
    of them when fixed (a scalar: 1 and ``scalar``; None: a vector of any length, known per
    entry) or ``dims`` axes of a multi-dimensional array; ``text`` says it in the file's
    words for messages."""

    dtype: np.dtype | None
    width: int | None
    scalar: bool
    text: str
    dims: int = 1


class Columns:
    """A TTree or an RNTuple of one file, opened with uproot."""

    def __init__(self, obj):
        import uproot

        self.obj = obj
        self.is_ntuple = isinstance(obj, uproot.behaviors.RNTuple.RNTuple)

    def keys(self) -> list[str]:
        return list(self.obj.keys())

    @property
    def num_entries(self) -> int:
        return int(self.obj.num_entries)

    def offsets(self, name: str) -> np.ndarray:
        """The first entry of each basket of ``name`` (TTree) or of each cluster (RNTuple),
        and the entry count last."""
        if not self.is_ntuple:
            return np.asarray(self.obj[name].entry_offsets, dtype=np.int64)
        starts = [int(c.num_first_entry) for c in self.obj.cluster_summaries]
        return np.asarray([*starts, self.num_entries] if starts else [0, 0], dtype=np.int64)

    def array(self, name: str, start: int, stop: int, library: str = "ak"):
        return self.obj[name].array(entry_start=start, entry_stop=stop, library=library)

    def layout(self, name: str) -> Layout:
        return self._ntuple_layout(name) if self.is_ntuple else self._tree_layout(name)

    def _tree_layout(self, name: str) -> Layout:
        import uproot

        interp = self.obj[name].interpretation
        if isinstance(interp, uproot.interpretation.numerical.AsDtype):
            dt = interp.to_dtype
            base = dt.subdtype[0] if dt.subdtype is not None else dt
            if base.kind in "biuf":
                width = int(np.prod(dt.shape)) if dt.shape else 1
                return Layout(base, width, not dt.shape, str(interp), max(1, len(dt.shape)))
        if isinstance(interp, uproot.interpretation.jagged.AsJagged):
            content = getattr(interp.content, "to_dtype", None)
            if content is not None and content.kind in "biuf":
                return Layout(content, None, False, str(interp))
        return Layout(None, None, False, str(interp))

    def _ntuple_layout(self, name: str) -> Layout:
        import awkward as ak

        field = self.obj[name]
        text = field.typename
        form = field.to_akform()[0].contents[0]
        width, dims = 1, 0
        while isinstance(form, ak.forms.RegularForm):  # std::array<T, n>, nested
            width, dims, form = width * form.size, dims + 1, form.content
        if isinstance(form, ak.forms.NumpyForm) and not form.inner_shape:
            dtype = np.dtype(form.primitive)
            if dtype.kind in "biuf":
                return Layout(dtype, width, dims == 0, text, max(1, dims))
        if dims == 0 and isinstance(form, ak.forms.ListOffsetForm | ak.forms.ListForm):
            content = form.content
            if isinstance(content, ak.forms.NumpyForm) and not content.inner_shape:
                dtype = np.dtype(content.primitive)
                if dtype.kind in "biuf" and form.parameters.get("__array__") != "string":
                    return Layout(dtype, None, False, text)
        return Layout(None, None, False, text)


def open_columns(path: str, name: str) -> Columns:
    """The TTree or RNTuple ``name`` of the ROOT file ``path``, read with uproot (no array
    cache: an epoch must read the file, and memory stays bounded); DataError naming the file
    and the name when the file, or a TTree or RNTuple of that name, cannot be opened."""
    import os

    import uproot

    if not os.path.exists(path):
        raise DataError("file not found", file=path)
    kinds = (uproot.behaviors.TTree.TTree, uproot.behaviors.RNTuple.RNTuple)
    try:
        f = uproot.open(path, array_cache=None)
    except Exception as err:
        raise DataError(f"cannot open as a ROOT file ({why(err)})", file=path) from err
    try:
        obj = f[name]
    except KeyError as err:
        raise DataError("no such tree in the file", file=path, tree=name) from err
    except Exception as err:
        raise _unreadable(err, path, name) from err
    if not isinstance(obj, kinds):
        raise DataError(
            f"'{name}' is a {f.classname_of(name)}, not a TTree or an RNTuple",
            file=path,
            tree=name,
        )
    try:
        obj.keys(), obj.num_entries  # an RNTuple's header and footer are read here, not above
    except Exception as err:
        raise _unreadable(err, path, name) from err
    return Columns(obj)


def _unreadable(err: Exception, path: str, name: str) -> DataError:
    return DataError(
        f"cannot read the tree ({why(err)}); the file may be truncated or corrupt",
        file=path,
        tree=name,
    )


def why(err: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__
