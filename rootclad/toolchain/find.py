"""Where the C++ compiler, Clad, BLAS and nvcc are on this machine.

Everything is found through the environment; nothing is downloaded or built.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


class ToolchainError(RuntimeError):
    """A tool the user asked for is not installed; the message says what to install."""


def run_tool(cmd: list[str], *, timeout: float, memory: int | None = None):
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)`` that leaves
    nothing running: the tool runs in a process group of its own, which is killed whole (a
    compiler driver and the cc1plus, as and ld it started) when the timeout passes
    (``subprocess.TimeoutExpired`` then) or the call is interrupted (KeyboardInterrupt, any
    exception). When this process dies without running Python code (SIGKILL, an unhandled
    SIGTERM) Linux kills the tool itself (PR_SET_PDEATHSIG); its own children are not reached
    then. ``memory``: the address space each process of the tool may use, in bytes
    (RLIMIT_AS).

    Known limits: Linux sends the death signal when the *thread* that started the tool ends,
    so a compile started from a short-lived thread loses the tool if that thread exits first
    (rootclad compiles on the calling thread and waits); and ``preexec_fn`` runs Python
    between fork and exec, which a process with other threads holding locks could deadlock in
    (the setup makes three system calls and allocates nothing of its own)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, preexec_fn=_child_setup(memory)) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
        except BaseException:
            _kill_group(proc)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group's id is its leader's pid
    except ProcessLookupError:
        pass
    proc.wait()


def _child_setup(memory: int | None):
    """What the tool's process does between fork and exec (resolved here, in the parent)."""
    parent = os.getpid()
    prctl = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if memory is not None and hard != resource.RLIM_INFINITY:
        memory = min(memory, hard)

    def setup():
        if prctl is not None:
            prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with this process
            if os.getppid() != parent:  # it died before the line above
                os._exit(1)
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, hard))

    return setup


def _version(cmd: str) -> str:
    """The compiler's version line; asked once per executable as it stands (its path, size and
    time of change), since every cache key of every build asks."""
    try:
        st = os.stat(shutil.which(cmd) or cmd)
    except OSError:
        return "unknown"
    return _version_of(cmd, st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=64)
def _version_of(cmd: str, *stat) -> str:
    try:
        out = run_tool([cmd, "--version"], timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (out.stdout or out.stderr).strip().splitlines()
    # nvcc prints its release on a later line than the first
    release = [ln for ln in lines if "release" in ln]
    return (release or lines or [""])[0].strip()


def _explicit_program(var: str) -> str | None:
    """The executable ``$var`` names, or None when unset; an error when it names none."""
    value = os.environ.get(var)
    if not value:
        return None
    path = shutil.which(value)
    if not path:
        raise ToolchainError(f"{var}={value} names no executable program; fix or unset {var}")
    return path


@functools.cache
def find_cxx() -> tuple[str, str]:
    """The C++ compiler for the pullback engine: ``ROOTCLAD_CXX``, ``CXX``, g++ or clang++.

    Returns ``(path, version line)``. A variable that is set must name a compiler: it is
    an error, not a silent fall-back, when it does not. Raises :class:`ToolchainError`
    when none is found.
    """
    for var in ("ROOTCLAD_CXX", "CXX"):
        path = _explicit_program(var)
        if path:
            return path, _version(path)
    for name in ("g++", "clang++", "c++"):
        path = shutil.which(name)
        if path:
            return path, _version(path)
    raise ToolchainError(
        "rootclad needs a C++17 compiler to build models and found none "
        "(tried g++, clang++, c++). Install one, e.g. `apt-get install g++` "
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


_CLAD_HEADER = Path("clad", "Differentiator", "Differentiator.h")
CLAD_PREFIXES = ("/usr/local", "/opt/clad")  # searched after $CLAD_PREFIX


def _clad_candidates() -> list[tuple[str, str]]:
    """(plugin, include) pairs to try, most explicit first.

    ``ROOTCLAD_CLAD_PLUGIN`` and ``ROOTCLAD_CLAD_INCLUDE`` each fix their half (the other half
    is looked for beside it, then under the prefixes); ``CLAD_PREFIX`` then ``/usr/local``
    and ``/opt/clad`` are the prefixes. A variable that is set but points at nothing Clad
    installs is a :class:`ToolchainError` naming it.
    """
    env_plugin = os.environ.get("ROOTCLAD_CLAD_PLUGIN")
    env_include = os.environ.get("ROOTCLAD_CLAD_INCLUDE")
    env_prefix = os.environ.get("CLAD_PREFIX")
    if env_plugin and not Path(env_plugin).is_file():
        raise ToolchainError(f"ROOTCLAD_CLAD_PLUGIN={env_plugin} is not a file (Clad's clad.so)")
    if env_include and not Path(env_include, _CLAD_HEADER).is_file():
        raise ToolchainError(
            f"ROOTCLAD_CLAD_INCLUDE={env_include} holds no {_CLAD_HEADER} (it should be the "
            "include directory of an installed Clad)"
        )
    if env_prefix and not Path(env_prefix, "lib", "clad.so").is_file():
        raise ToolchainError(f"CLAD_PREFIX={env_prefix} holds no lib/clad.so")
    prefixes = [Path(p) for p in (env_prefix, *CLAD_PREFIXES) if p]
    if env_plugin:  # its own prefix first: <prefix>/lib/clad.so
        prefixes.insert(0, Path(env_plugin).resolve().parent.parent)
    if env_include:
        prefixes.insert(0, Path(env_include).resolve().parent)
    out = []
    for prefix in dict.fromkeys(prefixes):
        plugin = env_plugin or str(prefix / "lib" / "clad.so")
        include = env_include or str(prefix / "include")
        out.append((plugin, include))
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
    Returns ``(install or None, what was looked for / why it was rejected)``; raises
    :class:`ToolchainError` when one of those variables is set but points at nothing.
    """
    reasons = []
    for plugin, include in _clad_candidates():
        if not Path(plugin).is_file():
            reasons.append(f"no Clad plugin at {plugin}")
            continue
        if not Path(include, _CLAD_HEADER).is_file():
            reasons.append(f"no {Path(include, _CLAD_HEADER)} (set ROOTCLAD_CLAD_INCLUDE)")
            continue
        cxx = _explicit_program("ROOTCLAD_CXX")
        if not cxx or "clang" not in Path(cxx).name:
            cxx = next(
                (shutil.which(c) for c in ("clang++-19", "clang++-20", "clang++-21", "clang++-18",
                                           "clang++") if shutil.which(c)),
                None,
            )  # fmt: skip
        if not cxx:
            reasons.append("Clad plugin found but no clang++ to load it (set ROOTCLAD_CXX)")
            continue
        ver = _clad_version(include)
        return CladInstall(cxx=cxx, plugin=plugin, include=include, version=ver), "found"
    return None, "; ".join(dict.fromkeys(reasons)) or "no candidate locations"


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
    path = _explicit_program("ROOTCLAD_NVCC") or shutil.which("nvcc")
    if not path:
        return None
    return path, _version(path)


def find_cublas() -> str | None:
    """The cuBLAS library the CUDA build will link: the CUDA toolkit's next to nvcc, else the
    ``nvidia-cublas`` wheel's, else one the dynamic loader knows; None when there is none."""
    import ctypes.util
    import importlib.util

    candidates: list[Path] = []
    nvcc = find_nvcc()
    if nvcc:
        root = Path(nvcc[0]).resolve().parent.parent
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            candidates += sorted((root / sub).glob("libcublas.so*"))
    for pkg in ("nvidia.cublas", "nvidia.cu13", "nvidia"):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        for where in (spec.submodule_search_locations or []) if spec else []:
            candidates += sorted(Path(where).glob("**/libcublas.so*"))
    if candidates:
        return str(candidates[0])
    return ctypes.util.find_library("cublas")


def cuda_driver_version() -> str | None:
    """The installed CUDA driver's version ("13.0"), from libcuda; None without a driver."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"
