"""``torch.nn`` modules -> :class:`Graph` through ``torch.export`` and PyTorch's core ATen IR.

``compile(model, x, frontend="export")``: the module is captured by ``torch.export`` (not
strict, the batch axis dynamic) and decomposed into core ATen ops, except the layers rootclad
runs fused (linear, convolutions, layer and batch norm, softmax), which stay one op each. Every
ATen op lowers through one table (:data:`table.LOWERINGS`), each entry in its family's file:
:mod:`.pointwise` (unary math, arithmetic), :mod:`.layers` (the fused layers),
:mod:`.layout` (views, pieces, reductions).
The interface a lowering gets is :class:`lowering.Lowering`. Every ONNX file is lowered here
(its nodes run by :mod:`rootclad.frontends.onnx.replay`); for torch modules ``frontend="fx"``
stays the default until this front-end passes every test the fx one does (issue 44).
"""

from __future__ import annotations

from rootclad.frontends.aten.lowering import graph_from_export

__all__ = ["graph_from_export"]
