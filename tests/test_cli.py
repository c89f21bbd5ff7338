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
