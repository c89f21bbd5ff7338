"""``rootclad doctor``: which engines, compilers, BLAS, ROOT and CUDA tools are present."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import warnings

# What to do when Clad is not found (docs/install.md says more).
CLAD_HOWTO = (
    "to enable the clad engine: a Clad plugin built for an installed Clang, named by",
    "  export ROOTCLAD_CLAD_PLUGIN=/path/to/lib/clad.so",
    "  export ROOTCLAD_CLAD_INCLUDE=/path/to/include   # Clad's headers",
    "  export ROOTCLAD_CXX=clang++-19                   # the Clang it was built for",
    "see docs/install.md. Until then the pullback engine (rootclad's own reverse sweep)",
    "writes every backward pass.",
)


def _line(name: str, value: str) -> str:
    return f"  {name:<18} {value}"


def _root_status() -> str:
    try:
        version = importlib.metadata.version("ROOT")
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        with warnings.catch_warnings():  # the ROOT wheel warns that it is an alpha release
            warnings.simplefilter("ignore")
            import ROOT  # noqa: N811  (PyROOT's module name)
    except Exception as exc:  # PyROOT fails in many ways when misinstalled
        return f"not importable ({type(exc).__name__}: {exc})" + (
            f"; package ROOT {version} is installed" if version else ""
        )
    features = str(ROOT.gROOT.GetConfigFeatures())
    clad = "with Clad" if "clad" in features.split() else "without Clad"
    sofie = "with TMVA-SOFIE" if "tmva-sofie" in features.split() else "without TMVA-SOFIE"
    return f"{ROOT.gROOT.GetVersion()} ({clad}, {sofie})"


def report() -> str:
    import torch

    from rootclad import __version__
    from rootclad.compiler import engines_available
    from rootclad.toolchain import (
        CacheError,
        ToolchainError,
        blas_flags,
        cache_dir,
        cuda_driver_version,
        find_clad,
        find_cublas,
        find_nvcc,
    )

    lines = [
        f"rootclad {__version__} on {platform.machine()} {platform.system()}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs",
        "",
        "Engines:",
    ]
    for name, status in engines_available().items():
        lines.append(_line(name, status))
    lines.append(_line("torch autograd", f"reference (torch {torch.__version__})"))
    lines += ["", "Toolchain:"]
    try:
        clad, why = find_clad()
    except ToolchainError as exc:
        clad, why = None, str(exc)
    if clad:
        lines += [
            _line("Clad plugin", clad.plugin),
            _line("Clad headers", clad.include),
            _line("Clad compiler", clad.cxx),
        ]
    else:
        lines.append(_line("Clad", f"not found ({why})"))
        lines += [_line("", line) for line in CLAD_HOWTO]
    try:
        _, _, blas = blas_flags()
        lines.append(_line("BLAS", blas))
    except ToolchainError as exc:
        lines.append(_line("BLAS", f"missing: {exc}"))
    try:
        nvcc = find_nvcc()
        lines.append(_line("nvcc", f"{nvcc[0]} ({nvcc[1]})" if nvcc else "not found"))
    except ToolchainError as exc:
        lines.append(_line("nvcc", str(exc)))
    try:
        cublas = find_cublas()
    except ToolchainError as exc:
        cublas = str(exc)
    lines.append(
        _line("cuBLAS", cublas or "not found (the CUDA toolkit's, or pip install nvidia-cublas)")
    )
    driver = cuda_driver_version()
    lines.append(_line("CUDA driver", driver or "none (no libcuda.so.1)"))
    gpu = torch.cuda.is_available()
    lines.append(_line("CUDA device", torch.cuda.get_device_name(0) if gpu else "none"))
    lines.append(_line("ROOT", _root_status()))
    try:
        lines.append(_line("cache", str(cache_dir())))
    except CacheError as exc:
        lines.append(_line("cache", f"refused: {exc}"))
    lines.append(_line("rootclad threads", _rootclad_threads()))
    lines.append(_line("torch threads", str(torch.get_num_threads())))
    return "\n".join(lines)


def _rootclad_threads() -> str:
    """The size of a compiled model's thread pool (parallel.h: ROOTCLAD_NUM_THREADS, else the
    cores, at most MAX_THREADS), and where it comes from."""
    from rootclad.compiler import MAX_THREADS, num_threads

    try:
        n = num_threads()
    except ValueError as exc:
        return f"refused: {exc}"
    if n is not None:
        return f"{n} (ROOTCLAD_NUM_THREADS)"
    return f"{min(os.cpu_count() or 1, MAX_THREADS)} (the cores; ROOTCLAD_NUM_THREADS sets it)"
