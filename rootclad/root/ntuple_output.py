"""Scores written as an RNTuple: the TTree ``rootclad::score_tree`` writes, rewritten by
RDataFrame's Snapshot with its record (C++ headers do not write RNTuples: RNTupleWriter in a
macro's header crashed root.exe on the macro's second ``.x``)."""

from __future__ import annotations

import os
import uuid
import warnings
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
    except uproot.KeyInFileError:  # no such tree: the scoring names it
        return "ttree"
    except Exception as err:  # noqa: BLE001  (the scoring itself says what is wrong with it)
        warnings.warn(
            f"{file}: cannot tell whether '{tree}' is an RNTuple ({err}); the scores are "
            "written as a TTree",
            stacklevel=3,
        )
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
    """The scores' TTree as an RNTuple with its record, checked before it may be renamed: uproot
    writes it (one writer in entry order: RDataFrame's Snapshot under ImplicitMT writes clusters
    in the order threads finish them), PyROOT adds the TNamed record."""
    import uproot

    with uproot.open(tree_file) as f:
        scores = f[out_tree][column].array(library="np")
    with uproot.recreate(ntuple_file) as f:
        f.mkrntuple(out_tree, {column: scores})
    root = import_root()
    with CLING_LOCK:
        keep = root.TDirectory.TContext()  # the caller's current directory, theirs again after
        try:
            src = root.TFile.Open(str(tree_file))
            record = src.Get("rootclad_scoring")
            title = str(record.GetTitle()) if record else None
            src.Close()
            if title is not None:  # score_files's record of what was scored
                dst = root.TFile.Open(str(ntuple_file), "UPDATE")
                if not dst or dst.IsZombie():
                    raise OSError(f"cannot add the scoring record to {ntuple_file}")
                root.TNamed("rootclad_scoring", title).Write()
                dst.Close()
                if dst.TestBit(root.TFile.kWriteError):
                    raise OSError(f"cannot write the scoring record to {ntuple_file}")
        finally:
            del keep
    with uproot.open(ntuple_file) as f:  # what will be renamed into place, read back
        ok = f.classname_of(out_tree) == "ROOT::RNTuple" and f[out_tree].num_entries == len(scores)
        ok = ok and (title is None or "rootclad_scoring" in f)
    if not ok:
        raise OSError(f"the scores rewritten as an RNTuple in {ntuple_file} do not read back")
