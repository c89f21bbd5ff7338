"""Compile C++ source into a shared library (or a program), cached by content.

The cache key is a hash of the source, the flags, the compiler's identity and the
rootclad headers the source may include. Builds happen in a temporary directory and
are renamed into place, under a per-key file lock, so two processes building the same
model at once never see or leave a half-written library. Each build records the size
and SHA-256 of what it wrote (``<file>.sha256``); a cached file that no longer matches
(truncated, overwritten) is built again instead of loaded, and a work directory left by
a killed build is removed by the next build of the same key.

The cache holds code this process loads and runs, so it trusts only what its user wrote: its
directories are made 0700 whatever the umask, files are written without group or other write
permission, and a directory or file that another user owns or can write to is refused
(:class:`CacheError`), as ssh and pip refuse theirs. A cached library that matches its
manifest but does not load is built again, once, with a warning (:func:`load_library`).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from rootclad.toolchain.find import _version, run_tool


class CompileError(RuntimeError):
    """The generated code did not compile; ``log_path`` holds the compiler output.

    ``cause``: ``"error"`` (the compiler rejected the code), ``"timeout"`` (it ran past the
    build's timeout and was stopped) or ``"killed"`` (it ran out of memory or died of a
    signal)."""

    def __init__(self, message: str, log_path: Path, cause: str = "error"):
        super().__init__(message)
        self.log_path = log_path
        self.cause = cause


class CacheError(RuntimeError):
    """The compile cache is not safe to load from (another user owns it or can write to it);
    the message names the path and says how to fix it."""


def cache_dir() -> Path:
    """``$ROOTCLAD_CACHE_DIR`` or ``~/.cache/rootclad``, created on demand (0700, as are its
    missing parents); :class:`CacheError` when another user owns it or can write to it."""
    root = os.environ.get("ROOTCLAD_CACHE_DIR") or Path.home() / ".cache" / "rootclad"
    return _private_dir(Path(root))


def _private_dir(path: Path) -> Path:
    """``path``, made 0700 whatever the umask if missing (its missing parents too, as the XDG
    base directory spec asks), then checked as :func:`_check_trusted` does."""
    if not path.is_dir():
        _make_private_dir(path)
    _check_trusted(path)
    return path


def _make_private_dir(path: Path) -> None:
    if not path.parent.is_dir():
        _make_private_dir(path.parent)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:  # made by another process meanwhile: checked like any other
        return
    os.chmod(path, 0o700)  # mkdir's mode is masked by the umask


def _check_trusted(path: Path) -> None:
    """Refuse a cache directory or file that another user owns or that group or others can
    write to: they could put their code where rootclad loads and runs it as this user."""
    st = path.stat()
    me = os.geteuid()
    is_dir = path.is_dir()
    fix = (
        "set ROOTCLAD_CACHE_DIR to a directory of your own"
        if is_dir
        else f"remove {path} (rootclad builds it again)"
    )
    if st.st_uid not in (me, 0):
        raise CacheError(
            f"{path} is owned by uid {st.st_uid}, not by you (uid {me}): another user could put "
            f"code there that rootclad would load and run as you; {fix}"
        )
    if st.st_mode & 0o022:
        who = {0o020: "group", 0o002: "others", 0o022: "group and others"}[st.st_mode & 0o022]
        fix = f"`chmod 700 {path}` or {fix}" if is_dir else fix
        raise CacheError(
            f"{path} is writable by {who} (mode {st.st_mode & 0o7777:o}): they could put code "
            f"there that rootclad would load and run as you; {fix}"
        )


def compile_memory_limit() -> int | None:
    """The address space each compiler process may use, in bytes (None: no limit).

    ``ROOTCLAD_COMPILE_MEMORY_GB`` (GB of 2^30 bytes; 0: no limit), by default 3/4 of this
    machine's memory (or of its cgroup's limit, in a container): the clad engine's compile of
    densenet121 grew clang to 23 of 24 GB; it now fails with a :class:`CompileError` instead.
    """
    value = os.environ.get("ROOTCLAD_COMPILE_MEMORY_GB", "").strip()
    if not value:
        return _machine_memory() * 3 // 4
    try:
        gb = float(value)
    except ValueError:
        gb = -1.0
    if not (math.isfinite(gb) and gb >= 0):
        raise ValueError(
            f"ROOTCLAD_COMPILE_MEMORY_GB={value!r}: must be a number of GB the compiler may use "
            "(0: no limit)"
        )
    return int(gb * 2**30) or None


def _machine_memory() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:  # cgroup v2; "max" when unlimited
        return min(total, int(Path("/sys/fs/cgroup/memory.max").read_text()))
    except (OSError, ValueError):
        return total


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
    rebuild: bool = False,
    kind: str | None = None,
) -> tuple[Path, bool]:
    """Build ``source`` into ``<cache>/<name>-<key>.so``; returns ``(path, built_now)``.

    ``shared=False`` links a program instead (``<cache>/<subdir>/<name>-<key>``, no suffix);
    ``kind="object"`` compiles an object file (``<name>-<key>.o``) for :func:`link_library`.
    A warm cache returns without running the compiler, once the cached file matches the size
    and SHA-256 recorded when it was built (a truncated or overwritten library is rebuilt,
    never loaded); ``rebuild=True`` builds it again all the same. On a compile error the
    compiler log is kept at ``<cache>/<name>-<key>.log`` and :class:`CompileError` names it;
    no library is left in the cache. :class:`CacheError` when the cache or the cached file is
    another user's or writable by others.
    """
    kind = kind or ("shared" if shared else "program")
    key = source_key(source, cxx, [*flags, kind], list(link_flags))
    root = cache_dir()
    if subdir:
        root = _private_dir(root / subdir)
    out = root / f"{name}-{key}{_SUFFIX[kind]}"

    def make():
        how = {"kind": kind, "suffix": suffix, "timeout": timeout}
        _compile(
            source, out, key=key, name=name, cxx=cxx, flags=flags, link_flags=link_flags, **how
        )

    return out, _cached(out, f"{name}-{key}", rebuild, make)


_SUFFIX = {"shared": ".so", "program": "", "object": ".o", "archive": ".a"}


def link_library(
    objects: list[Path],
    *,
    name: str,
    cxx: str,
    link_flags: list[str] = (),
    archive: bool = False,
    exports: str | None = None,
    rebuild: bool = False,
) -> tuple[Path, bool]:
    """Link object files built by :func:`build_library` into ``<cache>/<name>-<key>.so`` (or
    archive them: ``archive=True``, ``.a``), cached and checked as a library built from source
    is; the key hashes the objects' contents and the flags. ``exports``: the symbols the
    library exports (a version script's ``global:`` entries), under a version named after its
    key, so that a library linked against it binds to this build alone, whatever other build
    a process has loaded (but glibc lets a definition without a version satisfy a versioned
    reference: a library exporting rootclad's names unversioned, once global, as ROOT's
    RDataFrame makes every loaded library, would take the calls); its soname is its file
    name."""
    h = hashlib.sha256()
    for part in (cxx, _version(cxx), " ".join(link_flags), str(archive), str(exports)):
        h.update(part.encode() + b"\0")
    for obj in objects:
        h.update(file_digest(obj).encode())
    key = h.hexdigest()[:20]
    out = cache_dir() / f"{name}-{key}{'.a' if archive else '.so'}"

    def make():
        work = Path(tempfile.mkdtemp(prefix=f"{name}-{key}.tmp-", dir=out.parent))
        try:
            tmp = work / out.name
            extra = []
            if exports is not None:
                script = work / "exports.map"
                script.write_text(f"ROOTCLAD_{key} {{\n  global: {exports};\n  local: *;\n}};\n")
                extra = [f"-Wl,--version-script={script}", f"-Wl,-soname,{out.name}"]
            if archive:
                cmd = ["ar", "rcs", str(tmp), *map(str, objects)]
            else:
                cmd = [cxx, "-shared", "-o", str(tmp), *map(str, objects), *link_flags, *extra]
            proc = run_tool(cmd, timeout=300, memory=compile_memory_limit())
            if proc.returncode != 0 or not tmp.is_file():
                log = out.parent / f"{name}-{key}.log"
                text = f"$ {' '.join(cmd)}\n\n{proc.stdout}{proc.stderr}"
                (work / "log").write_text(text)
                _publish(work / "log", log)
                raise CompileError(f"linking {name!r} failed; full log: {log}", log)
            _publish_verified(work, tmp, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return out, _cached(out, f"{name}-{key}", rebuild, make)


def _cached(out: Path, stem: str, rebuild: bool, make: Callable[[], None]) -> bool:
    """Make ``out`` with ``make()`` unless a verified copy is there; under a per-key file lock,
    so that two processes building it at once leave one good copy. Returns whether it built."""
    if not rebuild and _verified(out):
        return False
    root = out.parent
    # O_NOFOLLOW, no truncation: the lock file is opened, never written
    lock = os.open(root / f"{stem}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not rebuild and _verified(out):  # another process built it while we waited
            return False
        out.unlink(missing_ok=True)  # missing, truncated or foreign: build it again
        # a work directory of this key left behind is stale: its builder held this lock
        for stale in root.glob(f"{stem}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        make()
        return True
    finally:
        os.close(lock)  # and with it the lock


def load_library(
    build: Callable[..., tuple[Path, bool]], load: Callable = ctypes.CDLL
) -> tuple[object, Path, bool]:
    """``load(path)`` of the library ``build()`` returns (``build`` is :func:`build_library`
    with its arguments bound, or a function that calls it); returns ``(library, path,
    built_now)``.

    A cached library that matches its manifest can still fail to load (written wrong by a
    broken disk or tool); it failed every compile until deleted by hand. It is built again
    (``build(rebuild=True)``), once, with a warning naming it and the loader's error; a
    library that fails to load right after its build raises the loader's error.
    """
    path, built = build()
    try:
        return load(str(path)), path, built
    except OSError as exc:
        if built:
            raise
        warnings.warn(
            f"the cached library {path} failed to load ({exc}); building it again",
            stacklevel=2,
        )
    path, built = build(rebuild=True)
    try:
        return load(str(path)), path, built
    except OSError as exc:
        raise OSError(f"{path}, built again, does not load either: {exc}") from exc


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
    """``out`` exists and matches the size and SHA-256 recorded when it was built; a
    :class:`CacheError` when it or its manifest is another user's or writable by others."""
    try:
        for path in (_manifest(out), out):
            _check_trusted(path)
        size, digest = _manifest(out).read_text().split()
        return out.stat().st_size == int(size) and file_digest(out) == digest
    except (OSError, ValueError):
        return False


def _publish(tmp: Path, dest: Path, mode: int = 0o644) -> None:
    """Move ``tmp`` (in the build's private work directory) to ``dest`` with ``mode``: no file
    of the cache is ever writable by group or others, whatever the umask."""
    os.chmod(tmp, mode)
    os.replace(tmp, dest)


# the lines a compiler prints when it (or a process it started) runs out of memory, and when
# one crashes or is killed by a signal: g++, clang and nvcc. Only a diagnostic's own line is
# read (a quoted source line is indented), so a program that mentions bad_alloc is no match.
_NO_MEMORY = ("out of memory", "memory exhausted", "cannot allocate memory",
              "std::bad_alloc", "allocation failed")  # fmt: skip
_CRASHED = ("signal terminated program", "due to signal", "unable to execute command")


def _failure(proc: subprocess.CompletedProcess, timeout: float, memory: int | None):
    """The :class:`CompileError` cause of a failed compile (``timeout``; ``killed``: out of
    memory, crashed or killed by a signal; ``error``: the code was refused), and the words that
    say which."""
    if proc.returncode is None:
        return "timeout", f"ran past the timeout of {timeout:g} s and was stopped"
    limit = f"memory limit {memory / 2**30:g} GB" if memory else "no memory limit"
    limit += ", ROOTCLAD_COMPILE_MEMORY_GB"
    lines = [ln.strip() for ln in proc.stderr.splitlines() if not ln[:1].isspace()]

    def first(words):
        return next((ln for ln in lines if any(w in ln.lower() for w in words)), None)

    if line := first(_NO_MEMORY):
        return "killed", f"failed: the compiler ran out of memory ({line}; {limit})"
    sig = -proc.returncode
    if sig > 0:
        return "killed", (f"failed: the compiler was killed by signal {sig} "
                          f"({signal.strsignal(sig)}; {limit})")  # fmt: skip
    if line := first(_CRASHED):
        return "killed", f"failed: the compiler crashed ({line}; {limit})"
    first_error = next((ln for ln in proc.stderr.splitlines() if "error" in ln), "")
    return "error", f"failed; first error: {first_error.strip() or '(none printed)'}"


def _compile(source, out, *, key, name, cxx, flags, link_flags, suffix, timeout, kind):
    root = out.parent
    log_path = root / f"{name}-{key}.log"
    kept_src = root / f"{name}-{key}{suffix}"
    memory = compile_memory_limit()
    work = Path(tempfile.mkdtemp(prefix=f"{name}-{key}.tmp-", dir=root))
    try:
        src = work / f"{name}{suffix}"
        src.write_text(source)
        tmp_out = work / out.name
        # nvcc passes host-compiler options through -Xcompiler
        pic = ["-Xcompiler", "-fPIC"] if Path(cxx).name.startswith("nvcc") else ["-fPIC"]
        how = {"shared": ["-shared", *pic], "object": ["-c", *pic], "program": []}[kind]
        cmd = [cxx, *flags, *how, "-o", str(tmp_out), str(src), *link_flags]
        t0 = time.perf_counter()
        try:
            proc = run_tool(cmd, timeout=timeout, memory=memory)
        except subprocess.TimeoutExpired as exc:  # stopped, with what it printed until then
            proc = subprocess.CompletedProcess(cmd, None, exc.stdout or "", exc.stderr or "")
        elapsed = time.perf_counter() - t0
        # Keep the source next to the library (or the log): users read it, debuggers find it.
        _publish(src, kept_src)
        if proc.returncode != 0 or not tmp_out.is_file():
            log = work / "log"
            log.write_text(
                f"$ {' '.join(cmd)}\n(source kept at {kept_src})\n\n{proc.stdout}{proc.stderr}"
            )
            _publish(log, log_path)
            cause, why = _failure(proc, timeout, memory)
            size = f"{len(source.encode()):,} bytes, {source.count(chr(10)):,} lines of C++"
            raise CompileError(
                f"compiling the generated code for {name!r} ({cxx}, {size}) {why}; "
                f"full log: {log_path}",
                log_path,
                cause,
            )
        build = work / "build"
        build.write_text(f"$ {' '.join(cmd)}\nseconds: {elapsed:.2f}\n{proc.stderr}")
        _publish(build, root / f"{name}-{key}.build")
        _publish_verified(work, tmp_out, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _publish_verified(work: Path, tmp_out: Path, out: Path) -> None:
    """The manifest first, then the file: whoever sees the file can verify it."""
    manifest = work / "manifest"
    manifest.write_text(f"{tmp_out.stat().st_size} {file_digest(tmp_out)}\n")
    _publish(manifest, _manifest(out))
    _publish(tmp_out, out, 0o755)  # atomic: readers see no library or a whole one
