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
        return x + self.offset


class _ExpandsActivation(nn.Module):
    def forward(self, x):
        return x[:, :1].expand(-1, 6) * x


class _NormByActivation(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(6))

    def forward(self, x):
        return F.layer_norm(x, (6,), torch.tanh(self.p), None)  # a value, not the parameter


@pytest.mark.parametrize(
    "module, words",
    [
        (_ReadsBuffer(), ["'offset'", "not buffers"]),
        (_ExpandsActivation(), ["expand", "only a parameter's expand"]),
        (_NormByActivation(), ["layer_norm", "weight must be a parameter"]),
    ],
)
def test_what_reads_attributes_rootclad_cannot_compile_is_refused(module, words):
    with pytest.raises(IRError) as err:
        rootclad.compile(module.double(), example_input=torch.randn(4, 6, dtype=torch.float64),
                         engine="pullback")  # fmt: skip
    for word in words:
        assert word in str(err.value), str(err.value)
