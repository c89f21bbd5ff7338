"""Training batches streamed from RDataFrames: filters and defines applied, no copy to a file.

``from_rdataframe(df, ..., stream=True)`` (or a list of RDataFrames) returns a
:class:`RDataFrameStream`. Opening it runs each RDataFrame's event loop once, for the entry
numbers its filters pass; the plan of :mod:`rootclad.data.schedule` (shuffled blocks, a window
of blocks shuffled together, the validation split, ranks' shares) then works on those rows as
on a file's entries. A block is read by one event loop over the range of source entries that
holds its rows (``rootclad/data/rdf_stream.h``: the loop's range moved as ROOT's RDataLoader
moves it, each column taken by a typed Take, no JIT per block), and its rows must be the rows
the first pass found: a filter that passes other entries each time (a random one) is an
error, never a silently different epoch.
"""

from __future__ import annotations

import difflib
import re

import numpy as np

from rootclad.data.cling import CLING_LOCK, declare_header, import_root
from rootclad.data.columns import why as _why
from rootclad.data.errors import DataError
from rootclad.data.table import TableIterator

# The column types a stream reads: ROOT's spelling -> the C++ type it is taken as. Only these
# names (and containers of them built here) ever reach cppyy's templates.
_NUMBERS = {
    "float": "float",
    "Float_t": "float",
    "double": "double",
    "Double_t": "double",
    "int": "int",
    "Int_t": "int",
    "unsigned int": "unsigned int",
    "UInt_t": "unsigned int",
    "short": "short",
    "Short_t": "short",
    "unsigned short": "unsigned short",
    "UShort_t": "unsigned short",
    "long": "long",
    "Long_t": "long",
    "unsigned long": "unsigned long",
    "ULong_t": "unsigned long",
    "Long64_t": "Long64_t",
    "long long": "long long",
    "ULong64_t": "ULong64_t",
    "unsigned long long": "unsigned long long",
    "char": "char",
    "Char_t": "char",
    "unsigned char": "unsigned char",
    "UChar_t": "unsigned char",
    "bool": "bool",
    "Bool_t": "bool",
    "std::int8_t": "std::int8_t",
    "std::uint8_t": "std::uint8_t",
    "std::int16_t": "std::int16_t",
    "std::uint16_t": "std::uint16_t",
    "std::int32_t": "std::int32_t",
    "std::uint32_t": "std::uint32_t",
    "std::int64_t": "std::int64_t",
    "std::uint64_t": "std::uint64_t",
}
_CONTAINERS = {
    "ROOT::VecOps::RVec": "ROOT::VecOps::RVec",
    "ROOT::RVec": "ROOT::VecOps::RVec",
    "RVec": "ROOT::VecOps::RVec",
    "std::vector": "std::vector",
    "vector": "std::vector",
}
_CONTAINER = re.compile(r"^(?P<kind>[\w:]+)<\s*(?P<item>[\w: ]+?)\s*(?:,\s*(?P<n>\d{1,9})\s*)?>$")


def _column_type(type_name: str) -> tuple[str, str, bool] | None:
    """(kind, C++ type, integral) of an RDataFrame column type rootclad reads, else None."""
    name = type_name.strip()
    if name in _NUMBERS:
        cpp = _NUMBERS[name]
        return "scalar", cpp, cpp not in ("float", "double")
    m = _CONTAINER.match(name)
    if not m or m["item"].strip() not in _NUMBERS:
        return None
    item = _NUMBERS[m["item"].strip()]
    if m["kind"] == "std::array" and m["n"] is not None:
        return "array", f"std::array<{item}, {int(m['n'])}>", item not in ("float", "double")
    if m["kind"] in _CONTAINERS and m["n"] is None:
        return "array", f"{_CONTAINERS[m['kind']]}<{item}>", item not in ("float", "double")
    return None


class RDataFrameStream(TableIterator):
    """Shuffled batches ``(x, y)`` or ``(x, y, w)`` from one or more RDataFrames, read from
    their event loops (see the module's text). Arguments as :class:`TableIterator`'s, the
    files being the RDataFrames; a block (one event loop) is whole clusters of the source, as
    many as stay within ``block_size`` passing rows (default 8192), or one larger cluster.
    Single-threaded loops only (ImplicitMT off: see rootclad/data/rdf_stream.h)."""

    def __init__(self, dataframes, *, features, target, weight=None, block_size=8192, **kwargs):
        if not isinstance(dataframes, (list, tuple)):
            dataframes = [dataframes]
        self._dfs = list(dataframes)
        n = len(self._dfs)
        names = ["RDataFrame"] if n == 1 else [f"RDataFrame {i}" for i in range(n)]
        super().__init__(
            names,
            features=features,
            target=target,
            weight=weight,
            block_size=block_size,
            tree=None,
            **kwargs,
        )

    # -- opening -----------------------------------------------------------------------------
    def _open(self):
        root = import_root()
        if root.IsImplicitMTEnabled():
            raise DataError(
                "cannot stream while ROOT's ImplicitMT is on: a multi-threaded event loop's "
                "rdfentry_ numbers entries in the order threads take them, so a block's rows "
                "cannot be put in entry order; call ROOT.DisableImplicitMT() first, or use "
                "from_rdataframe(df, ...) without stream=True",
                file=self.files[0],
            )
        with CLING_LOCK:
            declare_header("data/rdf_stream.h")
        self._nodes, self._accepted, self._types = [], [], None
        self._source_entries: list[int] = []
        self._columns_by_df: list[list] = []
        offsets, entries = [], []
        names = [*self.features, self.target, *([self.weight] if self.weight else [])]
        for label, df in zip(self.files, self._dfs, strict=True):
            node = root.RDF.AsRNode(df)
            for c in names:
                if not df.HasColumn(c):
                    known = [str(k) for k in df.GetColumnNames()]
                    close = difflib.get_close_matches(c, known, n=3, cutoff=0.5)
                    hint = f"; close matches: {', '.join(close)}" if close else ""
                    raise DataError(f"no such column{hint}", file=label, branch=c)
            if str(root.Internal.RDF.GetDataSourceLabel(node)) == "EmptyDS":
                raise DataError(
                    "an RDataFrame over no data source (RDataFrame(n)) cannot be streamed "
                    "block by block: use from_rdataframe(df, ...) without stream=True",
                    file=label,
                )
            types = [
                self._checked_type(df, label, c, i < len(self.features))
                for i, c in enumerate(names)
            ]
            if self._types is None:
                self._types = types
            elif [(t[0], t[2]) for t in types] != [(t[0], t[2]) for t in self._types]:
                raise DataError(
                    f"column types {[t[1] for t in types]} differ from the first "
                    f"RDataFrame's {[t[1] for t in self._types]} (scalar or array, integral "
                    "or floating-point)",
                    file=label,
                )
            self._columns_by_df.append([self._make_column(t) for t in types])
            try:
                with CLING_LOCK:
                    first = root.rootclad.data.rdf_first_pass(node)
                accepted = np.array(first.accepted, dtype=np.uint64)
            except Exception as err:
                raise DataError(f"its event loop failed: {_why(err)}", file=label) from err
            self._source_entries.append(int(first.source_entries))
            self._nodes.append(node)
            self._accepted.append(accepted)
            m = len(accepted)
            # blocks of whole clusters (as files' blocks are of whole baskets): a cluster is
            # read and decompressed once per epoch, not once per block inside it
            starts = np.searchsorted(accepted, np.array(first.cluster_starts, dtype=np.uint64))
            offsets.append(np.unique(np.concatenate([[0], starts, [m]]).astype(np.int64)))
            entries.append(m)
        self._widths = self._first_widths(names)
        self.length = sum(self._widths)
        self._starts = np.cumsum([0, *self._widths])
        self._target_dtype = np.int32 if self._types[len(self.features)][2] else np.float32
        return offsets, entries

    def _checked_type(self, df, label, column, feature: bool):
        type_name = str(df.GetColumnType(column))
        kind = _column_type(type_name)
        if kind is None or (not feature and kind[0] != "scalar"):
            found = f"found {type_name}"
            want = "numbers: a scalar, an array or a vector" if feature else "one number"
            raise DataError(f"expected {want} per entry, {found}", file=label, branch=column)
        return kind

    @staticmethod
    def _make_column(kind):
        root = import_root()
        shape, cpp, _ = kind
        if shape == "scalar":
            return root.rootclad.data.RDFScalarColumn[cpp]()
        return root.rootclad.data.RDFArrayColumn[cpp]()

    def _first_widths(self, names) -> list[int]:
        """Values per entry of each feature: 1 for a scalar, else the first accepted row's."""
        widths = []
        for i, _ in enumerate(self.features):
            widths.append(1 if self._types[i][0] == "scalar" else None)
        if None not in widths:
            return widths
        for f, accepted in enumerate(self._accepted):
            if len(accepted):
                entries, lengths, _ = self._read(f, 0, 1, names, None)
                self._check_entries(f, 0, 1, entries)
                return [
                    w if w is not None else int(n) for w, n in zip(widths, lengths, strict=True)
                ]
        raise DataError(
            "cannot tell the features' lengths: no RDataFrame passes any entry", file=self.files[0]
        )

    # -- reading -----------------------------------------------------------------------------
    def _read(self, f: int, start: int, stop: int, names, arrays):
        """One event loop over the source entries holding accepted rows [start, stop) of
        RDataFrame f: (the rows' entries, the first row's feature lengths, the block result)."""
        root = import_root()
        accepted = self._accepted[f]
        begin, end = int(accepted[start]), int(accepted[stop - 1]) + 1
        cols = root.std.vector["rootclad::data::RDFColumn*"]()
        for c in self._columns_by_df[f]:
            cols.push_back(c)
        cpp_names = root.std.vector["std::string"]()
        for n in names:
            cpp_names.push_back(n)
        widths = root.std.vector["long"]()
        if arrays is None:  # the lengths of the first row only
            for _ in self.features:
                widths.push_back(-1)
            x = y = w = None
            rows = -1
        else:
            x, y, w = arrays
            for n in self._widths:
                widths.push_back(int(n))
            rows = stop - start
        try:
            with CLING_LOCK:
                out = root.rootclad.data.read_rdf_block(
                    self._nodes[f],
                    begin,
                    end,
                    self._source_entries[f],
                    cols,
                    cpp_names,
                    widths,
                    x if x is not None else root.nullptr,
                    y if y is not None else root.nullptr,
                    w if w is not None else root.nullptr,
                    rows,
                )
        except Exception as err:
            raise DataError(
                f"its event loop failed: {_why(err)}", file=self.files[f], entry=begin
            ) from err
        entries = np.array(out.entries, dtype=np.uint64)
        return entries, list(out.first_lengths), out

    def _read_block(self, block, x, y, w=None):
        names = [*self.features, self.target, *([self.weight] if self.weight else [])]
        label = self.files[block.file]
        k = block.size
        yd = np.empty(k, np.float64)
        entries, _, out = self._read(block.file, block.start, block.stop, names, (x, yd, w))
        self._check_entries(block.file, block.start, block.stop, entries)
        if out.bad_row >= 0:
            name = self.features[out.bad_column]
            raise DataError(
                f"{out.bad_length} values where the first entry had {self._widths[out.bad_column]}",
                file=label,
                branch=name,
                entry=int(entries[out.bad_row]),
            )
        self._check_rows(x, yd, w, entries, label)
        y[...] = yd

    def _check_entries(self, f: int, start: int, stop: int, entries) -> None:
        want = self._accepted[f][start:stop]
        if len(entries) != len(want) or not np.array_equal(entries, want):
            raise DataError(
                f"the filters passed {len(entries)} entries of {int(want[0])}..{int(want[-1])} "
                f"where the first pass passed {len(want)}: an RDataFrame streamed must pass "
                "the same entries every time (a random filter cannot be streamed)",
                file=self.files[f],
            )

    def _check_rows(self, x, y, w, entries, label) -> None:
        if self.check_finite and not (np.isfinite(x.sum(axis=1)).all() and np.isfinite(x).all()):
            row, col = (int(v[0]) for v in np.nonzero(~np.isfinite(x)))
            name = self.features[int(np.searchsorted(self._starts, col, side="right")) - 1]
            raise DataError(
                f"non-finite value ({x[row, col]}) in a feature",
                file=label,
                branch=name,
                entry=int(entries[row]),
            )
        for what, values, column in (("target", y, self.target), ("weight", w, self.weight)):
            if values is not None and not np.isfinite(values).all():
                row = int(np.flatnonzero(~np.isfinite(values))[0])
                raise DataError(
                    f"non-finite {what} ({values[row]})",
                    file=label,
                    branch=column,
                    entry=int(entries[row]),
                )
