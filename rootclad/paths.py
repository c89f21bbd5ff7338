"""Where rootclad's files are (the directory to put on a compiler's include path), the check
that what a command writes is not what it reads, and how Python writes a file (``replacing``:
to a temporary name beside it, checked, then renamed; a failure leaves the old file untouched
and no temporary file behind, and a full disk is named as such: torch.save says only
``basic_ios::clear``, ROOT only prints an error line)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
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
    ``rootclad emit`` and ``build``, ``score_tree``, ``score_files`` and ``evaluate``."""
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


_CALLS = itertools.count(1)  # a temporary name per call: two threads never share one
# below this much free space, a writer's failure is taken to be the full disk's
_FULL = 1 << 20


def disk_full(path: Path) -> bool:
    return shutil.disk_usage(path.parent).free < _FULL


def write_error(path: Path, cause: str = "") -> OSError:
    """The OSError for a failed write of ``path``: ENOSPC when the disk is full."""
    code = errno.ENOSPC if disk_full(path) else errno.EIO
    return OSError(code, os.strerror(code) + cause, str(path))


@contextlib.contextmanager
def replacing(path: Path, suffix: str = ""):
    """Yields the temporary name to write; when the block ends without error, that file
    replaces ``path``. ``suffix`` ends the temporary name (numpy and matplotlib go by it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_CALLS)}.partial{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        full = isinstance(err, Exception) and not _names_enospc(err) and disk_full(path)
        tmp.unlink(missing_ok=True)
        if full:
            raise write_error(path, f" ({type(err).__name__}: {err})") from err
        if _names_enospc(err) and getattr(err, "filename", None) != str(path):
            # Python's writes name no file (or the temporary one): name the one being written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
        raise


def _names_enospc(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno == errno.ENOSPC
