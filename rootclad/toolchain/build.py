"""Compile C++ source into a shared library, cached by content.

The cache key is a hash of the source, the flags, the compiler's identity and the
rootclad headers the source may include. Builds happen in a temporary directory and
are renamed into place, under a per-key file lock, so two processes building the same
model at once never see or leave a half-written library.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rootclad.toolchain.find import _version


class CompileError(RuntimeError):
    """The generated code did not compile; ``log_path`` holds the compiler output."""

    def __init__(self, message: str, log_path: Path):
        super().__init__(message)
        self.log_path = log_path


def cache_dir() -> Path:
    """``$ROOTCLAD_CACHE_DIR`` or ``~/.cache/rootclad``, created on demand."""
    root = os.environ.get("ROOTCLAD_CACHE_DIR") or Path.home() / ".cache" / "rootclad"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def _headers_digest() -> str:
    include = Path(__file__).resolve().parent.parent / "include"
    h = hashlib.sha256()
    for path in sorted(include.rglob("*.h*")):
        h.update(path.relative_to(include).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _cpu_tag() -> str:
    """What -march=native compiles for: the CPU model and its instruction-set flags. A cache
    shared between machines (a home directory on a batch farm) then keeps one library per
    kind of CPU instead of handing AVX-512 code to a CPU without it."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform

        return f"{platform.machine()} {platform.processor()}"
    keep = ("model name", "flags", "Features", "CPU part", "CPU implementer")
    lines = [ln for ln in info.splitlines() if ln.split(":")[0].strip() in keep]
    return "\n".join(dict.fromkeys(lines))  # the first processor's lines, once each


def source_key(source: str, cxx: str, flags: list[str], link_flags: list[str]) -> str:
    h = hashlib.sha256()
    for part in (source, cxx, _version(cxx), " ".join(flags), " ".join(link_flags)):
        h.update(part.encode())
        h.update(b"\0")
    if any(f.startswith(("-march=native", "-mcpu=native", "-mtune=native")) for f in flags):
        h.update(_cpu_tag().encode())
    h.update(_headers_digest().encode())
    return h.hexdigest()[:20]


def build_library(
    source: str,
    *,
    name: str,
    cxx: str,
    flags: list[str],
    link_flags: list[str] = (),
    suffix: str = ".cpp",
    timeout: float = 900,
) -> tuple[Path, bool]:
    """Build ``source`` into ``<cache>/<name>-<key>.so``; returns ``(path, built_now)``.

    A warm cache returns at once without running the compiler. On a compile error the
    compiler log is kept at ``<cache>/<name>-<key>.log`` and :class:`CompileError` names it;
    no library is left in the cache.
    """
    key = source_key(source, cxx, list(flags), list(link_flags))
    root = cache_dir()
    lib = root / f"{name}-{key}.so"
    if lib.is_file():
        return lib, False
    lock_path = root / f"{name}-{key}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if lib.is_file():  # another process built it while we waited
                return lib, False
            _compile(
                source,
                lib,
                key=key,
                name=name,
                cxx=cxx,
                flags=flags,
                link_flags=link_flags,
                suffix=suffix,
                timeout=timeout,
            )
            return lib, True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _compile(source, lib, *, key, name, cxx, flags, link_flags, suffix, timeout):
    root = lib.parent
    log_path = root / f"{name}-{key}.log"
    work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    try:
        src = work / f"{name}{suffix}"
        src.write_text(source)
        tmp_lib = work / lib.name
        cmd = [cxx, *flags, "-shared", "-fPIC", "-o", str(tmp_lib), str(src), *link_flags]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0 or not tmp_lib.is_file():
            kept_src = root / f"{name}-{key}{suffix}"
            shutil.copyfile(src, kept_src)
            log_path.write_text(
                f"$ {' '.join(cmd)}\n(source kept at {kept_src})\n\n{proc.stdout}{proc.stderr}"
            )
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), "")
            raise CompileError(
                f"compiling the generated code for {name!r} failed ({cxx}); "
                f"first error: {first.strip() or '(none printed)'}; full log: {log_path}",
                log_path,
            )
        # Keep the source next to the library: users read it, and debuggers find it.
        shutil.copyfile(src, root / f"{name}-{key}{suffix}")
        (root / f"{name}-{key}.build").write_text(
            f"$ {' '.join(cmd)}\nseconds: {elapsed:.2f}\n{proc.stderr}"
        )
        os.replace(tmp_lib, lib)  # atomic: readers see no library or a whole one
    finally:
        shutil.rmtree(work, ignore_errors=True)
