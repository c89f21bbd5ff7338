"""Upsampling forms rootclad does not compile are refused naming the layer or call (the forms it
compiles are op cases: tests/fixtures/op_cases.py, against torch on every backend)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.ir.graph import IRError


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize(
    "net, shape, words",
    [
        (nn.Upsample(scale_factor=2, mode="bicubic"), (2, 3, 4), "mode='bicubic'"),
        (nn.Upsample(scale_factor=2, mode="nearest-exact"), (2, 5), "mode='nearest-exact'"),
        (
            Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", antialias=True)),
            (2, 3, 4),
            "antialias",
        ),  # fmt: skip
        (nn.Upsample(scale_factor=2, mode="trilinear"), (1, 2, 2, 2), "trilinear"),
    ],
)
def test_upsampling_forms_not_supported_are_refused(net, shape, words):
    with pytest.raises(IRError, match=words):
        rootclad.compile(net, torch.randn(2, *shape), engine="pullback")
