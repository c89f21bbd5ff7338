"""ATen ops of masks: comparisons (a mask of 1s and 0s, no gradient), logical ops on masks,
any/all, torch.where and masked_fill (each branch kept where the mask says, never multiplied by
it: an infinity in the branch not taken stays out), and dtype conversions.

Masks are values of 0s and 1s in the model's dtype; a comparison of two tensors compares their
difference with 0 (the same answer but where both are the same infinity: torch says equal,
their difference is NaN)."""

from __future__ import annotations

import math

import torch

from rootclad.frontends.aten.layout import reduce_over
from rootclad.frontends.aten.table import lowers
from rootclad.ir.ops.elementwise import COMPARISONS

_SCALAR = {"eq": None, "ne": None, **{c: c for c in COMPARISONS}}


def number(low, node, arg):
    """``arg`` as a number where it is one, or a constant tensor of one value; else None."""
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return float(arg)
    if isinstance(arg, bool):
        return float(arg)
    value = low.constant(arg)
    if value is not None and value.numel() == 1:
        return float(value.reshape(()).item())
    return None


def _compare(low, node, x: str, op: str, value: float, part: str = "") -> str:
    if math.isnan(value):
        raise low.refuse(node, "a comparison with NaN")
    if op in ("eq", "ne"):
        return low.emit(node, "equal", [x], {"value": value, "negate": op == "ne"}, part=part)
    return low.emit(node, "compare", [x], {"op": op, "value": value}, part=part)


@lowers(*(f"aten.{c}.{o}" for c in _SCALAR for o in ("Scalar", "Tensor")))
def _comparison(low, node, args, kw):
    op = node.target._opname
    a, b = args[0], args[1]
    found = number(low, node, b)
    if found is not None:
        _compare(low, node, low.value(node, a), op, found)
        return
    flipped = number(low, node, a)
    if flipped is not None:  # c < x is x > c
        turned = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}.get(op, op)
        _compare(low, node, low.value(node, b), turned, flipped)
        return
    difference = low.emit(node, "sub", [low.operand(node, a), low.operand(node, b)], part="diff")
    _compare(low, node, difference, op, 0.0)


@lowers("aten.logical_not.default", "aten.bitwise_not.default")
def _not(low, node, args, kw):
    """Not a mask (1 - m); of numbers, x == 0."""
    x = low.value(node, args[0])
    if args[0].meta["val"].dtype == torch.bool:
        low.emit(node, "affine", [x], {"scale": -1.0, "shift": 1.0})
    elif node.target._opname == "logical_not":
        _compare(low, node, x, "eq", 0.0)
    else:
        raise low.refuse(node, f"bitwise not of {args[0].meta['val'].dtype}")


@lowers(
    "aten.logical_and.default",
    "aten.bitwise_and.Tensor",
    "aten.logical_or.default",
    "aten.bitwise_or.Tensor",
    "aten.logical_xor.default",
    "aten.bitwise_xor.Tensor",
)
def _logical(low, node, args, kw):
    logical(low, node, args, node.target._opname.split("_")[-1])


def logical(low, node, args, op: str) -> None:
    """``op`` (and, or, xor) of two masks (0s and 1s)."""
    for arg in args[:2]:
        _mask_only(low, node, arg)
    a, b = (low.operand(node, v) for v in args[:2])
    if op == "and":
        low.emit(node, "mul", [a, b])
    elif op == "or":  # a + b is 1 or 2 where either is
        _compare(low, node, low.emit(node, "add", [a, b], part="sum"), "gt", 0.0)
    else:
        _compare(low, node, low.emit(node, "sub", [a, b], part="diff"), "ne", 0.0)


def _mask_only(low, node, arg) -> None:
    if arg.meta["val"].dtype != torch.bool:
        raise low.refuse(node, f"a logical op on {arg.name!r} of {arg.meta['val'].dtype}")


@lowers("aten.any.dim", "aten.any.dims", "aten.all.dim", "aten.all.dims")
def _any(low, node, args, kw):
    """any / all of a mask over axes: its largest / smallest value there."""
    _mask_only(low, node, args[0])
    dims = args[1] if len(args) > 1 else kw.get("dim")
    dims = [dims] if isinstance(dims, int) else dims
    reduce_over(low, node, args[0], dims, "amax" if node.target._opname == "any" else "amin")


@lowers("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(low, node, args, kw):
    cond, a, b = args[:3]
    _branches(low, node, cond, a, b)


@lowers("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(low, node, args, kw):
    x, mask, value = args[:3]
    fill = number(low, node, value)
    if fill == -math.inf and low.layout(node) is not None:  # attention's mask: one op
        out = low.shape(node)
        if low.shape(node, x) == out:
            low.emit(
                node,
                "masked_fill",
                [low.value(node, x), as_result(low, node, mask, "mask")],
                {"keep": False},
            )
            return
    _branches(low, node, mask, value, x)


def _branches(low, node, cond, a, b) -> None:
    """torch.where(cond, a, b): a where cond holds, b elsewhere, each branch's value filled
    with 0 where it is not taken (no gradient reaches it there), the two added."""
    if cond.meta["val"].dtype != torch.bool:
        raise low.refuse(node, f"a condition {cond.name!r} of {cond.meta['val'].dtype}")
    mask = as_result(low, node, cond, "cond")
    values = []
    for i, branch in enumerate((a, b)):
        found = number(low, node, branch)
        if found is not None:
            if math.isnan(found):
                raise low.refuse(node, "a branch of NaN")
            values.append(
                low.emit(node, "affine", [mask], {"scale": 0.0, "shift": found}, part=f"c{i}")
            )
        else:
            values.append(as_result(low, node, branch, f"b{i}"))
    select(low, node, mask, *values)


def select(low, node, mask: str, a: str, b: str, part: str = "") -> str:
    """a where the mask (IR values of the result's shape) is 1, else b: each kept or 0."""
    kept = [
        low.emit(
            node, "masked_fill", [v, mask], {"keep": i == 0, "zero": True}, part=f"{part}kept{i}"
        )
        for i, v in enumerate((a, b))
    ]
    return low.emit(node, "add", kept, part=part)


@lowers("aten.maximum.default", "aten.minimum.default")
def _maximum(low, node, args, kw):
    """torch.maximum(a, b) (minimum: a and b exchanged where they differ), as torch: a where
    a - b > 0, b where it is < 0, a / 2 + b / 2 where it is 0 (the value, half the gradient to
    each), and a + b where it is NaN (NaN, the whole gradient to each; but for two equal
    infinities, whose difference is NaN too: their value, the whole gradient to each, where
    torch gives half)."""
    a, b = (as_result(low, node, arg, f"x{i}") for i, arg in enumerate(args[:2]))
    difference = low.emit(node, "sub", [a, b], part="diff")
    masks = [_compare(low, node, difference, op, 0.0, part=op) for op in ("gt", "lt", "eq")]
    half = {"scale": 0.5, "shift": 0.0}
    halves = [low.emit(node, "affine", [v], half, part=f"half{i}") for i, v in enumerate((a, b))]
    tie = low.emit(node, "add", halves, part="tie")
    unordered = low.emit(node, "add", [a, b], part="unordered")
    first, second = (a, b) if node.target._opname == "maximum" else (b, a)
    rest = select(low, node, masks[2], tie, unordered, "equal")
    rest = select(low, node, masks[1], second, rest, "rest")
    select(low, node, masks[0], first, rest)


@lowers("aten.clamp.Tensor")
def _clamp(low, node, args, kw):
    """clamp(x, min, max) with tensor bounds, as torch's min(max(x, min), max): y = min where
    x - min < 0, else x; then max where y - max > 0, else y (max where min > max, as torch;
    the gradient to what is selected, where torch gives none to either bound at min == max;
    NaN stays)."""
    x = as_result(low, node, args[0], "x")
    bounds = [
        (args[1] if len(args) > 1 else kw.get("min"), "lt"),
        (args[2] if len(args) > 2 else kw.get("max"), "gt"),
    ]
    bounds = [(b, op) for b, op in bounds if b is not None]
    out = x
    for i, (bound, op) in enumerate(bounds):
        found = number(low, node, bound)
        if found is not None:  # compared as it is (x - c is NaN at an infinite x)
            mask = _compare(low, node, out, op, found, part=f"mask{i}")
            limit = low.emit(node, "affine", [mask], {"scale": 0.0, "shift": found}, part=f"n{i}")
        else:
            limit = as_result(low, node, bound, f"bound{i}")
            past = low.emit(node, "sub", [out, limit], part=f"past{i}")  # max(x, min), then
            mask = _compare(low, node, past, op, 0.0, part=f"mask{i}")
        out = select(low, node, mask, limit, out, "" if i == len(bounds) - 1 else f"at{i}")
    if not bounds:
        low.emit(node, "identity", [x])


def as_result(low, node, arg, part: str) -> str:
    """``arg`` as an operand of ``node`` of the result's per-sample shape (broadcast)."""
    src, out = low.operand(node, arg), low.shape(node)
    shape = (
        low.shape(node, arg)
        if low.layout(node, arg) is not None or low.layout(node) is None
        else None
    )
    if shape is None:  # aligned by operand(): its shape is the result's rank
        shape = _aligned(low, node, arg)
    if len(shape) < len(out):
        shape = (1,) * (len(out) - len(shape)) + tuple(shape)
        src = low.emit(node, "reshape", [src], {"shape": shape}, part=f"{part}_axes")
    if tuple(shape) != tuple(out):
        src = low.emit(node, "expand", [src], {"shape": out}, part=f"{part}_full")
    return src


def _aligned(low, node, arg) -> tuple[int, ...]:
    """The shape :meth:`Lowering.operand` gives a value the same for every sample."""
    shape = low.shape(node, arg)
    rank = len(node.meta["val"].shape)
    shape = (1,) * (rank - len(shape)) + tuple(shape)
    p, o, k = low.layout(node)
    return shape if o * k > 1 else shape[:p] + shape[p + 1 :]


_ITEMSIZE = {"float32": 4, "float64": 8}


@lowers("aten._to_copy.default", "aten.to.dtype")  # (type_as: decomposed, as it reads a dtype)
def _to(low, node, args, kw):
    converted(low, node, low.value(node, args[0]), args[0].meta["val"].dtype)


def converted(low, node, x: str, source: torch.dtype) -> None:
    """``node``'s value: value ``x`` of ``source`` in ``node``'s dtype: the same values, a mask
    where it becomes bool (x != 0); floats made integers are refused (torch truncates them),
    as are floats rounded to a narrower type than the compiled model's."""
    target = node.meta["val"].dtype
    if target == torch.bool and source != torch.bool:
        _compare(low, node, x, "ne", 0.0)
    elif source.is_floating_point and not target.is_floating_point:
        raise low.refuse(node, f"{source} made {target} (torch truncates)")
    elif source.is_floating_point and target.itemsize < _ITEMSIZE[low.dtype]:
        raise low.refuse(
            node,
            f"{source} rounded to {target}: the compiled model computes in {low.dtype} "
            "throughout (compile it in the type the model rounds to)",
        )
    else:
        low.emit(node, "identity", [x])
