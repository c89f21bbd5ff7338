"""``rootclad::Model`` in PyROOT and as RDataFrame columns, with no per-event Python."""

from __future__ import annotations

import difflib
import hashlib
import operator
import os
from pathlib import Path

from rootclad.data.cling import CLING_LOCK, declare, declare_header, import_root
from rootclad.data.schema import check_column_name
from rootclad.ir.graph import CLASS_INDEX_LOSSES
from rootclad.paths import check_outputs
from rootclad.root import shipping
from rootclad.root.errors import ExportError, ScoringError, cpp_errors
from rootclad.root.ntuple_output import output_format as output_format_of
from rootclad.root.ntuple_output import written_as


def _stem(stem) -> str:
    stem = str(Path(stem).resolve())
    for ext in (".so", ".root"):
        if not os.path.exists(stem + ext):
            raise FileNotFoundError(f"{stem}{ext}: no such file (write it with cm.export)")
    return stem


def _model_class():
    declare_header("model.h")
    root = import_root()
    cls = root.rootclad.Model
    with CLING_LOCK:
        if not getattr(cls, "_rootclad_sizes_checked", False):
            _check_array_sizes(cls)
            _raise_export_errors(cls)
            cls._rootclad_sizes_checked = True
    return cls


def _raise_export_errors(cls) -> None:
    """``rootclad.Model(stem)`` and ``m.load(path)`` from Python: a file C++ refuses (a stale
    library, damaged weights) raises :class:`ExportError` with rootclad's message, not
    cppyy's exception listing the C++ overloads it tried with that message inside."""
    init, load_weights = cls.__init__, cls.load

    def __init__(self, *args):
        with cpp_errors(ExportError):
            init(self, *args)

    def load(self, *args):
        with cpp_errors(ExportError):
            return load_weights(self, *args)

    load.__doc__ = getattr(load_weights, "__doc__", None)
    cls.__init__, cls.load = __init__, load


# Per method, what each argument before and after the batch size B (always the third) must
# hold: "in" B * input_size values, "dx" as many (the input gradient), "out" B * output_size,
# "y" the targets of B samples, "w" B weights or none (a null pointer: every weight 1), None no
# check (the optimizer).
_ARRAY_ARGS = {
    "predict": ("in", "out"),
    "input_grad": ("in", "dx"),
    "loss": ("in", "y"),
    "loss_and_grad": ("in", "y", "w"),
    "train_step": ("in", "y", None, "w"),
}
_ARRAY_NAMES = {
    "in": "input",
    "dx": "input gradient",
    "out": "output",
    "y": "target",
    "w": "weight",
}


def _check_array_sizes(cls) -> None:
    """From Python, arrays reach ``rootclad::Model`` as bare pointers: a batch size larger than
    the arrays given would read or write past them, a null pointer crashed the process. Check
    numpy arrays, RVecs and vectors against B first, refuse null pointers (``ROOT.nullptr``,
    None, 0) where an array is needed, and raise ValueError naming the method and the array."""

    def wrap(name, kinds):
        cxx = getattr(cls, name)

        def method(self, *args):
            if len(args) > 2:
                _check_batch(self, name, kinds, args)
            return cxx(self, *args)

        method.__name__ = name
        method.__doc__ = getattr(cxx, "__doc__", None)
        setattr(cls, name, method)

    for name, kinds in _ARRAY_ARGS.items():
        wrap(name, kinds)


def _is_null(array) -> bool:
    if array is None or array is import_root().nullptr:
        return True
    return isinstance(array, int) and array == 0


def _check_batch(model, method: str, kinds, args) -> None:
    arrays = [a for i, a in enumerate(args) if i != 2]
    for kind, array in zip(kinds, arrays, strict=False):
        if kind not in (None, "w") and _is_null(array):
            raise ValueError(
                f"rootclad.Model.{method}: the {_ARRAY_NAMES[kind]} array is a null pointer"
            )
    try:
        B = operator.index(args[2])
    except TypeError:
        return  # not a batch size: C++ overload resolution refuses the call
    per = {
        "in": model.input_size(),
        "dx": model.input_size(),
        "out": model.output_size(),
        "w": 1,
        "y": 1 if str(model.loss()) in CLASS_INDEX_LOSSES else model.output_size(),
    }
    for kind, array in zip(kinds, arrays, strict=False):
        if kind is None or _is_null(array):
            continue
        size = getattr(array, "size", None)
        if not isinstance(size, int):
            try:
                size = len(array)
            except TypeError:
                continue  # a bare pointer: nothing to check
        need = B * per[kind]
        if size < need:
            raise ValueError(
                f"rootclad.Model.{method}: a batch of {B} needs {need} {_ARRAY_NAMES[kind]} "
                f"values, the array given holds {size}"
            )


def load(stem):
    """``ROOT.rootclad.Model`` for the exported files ``STEM.so`` / ``STEM.root``.

    Files C++ refuses (a stale library, damaged weights, tensors of other shapes) raise
    :class:`ExportError`, rootclad's message naming the file."""
    stem = _stem(stem)
    cls = _model_class()
    with CLING_LOCK:
        return cls(stem)


def _slots(stem: str) -> str:
    """A C++ global pointer to a ``rootclad::SlotModels`` for ``stem``: one Model per
    processing slot, for Define expressions (``(*name)[rdfslot_]``).

    Named by a hash of the stem, the slot count and the files' identity (inode, size,
    modification time), so weights written after a first use (a macro's training) are read.
    The stem reaches C++ as a value through PyROOT, never as source text: a path may hold any
    character. The files are checked first through Python (a stale library raises here, not
    inside Cling)."""
    _cached_model(stem)
    root = import_root()
    n = max(1, int(root.ROOT.GetThreadPoolSize()))
    files = _identity(stem)
    name = "rootclad_slots_" + hashlib.sha256(f"{stem}:{n}:{files}".encode()).hexdigest()[:16]
    with CLING_LOCK:
        declare(f"rootclad::SlotModels* {name} = nullptr;\n")
        if not getattr(root, name):
            with cpp_errors(ExportError):
                slots = root.rootclad.SlotModels(stem, n)
            root.SetOwnership(slots, False)  # lives as long as the process, as Cling's globals
            setattr(root, name, slots)
    return name


def _names(cols) -> str:
    """A C++ global holding the columns' names, comma-separated, for the messages of a wrong
    event: set as a value through PyROOT (RDataFrame rewrites column names even inside a
    string literal of a Define's text)."""
    text = ",".join(cols)
    name = "rootclad_columns_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    root = import_root()
    with CLING_LOCK:
        declare(f"std::string {name};\n")
        if not str(getattr(root, name)):  # set once: an event loop may be reading it
            setattr(root, name, text)
    return f"{name}.c_str()"


_NUMBERS = {
    "bool",
    "char",
    "signed char",
    "unsigned char",
    "short",
    "unsigned short",
    "int",
    "unsigned int",
    "long",
    "unsigned long",
    "long long",
    "unsigned long long",
    "float",
    "double",
    "Bool_t",
    "Char_t",
    "UChar_t",
    "Short_t",
    "UShort_t",
    "Int_t",
    "UInt_t",
    "Long_t",
    "ULong_t",
    "Long64_t",
    "ULong64_t",
    "Float_t",
    "Double_t",
    "Float16_t",
    "Double32_t",
    "int8_t",
    "uint8_t",
    "int16_t",
    "uint16_t",
    "int32_t",
    "uint32_t",
    "int64_t",
    "uint64_t",
}


def _element_type(type_name: str) -> str | None:
    """``float`` for ``ROOT::VecOps::RVec<float>``, ``vector<Float_t>``...; None otherwise."""
    t = type_name.replace("ROOT::VecOps::", "").replace("ROOT::", "").replace("std::", "")
    for head in ("RVec<", "vector<"):
        if t.startswith(head) and t.endswith(">"):
            inner = t[len(head) : -1].strip()
            return inner if inner in _NUMBERS else None
    return None


def stored_columns(stem: str) -> list[str]:
    """The input columns an export stores (``cm.export(stem, schema=...)``); [] without."""
    return [str(c) for c in _cached_model(stem).input_columns()]


def columns_of(stem: str, inputs, what: str):
    """``inputs`` as given (checked against the export's schema, when it has one), or the
    schema's columns when ``inputs`` is None."""
    stored = stored_columns(stem)
    if inputs is None:
        if not stored:
            raise ValueError(
                f"{what}: the model {stem} stores no input columns (exported without a schema): "
                "pass inputs=, or export it with cm.export(stem, schema=...)"
            )
        return stored
    given = [inputs] if isinstance(inputs, str) else [str(c) for c in inputs]
    if stored and given != stored:
        raise ValueError(
            f"{what}: inputs {given} differ from the columns the model {stem} was exported "
            f"with, {stored} (names and order); leave inputs= out to use those"
        )
    return inputs


def _input_expr(df, inputs, stem: str, what: str, names_of=_names) -> str:
    """The C++ expression handing one event's input to ``Model::score``/``saliency``, after
    checking the columns' types (and, for a list of columns, their number) in Python, so that
    a mistake names the column instead of failing in Cling's compilation of the Define.
    ``names_of`` gives the C++ expression of the columns' names for the messages of a wrong
    event (a distributed RDataFrame's: :func:`shipping.names_expr`)."""
    inputs = columns_of(stem, inputs, what)
    n_in = int(_cached_model(stem).input_size())
    names = [str(c) for c in df.GetColumnNames()]
    if not isinstance(inputs, str) and len(inputs) == 1 and inputs[0] in names:
        # one array column holding the whole input: read it as such (a float RVec without a
        # copy); one number column goes through the list's conversion below
        if _element_type(str(df.GetColumnType(inputs[0]))) is not None:
            inputs = inputs[0]
    cols = [inputs] if isinstance(inputs, str) else list(inputs)
    if not cols:
        raise ValueError(f"{what}: no input columns given")
    for c in cols:
        if c not in names:
            close = difflib.get_close_matches(c, names, n=3, cutoff=0.5)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise ValueError(f"{what}: no column '{c}' in the RDataFrame{hint}")
        try:
            check_column_name(c)
        except ValueError as err:
            raise ValueError(f"{what}: {err}") from None
    if isinstance(inputs, str):
        type_name = str(df.GetColumnType(inputs))
        element = _element_type(type_name)
        if element is None:
            raise ValueError(
                f"{what}: column '{inputs}' holds {type_name}; one input column must hold the "
                f"whole input ({n_in} numbers per event: an array, vector or RVec), or pass a "
                "list of columns (numbers and arrays, concatenated in order)"
            )
        if element in ("float", "Float_t", "double", "Double_t") and "RVec" in type_name:
            return f"rootclad::checked_event({inputs}, {n_in}, rdfentry_, {names_of(cols)})"
        return f"rootclad::event_input({n_in}, rdfentry_, {names_of(cols)}, {inputs})"  # converted
    arrays = 0
    for c in cols:
        type_name = str(df.GetColumnType(c))
        if type_name.replace("std::", "") in _NUMBERS:
            continue
        if _element_type(type_name) is None:
            raise ValueError(
                f"{what}: column '{c}' holds {type_name}; a list of input columns takes "
                "numbers and arrays of numbers (RVec, vector or fixed-size)"
            )
        arrays += 1
    if not arrays and len(cols) != n_in:
        raise ValueError(
            f"{what}: {len(cols)} input columns {cols}; the model {stem} takes {n_in} values"
        )
    return f"rootclad::event_input({n_in}, rdfentry_, {names_of(cols)}, {', '.join(cols)})"


def model_files(stem: str) -> list[str]:
    """The export's own files, which no output may be: ``STEM.so`` and ``STEM.root``."""
    return [stem + ".so", stem + ".root"]


def _define(df, stem, inputs, column: str, method: str, what: str):
    check_column_name(column, f"{what}: column", dotted=False)
    stem = _stem(stem)
    if shipping.backend_of(df) is None:
        expr = _input_expr(df, inputs, stem, what)
        return df.Define(column, f"(*{_slots(stem)})[rdfslot_].{method}({expr})")
    expr = _input_expr(df, inputs, stem, what, names_of=shipping.names_expr)
    return df.Define(column, f"{shipping.model_expr(df, stem, what)}.{method}({expr})")


def define_score(df, stem, inputs=None, column: str = "score"):
    """``df`` with a column ``column``: the model's (first) output for each event.

    ``inputs`` defaults to the columns stored with the export (``cm.export(stem,
    schema=...)``); given, it must name those (checked), or, for an export without a schema,
    one column holding the whole input (an ``RVec``, ``std::vector`` or fixed-size
    array of numbers) or a list of columns, numbers and arrays, concatenated in that order (the
    readers' feature lists); a wrong column type or count raises ValueError naming the columns,
    an event of another length raises from the event loop naming its entry (``rdfentry_``) and
    each column's length. NaN inputs give NaN scores, as in torch. Works under
    ``ROOT.EnableImplicitMT()`` (one model per processing slot), and on a distributed
    RDataFrame (``ROOT.RDataFrame(tree, files, executor=dask_client)``): the export is shipped
    to the workers and opened once in each (``rootclad.root.shipping``, docs/distributed.md)."""
    return _define(df, stem, inputs, column, "score", "define_score")


def define_saliency(df, stem, inputs=None, column: str = "saliency"):
    """``df`` with a column ``column``: d(output) / d(input) per event, for a one-output model
    (``RVec<float>`` for a float input column, ``RVec<double>`` for a list of columns);
    ``inputs`` and a distributed ``df`` as :func:`define_score`'s."""
    return _define(df, stem, inputs, column, "saliency", "define_saliency")


def score_tree(
    file,
    stem,
    inputs=None,
    tree: str = "events",
    output=None,
    out_tree: str = "scores",
    column: str = "score",
    batch_size: int | None = None,
    output_format: str = "auto",
) -> Path:
    """Score every entry of the TTree or RNTuple ``tree`` in batches (C++:
    ``rootclad::score_tree``) and write the scores, entry by entry, to the TTree ``out_tree``
    of ``output`` (default ``<file>_scores.root``): a friend of an input TTree
    (``t.AddFriend(out_tree, output)``). ``output_format``: ``"auto"`` writes an RNTuple when
    the input is one (RDataFrame joins the two by entry: ``AddFriend`` is a TTree's), else a
    TTree; ``"ttree"`` or ``"rntuple"`` choose.
    ``inputs`` defaults to the columns stored with the export (checked when given, as
    :func:`define_score`'s): one branch holding the whole input (``float[N]``,
    ``vector<float>``) or a list of branches, numbers and arrays concatenated in order.
    ``batch_size`` defaults to the batch whose activations fill about 4 MB
    (``rootclad::Model::cache_batch``: 12 per thread for the GW CNN, 256 for the MLP).

    ``column`` must be an identifier, and ``output`` may not be the input or the model's own
    files (ValueError, before anything is written). A file that cannot be scored raises
    :class:`ScoringError`, an export that cannot be opened :class:`ExportError`."""
    check_column_name(column, "score_tree: column", dotted=False)
    stem = _stem(stem)
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such file")
    output = Path(output) if output else file.with_name(file.stem + "_scores.root")
    check_outputs(inputs=[file], outputs=[output], model_files=model_files(stem), what="score_tree")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    inputs = columns_of(stem, inputs, "score_tree")
    model = _cached_model(stem)  # declares model.h too
    root = import_root()
    if not isinstance(inputs, str):
        names = root.std.vector["std::string"]()
        for c in inputs:
            names.push_back(str(c))
        inputs = names
    fn = root.rootclad.score_tree
    fn.__release_gil__ = True
    fmt = output_format_of(output_format, file, tree)
    with cpp_errors(ScoringError), written_as(fmt, output, out_tree, column) as written:
        fn(model, str(file), tree, inputs, written, out_tree, column, int(batch_size or 0))
    return output


_MODELS: dict = {}


def _identity(stem: str) -> tuple:
    """What tells the export's files from others put in their place: device, inode, size and
    modification time of ``STEM.so`` and ``STEM.root`` (a replacement by rename is a new inode,
    one in place a new time, and mostly a new size, as two writes within a clock tick share
    their time)."""
    stats = [os.stat(stem + ext) for ext in (".so", ".root")]
    return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)


def _cached_model(stem: str):
    """One open Model per exported stem, opened again when its files change (opening reads
    the weights and checks the library: ~0.1 s for a 541k-parameter model)."""
    key = (stem, _identity(stem))
    with CLING_LOCK:
        if key not in _MODELS:
            for old in [k for k in _MODELS if k[0] == stem]:
                del _MODELS[old]
            _MODELS[key] = load(stem)
        return _MODELS[key]
