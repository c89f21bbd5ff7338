"""Graphs of the export front-end on the device kernels (as loops on the CPU, and on the GPU
where there is one) against torch autograd in float64: a mask input, and a constant the
forward makes (its buffer filled by the device model)."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, torch_loss
from fixtures.fresh_models import FRESH, fresh_inputs

from rootclad.compiler import compile_device

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(), reason="needs an NVIDIA GPU (none here)"
        ),
    ),
]
MODELS = {name: (build, shapes) for name, build, shapes, _ in FRESH}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["jet-attention-pooling", "sinusoidal-transformer"])
def test_an_exported_graph_runs_on_the_device_kernels_as_torch(name, device):
    build, shapes = MODELS[name]
    torch.manual_seed(0)
    net = build().double()
    xs = fresh_inputs(shapes)
    x = xs if len(xs) > 1 else xs[0]
    dm = compile_device(net, x, device=device, loss="mse")
    if name == "sinusoidal-transformer":
        assert dm.graph.constants, "the encoding made in forward is a constant of the graph"
    out_ref = net(*xs).detach()
    on = tuple(t.to(device) for t in xs)
    assert_close_rel(dm.predict(*on).cpu(), out_ref, 1e-10, "forward")
    y = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    loss, dp = dm.loss_and_grad(on if len(on) > 1 else on[0], y.to(device))
    loss_ref = torch_loss("mse", net(*xs), y)
    names, params = zip(*net.named_parameters(), strict=True)
    dp_ref = dict(zip(names, torch.autograd.grad(loss_ref, params), strict=True))
    assert_close_rel(loss.cpu(), loss_ref, 1e-10, "mse loss")
    assert_grads_close({k: v.cpu() for k, v in dp.items()}, dp_ref, 1e-10, "mse", against_all=True)
