"""The rootclad command line."""

import os
import subprocess
import sys


def _doctor(env=None):
    out = subprocess.run([sys.executable, "-m", "rootclad", "doctor"], capture_output=True,
                         text=True, env={**os.environ, **(env or {})}, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_doctor_lists_engines_and_tools():
    text = _doctor()
    for needle in ("pullback", "clad", "torch autograd", "BLAS", "ROOT", "nvcc", "cache"):
        assert needle in text, (needle, text)


def test_doctor_says_where_it_looked_for_clad():
    text = _doctor({"ROOTCLAD_CLAD_PLUGIN": "/nonexistent/clad.so"})
    clad_line = next(ln for ln in text.splitlines() if ln.strip().startswith("clad "))
    assert "unavailable" in clad_line and "/nonexistent/clad.so" in clad_line, clad_line


def _rootclad(*args):
    return subprocess.run([sys.executable, "-m", "rootclad", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_ordinary_mistakes_get_one_line_not_a_traceback(tmp_path):
    cases = [
        (["gw", "simulate", str(tmp_path / "x.root"), "-n", "5", "--sample-rate", "1000"],
         "power of two"),
        (["gw", "info", str(tmp_path / "missing.root")], "No such file"),
        (["gw", "simulate", str(tmp_path / "no" / "dir" / "x.root"), "-n", "5"],
         "no such directory"),
        (["gw", "simulate", str(tmp_path / "x.root"), "-n", "5", "--snr", "5,inf"], "finite"),
        (["gw", "simulate", str(tmp_path / "x.root"), "-n", "5", "--chunk-size", "0"],
         "chunk_size"),
    ]  # fmt: skip
    for args, words in cases:
        out = _rootclad(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("rootclad gw ") and words in out.stderr, out.stderr
    assert not any(tmp_path.iterdir())


def test_help_does_not_call_the_demo_the_gw_workflow():
    out = _rootclad("--help")
    demo = out.stdout[out.stdout.index("demo") :]
    assert "synthetic" in demo and "not yet the GW workflow" in " ".join(demo.split())
