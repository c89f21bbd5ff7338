"""Normalisations over groups of channels, lowered to the ops the rest of a model uses:
``nn.GroupNorm`` and ``nn.InstanceNorm1d``/``2d`` (without running statistics) as a reshape of
each sample to (groups, values), a LayerNorm without weights over each group, a reshape back,
and the per-channel scale and shift as parameters read directly (``parameter``, ``mul``,
``add``). The gradients are those of the parts: the same pullbacks as every model's."""

from __future__ import annotations

import math

from torch import nn

from rootclad.ir.graph import IRError, Node


def lower(low, fx_node, mod, module_node) -> None:
    path = fx_node.target
    kind = type(mod)
    where = f"module {path!r} ({kind.__module__}.{kind.__name__})"
    tensors = [a for a in fx_node.args if hasattr(a, "name")]
    if len(tensors) != 1 or len(fx_node.args) != 1 or fx_node.kwargs:
        raise IRError(f"{where} is called with {len(fx_node.args)} arguments; it takes one tensor")
    x = tensors[0]
    shape = tuple(low.shape(x)[1:])
    if isinstance(mod, nn.GroupNorm):
        groups, channels = mod.num_groups, mod.num_channels
    else:  # InstanceNorm1d / 2d: a group per channel
        rank = 2 if isinstance(mod, nn.InstanceNorm1d) else 3
        if len(shape) != rank:
            raise IRError(f"{where}: per-sample shape {shape}; (C, L) or (C, H, W) with the "
                          "batch axis first")  # fmt: skip
        if mod.track_running_stats:
            raise IRError(f"{where}: track_running_stats=True (running statistics in eval mode) "
                          "is not supported")  # fmt: skip
        groups = channels = shape[0]
    weights = (f"{path}.weight", f"{path}.bias") if mod.affine else (None, None)
    group_norm(low, fx_node.name, x, groups, channels, float(mod.eps), *weights, where)


def group_norm(low, out, x, groups, channels, eps, weight, bias, where) -> None:
    """x normalised over groups of its channels (the first per-sample axis), then scaled and
    shifted per channel by the parameters named ``weight`` and ``bias`` (or neither)."""
    shape = tuple(low.shape(x)[1:])
    if not shape or shape[0] != channels or channels % groups:
        raise IRError(f"{where}: expects {channels} channels in {groups} groups on the first "
                      f"per-sample axis, got per-sample shape {shape}")  # fmt: skip
    n = math.prod(shape) // groups

    def add(suffix, op, inputs, attrs=None, params=None, name=None):
        name = name or f"{out}__{suffix}"
        low.nodes.append(Node(name, op, inputs, name, attrs or {}, params or {}))
        return name

    h = add("groups", "reshape", [x.name], {"shape": (groups, n)})
    h = add("normed", "layer_norm", [h], {"normalized_shape": (n,), "eps": eps})
    last = out if weight is None and bias is None else None
    h = add("back", "reshape", [h], {"shape": shape}, name=last)
    ones = (channels,) + (1,) * (len(shape) - 1)
    if weight is not None:
        w = add("weight", "parameter", [], {"shape": ones}, {"weight": weight})
        h = add("scaled", "mul", [h, w], name=out if bias is None else None)
    if bias is not None:
        b = add("bias", "parameter", [], {"shape": ones}, {"weight": bias})
        add("out", "add", [h, b], name=out)


LAYERS = {nn.GroupNorm: lower, nn.InstanceNorm1d: lower, nn.InstanceNorm2d: lower}
