"""rootclad.root.evaluate: a TMVA-style evaluation of an exported classifier.

References: the torch module itself (its scores and input gradients on the same events),
scikit-learn's roc_auc_score and roc_curve, numpy histograms and counts, ROOT's
TH1::KolmogorovTest on histograms this test fills itself, and a net built to ignore one input
(whose importance must then be zero)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="evaluate reads RDataFrames and writes ROOT files")
sklearn_metrics = pytest.importorskip("sklearn.metrics", reason="the AUC reference")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402
from rootclad.data import Schema  # noqa: E402

N = 800  # events per file: half train, half test


def _write(path: Path, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, N).astype(np.int32)
    data = {
        "pt": (rng.normal(50, 10, N) + 6 * label).astype(np.float32),
        "eta": rng.normal(0, 2, N).astype(np.float32),
        "jets": (rng.normal(3, 1, (N, 4)) + 0.5 * label[:, None]).astype(np.float32),
        "label": label,
        "w": rng.uniform(0.5, 2, N),
        "half": (np.arange(N) % 2).astype(np.int32),
    }
    types = {k: np.dtype((v.dtype, v.shape[1:])) for k, v in data.items()}
    with uproot.recreate(path) as f:
        f.mktree("t", types).extend(data)
    return data


def _x(data, keep) -> np.ndarray:
    return np.concatenate([data["pt"][keep, None], data["eta"][keep, None], data["jets"][keep]], 1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("evaluate")
    data = _write(d / "toy.root", 3)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    with torch.no_grad():
        net[0].weight[:, 0] *= 0.05  # pt in its units
        net[0].weight[:, 1] = 0.0  # eta is ignored: its importance must be zero
    cm = rootclad.compile(net, torch.zeros(1, 6), engine="pullback")
    cm.export(d / "net", schema=Schema({"pt": 1, "eta": 1, "jets": 4}, target="label", weight="w"))
    return d, data, net


def _frames(d: Path, half: int):
    df = ROOT.RDataFrame("t", str(d / "toy.root")).Filter(f"half == {half}")
    return {"signal": df.Filter("label == 1"), "background": df.Filter("label == 0")}


def _torch_scores(net, data, keep) -> np.ndarray:
    with torch.no_grad():
        return net(torch.tensor(_x(data, keep), dtype=torch.float32)).numpy()[:, 0]


def test_evaluation_against_sklearn_numpy_and_root(setup):
    d, data, net = setup
    ev = rootclad.root.evaluate(
        d / "net",
        test=_frames(d, 1),
        train=_frames(d, 0),
        weight="w",
        output=d / "ev.root",
        bootstrap=50,
    )
    test = data["half"] == 1
    score, y, w = _torch_scores(net, data, test), data["label"][test], data["w"][test]
    assert ev.auc == pytest.approx(
        sklearn_metrics.roc_auc_score(y, score, sample_weight=w), abs=1e-6
    )
    fpr, tpr, _ = sklearn_metrics.roc_curve(y, score, sample_weight=w, drop_intermediate=False)
    sig, rej = ev.roc
    np.testing.assert_allclose(1 - rej, fpr, atol=1e-9)  # a point per distinct score
    np.testing.assert_allclose(sig, tpr, atol=1e-9)
    assert 0 < ev.auc_error < 0.1
    for bkg_eff in (0.01, 0.1, 0.3):  # the summary's working points, against sklearn's ROC
        want = np.interp(bkg_eff, fpr, tpr)
        assert ev.signal_efficiency_at(bkg_eff) == pytest.approx(want, abs=1e-9)

    with uproot.open(d / "ev.root") as f:
        counts, edges = f["score_test_signal"].to_numpy()
        summary = json.loads(str(f["rootclad_evaluation"]))
    # the edges are the scores' extremes: torch's float32 score of the extreme event may lie
    # a rounding below rootclad's, outside them
    inside = np.clip(score[y == 1], edges[0], edges[-1])
    ref, _ = np.histogram(inside, edges, weights=w[y == 1])
    np.testing.assert_allclose(counts, ref, rtol=1e-9)
    assert summary["auc"] == pytest.approx(ev.auc)

    # KS: ROOT's test on histograms filled here from torch's scores
    train = data["half"] == 0
    score_tr, y_tr, w_tr = _torch_scores(net, data, train), data["label"][train], data["w"][train]
    for cls, c in (("signal", 1), ("background", 0)):
        h = [ROOT.TH1D(f"ks_{cls}_{i}", "", len(edges) - 1, edges) for i in range(2)]
        for hh, (s, ww) in zip(
            h, ((score_tr[y_tr == c], w_tr[y_tr == c]), (score[y == c], w[y == c])), strict=True
        ):
            hh.Sumw2()
            # as above; ROOT's last bin excludes its upper edge, numpy's includes it
            s = np.clip(s, edges[0], np.nextafter(edges[-1], -np.inf)).astype(np.float64)
            hh.FillN(len(s), s, ww.astype(np.float64))
        assert ev.ks[cls] == pytest.approx(h[0].KolmogorovTest(h[1]), abs=1e-9)

    f = ROOT.TFile.Open(str(d / "ev.root"))
    eff = f.Get("efficiency_background")
    for i, cut in enumerate(ev.cuts[:10], 1):
        bkg = y == 0
        assert eff.GetEfficiency(i) == pytest.approx(w[bkg][score[bkg] >= cut].sum() / w[bkg].sum())
    f.Close()


def test_importance_of_an_ignored_input_is_zero(setup, tmp_path):
    d, data, net = setup
    mine = ROOT.TFile.Open(str(tmp_path / "mine.root"), "RECREATE")  # the user's current file
    theirs = ROOT.TH1D("score_test_signal", "the user's own", 3, 0, 1)
    ev = rootclad.root.evaluate(
        d / "net",
        test=(str(d / "toy.root"), "t"),
        label="label",
        output=d / "ev_label.root",
        plots=False,
        bootstrap=2,
    )
    assert mine.Get("score_test_signal") == theirs  # left where it was, named as it was
    assert ROOT.gDirectory.GetPath() == mine.GetPath()  # still the user's current directory
    mine.Close()
    grad, perm = ev.importance["input gradient"], ev.importance["permutation (AUC lost)"]
    assert set(grad) == set(perm) == {"pt", "eta", "jets"}
    assert grad["eta"] == 0.0 and perm["eta"] == 0.0
    assert grad["jets"] > 0 and grad["pt"] > 0
    # the gradient importance against torch autograd: mean |d score / d x| * std(x), per column
    x = torch.tensor(_x(data, slice(None)), dtype=torch.float32, requires_grad=True)
    (g,) = torch.autograd.grad(net(x).sum(), x)
    xn = x.detach().numpy().astype(np.float64)
    ref = np.abs(g.numpy()).mean(0) * xn.std(0)
    assert grad["jets"] == pytest.approx(ref[2:].sum(), rel=1e-4)
    assert grad["pt"] == pytest.approx(ref[0], rel=1e-4)
    assert "Variable ranking (input gradient)" in str(ev) and "AUC" in str(ev)


def test_outputs_plots_and_bad_input(setup, tmp_path):
    d, *_ = setup
    ev = rootclad.root.evaluate(
        d / "net", test=_frames(d, 1), output=tmp_path / "e.root", bootstrap=2
    )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "e.html",
        "e.root",
        "e_efficiency.png",
        "e_importance.png",
        "e_roc.png",
        "e_scores.png",
    ]
    assert ev.ks == {}  # no train sample: no overtraining check
    page = (tmp_path / "e.html").read_text()
    assert "ROC integral" in page and 'src="e_roc.png"' in page
    bad = {
        "signal": ROOT.RDataFrame("t", str(d / "toy.root")),
        "background": _frames(d, 1)["background"],
    }
    with pytest.raises(ValueError, match="the test signal source has no column 'nope'"):
        rootclad.root.evaluate(d / "net", test=bad, weight="nope", output=tmp_path / "x.root")
    with pytest.raises(ValueError, match="test= takes"):
        rootclad.root.evaluate(d / "net", test={"signal": bad["signal"]})
    with pytest.raises(ValueError, match="is the model's own"):
        rootclad.root.evaluate(d / "net", test=_frames(d, 1), output=d / "net.root")
    with pytest.raises(ValueError, match="is the input"):  # never written over a source
        rootclad.root.evaluate(
            d / "net", test=str(d / "toy.root"), label="label", tree="t", output=d / "toy.root"
        )
    with pytest.raises(ValueError, match="cannot read the tree 'nope'"):
        rootclad.root.evaluate(
            d / "net",
            test=str(d / "toy.root"),
            label="label",
            tree="nope",
            output=tmp_path / "z.root",
        )
    two = rootclad.compile(nn.Linear(6, 2), torch.zeros(1, 6), engine="pullback")
    two.export(tmp_path / "two")
    with pytest.raises(ValueError, match="has 2 outputs; it evaluates a classifier of one"):
        rootclad.root.evaluate(tmp_path / "two", test=_frames(d, 1), inputs=["pt", "eta", "jets"])
    empty = {"signal": bad["signal"].Filter("pt < -1e9"), "background": bad["background"]}
    with pytest.raises(ValueError, match="the test signal source holds no events"):
        rootclad.root.evaluate(d / "net", test=empty, output=tmp_path / "y.root")


def test_the_cpp_twin_gives_the_python_evaluation(setup, tmp_path):
    """rootclad/evaluate.h (for macros) on files of each class and half: the AUC, ROC,
    efficiencies and KS probabilities of the Python evaluation (itself checked against
    scikit-learn and ROOT above), and the same objects in its file."""
    from rootclad.data.cling import declare_header

    d, data, _ = setup
    sources = {}
    for half, split in ((1, "test"), (0, "train")):
        for lab, cls in ((1, "signal"), (0, "background")):
            keep = (data["half"] == half) & (data["label"] == lab)
            path = tmp_path / f"{split}_{cls}.root"
            part = {k: v[keep] for k, v in data.items()}
            with uproot.recreate(path) as f:
                f.mktree("t", {k: np.dtype((v.dtype, v.shape[1:])) for k, v in part.items()})
                f["t"].extend(part)
            sources[split, cls] = str(path)
    py = rootclad.root.evaluate(
        d / "net",
        test={c: sources["test", c] for c in ("signal", "background")},
        train={c: sources["train", c] for c in ("signal", "background")},
        tree="t",
        weight="w",
        output=tmp_path / "py.root",
        plots=False,
        bootstrap=2,
    )
    declare_header("evaluate.h")
    model = rootclad.root.load(d / "net")

    def src(split, cls):
        return ROOT.rootclad.EvaluationSource(sources[split, cls], "t", "w")

    cc = ROOT.rootclad.evaluate(
        model,
        src("test", "signal"),
        src("test", "background"),
        str(tmp_path / "cc.root"),
        src("train", "signal"),
        src("train", "background"),
    )
    assert cc.auc == pytest.approx(py.auc, rel=1e-6)  # Python sums float32 weights
    np.testing.assert_allclose(list(cc.roc_signal_efficiency), py.roc[0], rtol=1e-6)
    np.testing.assert_allclose(list(cc.roc_background_rejection), py.roc[1], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(list(cc.cuts), py.cuts)
    np.testing.assert_allclose(list(cc.signal_efficiency), py.efficiency["signal"], rtol=1e-6)
    np.testing.assert_allclose(
        list(cc.background_efficiency), py.efficiency["background"], rtol=1e-6
    )
    assert (cc.ks_signal, cc.ks_background) == pytest.approx(
        (py.ks["signal"], py.ks["background"]), rel=1e-6
    )
    grad = py.importance["input gradient"]
    assert list(cc.columns) == list(grad)
    np.testing.assert_allclose(list(cc.gradient_importance), list(grad.values()), rtol=1e-5)
    with uproot.open(tmp_path / "py.root") as a, uproot.open(tmp_path / "cc.root") as b:
        for name in ("score_test_signal", "score_train_background", "importance_input"):
            np.testing.assert_allclose(a[name].values(), b[name].values(), rtol=1e-6)
        assert json.loads(str(b["rootclad_evaluation"]))["auc"] == pytest.approx(py.auc)
    ROOT.TH1D("score_test_signal", "the user's own", 3, 0, 1)  # in the current directory
    mine = ROOT.gDirectory.GetList().FindObject("score_test_signal")
    ROOT.rootclad.evaluate(
        model, src("test", "signal"), src("test", "background"), str(tmp_path / "again.root")
    )
    assert ROOT.gDirectory.GetList().FindObject("score_test_signal") == mine  # left as it was
    with pytest.raises(Exception, match="train sources of both classes, or none"):
        ROOT.rootclad.evaluate(
            model,
            src("test", "signal"),
            src("test", "background"),
            str(tmp_path / "w.root"),
            src("train", "signal"),
        )
    with pytest.raises(Exception, match="holds no events|no such"):
        ROOT.rootclad.evaluate(
            model,
            ROOT.rootclad.EvaluationSource(sources["test", "signal"], "nope", ""),
            src("test", "background"),
            str(tmp_path / "x.root"),
        )
