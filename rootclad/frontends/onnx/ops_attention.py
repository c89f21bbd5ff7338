"""The ONNX table's attention (see ops.py): ``Attention`` (opset 23 on) written out as torch
computes it, its products, mask and softmax, which the export front-end lowers as any; and
``Einsum``, the products attention is often written with."""

from __future__ import annotations

import math

import torch

from rootclad.frontends.onnx.ops import ATTRIBUTES, onnx_op, tensor

ATTRIBUTES["Attention"] = {
    "is_causal",
    "kv_num_heads",
    "q_num_heads",
    "qk_matmul_output_mode",
    "scale",
    "softcap",
    "softmax_precision",
}


def _heads(node, x, heads_attr: str):
    """``x`` as (B, heads, sequence, size): a 3-d input's last axis split into heads."""
    if x.dim() == 4:
        return x
    heads = node.attr(heads_attr)
    if x.dim() != 3 or not heads or x.shape[2] % heads:
        raise node.refuse(f"a {x.dim()}-d input without {heads_attr} dividing its last axis")
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


@onnx_op("Attention")
def _attention(node, ins):
    ins = list(ins) + [None] * (7 - len(ins))
    q, k, v, mask, past_k, past_v, lengths = ins[:7]
    wanted = [bool(o) for o in node.outputs]
    if lengths is not None or any(wanted[3:]):
        raise node.refuse("sequence lengths or the products' output (qk_matmul_output)")
    three_d = q.dim() == 3
    q = _heads(node, q, "q_num_heads")
    k, v = _heads(node, k, "kv_num_heads"), _heads(node, v, "kv_num_heads")
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    present = [k, v]
    if q.shape[1] != k.shape[1]:  # grouped queries: each key and value head serves a group
        if q.shape[1] % k.shape[1]:
            raise node.refuse(f"{q.shape[1]} query heads for {k.shape[1]} key heads")
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = node.attr("scale")
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale  # (0.0 is a scale too)
    scores = torch.matmul(q * scale, k.transpose(-1, -2))
    cap = node.attr("softcap", 0.0)
    if cap > 0:  # as ONNX's reference: a cap of 0 or below caps nothing
        scores = cap * torch.tanh(scores / cap)
    if mask is not None:
        mask = tensor(node, mask, scores if not _is_bool(mask) else None)
        short = k.shape[2] - mask.shape[-1]  # a mask of fewer keys: the others masked
        if short > 0:
            fill = False if mask.dtype == torch.bool else float("-inf")
            mask = torch.cat([mask, mask.new_full((*mask.shape[:-1], short), fill)], -1)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    if node.attr("is_causal", 0):  # query i sees the keys up to past + i (ONNX's alignment)
        rows, cols = scores.shape[-2], scores.shape[-1]
        later = torch.ones(rows, cols, dtype=torch.bool).triu(past + 1)
        scores = scores.masked_fill(later, float("-inf"))
    y = torch.matmul(torch.ops.aten._safe_softmax(scores, -1), v)
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    return [y, *present][: len(node.outputs)]


def _is_bool(mask) -> bool:
    return (mask.dtype == torch.bool) if isinstance(mask, torch.Tensor) else mask.dtype == bool


@onnx_op("Einsum")
def _einsum(node, ins):
    return torch.einsum(node.attr("equation"), *[tensor(node, v) for v in ins])
