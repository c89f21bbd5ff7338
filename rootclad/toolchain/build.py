"""Compile C++ source into a shared library (or a program), cached by content.

The cache key is a hash of the source, the flags, the compiler's identity and the
rootclad headers the source may include. Builds happen in a temporary directory and
are renamed into place, under a per-key file lock, so two processes building the same
model at once never see or leave a half-written library. Each build records the size
and SHA-256 of what it wrote (``<file>.sha256``); a cached file that no longer matches
(truncated, overwritten) is built again instead of loaded, and a work directory left by
a killed build is removed by the next build of the same key.
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
    shared: bool = True,
    subdir: str | None = None,
) -> tuple[Path, bool]:
    """Build ``source`` into ``<cache>/<name>-<key>.so``; returns ``(path, built_now)``.

    ``shared=False`` links a program instead (``<cache>/<subdir>/<name>-<key>``, no suffix).
    A warm cache returns without running the compiler, once the cached file matches the size
    and SHA-256 recorded when it was built (a truncated or overwritten library is rebuilt,
    never loaded). On a compile error the compiler log is kept at ``<cache>/<name>-<key>.log``
    and :class:`CompileError` names it; no library is left in the cache.
    """
    key = source_key(source, cxx, list(flags), list(link_flags))
    root = cache_dir()
    if subdir:
        root = root / subdir
        root.mkdir(parents=True, exist_ok=True)
    out = root / f"{name}-{key}{'.so' if shared else ''}"
    if _verified(out):
        return out, False
    lock_path = root / f"{name}-{key}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _verified(out):  # another process built it while we waited
                return out, False
            out.unlink(missing_ok=True)  # missing, truncated or foreign: build it again
            # a work directory of this key left behind is stale: its builder held this lock
            for stale in root.glob(f"{name}-{key}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            _compile(
                source,
                out,
                key=key,
                name=name,
                cxx=cxx,
                flags=flags,
                link_flags=link_flags,
                shared=shared,
                suffix=suffix,
                timeout=timeout,
            )
            return out, True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """The hex digest of a file's bytes, read in blocks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _manifest(out: Path) -> Path:
    return out.with_name(out.name + ".sha256")


def _verified(out: Path) -> bool:
    """``out`` exists and matches the size and SHA-256 recorded when it was built."""
    try:
        size, digest = _manifest(out).read_text().split()
        return out.stat().st_size == int(size) and file_digest(out) == digest
    except (OSError, ValueError):
        return False


def _compile(source, out, *, key, name, cxx, flags, link_flags, suffix, timeout, shared):
    root = out.parent
    log_path = root / f"{name}-{key}.log"
    work = Path(tempfile.mkdtemp(prefix=f"{name}-{key}.tmp-", dir=root))
    try:
        src = work / f"{name}{suffix}"
        src.write_text(source)
        tmp_out = work / out.name
        # nvcc passes host-compiler options through -Xcompiler
        pic = ["-Xcompiler", "-fPIC"] if Path(cxx).name.startswith("nvcc") else ["-fPIC"]
        kind = ["-shared", *pic] if shared else []
        cmd = [cxx, *flags, *kind, "-o", str(tmp_out), str(src), *link_flags]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0 or not tmp_out.is_file():
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
        # the manifest first, then the file: whoever sees the file can verify it
        manifest = work / "manifest"
        manifest.write_text(f"{tmp_out.stat().st_size} {file_digest(tmp_out)}\n")
        os.replace(manifest, _manifest(out))
        os.replace(tmp_out, out)  # atomic: readers see no library or a whole one
    finally:
        shutil.rmtree(work, ignore_errors=True)
