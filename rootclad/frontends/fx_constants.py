"""Constant tensors in a traced model: values a ``forward`` computes without its inputs or
parameters (``torch.ones(L, L).triu(1)``, ``nn.Transformer.generate_square_subsequent_mask``,
a mask registered as a buffer). rootclad compiles them as attention masks that are causal:
masked exactly where key j comes after query i by more than some offset (j > i + offset),
which the IR's ``causal_fill`` writes without holding the mask. Such a constant is taken by
``F.scaled_dot_product_attention(attn_mask=...)`` (a boolean: True attends; a float: added),
``nn.MultiheadAttention(attn_mask=...)``, the encoders' ``src_mask`` / ``mask`` (a boolean:
True masks; a float: added) and ``masked_fill(mask, -inf)``. A float mask must hold only 0
and -inf. Any other constant, or one used elsewhere, is refused naming the node.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rootclad.ir.graph import IRError

# the constants a traced model may hold (a mask over a long sequence: 4096 x 4096)
MAX_VALUES = 1 << 24


def record(interp, n, result) -> None:
    """Called by the shape propagation for each node: whether its ``result`` depends on an
    input's values (``rc_data``; numbers from shapes do not) or on a trained parameter
    (``rc_trained``); a tensor that does neither keeps its value (``rc_const``)."""
    values = result if isinstance(result, (tuple, list)) else (result,)
    if not any(isinstance(v, torch.Tensor) for v in values):  # numbers: static (fx_values)
        return
    reads = n.all_input_nodes
    data = n.op == "placeholder" or any(a.meta.get("rc_data") for a in reads)
    trained = any(a.meta.get("rc_trained") for a in reads)
    if n.op == "get_attr":
        trained = isinstance(interp.fetch_attr(n.target), nn.Parameter)
    if n.op == "call_module":  # a layer's output depends on its parameters
        trained = trained or any(True for _ in interp.fetch_attr(n.target).parameters())
    n.meta["rc_data"], n.meta["rc_trained"] = data, trained
    if (not data and not trained and isinstance(result, torch.Tensor)
            and result.numel() <= MAX_VALUES):  # fmt: skip
        n.meta["rc_const"] = result.detach().clone()


def is_constant(fx_node) -> bool:
    return "rc_const" in fx_node.meta


def lower(low, fx_node) -> bool:
    """Skip a constant (it is lowered where a mask takes it); refuse a node that reads one
    anywhere else. False where ``fx_node`` is neither."""
    if is_constant(fx_node) and fx_node.op != "output":
        low.constants.add(fx_node.name)
        return True
    held = [a for a in fx_node.all_input_nodes if a.name in low.constants]
    if not held or all(a in mask_arguments(low, fx_node) for a in held):
        return False
    what = (f"module {fx_node.target!r}" if fx_node.op == "call_module" else
            "the model's output" if fx_node.op == "output" else
            f"fx node {fx_node.name!r} ({_name(fx_node.target)})")  # fmt: skip
    raise IRError(f"{what} reads {held[0].name!r}, a constant tensor (computed without the "
                  "model's inputs or parameters); rootclad compiles constants only as causal "
                  "attention masks (attn_mask, src_mask, masked_fill's mask), and buffers (or a "
                  "contiguous block of one, pe[:, :L]) where they meet the input")  # fmt: skip


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def mask_arguments(low, fx_node) -> list:
    """The arguments of ``fx_node`` in which a mask is passed."""
    args, kw = list(fx_node.args), dict(fx_node.kwargs)
    if fx_node.op == "call_module":
        mod = low.traced.get_submodule(fx_node.target)
        names = {nn.MultiheadAttention: ("query", "key", "value", "key_padding_mask",
                                         "need_weights", "attn_mask"),
                 nn.TransformerEncoderLayer: ("src", "src_mask"),
                 nn.TransformerEncoder: ("src", "mask")}.get(type(mod), ())  # fmt: skip
        bound = dict(zip(names, args, strict=False)) | kw
        return [bound.get(k) for k in ("attn_mask", "src_mask", "mask")]
    name = _name(fx_node.target)
    if name == "scaled_dot_product_attention":
        return [args[3] if len(args) > 3 else kw.get("attn_mask")]
    if name == "masked_fill":
        return [args[1] if len(args) > 1 else kw.get("mask")]
    return []


def causal_offset(low, mask, attends: bool, scores, where) -> int:
    """The offset of a constant causal ``mask`` on scores of per-sample shape ``scores``
    (..., L, S): masked exactly where j > i + offset. ``attends``: a boolean's True attends
    (scaled_dot_product_attention's attn_mask) rather than masks."""
    value = mask.meta["rc_const"]
    if "rc_const_alt" in mask.meta and mask.meta["rc_const_alt"].shape != value.shape:
        raise IRError(f"{where}: the constant mask {mask.name!r} changes shape with the batch "
                      "size; a causal mask is (L, S)")  # fmt: skip
    if len(scores) < 2:
        raise IRError(f"{where}: the constant mask {mask.name!r} meets a value of per-sample "
                      f"shape {tuple(scores)}; a causal mask is (L, S) on scores (..., L, S)")  # fmt: skip
    L, S = scores[-2:]
    while value.dim() > 2 and value.shape[0] == 1:
        value = value[0]
    if tuple(value.shape) != (L, S):
        raise IRError(f"{where}: the constant mask {mask.name!r} of shape {tuple(value.shape)} "
                      f"meets scores of (L, S) = ({L}, {S}); a causal mask is (L, S)")  # fmt: skip
    if value.dtype == torch.bool:
        masked = ~value if attends else value
    else:
        masked = value == -math.inf
        if bool(((value != 0) & ~masked).any()):
            raise IRError(f"{where}: the constant float mask {mask.name!r} holds values other "
                          "than 0 and -inf: an additive bias, which rootclad does not compile "
                          "as a constant")  # fmt: skip
    ones = torch.ones(L, S, dtype=torch.bool)
    for off in range(-L, S):
        if torch.equal(masked, torch.triu(ones, diagonal=off + 1)):
            return off
    raise IRError(f"{where}: the constant mask {mask.name!r} is not causal (masked exactly where "
                  "key j > query i + some offset); rootclad compiles constant masks of that "
                  "form only (give other masks as inputs of the model)")  # fmt: skip


def record_alt(n, result) -> None:
    """The run at one sample more: a constant's value there (its shape must not change)."""
    if "rc_const" in n.meta and isinstance(result, torch.Tensor):
        n.meta["rc_const_alt"] = result
