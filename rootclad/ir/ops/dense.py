"""Dense: Linear on the last axis."""

from __future__ import annotations

from rootclad.ir.graph import expect
from rootclad.ir.ops.common import numel
from rootclad.ir.registry import OpSpec, register


def _linear_infer(node, shapes, graph):
    (shape,) = shapes
    w = graph.param(node.params["weight"])
    expect(
        len(shape) >= 1 and shape[-1] == w.shape[1],
        node,
        f"expected input (..., {w.shape[1]}), got per-sample shape {shape}",
    )
    return (*shape[:-1], w.shape[0])


register(
    OpSpec(
        "linear",
        "dense",
        "Linear on the last axis (any leading per-sample axes)",
        _linear_infer,
        params=("weight", "bias"),
        saves=("in",),
        flops=lambda node, g: 2 * numel(node.in_shape) * node.out_shape[-1],
        modules=("Linear", "LazyLinear"),
    )
)
