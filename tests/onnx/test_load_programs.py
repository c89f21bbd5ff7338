"""rootclad.load: torch.export programs (.pt2) and TorchScript modules (.pt), through ONNX,
against the torch module they were saved from (outputs, input gradients, parameter names);
both only when the caller trusts the file, since torch's loaders run code it holds."""

from __future__ import annotations

import io
import os
import warnings
import zipfile

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
    # torch's names (in the file's order of its initializers)
    assert sorted(n for n, _ in cm.named_parameters()) == sorted(
        n for n, _ in net.named_parameters()
    )
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
        cm = rootclad.load(tmp_path / "net.pt2", engine="pullback", trusted=True)
    _check(cm, net, torch.randn(5, 1, 64))


def test_torchscript_module(tmp_path):
    net, x = _net(), torch.randn(3, 1, 64)
    torch.jit.trace(net, x).save(tmp_path / "net.pt")
    with pytest.raises(ValueError, match="example_input"):
        rootclad.load(tmp_path / "net.pt", trusted=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = rootclad.load(tmp_path / "net.pt", example_input=x, engine="pullback", trusted=True)
    _check(cm, net, torch.randn(5, 1, 64))


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown model format '.h5'"):
        rootclad.load(tmp_path / "net.h5")
    with pytest.raises(FileNotFoundError, match="net.pt2"):
        rootclad.load(tmp_path / "net.pt2")


class _Payload:
    """Unpickled, creates the file ``marker``: what a hostile model file would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mknod, (self.marker,))


def _hostile_pt2(tmp_path, marker):
    """A torch.export program whose sample inputs are replaced by a pickled payload."""
    net, x = _net(), torch.randn(3, 1, 64)
    torch.export.save(torch.export.export(net, (x,)), tmp_path / "good.pt2")
    payload = io.BytesIO()
    torch.save(_Payload(marker), payload)
    path = tmp_path / "sent.pt2"
    with zipfile.ZipFile(tmp_path / "good.pt2") as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            dst.writestr(item, payload.getvalue() if "sample_inputs" in item.filename else data)
    return path


def test_a_program_file_is_refused_unless_trusted_and_its_payload_never_runs(tmp_path):
    marker = tmp_path / "MARKER"
    path = _hostile_pt2(tmp_path, marker)
    with pytest.raises(ValueError, match=r"sent\.pt2: a torch.export program .* runs code"):
        rootclad.load(path)
    net, x = _net(), torch.randn(3, 1, 64)
    torch.jit.trace(net, x).save(tmp_path / "net.pt")
    with pytest.raises(ValueError, match=r"net\.pt: a TorchScript module .* trusted=True"):
        rootclad.load(tmp_path / "net.pt", example_input=x)
    assert not marker.exists()
    # the payload is real: torch's loader runs it when the caller says the file is trusted
    with warnings.catch_warnings(), pytest.raises(Exception):  # noqa: B017
        warnings.simplefilter("ignore")
        rootclad.load(path, trusted=True)
    assert marker.exists()


def test_emit_refuses_a_program_file_unless_trusted(tmp_path, capsys):
    from rootclad.cli import main

    marker = tmp_path / "MARKER"
    path = _hostile_pt2(tmp_path, marker)
    assert main(["emit", str(path), "-o", str(tmp_path / "net.hxx")]) == 2
    assert "--trusted" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "net.hxx").exists()
