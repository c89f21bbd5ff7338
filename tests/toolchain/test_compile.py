"""A compile that is interrupted, runs too long or runs out of memory leaves nothing running.

The build's timeout raised a raw ``subprocess.TimeoutExpired`` and left the compiler (clang's
cc1) running; Ctrl-C or a kill of the Python process left clang++/cc1plus running; under a
memory cap the CompileError quoted the compiler's crash dump. The compiler now runs in its own
process group, killed whole when the build is interrupted or times out, under an address-space
limit (``ROOTCLAD_COMPILE_MEMORY_GB``); a timeout or an out-of-memory death is a CompileError
that says so. Fake compilers (shell scripts) stand in for a compile that hangs.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import rootclad
import rootclad.compiler
from rootclad.toolchain import CladInstall, CompileError, build_library, find_cxx, recipes

SRC = 'extern "C" int rc_answer() { return 42; }\n'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(path))
    return path


def fake_compiler(tmp_path: Path, body: str) -> Path:
    """A 'compiler' that answers --version, records its pid, then runs ``body``."""
    script = tmp_path / "fake-cxx"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in --version) echo "fake-cxx 1.0"; exit 0;; esac\n'
        f"echo $$ > {tmp_path}/driver.pid\n" + body
    )
    script.chmod(0o755)
    return script


# the driver starts a long child (cc1plus, say) and waits for it
HANGS = "sleep 30 &\necho $! > {dir}/child.pid\nwait\n"


def _pids(tmp_path: Path, names=("driver", "child")) -> list[int]:
    deadline = time.monotonic() + 20
    files = [tmp_path / f"{n}.pid" for n in names]
    while not all(f.is_file() and f.read_text().strip() for f in files):
        assert time.monotonic() < deadline, "the fake compiler never started"
        time.sleep(0.05)
    return [int(f.read_text()) for f in files]


def _alive(pid: int) -> bool:
    """Running (a zombie is not: nothing may reap orphans in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait_gone(pids, seconds=10) -> list[int]:
    """The pids still running after up to ``seconds`` (SIGKILL takes effect asynchronously)."""
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_a_timeout_is_a_compile_error_and_leaves_nothing_running(tmp_path, cache):
    cxx = fake_compiler(tmp_path, HANGS.format(dir=tmp_path))
    t0 = time.monotonic()
    with pytest.raises(CompileError) as err:
        build_library(SRC, name="rc_hang", cxx=str(cxx), flags=[], timeout=2)
    assert time.monotonic() - t0 < 15  # not held until the child's 30 s sleep ends
    msg = str(err.value)
    assert "'rc_hang'" in msg and str(cxx) in msg and "timeout of 2 s" in msg
    assert f"{len(SRC)} bytes" in msg and "1 lines" in msg
    assert err.value.cause == "timeout"
    assert err.value.log_path.is_file() and str(err.value.log_path) in msg
    assert _wait_gone(_pids(tmp_path)) == []
    assert [p for p in cache.iterdir() if p.is_dir()] == []  # no work directory left


def test_ctrl_c_during_a_compile_stops_the_whole_compiler(tmp_path, cache):
    """A KeyboardInterrupt raised from a signal handler while the compiler runs."""
    cxx = fake_compiler(tmp_path, HANGS.format(dir=tmp_path))

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    def press_ctrl_c():
        _pids(tmp_path)
        os.kill(os.getpid(), signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, interrupt)
    thread = threading.Thread(target=press_ctrl_c)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            build_library(SRC, name="rc_ctrl_c", cxx=str(cxx), flags=[], timeout=60)
    finally:
        thread.join()
        signal.signal(signal.SIGUSR1, old)
    assert _wait_gone(_pids(tmp_path)) == []


def test_the_compiler_dies_with_a_killed_python(tmp_path, cache):
    """SIGKILL (or an unhandled SIGTERM) of Python runs no Python code: the kernel ends the
    compiler driver (PR_SET_PDEATHSIG). Here the driver is the compile, as clang's is (it runs
    its cc1 in-process)."""
    cxx = fake_compiler(tmp_path, "exec sleep 30\n")
    code = (
        "from rootclad.toolchain import build_library\n"
        f"build_library({SRC!r}, name='rc_orphan', cxx={str(cxx)!r}, flags=[], timeout=60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        (driver,) = _pids(tmp_path, ["driver"])
        assert _alive(driver)
    finally:
        proc.kill()
        proc.wait()
    assert _wait_gone([driver]) == []


def test_a_compiler_out_of_memory_says_so(cache, monkeypatch):
    """Under the memory limit g++ dies ('virtual memory exhausted', or a crash in cc1plus):
    the error says the compiler ran out of memory, and names the limit and its variable."""
    monkeypatch.setenv("ROOTCLAD_COMPILE_MEMORY_GB", "0.06")
    src = "#include <map>\n#include <string>\nstd::map<std::string, int> m;\n"
    with pytest.raises(CompileError) as err:
        build_library(src, name="rc_oom", cxx=find_cxx()[0], flags=["-O2"])
    msg = str(err.value)
    assert "the compiler ran out of memory (" in msg or "the compiler crashed (" in msg, msg
    assert "memory limit 0.06 GB" in msg and "ROOTCLAD_COMPILE_MEMORY_GB" in msg
    assert err.value.cause == "killed"
    assert err.value.log_path.is_file()


def test_a_compiler_killed_by_a_signal_says_so(tmp_path, cache):
    cxx = fake_compiler(tmp_path, "kill -KILL $$\n")
    with pytest.raises(CompileError, match=r"the compiler was killed by signal 9 \(Killed;") as err:
        build_library(SRC, name="rc_killed_cxx", cxx=str(cxx), flags=[])
    assert err.value.cause == "killed"


def test_a_crashed_compiler_is_not_said_to_be_out_of_memory(tmp_path, cache):
    """clang's crash report (a Clad bug, say) was read as 'ran out of memory or was killed'."""
    cxx = fake_compiler(tmp_path, "echo 'clang++: error: clang frontend command failed due to "
                                  "signal (use -v to see invocation)' >&2\nexit 1\n")  # fmt: skip
    with pytest.raises(CompileError, match="the compiler crashed \\(clang.*due to signal") as err:
        build_library(SRC, name="rc_crashed_cxx", cxx=str(cxx), flags=[])
    assert err.value.cause == "killed" and "out of memory" not in str(err.value)


def test_a_program_that_names_bad_alloc_is_an_error_not_a_lack_of_memory(tmp_path, cache):
    cxx = fake_compiler(tmp_path, "echo 'x.cpp:3:1: error: no member named bad_alloc_x' >&2\n"
                                  "echo '    std::bad_alloc e;' >&2\nexit 1\n")  # fmt: skip
    with pytest.raises(CompileError, match="first error: x.cpp:3:1") as err:
        build_library(SRC, name="rc_error_cxx", cxx=str(cxx), flags=[])
    assert err.value.cause == "error"


@pytest.mark.parametrize("value", ["3", "0.5"])
def test_the_memory_limit_reaches_the_compiler(tmp_path, cache, monkeypatch, value):
    cxx = fake_compiler(tmp_path, f"ulimit -v > {tmp_path}/limit\nexit 1\n")
    monkeypatch.setenv("ROOTCLAD_COMPILE_MEMORY_GB", value)
    with pytest.raises(CompileError):
        build_library(SRC, name="rc_limit", cxx=str(cxx), flags=[])
    assert int((tmp_path / "limit").read_text()) == int(float(value) * 2**30) // 1024


def test_the_default_memory_limit_is_below_the_machines_memory(tmp_path, cache, monkeypatch):
    """Without the variable a compile still cannot take all the memory (densenet121 through
    the clad engine grew clang to 23 of 24 GB)."""
    monkeypatch.delenv("ROOTCLAD_COMPILE_MEMORY_GB", raising=False)
    cxx = fake_compiler(tmp_path, f"ulimit -v > {tmp_path}/limit\nexit 1\n")
    with pytest.raises(CompileError):
        build_library(SRC, name="rc_limit", cxx=str(cxx), flags=[])
    limit = (tmp_path / "limit").read_text().strip()
    mem_kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    assert limit != "unlimited" and 0 < int(limit) < mem_kb


def test_no_memory_limit_with_zero(tmp_path, cache, monkeypatch):
    if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        pytest.skip("this process itself runs under an address-space limit")
    cxx = fake_compiler(tmp_path, f"ulimit -v > {tmp_path}/limit\nexit 1\n")
    monkeypatch.setenv("ROOTCLAD_COMPILE_MEMORY_GB", "0")
    with pytest.raises(CompileError):
        build_library(SRC, name="rc_limit", cxx=str(cxx), flags=[])
    assert (tmp_path / "limit").read_text().strip() == "unlimited"


@pytest.mark.parametrize("value", ["lots", "-1", "nan", "inf"])
def test_a_bad_memory_limit_is_refused_by_name(cache, monkeypatch, value):
    monkeypatch.setenv("ROOTCLAD_COMPILE_MEMORY_GB", value)
    with pytest.raises(ValueError, match=f"ROOTCLAD_COMPILE_MEMORY_GB={value!r}"):
        build_library(SRC, name="rc_limit", cxx=find_cxx()[0], flags=[])


# -- the engine: a clad build that runs out of time or memory falls back to the pullback one
def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


@pytest.fixture
def fake_clad(tmp_path, monkeypatch, runtime_cache):
    """A Clad install whose builds fail as ``fake_clad.cause`` says; the pullback engine's
    builds run for real (in a cache of their own that already holds the runtime)."""
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(runtime_cache))
    plugin = tmp_path / "clad.so"
    plugin.write_bytes(b"")
    install = CladInstall(cxx=find_cxx()[0], plugin=str(plugin), include=str(tmp_path),
                          version="fake")  # fmt: skip
    monkeypatch.setattr(rootclad.compiler, "find_clad", lambda: (install, "found"))
    real = recipes.build_library
    state = {"cause": "timeout", "clad_builds": 0}

    def build(source, *, flags, **kw):
        if f"-fplugin={plugin}" in flags:
            state["clad_builds"] += 1
            log = tmp_path / "clad.log"
            log.write_text("clang: killed\n")
            raise CompileError(f"fake clad build failed ({state['cause']})", log, state["cause"])
        return real(source, flags=flags, **kw)

    monkeypatch.setattr(recipes, "build_library", build)
    return state


@pytest.mark.parametrize("cause", ["timeout", "killed"])
def test_auto_falls_back_to_the_pullback_engine_when_clad_runs_out(fake_clad, cause):
    fake_clad["cause"] = cause
    net, x = _net(), torch.randn(5, 4)
    with pytest.warns(UserWarning, match=f"the clad engine's build .*{cause}.*pullback engine"):
        cm = rootclad.compile(net, example_input=x, engine="auto")
    assert fake_clad["clad_builds"] == 1 and cm.engine == "pullback"
    torch.testing.assert_close(cm.predict(x), net(x).detach())


def test_an_explicit_clad_engine_does_not_fall_back(fake_clad):
    with pytest.raises(CompileError, match="clad engine.*engine='pullback'"):
        rootclad.compile(_net(), example_input=torch.randn(5, 4), engine="clad")


def test_a_clad_compile_error_does_not_fall_back(fake_clad):
    """Wrong generated code is a bug to see, not a reason to switch engines."""
    fake_clad["cause"] = "error"
    with pytest.raises(CompileError, match=r"fake clad build failed \(error\)"):
        rootclad.compile(_net(), example_input=torch.randn(5, 4), engine="auto")
    assert fake_clad["clad_builds"] == 1
