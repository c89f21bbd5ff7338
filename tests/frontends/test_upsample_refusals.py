"""Upsampling beyond the op cases (tests/fixtures/op_cases.py, against torch on every backend):
torch's 1-d nearest forward at scales near 1 and 2, the 1-d nearest-exact mode against torch,
and the forms refused naming the ATen op and the layer or call that made it."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import check_against_torch
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
        # torch decomposes bicubic and trilinear into gathers by several index tensors
        (
            nn.Upsample(scale_factor=2, mode="bicubic"),
            (2, 3, 4),
            r"aten\.index\.Tensor \(node 'index' in module '0' \(Upsample\)\): indexing by 2 index",
        ),
        (
            Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", antialias=True)),
            (2, 3, 4),
            r"aten\._upsample_bilinear2d_aa\.default .*in module '0' \(Fn\)\): not supported",
        ),
        (
            nn.Upsample(scale_factor=2, mode="trilinear"),
            (1, 2, 2, 2),
            r"aten\.index\.Tensor \(node 'index' in module '0' \(Upsample\)\): indexing by 3 index",
        ),
    ],
    ids=["bicubic", "antialias", "trilinear"],
)
def test_upsampling_forms_not_supported_are_refused(net, shape, words):
    with pytest.raises(IRError, match=words):
        rootclad.compile(nn.Sequential(net), torch.randn(2, *shape), engine="pullback")


def test_nearest_exact_1d_matches_torch():
    """mode='nearest-exact' (torch's floor((o + 0.5) / scale)) at twice the size: forward and
    input gradient against torch."""
    x = torch.randn(3, 2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    check_against_torch(nn.Upsample(scale_factor=2, mode="nearest-exact"), x, loss="mse")


@pytest.mark.parametrize("scale, n", [(1.01, 10), (2.05, 5), (1.3, 3)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nearest_1d_by_scales_near_1_and_2_indexes_as_torchs_forward(scale, n, dtype):
    """torch's 1-d forward floors o * (1 / scale) even where its backward and its 2-d kernel
    take n -> n and n -> 2n as a copy and a doubling; rootclad follows the forward, and its
    gradient is that forward's (checked by torch autograd of the same gather)."""
    net = nn.Upsample(scale_factor=scale)
    x = torch.randn(3, 2, n, dtype=dtype, requires_grad=True)
    cm = rootclad.compile(net, x.detach(), engine="pullback")
    out, ref = cm(x), net(x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    idx = torch.arange(ref.shape[-1], dtype=dtype) * torch.tensor(1.0 / scale, dtype=dtype)
    gathered = x[..., idx.floor().long().clamp(max=n - 1)]
    d = torch.randn_like(ref)
    (got,) = torch.autograd.grad(out, x, d)
    (want,) = torch.autograd.grad(gathered, x, d)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
