"""Where rootclad's files are (the directory to put on a compiler's include path), and the check
that what a command writes is not what it reads."""

from __future__ import annotations

import os
from pathlib import Path


def get_include() -> str:
    """The directory to put on the include path for ``#include "rootclad/kernels.h"``."""
    return str(Path(__file__).resolve().parent / "include")


def check_outputs(inputs, outputs) -> None:
    """Refuse to write: an output that is one of ``inputs`` (the same path, a link to it, or
    the same file under another name) or that another output also names. Raises ValueError
    naming both, before anything is written."""
    seen: dict[str, Path] = {}
    for path in map(Path, outputs):
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(f"{path} is written twice (also as {seen[real]}); choose other names")
        seen[real] = path
        for source in map(Path, inputs):
            if real == os.path.realpath(source) or (
                path.exists() and source.exists() and os.path.samefile(path, source)
            ):
                raise ValueError(
                    f"{path} would be written over the input {source}; choose another output"
                )
