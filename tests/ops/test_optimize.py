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
