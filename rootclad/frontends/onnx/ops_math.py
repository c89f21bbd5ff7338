"""The ONNX table's sums of several operands, reductions, running sums and products,
arg-extremes and normalizations, written with the torch ops the other entries use (see
ops.py)."""

from __future__ import annotations

import copy
import functools

import numpy as np
import torch
import torch.nn.functional as F

from rootclad.frontends.onnx.ops import ATTRIBUTES, OPS, STATIC, ints, is_number, onnx_op, tensor
from rootclad.frontends.onnx.ops_shapes import _axes

_REDUCTIONS = ("ReduceL1", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd")
STATIC.update({**dict.fromkeys(_REDUCTIONS, (1,)), "CumProd": (1,)})
ATTRIBUTES.update(
    {
        **dict.fromkeys(_REDUCTIONS, ATTRIBUTES["ReduceSum"]),
        "CumProd": {"exclusive", "reverse"},
        **dict.fromkeys(("ArgMax", "ArgMin"), {"axis", "keepdims", "select_last_index"}),
        "Hardmax": {"axis"},
        "LpNormalization": {"axis", "p"},
        "ThresholdedRelu": {"alpha"},
        "SpaceToDepth": {"blocksize", "mode"},
    }
)


def _as(node, op: str):
    """``node`` read as the table's two-operand ``op`` (Sum and Mean add as Add)."""
    pair = copy.copy(node)
    pair.op = op
    return pair


@onnx_op("Sum", "Mean")
def _sum(node, ins):
    """The sum (or mean) of any number of operands, broadcast as Add's, added left to right
    as onnx's reference adds them."""
    add = _as(node, "Add")
    total = functools.reduce(lambda a, b: OPS["Add"](add, [a, b]), ins)
    if node.op == "Sum" or len(ins) == 1:
        return total
    return np.true_divide(total, len(ins)) if is_number(total) else total / len(ins)


_pairwise = OPS["Max"]  # (ops.py's entry of two operands)


@onnx_op("Max", "Min")
def _extremes(node, ins):
    """Max and Min of any number of operands (one: itself), pairwise."""
    return functools.reduce(lambda a, b: _pairwise(node, [a, b]), ins)


@onnx_op(*_REDUCTIONS)
def _reduce(node, ins):
    x, axes = ins[0], _axes(node, ins)
    keep = bool(node.attr("keepdims", 1))
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.ndim if is_number(x) else x.dim()))
    if is_number(x):  # a product of sizes (the batch size's symbol among them) stays numbers
        if node.op != "ReduceProd":
            raise node.refuse("of numbers")
        return np.prod(x, axis=tuple(axes), keepdims=keep)
    x = tensor(node, x)
    if node.op == "ReduceL1":
        return x.abs().sum(axes, keepdim=keep)
    if node.op == "ReduceLogSum":
        return torch.log(x.sum(axes, keepdim=keep))
    if node.op == "ReduceLogSumExp":
        return torch.logsumexp(x, axes, keepdim=keep)
    axes = sorted({a + x.dim() if a < 0 else a for a in axes})
    for a in axes:  # (torch.prod takes one axis)
        x = torch.prod(x, a, keepdim=True)
    return x if keep else x.squeeze(axes)


@onnx_op("CumSum", "CumProd")
def _running(node, ins):
    """The running sum (product) along the axis; reverse: from its end; exclusive: the sum
    (product) before each element, the running one moved one place along, a 0 (1) first."""
    x = tensor(node, ins[0])
    axis = ints(node, ins[1], "axis")[0]
    axis = axis + x.dim() if axis < 0 else axis
    if isinstance(x.shape[axis], torch.SymInt):
        raise node.refuse("along the batch axis (rootclad never mixes samples)")
    reverse, product = bool(node.attr("reverse", 0)), node.op == "CumProd"
    out = (torch.cumprod if product else torch.cumsum)(x.flip(axis) if reverse else x, axis)
    if node.attr("exclusive", 0):
        if x.shape[axis] == 1:
            raise node.refuse("exclusive along an axis of 1 (a constant, no running result)")
        pad = [0, 0] * (x.dim() - 1 - axis) + [1, 0]
        out = F.pad(out.narrow(axis, 0, out.shape[axis] - 1), pad, value=float(product))
    return out.flip(axis) if reverse else out


@onnx_op("ArgMax", "ArgMin")
def _argmax(node, ins):
    """The index of the first largest (smallest) along ``axis``, or of the last one
    (select_last_index: the first of the values reversed, counted from the end)."""
    x = tensor(node, ins[0])
    axis, keep = node.attr("axis", 0), bool(node.attr("keepdims", 1))
    fn = torch.argmax if node.op == "ArgMax" else torch.argmin
    if not node.attr("select_last_index", 0):
        return fn(x, axis, keep)
    return (x.shape[axis] - 1) - fn(x.flip(axis), axis, keep)


@onnx_op("Hardmax")
def _hardmax(node, ins):
    """1 at the first largest value along ``axis``, 0 elsewhere."""
    x = tensor(node, ins[0])
    axis = node.attr("axis", -1)
    axis = axis + x.dim() if axis < 0 else axis
    at = torch.argmax(x, axis, keepdim=True)
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    return (torch.arange(x.shape[axis]).reshape(shape) == at).to(x.dtype)


@onnx_op("LpNormalization")
def _lp_normalization(node, ins):
    """x divided by its 1- or 2-norm along ``axis``, no epsilon added; 0 where the norm is 0,
    as ONNX says."""
    x, p = tensor(node, ins[0]), node.attr("p", 2)
    axis = node.attr("axis", -1)
    if p not in (1, 2):
        raise node.refuse(f"p={p} (1 and 2 are ONNX's)")
    total = x.abs().sum(axis, keepdim=True) if p == 1 else (x * x).sum(axis, keepdim=True)
    total = torch.where(total == 0, 1.0, total)  # (x is 0 there; no 0 reaches sqrt's gradient)
    return x / (total if p == 1 else torch.sqrt(total))


@onnx_op("ThresholdedRelu")
def _thresholded_relu(node, ins):
    x = tensor(node, ins[0])
    return torch.where(x > node.attr("alpha", 1.0), x, 0.0)


@onnx_op("SpaceToDepth")
def _space_to_depth(node, ins):
    """Each block of b x b pixels to b x b channels: the block's offset major (mode DCR, as
    DepthToSpace's, reversed) or the channel major (CRD)."""
    x, b = tensor(node, ins[0]), node.attr("blocksize")
    mode = node.attr("mode", "DCR")
    if mode not in ("DCR", "CRD") or x.dim() != 4 or not isinstance(b, int) or b < 1:
        raise node.refuse(
            f"mode {mode!r}, blocksize {b!r}, {x.dim()}-d data (ONNX's: DCR or CRD, a positive "
            "blocksize, 4-d data)"
        )
    n, c, h, w = x.shape
    if h % b or w % b:
        raise node.refuse(f"blocksize {b} does not divide the image's {h} x {w}")
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    x = x.reshape(n, c, h // b, b, w // b, b).permute(order)
    return x.reshape(n, c * b * b, h // b, w // b)
