"""torch.einsum (issue 27): the forms attention and custom layers write (an ellipsis, three
operands, a sum down to the batch axis among them), against torch autograd (forward and input
gradient), and the forms rootclad does not compile refused naming the ATen op torch's
decomposition left, or the model's output, and why. The one-op cases
(tests/fixtures/op_cases.py) run two of them on both engines, the device kernels and through
ONNX's Einsum."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import assert_close_rel
from fixtures.op_cases import Fn
from torch import nn

import rootclad
from rootclad.ir.graph import IRError

F64 = torch.float64

FORMS = [
    ("bmm-transposed", lambda x: torch.einsum("bij,bkj->bik", x, 2 * x), (4, 5)),
    ("attention-scores", lambda x: torch.einsum("bhqd,bhkd->bhqk", x, x + 1), (2, 3, 4)),
    ("attention-output-heads-last", lambda x: torch.einsum("bhqk,bhkd->bqhd", x.softmax(-1), x), (2, 3, 3)),
    ("transpose", lambda x: torch.einsum("bij->bji", x), (3, 4)),
    ("row-sums", lambda x: torch.einsum("bij->bi", x), (3, 4)),
    ("outer-product", lambda x: torch.einsum("bi,bj->bij", x[:, 0], x[:, 1]), (2, 4)),
    ("contract-and-sum-away", lambda x: torch.einsum("bij,bjk->bk", x, x.transpose(1, 2)), (3, 4)),
    ("bilinear-pairs", lambda x: torch.einsum("bnd,bmd->bnm", x, torch.tanh(x)), (5, 2)),
    ("ellipsis", lambda x: torch.einsum("...ij->...ji", x), (3, 4)),
    ("three-operands", lambda x: torch.einsum("bij,bjk,bkl->bil", x, x.transpose(1, 2), x), (3, 4)),
    ("batch-alone", lambda x: torch.einsum("bij->b", x), (3, 4)),
]  # fmt: skip


@pytest.mark.parametrize("fn, shape", [pytest.param(*c[1:], id=c[0]) for c in FORMS])
def test_einsum_matches_torch(fn, shape):
    x = torch.randn(3, *shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    cm = rootclad.compile(Fn(fn), x, loss="mse", engine="pullback")
    xr = x.clone().requires_grad_(True)
    out = Fn(fn)(xr)
    d_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (want,) = torch.autograd.grad(out, [xr], d_out)
    assert_close_rel(cm.predict(x), out.detach(), 1e-12, "forward")
    assert_close_rel(cm.input_grad(x, d_out=d_out), want, 1e-12, "d_x")


class _WithWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 2))

    def forward(self, x):
        return torch.einsum("bij,jk->bik", x, self.w)


REFUSED = [
    ("diagonal", lambda x: torch.einsum("bii->bi", x[:, :, :3]), r"ATen op aten\.diagonal\.default .*not supported"),
    ("batch-not-first", lambda x: torch.einsum("ibj->bij", x), r"the model's output .* has its batch axis at axis 1, not first"),
]  # fmt: skip


@pytest.mark.parametrize("fn, words", [pytest.param(*c[1:], id=c[0]) for c in REFUSED])
def test_einsum_forms_not_compiled_are_refused_naming_the_node(fn, words):
    with pytest.raises(IRError, match=words):
        rootclad.compile(Fn(fn), torch.randn(3, 3, 4, dtype=F64), loss="mse", engine="pullback")


def test_einsum_with_a_parameter_is_refused_naming_the_node():
    """torch writes "bij,jk->bik" as a bmm of the samples' rows, all in one matrix, by the
    weight: refused at that bmm."""
    with pytest.raises(IRError, match=r"ATen op aten\.bmm\.default .*batch axes differ"):
        rootclad.compile(_WithWeight().double(), torch.randn(3, 3, 4, dtype=F64), loss="mse",
                         engine="pullback")  # fmt: skip
