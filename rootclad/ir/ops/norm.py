"""Normalisations along axes: Softmax / LogSoftmax, LayerNorm, BatchNorm."""

from __future__ import annotations

from rootclad.ir.graph import IRError, expect
from rootclad.ir.ops.common import F, arg
from rootclad.ir.registry import OpSpec, register


def _softmax_infer(node, shapes, graph):
    (shape,) = shapes
    axis = node.attrs["axis"]
    expect(0 <= axis < len(shape), node, f"axis {axis} is not a per-sample axis of {shape}")
    return shape


def _softmax_module(mod, where):
    if mod.dim is None:
        raise IRError(f"{where}: give dim explicitly (implicit dim is deprecated in torch)")
    return {"dim": mod.dim}


for _name, _module in (("softmax", "Softmax"), ("log_softmax", "LogSoftmax")):
    register(
        OpSpec(
            _name,
            "norm",
            f"{_module} along a per-sample axis",
            _softmax_infer,
            saves=("out",),
            modules=(_module,),
            from_module=_softmax_module,
            functions=(f"torch.{_name}", F + _name, f"Tensor.{_name}"),
            from_call=lambda args, kw, where: {"dim": arg(args, kw, 0, "dim", None)},
        )
    )


register(
    OpSpec(
        "safe_softmax",
        "norm",
        "softmax whose lines of all -inf give 0s (torch's scaled_dot_product_attention since "
        "2.5: a query every key of which is masked)",
        _softmax_infer,
        saves=("out",),
    )
)


def _layer_norm_infer(node, shapes, graph):
    (shape,) = shapes
    ns = tuple(node.attrs["normalized_shape"])
    expect(
        len(ns) <= len(shape) and tuple(shape[len(shape) - len(ns) :]) == ns,
        node,
        f"normalized_shape {ns} is not the trailing shape of the per-sample input {shape}",
    )
    for role in ("weight", "bias"):
        if role in node.params:
            p = graph.param(node.params[role])
            expect(p.shape == ns, node, f"{role} has shape {p.shape}, expected {ns}")
    return shape


register(
    OpSpec(
        "layer_norm",
        "norm",
        "LayerNorm over the trailing axes (with or without affine weights)",
        _layer_norm_infer,
        params=("weight", "bias"),
        saves=("in",),
        modules=("LayerNorm",),
        from_module=lambda mod, where: {
            "normalized_shape": tuple(mod.normalized_shape),
            "eps": float(mod.eps),
        },
    )
)


def _batch_norm_module(mod, where):
    if mod.momentum is None:
        raise IRError(f"{where}: momentum=None (a cumulative average) is not supported")
    return {"eps": float(mod.eps), "momentum": float(mod.momentum)}


def _batch_norm_infer(node, shapes, graph):
    (shape,) = shapes
    expect(
        len(shape) in (1, 2, 3, 4),
        node,
        f"expected input (C,), (C, L), (C, H, W) or (C, D, H, W), got per-sample shape {shape}",
    )
    for role in ("weight", "bias"):
        if role in node.params:
            p = graph.param(node.params[role])
            expect(p.shape == (shape[0],), node, f"{role} has shape {p.shape}, expected "
                   f"({shape[0]},) for {shape[0]} channels")  # fmt: skip
    return shape


register(
    OpSpec(
        "batch_norm",
        "norm",
        "BatchNorm1d/2d/3d: batch statistics in training mode (updating the running ones as "
        "torch), running statistics in eval mode",
        _batch_norm_infer,
        params=("weight", "bias"),
        buffers=("running_mean", "running_var", "num_batches_tracked"),
        saves=("in",),
        mixes_batch=True,
        modules=("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"),
        from_module=_batch_norm_module,
    )
)
