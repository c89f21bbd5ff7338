"""The root.exe macros: training in C++ from a TTree and RDataFrame scoring, plain and ACLiC.

References: the same model trained from Python on the batches the Python iterator gives for the
same settings, and an AUC computed here from the compiled model's scores.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import uproot
from torch import nn

pytest.importorskip("ROOT", reason="the macros need ROOT")
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("root") is None, reason="root.exe not on PATH"),
]

import rootclad  # noqa: E402
from rootclad.data.compiled import CompiledBatchIterator  # noqa: E402
from rootclad.gw import simulate  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
N = 256  # 0.125 s at 2048 Hz


def _net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(1, 4, 8), nn.ReLU(), nn.MaxPool1d(4), nn.Flatten(),
                        nn.Linear(4 * 62, 1))  # fmt: skip
    return net


@pytest.fixture(scope="module")
def gw_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gw") / "gw.root"
    simulate(path, 400, seed=1, workers=1, progress=False, duration=N / 2048)
    return path


def _root(macro_call: str, build_dir: Path) -> subprocess.CompletedProcess:
    """``root -l -b -q`` on a macro call; ACLiC builds go to build_dir, not into macros/."""
    cmd = ["root", "-l", "-b", "-q", "-e", f'gSystem->SetBuildDir("{build_dir}", true);',
           macro_call]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("aclic", [False, True], ids=["cling", "aclic"])
def test_train_macro_equals_python_training(gw_file, tmp_path, aclic):
    cm = rootclad.compile(_net(), example_input=torch.zeros(1, 1, N), engine="pullback")
    start = {k: v.clone() for k, v in cm.state_dict().items()}
    cm.export(tmp_path / "gwnet")
    plus = "+" if aclic else ""
    out = _root(f'macros/train_gw.C{plus}("{gw_file}", "{tmp_path / "gwnet"}", 2, 64, 1e-3, 0.2, 7)',
                tmp_path)  # fmt: skip
    assert "saved the weights" in out.stdout, out.stdout + out.stderr
    losses = [float(v) for v in re.findall(r"train loss ([\d.]+)", out.stdout)]
    assert len(losses) == 2
    # the same run in Python: the iterator plans the batches as tree_reader.h does
    it = CompiledBatchIterator(str(gw_file), batch_size=64, split="train",
                               validation_fraction=0.2, shuffle=True, seed=7)  # fmt: skip
    opt = rootclad.optim.Adam(cm, lr=1e-3)
    for epoch in range(2):
        total = seen = 0
        for x, y in it:
            total += cm.train_step(torch.from_numpy(x), torch.from_numpy(y).float(), opt) * len(y)
            seen += len(y)
        assert abs(total / seen - losses[epoch]) <= 1e-5 * losses[epoch]
    with uproot.open(tmp_path / "gwnet.root") as f:
        for name, p in cm.state_dict().items():
            trained = f[name]["values"].array(library="np")[0]
            np.testing.assert_allclose(trained, p.reshape(-1).double().numpy(), rtol=1e-5,
                                       atol=1e-7)  # fmt: skip
            assert not np.allclose(trained, start[name].reshape(-1).numpy())  # it trained


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(signal outscores noise), ties counted half."""
    sig, bkg = scores[labels == 1], scores[labels == 0]
    greater = (sig[:, None] > bkg[None, :]).sum() + 0.5 * (sig[:, None] == bkg[None, :]).sum()
    return float(greater) / (len(sig) * len(bkg))


@pytest.mark.slow
@pytest.mark.parametrize("aclic", [False, True], ids=["cling", "aclic"])
def test_score_macro_writes_histograms_roc_and_png(gw_file, tmp_path, aclic):
    cm = rootclad.compile(_net(), example_input=torch.zeros(1, 1, N), engine="pullback")
    cm.export(tmp_path / "gwnet")
    plus = "+" if aclic else ""
    out = _root(f'macros/score_gw.C{plus}("{gw_file}", "{tmp_path / "gwnet"}", '
                f'"{tmp_path / "scores"}")', tmp_path)  # fmt: skip
    m = re.search(r"AUC ([\d.]+) on 400 events", out.stdout)
    assert m, out.stdout + out.stderr
    with uproot.open(gw_file) as f:
        x = f["events"]["strain"].array(library="np").reshape(-1, 1, N)
        labels = f["events"]["label"].array(library="np")
    scores = cm.predict(torch.from_numpy(x)).numpy()[:, 0]
    assert abs(float(m.group(1)) - _auc(scores, labels)) < 1e-6
    with uproot.open(tmp_path / "scores.root") as f:
        assert f["score_noise"].values().sum() == (labels == 0).sum()
        assert f["score_signal"].values().sum() == (labels == 1).sum()
        assert f["saliency"].values().shape == (N,)
        assert "roc" in [k.split(";")[0] for k in f.keys()]
    assert (tmp_path / "scores.png").stat().st_size > 10_000
    _check_roc_pad(tmp_path / "scores.root", n_noise=int((labels == 0).sum()))


@pytest.mark.slow
def test_score_macro_reads_the_columns_the_model_was_exported_with(gw_file, tmp_path):
    """The same events under other branch names ("h", "truth"): score_gw.C takes them from the
    export's schema (rootclad::Model::input_columns, target_column), not from its defaults."""
    with uproot.open(gw_file) as f:
        x = f["events"]["strain"].array(library="np")
        labels = f["events"]["label"].array(library="np")
    renamed = tmp_path / "renamed.root"
    with uproot.recreate(renamed) as f:
        f.mktree("events", {"h": np.dtype((np.float32, (N,))), "truth": np.int32}).extend(
            {"h": x.astype(np.float32), "truth": labels.astype(np.int32)}
        )
    cm = rootclad.compile(_net(), example_input=torch.zeros(1, 1, N), engine="pullback")
    cm.export(tmp_path / "gwnet", schema=rootclad.data.Schema({"h": N}, target="truth"))
    out = _root(f'macros/score_gw.C("{renamed}", "{tmp_path / "gwnet"}", "{tmp_path / "s"}")',
                tmp_path)  # fmt: skip
    m = re.search(r"AUC ([\d.]+) on 400 events", out.stdout)
    assert m, out.stdout + out.stderr
    scores = cm.predict(torch.from_numpy(x.reshape(-1, 1, N))).numpy()[:, 0]
    assert abs(float(m.group(1)) - _auc(scores, labels)) < 1e-6


def _check_roc_pad(path: Path, n_noise: int) -> None:
    """The ROC as OUT.png draws it (the canvas, saved in OUT.root): a logarithmic false-alarm
    axis reaching below the floor, the floor (1 / noise events) as a vertical line, the curve
    drawn only at measured, positive false-alarm probabilities; the floor also as a number."""
    from rootclad.data.cling import import_root

    ROOT = import_root()
    ROOT.gROOT.SetBatch(True)
    f = ROOT.TFile.Open(str(path))
    try:
        floor = 1.0 / n_noise
        assert f.Get("roc_floor").GetVal() == pytest.approx(floor, rel=1e-12)
        pad = f.Get("canvas").GetPad(2)
        assert pad.GetLogx() == 1
        prims = list(pad.GetListOfPrimitives())
        frame = next(o for o in prims if o.InheritsFrom("TH1"))
        assert frame.GetXaxis().GetXmin() < floor and frame.GetXaxis().GetXmax() == 1
        assert frame.GetXaxis().GetTitle() == "false-alarm probability"
        lines = [o for o in prims if o.ClassName() == "TLine"]
        assert any(ln.GetX1() == ln.GetX2() == pytest.approx(floor, rel=1e-12) for ln in lines)
        (curve,) = [o for o in prims if o.InheritsFrom("TGraph")]
        x = [curve.GetPointX(i) for i in range(curve.GetN())]
        assert min(x) == pytest.approx(floor, rel=1e-12) and max(x) == 1.0
        legend = next(o for o in prims if o.ClassName() == "TLegend")
        labels = [e.GetLabel() for e in legend.GetListOfPrimitives()]
        assert any("noise events" in t for t in labels), labels
    finally:
        f.Close()


def test_macros_report_bad_input_and_return_nonzero(tmp_path):
    out = _root(f'macros/train_gw.C("{tmp_path / "nope.root"}", "{tmp_path / "nope"}", 1)',
                tmp_path)  # fmt: skip
    assert "train_gw: " in out.stderr and "nope.root" in out.stderr, out.stderr
    assert "(int) 1" in out.stdout
    out = _root(f'macros/score_gw.C("{tmp_path / "nope.root"}", "{tmp_path / "nope"}")', tmp_path)
    assert "score_gw: " in out.stderr and "nope" in out.stderr, out.stderr


def test_exported_header_is_all_a_macro_needs(tmp_path):
    """#include "STEM.h" (rootclad's C++ host in one file) declares rootclad::Model; the
    macro lives outside the checkout."""
    cm = rootclad.compile(_net(), example_input=torch.zeros(1, 1, N), engine="pullback")
    cm.export(tmp_path / "net")
    x = torch.linspace(-1, 1, N).reshape(1, 1, N)
    (tmp_path / "use_net.C").write_text(
        f'#include "{tmp_path / "net.h"}"\n'
        "int use_net() {\n"
        f'  rootclad::Model m("{tmp_path / "net"}");\n'
        f"  std::vector<float> x({N}), out(1);\n"
        f"  for (int i = 0; i < {N}; ++i) x[i] = -1.0f + 2.0f * i / ({N} - 1);\n"
        "  m.predict(x.data(), out.data(), 1);\n"
        '  printf("score %.9g\\n", out[0]);\n'
        "  return 0;\n"
        "}\n"
    )
    out = subprocess.run(["root", "-l", "-b", "-q", str(tmp_path / "use_net.C")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    m = re.search(r"score (\S+)", out.stdout)
    assert m, out.stdout + out.stderr
    assert abs(float(m.group(1)) - cm.predict(x).item()) <= 1e-6
