"""``torch.nn`` modules -> :class:`Graph` through ``torch.export`` and PyTorch's core ATen IR.

``compile(model, x)``: the module is captured by ``torch.export`` (not strict, the batch axis
dynamic) and decomposed into core ATen ops, except the layers rootclad runs fused (linear,
convolutions, layer and batch norm, softmax), which stay one op each (a program whose ops are
all lowered as captured is not decomposed again). Every ATen op lowers through one table
(:data:`table.LOWERINGS`), each entry in its family's file: :mod:`.pointwise` (unary math,
arithmetic), :mod:`.layers` (the fused layers), :mod:`.layout` (views, pieces, reductions,
products), :mod:`.indexing`, :mod:`.logic`, :mod:`.writes` (in-place assignment, scatter),
:mod:`.norms`, :mod:`.draws`; :mod:`.modules` makes a torch.nn layer's node. The interface a
lowering gets is :class:`lowering.Lowering`.
Every ONNX file is lowered here too (its nodes run by :mod:`rootclad.frontends.onnx.replay`).
"""

from __future__ import annotations

from rootclad.frontends.aten.lowering import graph_from_export

__all__ = ["graph_from_export"]
