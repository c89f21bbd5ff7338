"""The graph rewrites that change cost, not values (rootclad/ir/optimize.py): permutes merged,
scales moved onto one operand of a product. Their values are checked against torch by every
model test (both front-ends' graphs pass through them); here, what they leave."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rootclad.frontends.aten import graph_from_export
from rootclad.ir.graph import Graph, Node
from rootclad.ir.optimize import simplify


def _graph(shape, *nodes) -> Graph:
    graph = Graph(["x"], [shape], list(nodes), nodes[-1].output, [], "float64")
    graph.validate()
    return graph


def _permute(name, src, perm) -> Node:
    return Node(name, "permute", [src], name, {"perm": perm})


def test_permutes_that_undo_each_other_vanish_and_others_merge_into_one():
    relu = Node("c", "relu", ["b"], "c")
    undone = simplify(
        _graph((2, 3, 4), _permute("a", "x", (1, 2, 0)), _permute("b", "a", (2, 0, 1)), relu)
    )
    assert [n.op for n in undone.nodes] == ["relu"] and undone.nodes[0].inputs == ["x"]
    merged = simplify(
        _graph((2, 3, 4), _permute("a", "x", (1, 0, 2)), _permute("b", "a", (0, 2, 1)), relu)
    )
    (p, _) = merged.nodes
    # x.permute(1, 0, 2).permute(0, 2, 1) == x.permute(1, 2, 0)
    x = torch.arange(24).reshape(2, 3, 4)
    assert p.attrs["perm"] == (1, 2, 0) and p.inputs == ["x"]
    assert torch.equal(x.permute(1, 0, 2).permute(0, 2, 1), x.permute(*p.attrs["perm"]))


def test_a_permute_read_twice_or_beyond_the_kernels_stays():
    both = Node("c", "matmul", ["a", "b"], "c")  # (3, 2) @ (2, 3): a read by b and c
    shared = simplify(_graph((2, 3), _permute("a", "x", (1, 0)), _permute("b", "a", (1, 0)), both))
    assert [n.op for n in shared.nodes] == ["permute", "permute", "matmul"]
    five = (2, 3, 4, 5, 6)
    first, then = _permute("a", "x", (1, 0, 2, 3, 4)), _permute("b", "a", (0, 1, 4, 3, 2))
    kept = simplify(_graph(five, first, then, Node("c", "relu", ["b"], "c")))
    assert [n.op for n in kept.nodes] == ["permute", "permute", "relu"]


class Attention(nn.Module):
    def forward(self, q):
        return F.scaled_dot_product_attention(q, 2 * q, q + 1)


def test_torchs_attention_scales_the_scores_once_and_transposes_no_value_back_and_forth():
    graph = graph_from_export(Attention(), torch.randn(2, 5, 4), "float32")
    ops = [n.op for n in graph.nodes]
    made = {n.output: n for n in graph.nodes}
    # torch.export scales q and k each by 4 ** -0.25 and writes the output's transposes twice
    scales = [n for n in graph.nodes if n.op == "affine" and n.attrs["shift"] == 0.0]
    assert [n.attrs["scale"] for n in scales if n.attrs["scale"] != 2.0] == [pytest.approx(0.5)]
    pairs = [n for n in graph.nodes if n.op == "permute" and made.get(n.inputs[0], n).op == n.op]
    assert not pairs, ops


class _Cell(nn.Module):
    """A recurrent loop as people write it: the state starts as zeros made in forward."""

    def __init__(self):
        super().__init__()
        self.inp, self.hid = nn.Linear(3, 4), nn.Linear(4, 4)
        self.gate = nn.Linear(4, 4, bias=False)

    def forward(self, x):  # (B, T, 3)
        h = x.new_zeros(x.shape[0], 4)
        c = x.new_zeros(x.shape[0], 4)
        for t in range(x.shape[1]):
            c = torch.sigmoid(self.gate(h)) * c + torch.tanh(self.inp(x[:, t]) + self.hid(h))
            h = torch.tanh(c)
        return h


@pytest.mark.parametrize("net", [_Cell(), nn.LSTM(3, 4, batch_first=True)], ids=["cell", "lstm"])
def test_products_with_a_zero_state_are_not_computed_and_sums_keep_the_other_term(net):
    """The first step from a zero state: h W + b is the bias, f * c and what computed f go,
    a sum with 0 is its other term. The values and gradients: tests/torch/test_recurrent.py and
    the check against torch below."""
    from fixtures.core import check_against_torch

    x, net = torch.randn(2, 3, 3), _Readout(net)
    graph = graph_from_export(net, x, "float32")
    zeros = {n.output for n in graph.nodes if n.op == "parameter" and n.buffers}
    assert not zeros, [n.name for n in graph.nodes if n.op == "parameter"]
    # products of x (an LSTM projects all steps at once) and of h at steps 2 and 3 only
    cell = isinstance(net.net, _Cell)
    assert sum(n.op == "linear" for n in graph.nodes) == (3 if cell else 1) + 2 * (2 if cell else 1)
    check_against_torch(net, x, loss="mse")


class _Readout(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        out = self.net(x)
        return out[0][:, -1] if isinstance(out, tuple) else out
