"""How ``rootclad gw run`` writes a file: to a temporary name beside it, checked, then renamed.
A failure leaves the old file untouched and no temporary file behind, and a full disk is named
as such (torch.save says only ``basic_ios::clear``, ROOT only prints an error line)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
from pathlib import Path

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
