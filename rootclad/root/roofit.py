"""A rootclad model as a RooFit function, with the compiled backward's gradient for Minuit2.

``rootclad/roofit.h`` defines ``rootclad::RooModelFunction`` (the model's output for a list of
RooRealVars) and ``rootclad::RooModelSum`` (a weighted sum of it over a dataset's rows: a neural
negative log-likelihood). RooFit writes objects to files and workspaces through a dictionary,
so the header is compiled once with ACLiC into the private cache (keyed by the headers' content
and ROOT's version) and loaded::

    from rootclad.root import roofit
    nn = roofit.function("build/lr", [x, mu], name="nn")     # or a compiled model
    nll = roofit.model_sum(nn, data, scale=-1.0)            # -sum log r(x_i; mu)
    minimizer = ROOT.RooMinimizer(nll)                      # Minuit2 uses nll's gradient
    minimizer.migrad(); minimizer.hesse()

In a ``root.exe`` macro: ``gSystem->Load("<python -m rootclad.root.roofit>")``, then the
classes as above. A workspace holding them is read back anywhere the library is loaded: the
functions carry their export's bytes, not its path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import tempfile
from pathlib import Path

from rootclad.data.cling import CLING_LOCK, declare_header, import_root
from rootclad.paths import get_include
from rootclad.root.errors import cpp_errors

HEADER = Path(get_include()) / "rootclad" / "roofit.h"
_LIBRARY: list[Path] = []


class RooFitError(ValueError):
    """A RooFit function that cannot be made from these arguments (the message names the
    function, the export and the inputs)."""


def _build_dir() -> Path:
    from rootclad.codegen.standalone import amalgamate
    from rootclad.toolchain.build import _private_dir, cache_dir

    root = import_root()
    body = amalgamate('#include "rootclad/roofit.h"\n', HEADER.parent)
    key = hashlib.sha256(f"{body}\n{root.gROOT.GetVersion()}".encode()).hexdigest()[:16]
    return _private_dir(cache_dir() / "roofit" / key)


def library() -> Path:
    """The ACLiC build of ``roofit.h`` (built on first use, under a lock; then loaded)."""
    with CLING_LOCK:
        if _LIBRARY:
            return _LIBRARY[0]
        declare_header("model.h")
        root = import_root()
        build = _build_dir()
        system = root.gSystem
        # ACLiC's build directory is the process's: the user's own builds keep theirs (the
        # include path keeps rootclad's include directory, which names no other headers)
        old_dir = str(system.GetBuildDir())
        lock = os.open(build / "aclic.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            system.SetBuildDir(str(build), True)
            system.AddIncludePath(f"-I{get_include()}")
            # k: keep the library; O: optimised. ACLiC rebuilds when the header is newer.
            if not system.CompileMacro(str(HEADER), "kO"):
                raise RuntimeError(
                    f"rootclad: ACLiC could not build {HEADER} in {build} (its messages above)"
                )
        finally:
            os.close(lock)
            system.SetBuildDir(old_dir)
        (path,) = sorted(build.rglob("roofit_h.so"))
        _LIBRARY.append(path)
        return path


def load():
    """The ROOT module with ``rootclad::RooModelFunction`` and ``RooModelSum`` loaded."""
    library()
    return import_root()


def function(model, inputs, name: str = "network", title: str | None = None):
    """A ``rootclad::RooModelFunction``: ``model`` (an export's stem, or a compiled model,
    exported for the purpose) evaluated at ``inputs`` (RooRealVars or other RooAbsReals, one
    per model input, in its input order). RooFitError names the function, the export and both
    input lists when they do not match, or when the model has more than one output."""
    root = load()
    args = root.RooArgList()
    for v in inputs:
        args.add(v)
    with tempfile.TemporaryDirectory(prefix="rootclad-roofit-") as tmp:
        stem = str(model)
        if hasattr(model, "export"):
            stem = str(Path(tmp) / "model")
            model.export(stem)
        origin = stem if stem == str(model) else "a compiled model (exported for the function)"
        with cpp_errors(RooFitError):
            return root.rootclad.RooModelFunction(name, title or name, stem, args, origin)


def trust(md5: str) -> None:
    """Let the RooFit functions read from a file run the export whose library and weights have
    this MD5 (the error of a function read from someone else's file names it): its library is
    code, so a workspace from elsewhere runs only after this. Functions made here from an
    export, and exports this account has run before, need nothing."""
    load().rootclad.RooModelExport.trust(str(md5))


def model_sum(function, data, scale: float = 1.0, name: str | None = None):
    """``scale`` times the weighted sum over the rows of ``data`` (a RooAbsData) of
    ``function``: its inputs that are columns of ``data`` are read from each row, the others
    are the fit's parameters. With the model's output log r(x; theta), ``scale=-1`` gives the
    negative log-likelihood (ratio) a RooMinimizer fits with the model's gradient."""
    root = load()
    name = name or f"{function.GetName()}_sum"
    with cpp_errors(RooFitError):
        return root.rootclad.RooModelSum(name, name, function, data, float(scale))


__all__ = ["RooFitError", "function", "library", "load", "model_sum", "trust"]

if __name__ == "__main__":
    print(library())
    sys.exit(0)
