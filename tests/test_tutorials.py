"""The tutorials run headless and say what they claim: the notebooks (executed with nbclient
in a fresh kernel) and the PyROOT script."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


def _execute(name: str) -> str:
    """Runs the notebook top to bottom in a fresh kernel; its printed output."""
    nbformat = pytest.importorskip("nbformat", reason="the notebooks need the test extra")
    nbclient = pytest.importorskip("nbclient", reason="the notebooks need the test extra")
    book = nbformat.read(TUTORIALS / name, as_version=4)
    nbclient.NotebookClient(book, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(TUTORIALS)}}).execute()  # fmt: skip
    return "".join(o.get("text", "") for c in book.cells for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")  # fmt: skip


def test_notebooks_are_numbered_and_outputs_are_not_committed():
    books = sorted(p.name for p in TUTORIALS.glob("*.ipynb"))
    assert books == ["01_compile_and_train.ipynb", "02_root.ipynb", "03_gw_workflow.ipynb",
                     "04_hep_architectures.ipynb"]  # fmt: skip
    nbformat = pytest.importorskip("nbformat", reason="the notebooks need the test extra")
    for name in books:
        book = nbformat.read(TUTORIALS / name, as_version=4)
        assert not any(c.get("outputs") for c in book.cells if c.cell_type == "code"), name


def test_compile_and_train_notebook():
    out = _execute("01_compile_and_train.ipynb")
    diff = re.search(r"largest gradient difference (\S+)", out)
    assert diff and float(diff.group(1)) < 1e-4, out
    acc = re.search(r"training accuracy (\S+)", out)
    assert acc and float(acc.group(1)) > 0.9, out


def test_hep_architectures_notebook():
    """Embedding indices, a padding mask, attention and an LSTM in one tagger: torch's
    gradients, a bad particle type named, a tagger that learns the toy jets, and its ONNX
    file imported."""
    out = _execute("04_hep_architectures.ipynb")
    diff = re.search(r"largest gradient difference (\S+)", out)
    assert diff and float(diff.group(1)) < 1e-4, out
    assert re.search(r"input 1\[2, 5\] = 5: the Embedding reading it has 5 rows", out), out
    acc = re.search(r"training accuracy (\S+)", out)
    assert acc and float(acc.group(1)) > 0.9, out
    onnx = re.search(r"ONNX file imported; largest difference from torch over \d+ jets: (\S+)", out)
    assert onnx and float(onnx.group(1)) < 1e-5, out


@pytest.mark.slow
def test_root_notebook():
    pytest.importorskip("ROOT", reason="the notebook needs ROOT")
    out = _execute("02_root.ipynb")
    assert "400 events scored in C++" in out and "saved the weights" in out, out
    assert "columns: strain (256) target: label" in out, out  # the schema travelled
    loss = re.search(r"training loss after 5 epochs: ([\d.]+)", out)
    assert loss and float(loss.group(1)) < 0.6, out  # the standardised table model learned
    assert "columns=(('pt', 1), ('eta', 1), ('jets', 4))" in out, out
    first = re.search(r"\[([^\]]*)\] \[([^\]]*)\]", out)  # Model.predict next to cm.predict
    assert first and first.group(1).split() == first.group(2).split(), out


@pytest.mark.slow
def test_gw_workflow_notebook():
    out = _execute("03_gw_workflow.ipynb")
    aucs = [float(v) for v in re.findall(r"AUC (\S+)", out)]
    assert len(aucs) == 2 and min(aucs) > 0.8, out  # network and matched filter


def test_root_libtorch_tutorial():
    """LibTorch training from PyROOT through the compiled trainer learns the GW task."""
    pytest.importorskip("ROOT", reason="the tutorial needs ROOT")
    out = subprocess.run([sys.executable, str(TUTORIALS / "root_libtorch.py")],
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    final = next(ln for ln in out.stdout.splitlines() if ln.startswith("validation accuracy"))
    assert float(final.split()[2].rstrip(";")) > 0.8, final


def test_minuit_network_fit_tutorial():
    """Minuit2 with the compiled network's gradient lands where torch's L-BFGS does, in fewer
    chi2 evaluations than Minuit2 with its own finite differences."""
    pytest.importorskip("ROOT", reason="the tutorial needs ROOT")
    out = subprocess.run([sys.executable, str(TUTORIALS / "minuit_network_fit.py")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    diffs = [float(v) for v in re.findall(r"- torch\| = (\S+)", out.stdout)]
    assert len(diffs) == 2 and max(diffs) < 1e-4, out.stdout
    calls = re.search(r"calls with gradient (\d+), without (\d+)", out.stdout)
    assert calls and int(calls.group(1)) < int(calls.group(2)), out.stdout


def test_roofit_neural_likelihood_tutorial(tmp_path):
    """The network trained on the toy, fitted inside RooFit with its own gradient, lands within
    the exact fit's uncertainty with the same uncertainty; the fit with Minuit's numerical
    gradient lands at the same point; the profile and the workspace are written."""
    pytest.importorskip("ROOT", reason="the tutorial needs ROOT")
    script = [
        sys.executable,
        str(TUTORIALS / "roofit_neural_likelihood.py"),
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(script, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^exact \(RooGaussian::fitTo\) +\S+ +\S+", out.stdout, re.M), out.stdout
    shift = re.search(r"network - exact: (\S+) sigma; error ratio (\S+)", out.stdout)
    assert shift and abs(float(shift.group(1))) < 1 and abs(float(shift.group(2)) - 1) < 0.1, (
        out.stdout
    )
    values = re.findall(r"^network, .*? (-?\d+\.\d{4}) ", out.stdout, re.M)
    assert len(values) == 2 and values[0] == values[1], out.stdout
    assert (tmp_path / "profile.png").stat().st_size > 10_000
    assert (tmp_path / "workspace.root").is_file()
