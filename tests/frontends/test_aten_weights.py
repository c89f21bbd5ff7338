"""Convolutions of weights a forward computes from its parameters (weight norm, a gain per
filter) through the export front-end, against torch autograd in float64; and the weights it
cannot take, refused naming the op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.core import assert_close_rel, assert_grads_close, compiled_vjp, torch_vjp
from torch import nn

import rootclad
from rootclad.ir.graph import IRError


class Normed(nn.Module):
    """Every form a weight scaled per output channel takes: the old weight norm (a forward
    pre-hook, its weight a tensor no copy can take), the parametrization over the whole
    tensor (dim=None; over the output channels: the fresh set's TCN), a gain multiplied and a
    scale divided by in forward, in turn."""

    def __init__(self):
        super().__init__()
        self.old = nn.utils.weight_norm(nn.Conv1d(2, 4, 3, padding=1))
        wn = nn.utils.parametrizations.weight_norm
        self.whole = wn(nn.Conv1d(4, 3, 1, bias=False), dim=None)
        self.w = nn.Parameter(torch.randn(3, 3, 3))
        self.gain = nn.Parameter(torch.rand(3) + 0.5)
        self.b = nn.Parameter(torch.randn(3))
        self.scale = nn.Parameter(torch.rand(3, 1, 1) + 0.5)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        x = torch.tanh(self.old(x))
        x = self.drop(self.whole(x))
        return F.conv1d(x, self.w * self.gain.view(-1, 1, 1) / self.scale, self.b, padding=1)


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
def test_a_convolution_of_a_weight_scaled_per_output_channel_matches_torch():
    torch.manual_seed(0)
    net = Normed().double().eval()
    x = torch.randn(3, 2, 10, dtype=torch.float64)
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    assert not net.drop.training  # switched for the capture only, on the user's model
    convs = [n for n in cm.graph.nodes if n.op == "conv1d"]
    assert len(convs) == 3 and all(set(n.params) == {"weight"} for n in convs), convs
    out_ref, d_out, dx_ref, dp_ref = torch_vjp(net, x)
    out, dx, dp = compiled_vjp(cm, x, d_out)
    assert_close_rel(out, out_ref, 1e-10, "forward")
    assert_close_rel(dx, dx_ref, 1e-10, "d_input")
    assert_grads_close(dp, dp_ref, 1e-10, "vjp", against_all=True)
    assert {"old.weight_g", "old.weight_v", "gain", "scale"} <= set(dp)


class AlongInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 2, 3))
        self.g = nn.Parameter(torch.rand(2))

    def forward(self, x):
        return F.conv1d(x, self.w * self.g.view(1, -1, 1))


def test_a_weight_scaled_otherwise_is_refused_naming_the_op():
    with pytest.raises(IRError, match=r"aten\.conv1d\.default .*per output channel"):
        rootclad.compile(AlongInputs(), torch.randn(2, 2, 8))
