"""Where rootclad's files are: the directory to put on a compiler's include path."""

from __future__ import annotations

from pathlib import Path


def get_include() -> str:
    """The directory to put on the include path for ``#include "rootclad/kernels.h"``."""
    return str(Path(__file__).resolve().parent / "include")
