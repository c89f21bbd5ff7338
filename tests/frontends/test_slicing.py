"""Slicing, chunk / split, squeeze and padding: what is refused, naming the ATen op (or the
model's output) and why, and forms beyond the op cases against torch. What compiles is
checked against torch by the op cases (fixtures/op_cases.py: slice-*, chunk-split-unbind) on
every backend, and by shufflenet_v2 in tests/models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.core import check_against_torch
from fixtures.op_cases import Fn

import rootclad
from rootclad.ir.graph import IRError


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda x: x[0], ["aten.select.int", "dim=0 is the batch axis"]),
        # a forward that ties the batch size to a number stops torch.export: the refusal
        # says so (and names the line where torch's log of the guard gives it)
        (lambda x: x[1:], ["fixes the batch size"]),
        (lambda x: x[:, : x.size(0)], ["fixes the batch size"]),
        (lambda x: x[:, 3:3], ["aten.slice.Tensor", "an empty result"]),
        (lambda x: x.chunk(2)[0], ["fixes the batch size"]),
        (lambda x: x.split(x.size(0), 1)[0], ["fixes the batch size"]),
        (lambda x: x.chunk(x.size(0), 1)[0], ["chunk", "batch"]),
        (lambda x: torch.chunk(input=x, chunks=5, dim=0)[0], ["fixes the batch size"]),
        # torch drops the batch axis of a batch of 1
        (lambda x: x.squeeze(), ["squeeze", "batch axis"]),
        (lambda x: x.unsqueeze(0), ["the model's output", "batch axis at axis 1, not first"]),
        (lambda x: F.pad(x, (1, 1, 0, 1)), ["aten.pad.default", "counts for per-sample axes"]),
        (lambda x: F.pad(x, (-3, -3)), ["aten.pad.default", "an empty result"]),
        (lambda x: F.pad(x, (1, 1), value=float("inf")), ["aten.pad.default", "finite"]),
    ],
)
def test_slicing_rootclad_cannot_compile_is_refused_naming_the_node(fn, words):
    with pytest.raises(IRError) as err:
        x = torch.randn(4, 6, dtype=torch.float64)
        rootclad.compile(Fn(fn), example_input=x, engine="pullback")
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[:, torch.tensor([0, 2])],
        lambda x: torch.cat(x.chunk(2, 1), 1),
        lambda x: F.pad(x[:, None], (1, 1), mode="reflect"),
    ],
    ids=["a-tensor-as-index", "chunks-back-together", "reflect-pad"],
)
def test_indexing_by_a_tensor_chunks_and_a_reflect_pad_match_torch(fn):
    """A constant tensor as index (a gather), the pieces of chunk to one cat, F.pad's
    reflection: output and input gradient against torch."""
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    check_against_torch(Fn(fn), x, loss="mse")


def test_a_slice_of_a_slice_and_an_index_match_torch():
    """Several sliced axes chain one slice op each; an integer index drops its axis."""
    net = Fn(lambda x: x[:, 1:, ::2][:, -1, 1:] * 3)
    x = torch.randn(3, 4, 7, dtype=torch.float64, requires_grad=True)
    cm = rootclad.compile(net, example_input=x.detach(), engine="pullback")
    torch.testing.assert_close(cm.predict(x.detach()), net(x).detach(), rtol=0, atol=0)
    d = torch.randn(3, 3, dtype=torch.float64)
    (want,) = torch.autograd.grad(net(x), x, d)
    torch.testing.assert_close(cm.input_grad(x.detach(), d_out=d), want, rtol=1e-15, atol=0)
