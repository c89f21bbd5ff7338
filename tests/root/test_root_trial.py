"""The whole trial of a physicist new to rootclad, as one test: a toy signal/background TTree
(scalars of three types, an array of 4, integer labels, event weights) → a torch MLP with a
fitted Standardize, trained through ``from_rdataframe`` → exported with its schema → a macro
that reads the columns from the export, run twice in one ROOT session (``.L`` once, two calls;
and ACLiC twice) → the export moved to a fresh directory and scored there → a multi-threaded
RDataFrame ``define_score(df, stem)`` with no column list.

References: the torch module itself on the values uproot reads (every score), torch's own
weighted BCE for the training loss.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="the trial runs root.exe and RDataFrame")
pytestmark = [pytest.mark.root, pytest.mark.slow]

import rootclad  # noqa: E402
from rootclad.data import Standardize, from_rdataframe  # noqa: E402

N = 1200

MACRO = r"""
#include "net.h"

#include <cstdio>

// Scores the tree "t" of `file` with the model `stem`, reading the columns it was exported
// with, into `out`; prints what the export says about itself.
int trial(const char* file, const char* stem, const char* out) {
  rootclad::Model m(stem);
  std::printf("columns:");
  for (const auto& c : m.input_columns())
    std::printf(" %s", c.c_str());
  std::printf("; target %s; classes %s/%s\n", m.target_column().c_str(),
              m.class_names().at(0).c_str(), m.class_names().at(1).c_str());
  const long long n = rootclad::score_tree(m, file, "t", m.input_columns(), out);
  std::printf("scored %lld\n", n);
  return 0;
}
"""

MT = r"""
import sys
import numpy as np
import ROOT
import rootclad

ROOT.EnableImplicitMT(2)
df = rootclad.root.define_score(ROOT.RDataFrame("t", sys.argv[1]), sys.argv[2])
got = df.AsNumpy(["score", "rdfentry_"])
np.save(sys.argv[3], got["score"][np.argsort(got["rdfentry_"])])
"""


def toy(path: Path) -> dict:
    rng = np.random.default_rng(11)
    label = rng.integers(0, 2, N).astype(np.int32)
    data = {
        "pt": (rng.exponential(40, N) + 25 * label).astype(np.float32),
        "eta": rng.normal(0, 1.5 - 0.5 * label, N),
        "nj": rng.poisson(3 + 2 * label).astype(np.int32),
        "jets": (rng.normal(2, 1, (N, 4)) + label[:, None]).astype(np.float32),
        "label": label,
        "w": rng.uniform(0.5, 1.5, N),
    }
    types = {k: np.dtype((v.dtype, v.shape[1:])) if v.ndim > 1 else v.dtype
             for k, v in data.items()}  # fmt: skip
    with uproot.recreate(path) as f:
        f.mktree("t", types).extend(data)
    return data


def rows(data) -> np.ndarray:
    cols = [data["pt"][:, None], data["eta"][:, None], data["nj"][:, None], data["jets"]]
    return np.concatenate([c.astype(np.float64) for c in cols], 1).astype(np.float32)


def root_session(lines: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = ["root", "-l", "-b", "-q", "-e", f'gSystem->SetBuildDir("{cwd / "aclic"}", true);',
           *(arg for line in lines for arg in ("-e", line))]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def scores_of(path: Path) -> np.ndarray:
    with uproot.open(path) as f:
        return f["scores"]["score"].array(library="np")


def test_the_whole_trial(tmp_path):
    data = toy(tmp_path / "toy.root")
    df = ROOT.RDataFrame("t", str(tmp_path / "toy.root"))
    it = from_rdataframe(df, features=["pt", "eta", "nj", "jets"], target="label", weight="w",
                         batch_size=100, shuffle=True, seed=3)  # fmt: skip
    torch.manual_seed(0)
    net = nn.Sequential(Standardize.fit(it), nn.Linear(it.length, 16), nn.ReLU(),
                        nn.Linear(16, 1))  # fmt: skip
    cm = rootclad.compile(net, torch.zeros(1, it.length), engine="pullback")
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    first = last = None
    for _ in range(5):
        losses = [cm.train_step(torch.from_numpy(x), torch.from_numpy(y).float()[:, None], opt,
                                weight=torch.from_numpy(w)) for x, y, w in it]  # fmt: skip
        first, last = first or float(np.mean(losses)), float(np.mean(losses))
    assert last < 0.8 * first, (first, last)  # it learned

    # the trained torch module is the reference for every score below
    net.load_state_dict(cm.state_dict())
    x = rows(data)
    ref = net(torch.from_numpy(x)).detach().numpy()[:, 0]
    y, w = torch.from_numpy(data["label"]).float(), torch.from_numpy(data["w"]).float()
    weighted = nn.functional.binary_cross_entropy_with_logits(torch.from_numpy(ref), y,
                                                              weight=w)  # fmt: skip
    assert float(weighted) < 0.6  # better than chance on the whole file

    build = tmp_path / "build"
    build.mkdir()
    cm.export(build / "net", schema=it.schema.replace(classes=["background", "signal"]))
    (build / "trial.C").write_text(MACRO)
    shutil.copy(tmp_path / "toy.root", build / "toy.root")

    # a macro loaded once and called twice, then compiled by ACLiC twice, in one session each
    out = root_session([".L trial.C", 'trial("toy.root", "net", "a.root")',
                        'trial("toy.root", "net", "b.root")'], build)  # fmt: skip
    assert out.returncode == 0 and out.stdout.count("scored 1200") == 2, out.stdout + out.stderr
    assert "columns: pt eta nj jets; target label; classes background/signal" in out.stdout
    out = root_session(['.x trial.C+("toy.root", "net", "c.root")',
                        '.x trial.C+("toy.root", "net", "d.root")'], build)  # fmt: skip
    assert out.returncode == 0 and out.stdout.count("scored 1200") == 2, out.stdout + out.stderr
    for name in "abcd":
        np.testing.assert_allclose(scores_of(build / f"{name}.root"), ref, rtol=1e-5, atol=1e-5)

    # the export moved to a fresh directory (the checkout's headers out of reach): same scores
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for f in ("net.so", "net.root", "net.h", "trial.C", "toy.root"):
        shutil.move(build / f, moved / f)
    shutil.rmtree(build)
    out = root_session([".L trial.C", 'trial("toy.root", "net", "e.root")'], moved)
    assert out.returncode == 0 and "scored 1200" in out.stdout, out.stdout + out.stderr
    np.testing.assert_allclose(scores_of(moved / "e.root"), ref, rtol=1e-5, atol=1e-5)

    # a multi-threaded RDataFrame, no column list: the export says which
    (tmp_path / "mt.py").write_text(MT)
    run = subprocess.run([sys.executable, str(tmp_path / "mt.py"), str(moved / "toy.root"),
                          str(moved / "net"), str(tmp_path / "mt.npy")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "mt.npy"), ref, rtol=1e-5, atol=1e-5)
