"""The one way rootclad.data talks to Cling: a locked, cached ``gInterpreter.Declare``.

Cling refuses to see a definition twice, and PyROOT may be used from several
threads; so every declaration goes through :func:`declare`, which runs each
distinct piece of code once per process, under a lock. Code generated at run
time must name its C++ entities with a hash of their content
(:func:`hashed_name`), so two different versions never collide.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from pathlib import Path

_LOCK = threading.RLock()
CLING_LOCK = _LOCK  # for callers whose first use of a declared class must not race either
_DECLARED: set[str] = set()
_INCLUDE_PATHS: set[str] = set()


_ROOT = None


def import_root():
    """``import ROOT``, silencing only the wheel's "alpha stage" UserWarning, with ROOT's
    messages from threads without the GIL printed rather than handed to PyROOT's handler
    (``rootclad/pyroot_errors.h``: that crashed rootclad's GIL-released readers).

    Once per process, under the lock: ROOT sets itself up on first attribute access, and two
    threads doing that at once saw a half-made module (``ROOT.std`` missing)."""
    global _ROOT
    with _LOCK:
        if _ROOT is None:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message=r"(?s).*alpha stage", category=UserWarning
                )
                import ROOT
            ROOT.gInterpreter  # noqa: B018  (finishes ROOT's lazy set-up)
            ROOT.std  # noqa: B018
            _ROOT = ROOT
            declare_header("pyroot_errors.h")
            ROOT.rootclad.detail.install_gil_safe_error_handler()
    return _ROOT


def include_dir() -> str:
    """Directory holding ``rootclad/*.h`` (add it to a compiler's or Cling's include path)."""
    return str(Path(__file__).resolve().parent.parent / "include")


def hashed_name(prefix: str, code: str) -> str:
    """A C++ identifier ``<prefix>_<hash of code>``."""
    return f"{prefix}_{hashlib.sha256(code.encode()).hexdigest()[:16]}"


def add_include_path(path: str) -> None:
    with _LOCK:
        if path not in _INCLUDE_PATHS:
            import_root().gInterpreter.AddIncludePath(path)
            _INCLUDE_PATHS.add(path)


def declare(code: str) -> None:
    """Declare ``code`` to Cling once per process; raise if Cling refuses it."""
    key = hashlib.sha256(code.encode()).hexdigest()
    with _LOCK:
        if key in _DECLARED:
            return
        root = import_root()
        if not root.gInterpreter.Declare(code):
            raise RuntimeError(f"Cling refused the declaration:\n{code[:2000]}")
        _DECLARED.add(key)


def declare_header(name: str) -> None:
    """``#include "rootclad/<name>"`` into Cling (once)."""
    add_include_path(include_dir())
    declare(f'#include "rootclad/{name}"\n')
