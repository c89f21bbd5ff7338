"""Formatting and lint are checked by the tools, so they cannot drift."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY_DIRS = ["rootclad", "tests", "benchmarks", "tutorials"]


def _run(cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_lint():
    dirs = [d for d in PY_DIRS if (ROOT / d).is_dir()]
    out = _run(["ruff", "check", *dirs])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_format():
    dirs = [d for d in PY_DIRS if (ROOT / d).is_dir()]
    out = _run(["ruff", "format", "--check", *dirs])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("clang-format") is None, reason="clang-format is not installed")
def test_clang_format():
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "rootclad" / "include").rglob("*.h"))
    files += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("macros/*.[Ch]"))
    files += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/**/*.cpp"))
    out = _run(["clang-format", "--dry-run", "--Werror", *files])
    assert out.returncode == 0, out.stdout + out.stderr
