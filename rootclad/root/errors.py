"""rootclad's C++ errors as Python exceptions whose message is rootclad's.

PyROOT (cppyy) raises a C++ exception as its own exception type, with a message made of the
C++ signatures it tried and, indented under one of them, the C++ message; when several
overloads were tried it raises a TypeError listing them all. Neither can be sent from a Dask
worker to the client (the C++ object does not survive pickling). The bridge raises instead:

- :class:`ExportError`: an export ``rootclad::Model`` cannot open (missing, stale, foreign or
  damaged files, tensors of other shapes, a library directory others can write to);
- :class:`ScoringError`: a file ``score_tree`` / ``score_files`` cannot score (no such tree or
  branch, a branch of another type, an entry of another length, a failed write).

Both are RuntimeErrors carrying only text: the C++ message first (it names the file, tree,
branch and entry).
"""

from __future__ import annotations

import builtins
import contextlib
import re


class ExportError(RuntimeError):
    """An exported model (``STEM.so``, ``STEM.root``) that ``rootclad::Model`` refuses; the
    message is rootclad's, naming the file."""


class ScoringError(RuntimeError):
    """A file that ``score_tree`` or ``score_files`` could not score; the message is
    rootclad's, naming the file, tree, branch and entry where they apply."""


# One overload cppyy tried: its signature on a line ending in "=>", then what it raised,
# indented on the next lines ("runtime_error: rootclad: ...").
_SIGNATURE = re.compile(r"^.*=>[ \t]*$", re.M)
_RAISED = re.compile(r"^\s*(?P<type>[A-Za-z_][\w:]*): (?P<message>.*?)\s*$", re.S)


def cpp_message(err: BaseException) -> str | None:
    """The message of the C++ exception in ``err`` as the C++ code wrote it; None when ``err``
    holds none (a Python exception, or cppyy's TypeError when no overload took the arguments)."""
    text = str(err)
    blocks = _SIGNATURE.split(text)[1:]
    for block in blocks:
        raised = _RAISED.match(block)
        if raised and not hasattr(builtins, raised["type"]):  # runtime_error, not TypeError
            return raised["message"]
    is_cpp = any(c.__name__ == "CPPExcInstance" for c in type(err).__mro__)
    return text.strip() if is_cpp else None


@contextlib.contextmanager
def cpp_errors(kind: type[RuntimeError]):
    """Raise a C++ exception from the block as ``kind``, its C++ message alone; other
    exceptions pass as they are."""
    try:
        yield
    except Exception as err:
        message = cpp_message(err)
        if message is None:
            raise
        raise kind(message) from None
