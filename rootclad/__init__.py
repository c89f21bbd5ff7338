"""rootclad: compile PyTorch models to C++ whose backward pass is written by a compiler.

>>> cm = rootclad.compile(net, example_input=x, loss="bce_with_logits")
>>> loss = cm.train_step(x, y, rootclad.optim.Adam(cm, lr=1e-3))
"""

from __future__ import annotations

from pathlib import Path

from rootclad import optim
from rootclad.compiler import compile, engines_available

__version__ = "0.1.0"
__all__ = ["compile", "engines_available", "get_include", "optim", "__version__"]


def get_include() -> str:
    """The directory to put on the include path for ``#include "rootclad/kernels.h"``."""
    return str(Path(__file__).resolve().parent / "include")
