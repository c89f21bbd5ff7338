"""Slicing (rootclad/frontends/fx_slicing.py) and padding (fx_functional.py): what is refused, naming the fx node and why.
What compiles is checked against torch by the op cases (fixtures/op_cases.py: slice-*,
chunk-split-unbind) on every backend, and by shufflenet_v2 in tests/models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.op_cases import Fn

import rootclad
from rootclad.ir.graph import IRError


def _first_piece(x):
    return torch.cat(x.chunk(2, 1), 1)  # the pieces go to cat together, not one by one


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda x: x[0], ["getitem", "batch axis", "x[:, ...]"]),
        (lambda x: x[1:], ["getitem", "batch axis"]),
        # a tensor as index: a tensor constant, refused as such
        (lambda x: x[:, torch.tensor([0, 2])], ["_tensor_constant0"]),
        (lambda x: x[:, : x.size(0)], ["getitem", "batch size"]),
        (lambda x: x[:, 3:3], ["slice 3:3:1", "does not fit"]),
        (lambda x: x.chunk(2)[0], ["chunk", "batch axis"]),
        (_first_piece, ["chunk", "together", "one by one"]),
        (lambda x: x.split(x.size(0), 1)[0], ["split", "depend on the batch size"]),
        (lambda x: x.chunk(x.size(0), 1)[0], ["chunk", "depend on the batch size"]),
        (lambda x: torch.chunk(input=x, chunks=5, dim=0)[0], ["chunk", "batch axis"]),
        (lambda x: x.squeeze(), ["squeeze", "without dim"]),
        (lambda x: x.unsqueeze(0), ["unsqueeze", "batch axis"]),
        (lambda x: F.pad(x, (1, 1, 0, 1)), ["pad", "batch axis"]),
        (lambda x: F.pad(x[:, None], (1, 1), mode="reflect"), ["pad", "'reflect'"]),
        (lambda x: F.pad(x, (-3, -3)), ["slice 3:3:1", "does not fit"]),
        (lambda x: F.pad(x, (1, 1), value=float("inf")), ["pad", "finite"]),
    ],
)
def test_slicing_rootclad_cannot_compile_is_refused_naming_the_node(fn, words):
    with pytest.raises(IRError) as err:
        rootclad.compile(Fn(fn), example_input=torch.randn(4, 6, dtype=torch.float64),
                         engine="pullback")  # fmt: skip
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_slice_of_a_slice_and_an_index_match_torch():
    """Several sliced axes chain one slice op each; an integer index drops its axis."""
    net = Fn(lambda x: x[:, 1:, ::2][:, -1, 1:] * 3)
    x = torch.randn(3, 4, 7, dtype=torch.float64, requires_grad=True)
    cm = rootclad.compile(net, example_input=x.detach(), engine="pullback")
    torch.testing.assert_close(cm.predict(x.detach()), net(x).detach(), rtol=0, atol=0)
    d = torch.randn(3, 3, dtype=torch.float64)
    (want,) = torch.autograd.grad(net(x), x, d)
    torch.testing.assert_close(cm.input_grad(x.detach(), d_out=d), want, rtol=1e-15, atol=0)
