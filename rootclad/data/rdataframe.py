"""A table from an RDataFrame: its filters and defines applied, the needed columns written
once to a temporary file and read by a :class:`rootclad.data.TableIterator` (or, compiled, a
:class:`rootclad.data.CompiledTableIterator`)."""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence

from rootclad.data.cling import import_root
from rootclad.data.columns import why as _why
from rootclad.data.compiled import CompiledTableIterator
from rootclad.data.errors import DataError
from rootclad.data.schema import check_column_name
from rootclad.data.table import TableIterator


def from_rdataframe(
    df,
    *,
    features: str | Sequence[str],
    target: str,
    weight: str | None = None,
    compiled: bool = False,
    stream: bool = False,
    **kwargs,
) -> TableIterator:
    """A :class:`TableIterator` over an RDataFrame, its filters and defines applied
    (``compiled=True``: a :class:`rootclad.data.CompiledTableIterator`, read in C++).

    ``stream=True``: batches read from the RDataFrame's event loop block by block, no copy
    (:class:`rootclad.data.rdf_stream.RDataFrameStream`; ``df`` may be a list of RDataFrames).

    The needed columns are written once with RDataFrame's Snapshot to a temporary file, kept
    as long as the iterator lives, and read from there (epochs then cost no event loop). A
    column the RDataFrame does not have is refused by name, with the close matches; bad values
    (a vector of another length, a non-finite weight) are reported with the column and the
    entry number of the RDataFrame (``rdfentry_``), never the temporary file. A column's name
    must be a C++ name (ValueError otherwise): the snapshot's leaf lists are made of them."""
    if stream:
        from rootclad.data.rdf_stream import RDataFrameStream

        if compiled:
            raise ValueError("stream=True reads in C++ already: compiled= does not apply")
        return RDataFrameStream(df, features=features, target=target, weight=weight, **kwargs)
    feats = [features] if isinstance(features, str) else list(features)
    columns = [*feats, target, *([weight] if weight else [])]
    # Snapshot writes each column with the leaf list "<name>/<type>": a name such as s[64]
    # would be read as 64 values from the address of one
    for what, c in [*(("feature", f) for f in feats), ("target", target), ("weight", weight)]:
        if c is not None:
            check_column_name(c, what)
    for c in columns:
        if not df.HasColumn(c):
            known = [str(name) for name in df.GetColumnNames()]
            close = difflib.get_close_matches(c, known, n=3, cutoff=0.5)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise DataError(f'Unknown column "{c}" in the RDataFrame{hint}')
    tmpdir = tempfile.mkdtemp(prefix="rootclad-rdf-")
    path = os.path.join(tmpdir, "table.root")
    root = import_root()
    names = root.std.vector["std::string"]()
    for c in [*columns, _ENTRY]:
        names.push_back(c)
    try:
        # a TTree whatever the source (an RNTuple source otherwise draws ROOT's warning that
        # its default may change)
        options = root.RDF.RSnapshotOptions()
        options.fOutputFormat = root.RDF.ESnapshotOutputFormat.kTTree
        df.Define(_ENTRY, "rdfentry_").Snapshot("table", path, names, options)
        import uproot

        with uproot.open(path) as f:
            entries = f["table"][_ENTRY].array(library="np")
    except Exception as err:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise DataError(f"RDataFrame could not write the columns {columns}: {_why(err)}") from err
    cls = _CompiledRDataFrameTable if compiled else _RDataFrameTable
    try:
        it = cls(path, tree="table", features=feats, target=target, weight=weight, **kwargs)
    except DataError as err:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise _in_rdataframe(err, entries) from None
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    it._rdf_entries = entries
    weakref.finalize(it, shutil.rmtree, tmpdir, True)  # removed with the iterator
    return it


_ENTRY = "rootclad_rdfentry_"  # the RDataFrame's entry number of each row of the snapshot


def _in_rdataframe(err: DataError, entries) -> DataError:
    """``err`` about the snapshot, said of the RDataFrame: its column and its entry number."""
    entry = None if err.entry is None else int(entries[err.entry])
    return DataError(err.what, file="RDataFrame", branch=err.branch, entry=entry)


class _FromRDataFrame:
    """Reading errors name the RDataFrame's column and entry, not the temporary file."""

    _rdf_entries = None

    def __iter__(self):
        try:
            yield from super().__iter__()
        except DataError as err:
            raise _in_rdataframe(err, self._rdf_entries) from None

    def read_all(self):
        try:
            return super().read_all()
        except DataError as err:
            raise _in_rdataframe(err, self._rdf_entries) from None


class _RDataFrameTable(_FromRDataFrame, TableIterator):
    pass


class _CompiledRDataFrameTable(_FromRDataFrame, CompiledTableIterator):
    pass
