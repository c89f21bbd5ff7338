"""The compile cache trusts only what this user wrote, and rebuilds what fails to load.

A cache another user can write to let them swap a compiled library (and rewrite its manifest):
the next ``rootclad.compile`` ran their code. Cache directories are now made 0700 whatever the
umask, files are written without group/other write permission, and a directory or file owned
by another user or writable by group/others is refused, as ssh and pip refuse theirs. A cached
library that passes its manifest but does not load is built again once, with a warning.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rootclad.toolchain import (
    CacheError,
    CompileError,
    build_library,
    find_cxx,
    load_library,
)
from rootclad.toolchain.build import file_digest

SRC = 'extern "C" int rc_answer() { return 42; }\n'

# a library whose constructor leaves a marker: the proof that it was loaded and ran
ATTACKER = """
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void attack() {
    if (const char* path = std::getenv("RC_MARKER"))
        if (FILE* f = std::fopen(path, "w")) std::fclose(f);
}
"""

CHILD = """
import json, torch, rootclad
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).double()
x = torch.randn(5, 4, dtype=torch.float64)
cm = rootclad.compile(net, example_input=x, engine='pullback')
err = (cm.predict(x) - net(x)).abs().max().item()
print(json.dumps({'lib': str(cm.library_path), 'built': cm.built_now, 'err': err}))
"""

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a file owned by another user needs root to chown it"
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _compile_child(env) -> subprocess.CompletedProcess:
    """rootclad.compile of a small model in a fresh interpreter (one that never loaded the
    cached library, so the dynamic loader really opens the file)."""
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def _result(proc) -> dict:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _swap(lib: Path, replacement: Path) -> None:
    """What the attacker did: the library replaced, its manifest rewritten to match."""
    lib.write_bytes(replacement.read_bytes())
    Path(f"{lib}.sha256").write_text(f"{lib.stat().st_size} {file_digest(lib)}\n")


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_cache_directory_others_can_write_is_refused(tmp_path, monkeypatch, mode):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, mode)
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(cache))
    with pytest.raises(CacheError) as err:
        build_library(SRC, name="rc_trust", cxx=find_cxx()[0], flags=[])
    msg = str(err.value)
    assert str(cache) in msg and f"chmod 700 {cache}" in msg and "ROOTCLAD_CACHE_DIR" in msg
    assert oct(mode)[2:] in msg
    assert list(cache.iterdir()) == []  # nothing built, locked or written there


def test_a_subdirectory_others_can_write_is_refused(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(cache))
    (cache / "libtorch").mkdir(parents=True)
    os.chmod(cache, 0o700)
    os.chmod(cache / "libtorch", 0o777)
    with pytest.raises(CacheError, match=f"{cache / 'libtorch'}.*chmod 700"):
        build_library(SRC, name="rc_trust", cxx=find_cxx()[0], flags=[], subdir="libtorch")
    assert list((cache / "libtorch").iterdir()) == []


@needs_root
def test_a_cache_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(cache))
    with pytest.raises(CacheError, match=f"{cache} is owned by uid 65534.*ROOTCLAD_CACHE_DIR"):
        build_library(SRC, name="rc_trust", cxx=find_cxx()[0], flags=[])


def test_the_cache_is_private_whatever_the_umask(tmp_path, monkeypatch):
    """Under umask 000 the cache, its missing parents and its subdirectories were made 0777 and
    the library, its manifest and the kept source world-writable."""
    cache = tmp_path / "home" / "cache"
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(cache))
    cxx = find_cxx()[0]
    old = os.umask(0)
    try:
        lib, built = build_library(SRC, name="rc_umask", cxx=cxx, flags=[], subdir="sub")
        with pytest.raises(CompileError, match="full log"):  # a failed build keeps a log, source
            build_library("int f( {\n", name="rc_umask_bad", cxx=cxx, flags=[], subdir="sub")
    finally:
        os.umask(old)
    assert built
    for d in (tmp_path / "home", cache, cache / "sub"):
        assert _mode(d) == 0o700, d
    written = list((cache / "sub").iterdir())
    names = {p.name.split("-", 1)[0] + p.suffix for p in written}
    assert {"rc_umask.so", "rc_umask.sha256", "rc_umask.cpp", "rc_umask.build", "rc_umask.lock",
            "rc_umask_bad.log", "rc_umask_bad.cpp"} <= names  # fmt: skip
    for p in written:
        assert _mode(p) & 0o022 == 0, f"{p.name} is {oct(_mode(p))}"
    assert lib in written and _mode(lib) & 0o444 == 0o444  # still readable by its user


@pytest.mark.parametrize("who", ["another user", "group-writable"])
def test_a_library_swapped_in_the_cache_never_runs(tmp_path, runtime_cache, who):
    """The probe's attack: another user replaced a cached library and rewrote its manifest;
    the next compile ran the replacement's constructor. Now it is refused, never loaded."""
    if who == "another user" and os.geteuid() != 0:
        pytest.skip("a file owned by another user needs root to chown it")
    cache, marker = runtime_cache, tmp_path / "attacked"
    env = {**os.environ, "ROOTCLAD_CACHE_DIR": str(cache), "RC_MARKER": str(marker)}
    lib = Path(_result(_compile_child(env))["lib"])
    attacker = tmp_path / "attacker.so"
    subprocess.run([find_cxx()[0], "-shared", "-fPIC", "-x", "c++", "-", "-o", str(attacker)],
                   input=ATTACKER, text=True, check=True)  # fmt: skip
    _swap(lib, attacker)
    for path in (lib, Path(f"{lib}.sha256")):
        if who == "another user":
            os.chown(path, 65534, 65534)
        else:
            os.chmod(path, 0o664)
    proc = _compile_child(env)
    assert proc.returncode != 0
    assert "CacheError" in proc.stderr and str(lib) in proc.stderr, proc.stderr[-2000:]
    assert ("owned by uid 65534" if who == "another user" else "writable by group") in proc.stderr
    assert not marker.exists(), "the replaced library was loaded and its code ran"


def test_a_cached_library_that_does_not_load_is_rebuilt_with_a_warning(tmp_path, runtime_cache):
    """A garbage library with a matching manifest failed every compile ("invalid ELF
    header") until deleted by hand; it is now built again, once, with a warning."""
    cache = runtime_cache
    env = {**os.environ, "ROOTCLAD_CACHE_DIR": str(cache)}
    first = _result(_compile_child(env))
    lib = Path(first["lib"])
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not an ELF file\n" * 1000)
    _swap(lib, garbage)
    proc = _compile_child(env)
    second = _result(proc)
    assert second["lib"] == first["lib"] and second["built"] and second["err"] < 1e-12
    assert f"the cached library {lib} failed to load" in proc.stderr
    assert "invalid ELF header" in proc.stderr and "building it again" in proc.stderr
    third = _compile_child(env)
    assert not _result(third)["built"] and "failed to load" not in third.stderr


def test_a_library_that_fails_to_load_again_after_a_rebuild_raises(tmp_path):
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"\0" * 4096)
    calls = []

    def build(rebuild=False):
        calls.append(rebuild)
        return garbage, rebuild

    with pytest.warns(UserWarning, match=f"the cached library {garbage} failed to load"):
        with pytest.raises(OSError, match=f"{garbage}, built again, does not load either"):
            load_library(build)
    assert calls == [False, True]


def test_a_library_built_just_now_that_fails_to_load_is_not_built_again(tmp_path):
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"\0" * 4096)
    calls = []

    def build(rebuild=False):
        calls.append(rebuild)
        return garbage, True

    with pytest.raises(OSError, match=str(garbage)):
        load_library(build)
    assert calls == [False]


def test_load_library_loads_and_passes_the_build_through(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path / "cache"))
    build = functools.partial(build_library, SRC, name="rc_load", cxx=find_cxx()[0], flags=[])
    lib, path, built = load_library(build)
    assert built and lib.rc_answer() == 42
    assert load_library(build)[1:] == (path, False)


def test_doctor_says_why_the_cache_is_refused(tmp_path, monkeypatch):
    from rootclad.doctor import report

    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(cache))
    line = next(ln for ln in report().splitlines() if ln.strip().startswith("cache"))
    assert f"refused: {cache} is writable by group and others" in line
