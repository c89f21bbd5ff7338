"""ATen ops that draw random numbers: torch.randn_like and torch.randn of the batch's shape
(the IR's normal: a counter-based draw per element, again on every call, in training and eval
as torch's), in-place dropout's bernoulli (the IR's dropout of ones), and torchvision's
StochasticDepth, captured as one op of rootclad's own (its draw into torch.empty cannot say
its mode or p = 1). A draw the same for every sample (torch.randn(3)) is refused: the IR
draws per sample."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from rootclad.frontends.aten.table import lowers
from rootclad.ir.ops import OPS


# nondeterministic_seeded: a draw, which the lowering never folds (not even of a constant)
@torch.library.custom_op(
    "rootclad::stochastic_depth", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def stochastic_depth(x: torch.Tensor, p: float, mode: str) -> torch.Tensor:
    """torchvision's stochastic_depth in training (run where the capture computes its
    constants; the compiled op follows cm.train() and cm.eval())."""
    from torchvision.ops import stochastic_depth as layer

    out = layer(x, p, mode, True)
    return out.clone() if out is x else out  # (p = 0: torchvision returns x itself)


@stochastic_depth.register_fake
def _(x, p, mode):
    return torch.empty_like(x)


@contextlib.contextmanager
def own_ops(module: nn.Module):
    """The StochasticDepth layers of ``module`` calling rootclad::stochastic_depth while the
    block runs (an attribute of each layer's own, removed after)."""
    layers = [
        m
        for m in module.modules()
        if type(m).__name__ == "StochasticDepth" and type(m).__module__.startswith("torchvision")
    ]
    for layer in layers:
        layer.forward = lambda x, m=layer: stochastic_depth(x, float(m.p), m.mode)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


@lowers("rootclad.stochastic_depth.default")
def _stochastic_depth(low, node, args, kw):
    attrs = OPS["stochastic_depth"].from_call(args[1:], {}, low.where(node))
    if not attrs["whole_batch"]:  # torchvision draws per row of axis 0: the samples
        low.batch_first(node, args[0], "stochastic depth")
    low.emit(node, "stochastic_depth", [low.value(node, args[0])], attrs)


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
    """In-place dropout's mask (per element): the IR's dropout of ones times keep, following
    cm.train()/eval() as the layer does. Elsewhere torch draws in either mode: refused."""
    _, mod = low.module_of(node)
    dropout = type(mod) in (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)  # in place
    if not dropout:
        alpha = " (alpha dropout is not supported)" if "Alpha" in type(mod).__name__ else ""
        raise low.refuse(node, f"a random draw outside dropout and stochastic depth{alpha}")
    keep = low.number(node, args[1] if len(args) > 1 else kw.get("p", 0.5), "p")
    divides = all(
        getattr(u.target, "_opname", "") == "div" and u.args[0] is node and u.args[1] == keep
        for u in node.users
    )
    if not divides:  # the mask scaled by 1 / keep: in eval, ones (as the IR's dropout gives)
        raise low.refuse(node, "a draw not divided by its keep probability")
    if not low.layout(node) or not 0 < keep <= 1:
        raise low.refuse(node, f"a dropout mask the same for every sample, or of p={1 - keep}")
    shape = low.shape(node)
    ones = low.constant_value(node, torch.ones(shape), shape, "ones")
    mask = low.emit(node, "dropout", [ones], {"p": 1.0 - keep}, part="mask")
    low.emit(node, "affine", [mask], {"scale": keep, "shift": 0.0})
