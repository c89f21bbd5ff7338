"""rootclad.load: torch.export programs (.pt2) and TorchScript modules (.pt), through ONNX,
against the torch module they were saved from (outputs, input gradients, parameter names)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import rootclad

pytest.importorskip("onnx")


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(1, 4, 5), nn.ReLU(), nn.MaxPool1d(2), nn.Flatten(),
                         nn.Linear(4 * 30, 3), nn.Tanh(), nn.Linear(3, 1)).eval()  # fmt: skip


def _check(cm, net, x):
    assert [n for n, _ in cm.named_parameters()] == [n for n, _ in net.named_parameters()]
    assert torch.allclose(cm(x), net(x), rtol=1e-5, atol=1e-6)
    xr, xt = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (dx,) = torch.autograd.grad(cm(xr).sum(), xr)
    (dx_ref,) = torch.autograd.grad(net(xt).sum(), xt)
    assert torch.allclose(dx, dx_ref, rtol=1e-4, atol=1e-6)


def test_torch_export_program(tmp_path):
    net, x = _net(), torch.randn(3, 1, 64)
    ep = torch.export.export(net, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(ep, tmp_path / "net.pt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = rootclad.load(tmp_path / "net.pt2", engine="pullback")
    _check(cm, net, torch.randn(5, 1, 64))


def test_torchscript_module(tmp_path):
    net, x = _net(), torch.randn(3, 1, 64)
    torch.jit.trace(net, x).save(tmp_path / "net.pt")
    with pytest.raises(ValueError, match="example_input"):
        rootclad.load(tmp_path / "net.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = rootclad.load(tmp_path / "net.pt", example_input=x, engine="pullback")
    _check(cm, net, torch.randn(5, 1, 64))


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown model format '.h5'"):
        rootclad.load(tmp_path / "net.h5")
    with pytest.raises(FileNotFoundError, match="net.pt2"):
        rootclad.load(tmp_path / "net.pt2")
