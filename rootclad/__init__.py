"""rootclad: compile PyTorch models to C++ whose backward pass is written by a compiler.

>>> cm = rootclad.compile(net, example_input=x, loss="bce_with_logits")
>>> loss = cm.train_step(x, y, rootclad.optim.Adam(cm, lr=1e-3))
>>> result = rootclad.fit(cm, opt, batches, epochs=20, validation=val, patience=3)

Submodules are imported on first use, so ``import rootclad.gw`` does not load torch.
"""

from __future__ import annotations

import importlib

from rootclad.paths import get_include
from rootclad.version import __version__

__all__ = ["compile", "data", "engines_available", "fit", "get_include", "load", "onnx", "optim",
           "root", "__version__"]  # fmt: skip
_SUBMODULES = ("data", "onnx", "optim", "root")

_LAZY = {
    "compile": "rootclad.compiler",
    "engines_available": "rootclad.compiler",
    "fit": "rootclad.torch.fit",
    "load": "rootclad.compiler",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:  # rootclad.root.define_score(...) after a plain import rootclad
        value = importlib.import_module(f"rootclad.{name}")
    else:
        raise AttributeError(f"module 'rootclad' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_LAZY, *_SUBMODULES])
