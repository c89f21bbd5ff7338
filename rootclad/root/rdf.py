"""``rootclad::Model`` in PyROOT and as RDataFrame columns, with no per-event Python."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rootclad.data.cling import CLING_LOCK, declare, declare_header, import_root


def _stem(stem) -> str:
    stem = str(Path(stem).resolve())
    for ext in (".so", ".root"):
        if not os.path.exists(stem + ext):
            raise FileNotFoundError(f"{stem}{ext}: no such file (write it with cm.export)")
    return stem


def _model_class():
    declare_header("model.h")
    root = import_root()
    return root.rootclad.Model


def load(stem):
    """``ROOT.rootclad.Model`` for the exported files ``STEM.so`` / ``STEM.root``.

    C++ exceptions (a stale library, weights of other shapes) surface as Python exceptions."""
    stem = _stem(stem)
    cls = _model_class()
    with CLING_LOCK:
        return cls(stem)


def _slots(stem: str) -> str:
    """A C++ global ``rootclad::SlotModels`` for ``stem``: one Model per processing slot.

    Named by the stem, the slot count and the files' modification times, so weights written
    after a first use (a macro's training) are read. The files are checked first through
    Python (a stale library raises here, not inside Cling's declaration)."""
    _cached_model(stem)
    n = max(1, int(import_root().ROOT.GetThreadPoolSize()))
    times = [os.stat(stem + ext).st_mtime_ns for ext in (".so", ".root")]
    name = "rootclad_slots_" + hashlib.sha256(f"{stem}:{n}:{times}".encode()).hexdigest()[:16]
    declare(f'auto& {name} = *new rootclad::SlotModels("{stem}", {n});\n')
    return name


def _input_expr(inputs, what: str) -> str:
    if isinstance(inputs, str):
        return inputs
    cols = list(inputs)
    if not cols:
        raise ValueError(f"{what}: no input columns given")
    return "ROOT::RVecD{" + ", ".join(f"(double){c}" for c in cols) + "}"


def define_score(df, stem, inputs, column: str = "score"):
    """``df`` with a column ``column``: the model's (first) output for each event.

    ``inputs`` is one column holding the whole input (``RVec<float>``/``RVec<double>``, a
    fixed-size array) or a list of numeric columns concatenated in that order. Works under
    ``ROOT.EnableImplicitMT()`` (one model per processing slot)."""
    slots = _slots(_stem(stem))
    return df.Define(column, f"{slots}[rdfslot_].score({_input_expr(inputs, 'define_score')})")


def define_saliency(df, stem, inputs, column: str = "saliency"):
    """``df`` with a column ``column``: d(output) / d(input) per event, for a one-output model
    (``RVec<float>`` for a float input column, ``RVec<double>`` for a list of columns)."""
    slots = _slots(_stem(stem))
    expr = _input_expr(inputs, "define_saliency")
    return df.Define(column, f"{slots}[rdfslot_].saliency({expr})")


def score_tree(
    file,
    stem,
    inputs: str = "strain",
    tree: str = "events",
    output=None,
    out_tree: str = "scores",
    column: str = "score",
    batch_size: int | None = None,
) -> Path:
    """Score every entry of ``tree`` in batches (C++: ``rootclad::score_tree``) and write the
    scores, entry by entry, to the TTree ``out_tree`` of ``output`` (default
    ``<file>_scores.root``): a friend of the input tree (``t.AddFriend(out_tree, output)``).
    ``inputs`` is one branch holding the whole input (``float[N]``, ``vector<float>``).
    ``batch_size`` defaults to the batch whose activations fill about 4 MB
    (``rootclad::Model::cache_batch``: 12 for the GW CNN, 256 for the MLP)."""
    stem = _stem(stem)
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such file")
    output = Path(output) if output else file.with_name(file.stem + "_scores.root")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    model = _cached_model(stem)  # declares model.h too
    fn = import_root().rootclad.score_tree
    fn.__release_gil__ = True
    fn(model, str(file), tree, inputs, str(output), out_tree, column, int(batch_size or 0))
    return output


_MODELS: dict = {}


def _cached_model(stem: str):
    """One open Model per exported stem, opened again when its files change (opening reads
    the weights and checks the library: ~0.1 s for a 541k-parameter model)."""
    key = (stem, *(os.stat(stem + ext).st_mtime_ns for ext in (".so", ".root")))
    with CLING_LOCK:
        if key not in _MODELS:
            for old in [k for k in _MODELS if k[0] == stem]:
                del _MODELS[old]
            _MODELS[key] = load(stem)
        return _MODELS[key]
