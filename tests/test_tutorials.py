"""The tutorials run and say what they claim."""

import subprocess
import sys
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


def test_compile_and_train_tutorial():
    out = subprocess.run([sys.executable, str(TUTORIALS / "compile_and_train.py")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    diff = next(ln for ln in lines if "largest gradient difference" in ln)
    assert float(diff.rsplit(" ", 1)[1]) < 1e-4, diff
    final = next(ln for ln in lines if ln.startswith("final loss"))
    assert float(final.split()[-1]) > 0.9, final  # training accuracy


def test_root_libtorch_tutorial():
    """LibTorch training from PyROOT through the compiled trainer learns the GW task."""
    import pytest

    pytest.importorskip("ROOT", reason="the tutorial needs ROOT")
    out = subprocess.run([sys.executable, str(TUTORIALS / "root_libtorch.py")],
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    final = next(ln for ln in out.stdout.splitlines() if ln.startswith("validation accuracy"))
    assert float(final.split()[2].rstrip(";")) > 0.8, final
