"""A table from an RDataFrame: its filters and defines applied, the needed columns written
once to a temporary file and read by a :class:`rootclad.data.TableIterator` (or, compiled, a
:class:`rootclad.data.CompiledTableIterator`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence

from rootclad.data.cling import import_root
from rootclad.data.compiled import CompiledTableIterator
from rootclad.data.errors import DataError
from rootclad.data.loader import _why
from rootclad.data.table import TableIterator


def from_rdataframe(df, *, features: str | Sequence[str], target: str,
                    weight: str | None = None, compiled: bool = False,
                    **kwargs) -> TableIterator:  # fmt: skip
    """A :class:`TableIterator` over an RDataFrame, its filters and defines applied
    (``compiled=True``: a :class:`rootclad.data.CompiledTableIterator`, read in C++).

    The needed columns are written once with RDataFrame's Snapshot to a temporary file, kept
    as long as the iterator lives, and read from there (epochs then cost no event loop)."""
    feats = [features] if isinstance(features, str) else list(features)
    columns = [*feats, target, *([weight] if weight else [])]
    tmpdir = tempfile.mkdtemp(prefix="rootclad-rdf-")
    path = os.path.join(tmpdir, "table.root")
    root = import_root()
    names = root.std.vector["std::string"]()
    for c in columns:
        names.push_back(c)
    try:
        df.Snapshot("table", path, names)
    except Exception as err:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise DataError(f"RDataFrame could not write the columns {columns}: {_why(err)}") from err
    cls = CompiledTableIterator if compiled else TableIterator
    try:
        it = cls(path, tree="table", features=feats, target=target, weight=weight,
                           **kwargs)  # fmt: skip
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    weakref.finalize(it, shutil.rmtree, tmpdir, True)  # removed with the iterator
    return it
