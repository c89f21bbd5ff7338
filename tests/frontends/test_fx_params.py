"""Parameters read directly (rootclad/frontends/fx_params.py): what is refused, naming the fx
node. What compiles is checked against torch by the op cases (parameter-read-directly,
layer-norm-functional) on every backend, and by convnext_tiny in tests/models."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.ir.graph import IRError


class _ReadsBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.ones(6))

    def forward(self, x):
        return x + 2 * self.offset  # a value computed from the buffer alone


class _ReturnsParameter(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.p = nn.Parameter(torch.ones(1, 6))
        self.fc = nn.Linear(6, 6)
        self.make = make

    def forward(self, x):
        return self.make(self, x)


@pytest.mark.parametrize(
    "module, words",
    [
        (_ReturnsParameter(lambda m, x: m.p), ["'p'", "parameters alone"]),
        (_ReturnsParameter(lambda m, x: m.fc(m.p) * x), ["'fc'", "parameters alone"]),
        (_ReturnsParameter(lambda m, x: torch.tanh(m.p) * x), ["'tanh'", "parameters alone"]),
        (_ReadsBuffer(), ["'mul'", "a constant tensor", "where they meet the input"]),
    ],
)
def test_what_reads_attributes_rootclad_cannot_compile_is_refused(module, words):
    with pytest.raises(IRError) as err:
        rootclad.compile(module.double(), example_input=torch.randn(4, 6, dtype=torch.float64),
                         engine="pullback")  # fmt: skip
    for word in words:
        assert word in str(err.value), str(err.value)


class _SharedScalarFrozen(nn.Module):
    """A scalar parameter, a parameter a Linear also holds (its bias), a frozen one."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.gain = nn.Parameter(torch.tensor(1.5))
        self.shift = nn.Parameter(torch.linspace(-1, 1, 6), requires_grad=False)

    def forward(self, x):
        return (self.fc(x) + self.fc.bias) * self.gain - self.shift


def test_scalar_shared_and_frozen_parameters_read_directly_match_torch():
    net = _SharedScalarFrozen().double()
    x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cm = rootclad.compile(net, example_input=x, loss="mse", engine="pullback")
    loss, grads = cm.loss_and_grad(x, y)
    ref = F.mse_loss(net(x), y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-13, atol=0)
    assert set(grads) == {"fc.weight", "fc.bias", "gain"}
    for name, p in net.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-12, atol=1e-14, msg=name)
