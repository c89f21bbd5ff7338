"""LibTorch inside ROOT: a macro with LibTorch tensors in Cling (macros/train_libtorch.C) and
the compiled trainer of rootclad/libtorch_trainer.h from PyROOT.

Reference: the same model trained in Python with torch autograd and torch.optim.Adam on the
batches the iterator plans for the same settings (no rootclad optimizer or fused step).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import uproot
from torch import nn

pytest.importorskip("ROOT", reason="needs ROOT")
pytestmark = [pytest.mark.root, pytest.mark.slow]

import rootclad  # noqa: E402
from rootclad.data.compiled import CompiledBatchIterator  # noqa: E402
from rootclad.gw import simulate  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
N = 256


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(1, 4, 8), nn.Tanh(), nn.MaxPool1d(4), nn.Flatten(),
                         nn.Linear(4 * 62, 1))  # fmt: skip


@pytest.fixture(scope="module")
def gw_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gw") / "gw.root"
    simulate(path, 300, seed=3, workers=1, progress=False, duration=N / 2048)
    return path


def _torch_reference(cm, gw_file, epochs, lr, seed):
    """Python: autograd through cm and torch.optim.Adam, epoch by epoch; the mean losses."""
    it = CompiledBatchIterator(str(gw_file), batch_size=64, split="train",
                               validation_fraction=0.2, shuffle=True, seed=seed)  # fmt: skip
    opt = torch.optim.Adam(cm.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        total = seen = 0
        for x, y in it:
            out = cm(torch.from_numpy(x))
            loss = nn.functional.binary_cross_entropy_with_logits(
                out, torch.from_numpy(y)[:, None].float()
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            seen += len(y)
        losses.append(total / seen)
    return losses


def _assert_weights(cm, trained: dict, start: dict):
    for name, p in cm.state_dict().items():
        np.testing.assert_allclose(trained[name], p.reshape(-1).double().numpy(), rtol=1e-5,
                                   atol=1e-7, err_msg=name)  # fmt: skip
        assert not np.allclose(trained[name], start[name].reshape(-1).numpy())  # it trained


def test_assert_weights_fails_on_other_weights():
    cm = rootclad.compile(_net(), example_input=torch.zeros(1, 1, N), engine="pullback")
    start = {k: v.clone() for k, v in cm.state_dict().items()}
    wrong = {k: v.reshape(-1).double().numpy() * 1.001 for k, v in cm.state_dict().items()}
    with pytest.raises(AssertionError):
        _assert_weights(cm, wrong, start)


@pytest.mark.skipif(shutil.which("root") is None, reason="root.exe not on PATH")
def test_libtorch_macro_trains_like_torch_optim_in_python(gw_file, tmp_path):
    cm = rootclad.compile(_net(), example_input=torch.zeros(1, 1, N), engine="pullback")
    start = {k: v.clone() for k, v in cm.state_dict().items()}
    cm.export(tmp_path / "gwnet")
    call = f'macros/train_libtorch.C("{gw_file}", "{tmp_path / "gwnet"}", 2, 64, 1e-3, 0.2, 5)'
    out = subprocess.run(["root", "-l", "-b", "-q", f'macros/load_libtorch.C("{sys.executable}")',
                          call], cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert "saved the weights" in out.stdout, out.stdout + out.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"train loss ([\d.]+)", out.stdout)]
    reference = _torch_reference(cm, gw_file, 2, 1e-3, 5)
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    with uproot.open(tmp_path / "gwnet.root") as f:
        trained = {k: f[k]["values"].array(library="np")[0] for k in cm.state_dict()}
    _assert_weights(cm, trained, start)


def test_compiled_trainer_from_pyroot_trains_like_torch_optim(gw_file, tmp_path):
    from rootclad.data.cling import add_include_path, declare, import_root, include_dir
    from rootclad.torch.libtorch import build_trainer

    cm = rootclad.compile(_net(), example_input=torch.zeros(1, 1, N), engine="pullback")
    start = {k: v.clone() for k, v in cm.state_dict().items()}
    cm.export(tmp_path / "gwnet")
    ROOT = import_root()
    assert ROOT.gSystem.Load(str(build_trainer())) >= 0
    add_include_path(include_dir())
    declare('#include "rootclad/libtorch_trainer.h"\n#include "rootclad/model.h"\n')
    stem = str(tmp_path / "gwnet")
    m = ROOT.rootclad.Model(stem)
    params = m.parameters()
    t = ROOT.rootclad.LibTorchTrainer(stem + ".so", str(m.api().prefix), params.data(),
                                      m.n_params(), "adam", 1e-3)  # fmt: skip
    t.train_step.__release_gil__ = True  # LibTorch's autograd refuses to run holding the GIL
    it = CompiledBatchIterator(str(gw_file), batch_size=64, split="train",
                               validation_fraction=0.2, shuffle=True, seed=9)  # fmt: skip
    losses = []
    for _ in range(2):
        total = seen = 0
        for x, y in it:
            total += t.train_step(np.ascontiguousarray(x), y.astype(np.float32), len(y)) * len(y)
            seen += len(y)
        losses.append(total / seen)
    np.testing.assert_allclose(losses, _torch_reference(cm, gw_file, 2, 1e-3, 9), rtol=1e-5)
    flat = np.empty(int(t.n_params()))
    t.parameters(flat)
    trained = {p.name: flat[p.offset : p.offset + p.numel] for p in m.api().params}
    _assert_weights(cm, trained, start)
    with pytest.raises(Exception, match="unknown optimizer 'adamx'"):
        ROOT.rootclad.LibTorchTrainer(stem + ".so", str(m.api().prefix), params.data(),
                                      m.n_params(), "adamx", 1e-3)  # fmt: skip
