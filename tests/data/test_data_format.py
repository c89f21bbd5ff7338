"""Formatting by tools, checked here so it cannot drift (ruff for Python, clang-format for C++)."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = [
    "rootclad/gw",
    "rootclad/data",
    "tests/gw",
    "tests/data",
    "benchmarks/gw",
    "benchmarks/data",
]
CXX = ["rootclad/include/rootclad/tree_reader.h", "macros/read_gw_batches.C"]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff not installed")
def test_python_is_ruff_clean():
    paths = [p for p in PYTHON if (REPO / p).exists()]
    fmt = subprocess.run(
        ["ruff", "format", "--check", *paths], cwd=REPO, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    lint = subprocess.run(["ruff", "check", *paths], cwd=REPO, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.skipif(shutil.which("clang-format") is None, reason="clang-format not installed")
def test_cxx_is_clang_formatted():
    out = subprocess.run(
        ["clang-format", "--dry-run", "--Werror", *CXX], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
