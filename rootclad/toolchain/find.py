"""Where the C++ compiler, Clad, BLAS and nvcc are on this machine.

Everything is found through the environment; nothing is downloaded or built.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class ToolchainError(RuntimeError):
    """A tool the user asked for is not installed; the message says what to install."""


def _version(cmd: str) -> str:
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (out.stdout or out.stderr).strip().splitlines()
    # nvcc prints its release on a later line than the first
    release = [ln for ln in lines if "release" in ln]
    return (release or lines or [""])[0].strip()


@functools.cache
def find_cxx() -> tuple[str, str]:
    """The C++ compiler for the pullback engine: ``ROOTCLAD_CXX``, ``CXX``, g++ or clang++.

    Returns ``(path, version line)``; raises :class:`ToolchainError` when none is found.
    """
    tried = []
    for name in (os.environ.get("ROOTCLAD_CXX"), os.environ.get("CXX"), "g++", "clang++", "c++"):
        if not name:
            continue
        tried.append(name)
        path = shutil.which(name)
        if path:
            return path, _version(path)
    raise ToolchainError(
        "rootclad needs a C++17 compiler to build models and found none "
        f"(tried {', '.join(tried)}). Install one, e.g. `apt-get install g++` "
        "or `conda install gxx`, or point ROOTCLAD_CXX at it."
    )


@dataclass(frozen=True)
class CladInstall:
    """An installed Clad: the clang++ it was built for, its plugin and its headers."""

    cxx: str
    plugin: str
    include: str
    version: str

    def flags(self) -> list[str]:
        # The stamp (version, size and mtime of the plugin) changes the compile cache key
        # when Clad is rebuilt or updated; it is otherwise unused.
        st = Path(self.plugin).stat()
        stamp = hashlib.sha256(f"{self.version}:{st.st_size}:{st.st_mtime_ns}".encode())
        return [
            f"-fplugin={self.plugin}",
            f"-I{self.include}",
            f"-DROOTCLAD_CLAD_STAMP=0x{stamp.hexdigest()[:12]}",
        ]


def _clad_candidates() -> list[tuple[str, str]]:
    """(plugin, include) pairs to try: the environment first, then common prefixes."""
    env_plugin = os.environ.get("ROOTCLAD_CLAD_PLUGIN")
    env_include = os.environ.get("ROOTCLAD_CLAD_INCLUDE")
    if env_plugin or env_include:
        return [(env_plugin or "", env_include or "")]
    out = []
    for prefix in (os.environ.get("CLAD_PREFIX"), "/usr/local", "/opt/clad"):
        if prefix:
            out.append((str(Path(prefix, "lib", "clad.so")), str(Path(prefix, "include"))))
    return out


def _clad_version(include: str) -> str:
    """Clad's version from its installed Version.inc (``#define CLAD_VERSION_STRING "..."``)."""
    inc = Path(include, "clad", "Differentiator", "Version.inc")
    if inc.is_file():
        for line in inc.read_text().splitlines():
            if "CLAD_VERSION_STRING" in line and '"' in line:
                return line.split('"')[1]
    return "unknown"


@functools.cache
def find_clad() -> tuple[CladInstall | None, str]:
    """Look for Clad as a clang plugin.

    Uses ``ROOTCLAD_CLAD_PLUGIN`` (the plugin ``clad.so``), ``ROOTCLAD_CLAD_INCLUDE`` (the
    directory holding ``clad/Differentiator/Differentiator.h``) and ``ROOTCLAD_CXX`` (the clang++
    Clad was built against; default: the clang++ matching the plugin's LLVM if found).
    Returns ``(install or None, what was looked for / why it was rejected)``.
    """
    reasons = []
    for plugin, include in _clad_candidates():
        if not plugin or not Path(plugin).is_file():
            reasons.append(f"no Clad plugin at {plugin or '$ROOTCLAD_CLAD_PLUGIN (unset)'}")
            continue
        header = Path(include, "clad", "Differentiator", "Differentiator.h")
        if not header.is_file():
            reasons.append(f"no {header} (set ROOTCLAD_CLAD_INCLUDE)")
            continue
        cxx = os.environ.get("ROOTCLAD_CXX")
        if not cxx or "clang" not in Path(cxx).name:
            for cand in ("clang++-19", "clang++-20", "clang++-21", "clang++-18", "clang++"):
                if shutil.which(cand):
                    cxx = cand
                    break
        path = shutil.which(cxx) if cxx else None
        if not path:
            reasons.append("Clad plugin found but no clang++ to load it (set ROOTCLAD_CXX)")
            continue
        ver = _clad_version(include)
        return CladInstall(cxx=path, plugin=plugin, include=include, version=ver), "found"
    return None, "; ".join(reasons) or "no candidate locations"


@functools.cache
def blas_flags() -> tuple[list[str], list[str], str]:
    """Compile flags, link flags and a description of the BLAS the kernels use.

    The kernels call the CBLAS interface of OpenBLAS from the ``scipy-openblas32`` wheel
    (a maintained OpenBLAS build on PyPI, symbols prefixed ``scipy_``).
    """
    try:
        import scipy_openblas32 as ob
    except ImportError as exc:
        raise ToolchainError(
            "rootclad's kernels need BLAS from the scipy-openblas32 package: "
            "`pip install scipy-openblas32`"
        ) from exc
    lib_dir = ob.get_lib_dir()
    cflags = ["-DROOTCLAD_CBLAS_SCIPY", f"-I{ob.get_include_dir()}"]
    lflags = [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", f"-l{ob.get_library()}"]
    return cflags, lflags, ob.get_openblas_config()


@functools.cache
def find_nvcc() -> tuple[str, str] | None:
    path = shutil.which(os.environ.get("ROOTCLAD_NVCC", "nvcc"))
    if not path:
        return None
    return path, _version(path)
