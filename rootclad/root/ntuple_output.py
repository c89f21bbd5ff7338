"""Scores written as an RNTuple: the TTree ``rootclad::score_tree`` writes, rewritten by
RDataFrame's Snapshot with its record (C++ headers do not write RNTuples: RNTupleWriter in a
macro's header crashed root.exe on the macro's second ``.x``)."""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path

from rootclad.data.cling import CLING_LOCK, import_root

FORMATS = ("auto", "ttree", "rntuple")


def output_format(fmt: str, file, tree: str) -> str:
    """``"ttree"`` or ``"rntuple"``: ``fmt``, or for ``"auto"`` the input's own."""
    if fmt not in FORMATS:
        raise ValueError(f"output_format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt != "auto":
        return fmt
    import uproot

    try:
        with uproot.open(file) as f:
            return "rntuple" if f.classname_of(tree) == "ROOT::RNTuple" else "ttree"
    except Exception:  # noqa: BLE001  (the scoring itself says what is wrong with the input)
        return "ttree"


@contextmanager
def written_as(fmt: str, output, out_tree: str, column: str):
    """The path C++ writes its scores' TTree to: ``output`` itself for ``"ttree"``; else a
    temporary file beside it, rewritten as the RNTuple ``out_tree`` into another and renamed
    to ``output`` (whole or not at all; both temporaries removed whatever happens)."""
    if fmt == "ttree":
        yield str(output)
        return
    out = Path(output)
    stem = f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    tree_file, ntuple_file = out.with_name(stem + ".ttree.root"), out.with_name(stem + ".root")
    try:
        yield str(tree_file)
        _rewrite(tree_file, ntuple_file, out_tree, column)
        os.replace(ntuple_file, out)
    finally:
        tree_file.unlink(missing_ok=True)
        ntuple_file.unlink(missing_ok=True)


def _rewrite(tree_file: Path, ntuple_file: Path, out_tree: str, column: str) -> None:
    root = import_root()
    with CLING_LOCK:
        options = root.RDF.RSnapshotOptions()
        options.fOutputFormat = root.RDF.ESnapshotOutputFormat.kRNTuple
        names = root.std.vector["std::string"]()
        names.push_back(column)
        root.RDataFrame(out_tree, str(tree_file)).Snapshot(
            out_tree, str(ntuple_file), names, options
        )
        src = root.TFile.Open(str(tree_file))
        record = src.Get("rootclad_scoring")
        title = str(record.GetTitle()) if record else None
        src.Close()
        if title is not None:  # score_files's record of what was scored
            dst = root.TFile.Open(str(ntuple_file), "UPDATE")
            root.TNamed("rootclad_scoring", title).Write()
            dst.Close()
