"""ATen ops that draw random numbers: torch.randn_like and torch.randn of the batch's shape
(the IR's normal: a counter-based draw per element, again on every call, in training and eval
as torch's), and stochastic depth's bernoulli (the IR's dropout of ones). A draw the same for
every sample (torch.randn(3)) is refused: the IR draws per sample."""

from __future__ import annotations

import torch
from torch import nn

from rootclad.frontends.aten.table import lowers


@lowers("aten.randn_like.default", "aten.randn.default")
def _normal(low, node, args, kw):
    if low.layout(node) is None:
        raise low.refuse(node, "a draw the same for every sample (no batch axis)")
    if node.target._opname == "randn_like" and not low.is_held(args[0]):
        like = low.value(node, args[0])
    else:  # the shape of a batch value: a constant of ones stands for it
        shape = low.shape(node)
        like = low.constant_value(node, torch.ones(shape), shape, "shape")
    low.emit(node, "normal", [like])


@lowers("aten.bernoulli.p")
def _bernoulli(low, node, args, kw):
    """Stochastic depth's mask (torchvision draws bernoulli(empty(B, 1, ...), keep) and
    divides by keep), and in-place dropout's (per element): the IR's dropout of ones times
    keep, following cm.train()/eval() as the layer does. Elsewhere torch draws in either
    mode: refused."""
    _, mod = low.module_of(node)
    dropout = type(mod) in (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)  # in place
    if type(mod).__name__ != "StochasticDepth" and not dropout:
        alpha = " (alpha dropout is not supported)" if "Alpha" in type(mod).__name__ else ""
        raise low.refuse(node, f"a random draw outside dropout and stochastic depth{alpha}")
    keep = low.number(node, args[1] if len(args) > 1 else kw.get("p", 0.5), "p")
    divides = all(
        getattr(u.target, "_opname", "") == "div" and u.args[0] is node and u.args[1] == keep
        for u in node.users
    )
    if not divides:  # the mask scaled by 1 / keep: in eval, ones (as the IR's dropout gives)
        raise low.refuse(node, "a draw not divided by its keep probability")
    one_per_sample = low.layout(node) == (0, 1, 1)
    if not (one_per_sample or dropout and low.layout(node)) or not 0 < keep <= 1:
        raise low.refuse(
            node,
            "stochastic depth other than one draw per sample (mode='row') of p < 1 "
            "(mode='batch': one draw for the batch)",
        )
    shape = low.shape(node)
    ones = low.constant_value(node, torch.ones(shape), shape, "ones")
    mask = low.emit(node, "dropout", [ones], {"p": 1.0 - keep}, part="mask")
    low.emit(node, "affine", [mask], {"scale": keep, "shift": 0.0})
