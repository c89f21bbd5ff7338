"""Reading GW datasets (ROOT files) into training batches.

- :class:`BatchIterator`: Python iterator over ``(x, y)`` batches, read with uproot;
- :class:`CompiledBatchIterator`: the same batches from the compiled C++ reader
  (``rootclad/include/rootclad/tree_reader.h``, needs ROOT);
- :class:`TableIterator`, :func:`from_rdataframe`: any numeric columns as features, a
  target and optional event weights, from files or an RDataFrame;
  :class:`CompiledTableIterator` reads the same with the C++ ``TableReader``;
- :class:`Schema`, :class:`Standardize`: the input columns stored with an export, and a
  preprocessing stage compiled into the model;
- :class:`DataError`: bad input, naming file, tree, branch and entry.

Names load lazily; ``import rootclad.data`` imports neither uproot nor ROOT.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BatchIterator": "loader",
    "CompiledBatchIterator": "compiled",
    "CompiledTableIterator": "compiled",
    "DataError": "errors",
    "Schema": "schema",
    "Standardize": "standardize",
    "TableIterator": "table",
    "from_rdataframe": "rdataframe",
    "declare": "cling",
    "include_dir": "cling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rootclad.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rootclad.data.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
