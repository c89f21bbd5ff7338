"""ATen ops of normalisation over a sample's own values: group norm (torch's
native_group_norm) and instance norm (torch's batch norm without statistics over a view of the
batch as channels, (1, B * C, ...)), each a reshape of the sample to (groups, values), a layer
norm without weights over each group, a reshape back, and the per-channel scale and shift.
BatchNorm's forms are layers (layers.py)."""

from __future__ import annotations

import math

from torch import nn

from rootclad.frontends.aten.table import lowers


def _normed(low, node, x: str, shape, groups: int, eps: float, weight, bias, out=None) -> None:
    """``x`` of per-sample ``shape`` (C, ...) normalised over each of ``groups`` groups of
    channels, then scaled and shifted per channel (and given per-sample shape ``out``)."""
    channels = shape[0]
    n = math.prod(shape) // groups
    h = low.emit(node, "reshape", [x], {"shape": (groups, n)}, part="groups")
    h = low.emit(node, "layer_norm", [h], {"normalized_shape": (n,), "eps": eps}, part="normed")
    last = weight is None and bias is None and out is None
    h = low.emit(node, "reshape", [h], {"shape": tuple(shape)}, part="" if last else "back")
    ones = (channels,) + (1,) * (len(shape) - 1)
    for i, (tensor, op) in enumerate(((weight, "mul"), (bias, "add"))):
        if tensor is None:
            continue
        if low.layout(node, tensor) is None:
            t = low.held_as(node, tensor, ones, f"{op}_channels")
        else:  # instance norm's p.repeat(B): each sample's is p
            t = low.emit(
                node, "reshape", [low.value(node, tensor)], {"shape": ones}, part=f"{op}_channels"
            )
        final = (i == 1 or bias is None) and out is None
        h = low.emit(node, op, [h, t], part="" if final else f"{op}ed")
    if out is not None:
        low.emit(node, "reshape", [h], {"shape": tuple(out)})


@lowers("aten.native_group_norm.default")
def _group_norm(low, node, args, kw):
    x, weight, bias = args[:3]
    groups, eps = int(args[6]), float(args[7])
    low.batch_first(node, x, "group norm")
    shape = low.shape(node, x)
    if shape[0] % groups:
        raise low.refuse(node, f"{shape[0]} channels in {groups} groups")
    _normed(low, node, low.value(node, x), shape, groups, eps, weight, bias)
    low.tuples[node.name] = [low.names.pop(node.name), None, None]


@lowers("aten._native_batch_norm_legit.no_stats")
def _no_statistics(low, node, args, kw):
    """Batch norm on the batch's statistics without running ones: BatchNorm's
    track_running_stats=False (a layer), or instance norm's view of the samples' channels as
    one batch's channels (each sample's own statistics)."""
    from rootclad.frontends.aten.layers import _layer

    path, mod = low.module_of(node)
    if isinstance(mod, nn.modules.batchnorm._BatchNorm):
        _layer(low, node, args, kw)
        return
    x, weight, bias, _, _, eps = args[:6]
    p, o, k = low.layout(node, x)
    if (p, o) != (1, 1) or int(x.meta["val"].shape[0]) != 1:
        raise low.refuse(node, "batch statistics that mix the samples (not a BatchNorm layer)")
    whole = low.shape(node, x)  # (1, C, ...): the view's first axis, then a sample's channels
    shape = whole[1:]
    src = low.emit(node, "reshape", [low.value(node, x)], {"shape": shape}, part="channels")
    _normed(low, node, src, shape, shape[0], float(eps), weight, bias, whole)
    low.tuples[node.name] = [low.names.pop(node.name), None, None]
