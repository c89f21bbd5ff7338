"""A model's numbers and overwrites: in-place forms compile to what torch computes (torch.export
makes them functional), shape bookkeeping becomes constants, and the module and its input are
left as they were (tests/torch/test_bad_input.py: what would compute something else)."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import assert_close_rel, check_against_torch
from fixtures.op_cases import Fn
from torch import nn
from torch.nn import functional as F

import rootclad

F64 = torch.float64


class _Block(nn.Module):
    """A ResNet basic block as torchvision writes it: ReLU(inplace=True) and out += identity."""

    def __init__(self, c=3):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv1d(c, c, 3, padding=1), nn.Conv1d(c, c, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x
        out = self.relu(self.conv1(x))
        out = self.conv2(out)
        out += identity
        return self.relu(out)


class _Methods(nn.Module):
    """In-place methods and functions, each after a layer that does not keep its output for
    the backward (torch's autograd refuses the others)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.ModuleList(nn.Linear(5, 5) for _ in range(4))

    def forward(self, x):
        h = self.fc[0](x).mul_(2).add_(0.5)
        h = F.relu(h, inplace=True)
        h = F.leaky_relu(self.fc[1](h), 0.1, inplace=True)
        h = F.hardtanh(self.fc[2](h), -0.5, 1.5, True)
        return self.fc[3](h).clamp_(-1, 1)


class _ChannelShuffle(nn.Module):
    """ShuffleNet's bookkeeping on 1-d signals: the shape unpacked, asserted, divided."""

    def __init__(self, c=4, groups=2):
        super().__init__()
        self.groups = groups
        self.conv = nn.Conv1d(c, c, 3, padding=1)

    def forward(self, x):
        b, c, length = x.shape
        torch._assert(c % self.groups == 0, "channels must split into the groups")
        y = self.conv(x).relu()
        y = y.view(b, self.groups, c // self.groups, length).transpose(1, 2)
        y = y.reshape(x.size(0), -1, length)
        return y * (c**-0.5) + x.shape[1] // 2


@pytest.mark.parametrize(
    "build, shape",
    [
        pytest.param(lambda: _Block(), (3, 8), id="resnet-block"),
        pytest.param(lambda: _Methods(), (5,), id="in-place-methods-and-functions"),
        pytest.param(
            lambda: nn.Sequential(
                nn.Linear(4, 6),
                nn.Hardswish(inplace=True),
                nn.Dropout(0.5, True),
                nn.SiLU(inplace=True),
                nn.Linear(6, 2),
            ).eval(),  # fmt: skip
            (4,),
            id="in-place-layers",
        ),
        pytest.param(lambda: _ChannelShuffle(), (4, 6), id="shape-bookkeeping"),
        # a positional True that is not inplace: keepdim
        pytest.param(lambda: Fn(lambda x: torch.sum(x, 1, True) * x + x), (3, 4), id="keepdim"),
        pytest.param(
            lambda: Fn(lambda x: x.mean((1, 2)) + torch.sum(x, -1).mean(1)), (3, 4), id="reductions"
        ),  # fmt: skip
    ],
)
def test_in_place_forms_and_shape_bookkeeping_match_torch(build, shape):
    torch.manual_seed(0)
    net = build().double()
    x = torch.randn(3, *shape, dtype=F64)
    cm = check_against_torch(net, x)
    x5 = torch.randn(5, *shape, dtype=F64)  # another batch size: nothing baked in
    with torch.no_grad():
        assert_close_rel(cm.predict(x5), net(x5.clone()), 1e-12, "batch of 5")


def test_the_module_is_left_as_it_was():
    """The front-end captures the module and runs its program on the example (for its
    constants): the example, which the first layer writes in place, and the BatchNorm's
    statistics stay as they were, and so does every layer's mode. The compiled model computes
    what torch does (it leaves its own input as it is)."""
    net = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(3, 3), nn.BatchNorm1d(3)).double()
    x = torch.randn(4, 3, dtype=F64)
    before, stats = x.clone(), net[2].running_mean.clone()
    cm = rootclad.compile(net, x, "mse", engine="pullback")
    assert torch.equal(x, before) and torch.equal(net[2].running_mean, stats)
    assert net.training and all(m.training for m in net.modules())
    with torch.no_grad():
        assert_close_rel(cm.eval().predict(x), net.eval()(x.clone()), 1e-12, "eval forward")
