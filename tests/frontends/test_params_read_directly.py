"""Parameters and buffers read directly (not through a layer's call on the input): a value
computed from them alone (a layer called on a parameter, a function of one, a constant from a
buffer) against torch autograd, and the model whose output is a parameter refused, naming the
output. The op cases (parameter-read-directly, layer-norm-functional) check more forms against
torch on every backend, and convnext_tiny in tests/models."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import check_against_torch, perturbed
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


def test_a_model_returning_a_parameter_is_refused_naming_the_output():
    net = _ReturnsParameter(lambda m, x: m.p).double()
    with pytest.raises(IRError, match=r"the model's output .* is the same for every sample"):
        rootclad.compile(net, torch.randn(4, 6, dtype=torch.float64), engine="pullback")


@pytest.mark.parametrize(
    "module, against_all",
    [
        (_ReturnsParameter(lambda m, x: m.fc(m.p) * x), False),
        (_ReturnsParameter(lambda m, x: torch.tanh(m.p) * x), True),  # fc's gradients: zero
        (_ReadsBuffer(), False),
    ],
    ids=["layer-of-a-parameter", "function-of-a-parameter", "constant-from-a-buffer"],
)
def test_what_is_computed_from_parameters_or_buffers_alone_matches_torch(module, against_all):
    """Computed once for every sample, then met with the input: output, input and parameter
    gradients against torch (those of a layer held but never called, zero, as torch's)."""
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    check_against_torch(perturbed(module.double()), x, loss="mse", against_all=against_all)


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
