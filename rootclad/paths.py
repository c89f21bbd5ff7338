"""Where rootclad's files are (the directory to put on a compiler's include path), and the check
that what a command writes is not what it reads."""

from __future__ import annotations

import os
from pathlib import Path


def get_include() -> str:
    """The directory to put on the include path for ``#include "rootclad/kernels.h"``."""
    return str(Path(__file__).resolve().parent / "include")


def _file_id(path: Path) -> tuple[int, int] | None:
    """The device and inode of the file ``path`` names (through links); None where none is."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_outputs(inputs, outputs, *, model_files=(), what: str | None = None) -> None:
    """Refuse to write an output that is one of ``inputs`` or ``model_files`` (the same path,
    a link to it, or the same file under another name), or that another output also names.

    Raises ValueError naming both files before anything is written; ``what`` (the caller, as
    ``"score_tree"``) starts the message. The one check of every command that writes files:
    ``rootclad emit`` and ``build``, ``score_tree`` and ``score_files``."""
    lead = f"{what}: " if what else ""
    read = [(Path(f), "input") for f in inputs] + [(Path(f), "model") for f in model_files]
    read = [(path, kind, os.path.realpath(path), _file_id(path)) for path, kind in read]
    seen: dict[str, Path] = {}
    for path in map(Path, outputs):
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(
                f"{lead}{path} is written twice (also as {seen[real]}); choose other names"
            )
        seen[real] = path
        file_id = _file_id(path)
        for source, kind, source_real, source_id in read:
            if real != source_real and (file_id is None or file_id != source_id):
                continue
            if kind == "model":
                raise ValueError(
                    f"{lead}the output {path} is the model's own {source}; choose another output"
                )
            raise ValueError(
                f"{lead}the output {path} is the input {source} (the same file): it would be "
                "written over the input; choose another output"
            )
