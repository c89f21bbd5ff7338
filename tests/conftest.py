"""Fixtures for every test: a private compile cache, one torch thread, the toolchain switches."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
import torch

from rootclad.toolchain import find_clad, find_cxx


@pytest.fixture(scope="session", autouse=True)
def _rootclad_cache_dir(tmp_path_factory):
    """Compiled libraries of this session go to a tmp dir, never to ~/.cache/rootclad.

    Session-scoped, so it sets ``os.environ`` itself (monkeypatch is function-scoped);
    equal models share one library across the tests of the session, and the workers of one
    pytest-xdist session share the cache (the runtime libraries built once, under the cache's
    per-key locks), in the directory above their own.
    """
    old = os.environ.get("ROOTCLAD_CACHE_DIR")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        cache = tmp_path_factory.getbasetemp().parent / "rootclad-cache"
        cache.mkdir(mode=0o700, exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("rootclad-cache")
    os.environ["ROOTCLAD_CACHE_DIR"] = str(cache)
    yield
    if old is None:
        os.environ.pop("ROOTCLAD_CACHE_DIR", None)
    else:
        os.environ["ROOTCLAD_CACHE_DIR"] = old


@pytest.fixture
def runtime_cache(tmp_path):
    """A test's own compile cache (``tmp_path / "cache"``, 0700) that already holds the
    session's runtime object and library with their manifests, copied: a test about a model's
    cached library (damaged, swapped, rebuilt) then builds that library alone, not the
    runtime again (16 s each)."""
    import shutil
    from pathlib import Path

    from rootclad.toolchain.recipes import runtime_library, runtime_object

    cxx = find_cxx()[0]
    built = [runtime_object(cxx), runtime_library(cxx)]  # in the session's cache
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o700)
    for path in built:
        for f in (path, Path(f"{path}.sha256")):
            shutil.copy2(f, cache / f.name)
    return cache


@pytest.fixture
def toolchain_env():
    """A monkeypatch for toolchain variables; the finders' caches are cleared around it.

    ``find_cxx``/``find_clad`` are cached per process, so a test that fakes an absent tool
    must clear them before (to see its fake) and after (so later tests see the real tools).
    """
    find_cxx.cache_clear()
    find_clad.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        yield mp
    find_cxx.cache_clear()
    find_clad.cache_clear()


@pytest.fixture
def clad():
    """The installed Clad; skips, saying what was looked for, when there is none."""
    install, why = find_clad()
    if install is None:
        pytest.skip(f"Clad not found: {why}")
    return install


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The tests' tensors are tiny: torch's thread pool only adds spin-waiting (5x slower
    reference runs on a busy 2-core CI machine). Restored after each module."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 1 MB tmpfs that a filler file has filled to the last byte (skipped
    where a tmpfs cannot be mounted)."""
    d = tmp_path / "disk"
    d.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        with open(d / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as err:
                assert err.errno == errno.ENOSPC
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)  # -l: a traceback may hold a file open
