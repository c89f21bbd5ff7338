"""rootclad/fit.h, the C++ twin of rootclad.fit: early stopping and the best weights restored
through rootclad::Model, the same history as the Python fit on the same batches, and
macros/train_gw.C keeping the best epoch as the Python fit does.

References: a one-weight model whose weights after each epoch of full-batch SGD are known in
closed form (so the best validation epoch is known before either fit runs); the Python fit,
itself checked against a plain torch loop (tests/torch/test_fit.py), on the batches the
Python readers plan as tree_reader.h does.
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

ROOT = pytest.importorskip("ROOT", reason="rootclad/fit.h needs ROOT (PyROOT)")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402
import rootclad.root  # noqa: E402
from rootclad.data.cling import declare, declare_header, import_root  # noqa: E402
from rootclad.data.compiled import CompiledBatchIterator, CompiledTableIterator  # noqa: E402
from rootclad.gw import simulate  # noqa: E402

F64 = torch.float64
REPO = Path(__file__).resolve().parents[2]
N = 256


@pytest.fixture(scope="module")
def cxx():
    import_root()
    declare_header("fit.h")
    declare("struct FitTestStopAt { int at; bool operator()(const rootclad::FitEpoch& e) const "
            "{ return e.epoch == at; } };\n")  # fmt: skip
    return ROOT.rootclad


def _table(path, columns):
    with uproot.recreate(path) as f:
        f.mktree("t", {k: v.dtype for k, v in columns.items()}).extend(columns)
    return str(path)


def _reader(path, *, weight="", batch=8, split="all", fraction=0.0, shuffle=False, seed=0):
    r = ROOT.rootclad.data.TableReader([str(path)], "t", ["x", "z"], "y", weight)
    r.configure(batch, split, fraction, shuffle, seed)
    return r


def test_cpp_fit_stops_early_and_restores_the_best_weights(cxx, tmp_path):
    """Linear(2, 1) without bias, weights 0, mse on y = 2x (z = 0), full-batch SGD at eta:
    the first weight after t epochs is 2 - 2 r**t, r = 1 - 2 eta mean(x**2); the validation
    targets are 1.45 x, so the best epoch is where that weight is nearest 1.45."""
    x = np.linspace(0.5, 1.5, 8).astype(np.float32)
    zero = np.zeros(8, np.float32)
    train = _table(tmp_path / "train.root", {"x": x, "z": zero, "y": 2 * x})
    yv = (np.float32(1.45) * x).astype(np.float32)
    val = _table(tmp_path / "val.root", {"x": x, "z": zero, "y": yv})
    eta, patience = 0.1, 3
    xd = x.astype(np.float64)
    r = 1 - 2 * eta * np.mean(xd**2)
    w = [2 - 2 * r**t for t in range(41)]
    val_losses = [np.mean((w[t] * xd - yv) ** 2) for t in range(1, 41)]
    best = int(np.argmin(val_losses)) + 1
    assert 3 < best < 30
    net = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        net.weight.zero_()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 2, dtype=F64), loss="mse",
                          engine="pullback")  # fmt: skip
    cm.export(tmp_path / "lin")

    def run(restore=True, stop_at=0):
        m = rootclad.root.load(tmp_path / "lin")
        o = cxx.FitOptions()
        o.epochs, o.patience, o.restore_best, o.verbose = 40, patience, restore, False
        opt = cxx.SGD(m, eta)
        tr, va = _reader(train), _reader(val)
        if stop_at:
            return m, cxx.fit(m, opt, tr, va, o, ROOT.FitTestStopAt(stop_at))
        return m, cxx.fit(m, opt, tr, va, o)

    m, res = run()
    assert res.best_epoch == best and res.stopped_early
    assert len(res.history) == best + patience
    np.testing.assert_allclose([h.val_loss for h in res.history], val_losses[: best + patience],
                               rtol=1e-10)  # fmt: skip
    assert [h.epoch for h in res.history] == list(range(1, best + patience + 1))
    assert all(h.lr == eta for h in res.history)
    assert np.asarray(m.parameters())[0] == pytest.approx(w[best], rel=1e-12)  # restored
    m, res = run(restore=False)
    assert np.asarray(m.parameters())[0] == pytest.approx(w[best + patience], rel=1e-12)
    m, res = run(stop_at=2)  # on_epoch_end returning true stops there
    assert len(res.history) == 2 and res.stopped_early and res.best_epoch == 2
    # no validation reader: the training loss is monitored, it falls every epoch
    m = rootclad.root.load(tmp_path / "lin")
    o = cxx.FitOptions()
    o.epochs, o.patience, o.verbose = 6, 2, False
    res = cxx.fit(m, cxx.SGD(m, eta), _reader(train), o)
    assert res.best_epoch == 6 and not res.stopped_early
    assert all(np.isnan(h.val_loss) for h in res.history)


@pytest.fixture(scope="module")
def gw_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gw") / "gw.root"
    simulate(path, 300, seed=1, workers=1, progress=False, duration=N / 2048)
    return path


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(1, 4, 8), nn.ReLU(), nn.MaxPool1d(4), nn.Flatten(),
                         nn.Linear(4 * 62, 1))  # fmt: skip


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))


@pytest.fixture(scope="module")
def weighted_table(tmp_path_factory):
    g = np.random.default_rng(4)
    x, z = g.normal(size=500).astype(np.float32), g.normal(size=500).astype(np.float32)
    y = ((x + 0.5 * z + 0.3 * g.normal(size=500)) > 0).astype(np.int32)
    w = (0.5 + g.random(500)).astype(np.float32)
    return _table(tmp_path_factory.mktemp("table") / "t.root", {"x": x, "z": z, "y": y, "w": w})


@pytest.mark.parametrize("data", ["gw", "table-weighted-sum_w"])
def test_cpp_and_python_fit_give_the_same_history(cxx, data, gw_file, weighted_table, tmp_path):
    """The same float64 model, optimizer, settings and batches: the Python fit and the C++ fit
    give the same train and validation losses each epoch, stop at the same epoch and end with
    the same weights."""
    gw = data == "gw"
    net = (_cnn() if gw else _mlp()).double()
    shape = (1, 1, N) if gw else (1, 2)
    cm = rootclad.compile(net, example_input=torch.zeros(shape, dtype=F64), engine="pullback")
    cm.export(tmp_path / "net")  # before training: C++ starts from the same weights
    settings = dict(batch_size=32, validation_fraction=0.25, seed=7)
    norm = "mean" if gw else "sum_w"
    if gw:
        tr = CompiledBatchIterator(str(gw_file), split="train", shuffle=True, **settings)
        va = CompiledBatchIterator(str(gw_file), split="validation", shuffle=False, **settings)
    else:
        table = dict(tree="t", features=["x", "z"], target="y", weight="w")
        tr = CompiledTableIterator(weighted_table, split="train", shuffle=True, **table,
                                   **settings)  # fmt: skip
        va = CompiledTableIterator(weighted_table, split="validation", shuffle=False, **table,
                                   **settings)  # fmt: skip
    lr, epochs, patience = (3e-3, 6, 2) if gw else (5e-2, 8, 2)
    py = rootclad.fit(cm, rootclad.optim.Adam(cm, lr=lr), tr, epochs=epochs, validation=va,
                      patience=patience, weight_norm=norm, progress=False)  # fmt: skip

    m = rootclad.root.load(tmp_path / "net")
    m.set_weight_norm(norm)
    o = cxx.FitOptions()
    o.epochs, o.patience, o.verbose = epochs, patience, False
    args = dict(batch=32, fraction=0.25, seed=7)
    if gw:
        ctr, cva = cxx.data.BatchReader([str(gw_file)]), cxx.data.BatchReader([str(gw_file)])
        ctr.configure(32, "train", 0.25, True, 7)
        cva.configure(32, "validation", 0.25, False, 7)
    else:
        ctr = _reader(weighted_table, weight="w", split="train", shuffle=True, **args)
        cva = _reader(weighted_table, weight="w", split="validation", **args)
    res = cxx.fit(m, cxx.Adam(m, lr), ctr, cva, o)
    got = [(h.train_loss, h.val_loss, h.lr) for h in res.history]
    expected = [(h["train_loss"], h["val_loss"], h["lr"]) for h in py.history]
    assert len(got) == len(expected) >= 2
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    assert (res.best_epoch, res.stopped_early) == (py.best_epoch, py.stopped_early)
    flat = torch.cat([p.detach().reshape(-1) for p in cm.parameters()]).numpy()
    np.testing.assert_allclose(np.asarray(m.parameters()), flat, rtol=1e-10, atol=1e-13)
    assert expected[-1][0] < expected[0][0]  # it trained


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("root") is None, reason="root.exe not on PATH")
def test_train_gw_macro_keeps_the_best_epoch_as_rootclad_fit_does(gw_file, tmp_path):
    cm = rootclad.compile(_cnn(), example_input=torch.zeros(1, 1, N), engine="pullback")
    cm.export(tmp_path / "gwnet")
    call = f'macros/train_gw.C("{gw_file}", "{tmp_path / "gwnet"}", 8, 32, 1e-2, 0.25, 3, 1)'
    out = subprocess.run(["root", "-l", "-b", "-q", call], cwd=REPO, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert "saved the weights" in out.stdout, out.stdout + out.stderr
    settings = dict(batch_size=32, validation_fraction=0.25, seed=3)
    py = rootclad.fit(cm, rootclad.optim.Adam(cm, lr=1e-2),
                      CompiledBatchIterator(str(gw_file), split="train", **settings), epochs=8,
                      validation=CompiledBatchIterator(str(gw_file), split="validation",
                                                       shuffle=False, **settings),
                      patience=1, progress=False)  # fmt: skip
    losses = [float(v) for v in re.findall(r"validation loss ([\d.]+)", out.stdout)]
    np.testing.assert_allclose(losses, [h["val_loss"] for h in py.history], rtol=1e-5)
    assert f"kept the weights of epoch {py.best_epoch}" in out.stdout
    assert py.stopped_early == ("stopped early" in out.stdout)
    last = py.best_epoch == len(py.history)  # Adam's state is saved with the last weights only
    assert ("with Adam's state" in out.stdout) == last, out.stdout
    with uproot.open(tmp_path / "gwnet.root") as f:
        assert ("rootclad_optimizer" in [k.split(";")[0] for k in f.keys()]) == last
        for name, p in cm.state_dict().items():  # the best epoch's, restored on both sides
            trained = f[name]["values"].array(library="np")[0]
            np.testing.assert_allclose(trained, p.reshape(-1).double().numpy(), rtol=1e-4,
                                       atol=1e-6)  # fmt: skip
