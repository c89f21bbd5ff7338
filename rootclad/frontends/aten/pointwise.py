"""Pointwise ATen ops: unary math (one IR op each, its attributes read as torch's functional
form reads them), and arithmetic between two values of the batch or a value and a number."""

from __future__ import annotations

import math

import torch

from rootclad.frontends.aten.table import lowers
from rootclad.ir.ops import OPS

# ATen op -> the IR op of the same function
_UNARY = {
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "silu": "silu",
    "abs": "abs",
    "exp": "exp",
    "log": "log",
    "log1p": "log1p",
    "erf": "erf",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "reciprocal": "reciprocal",
    "sign": "sign",
    "gelu": "gelu",
    "leaky_relu": "leaky_relu",
    "softplus": "softplus",
    "hardtanh": "hardtanh",
    "hardsigmoid": "hardsigmoid",
    "hardswish": "hardswish",
    "mish": "mish",
    "clamp": "clamp",
    "selu": "selu",
    **{f: f for f in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh")},
    **{f: f for f in ("acosh", "atanh")},
}


def _unary(low, node, args, kw):
    op = _UNARY[node.target._opname]
    attrs = OPS[op].from_call(args[1:], dict(kw), low.where(node)) if OPS[op].from_call else {}
    if op == "hardtanh" and (attrs.get("min_val"), attrs.get("max_val")) == (0.0, 6.0):
        op, attrs = "relu6", {}  # ReLU6 (a Hardtanh in torch), one comparison fewer
    low.emit(node, op, [low.value(node, args[0])], attrs)


@lowers("aten.prelu.default", "aten._prelu_kernel.default", kept=True)
def _prelu(low, node, args, kw):
    """PReLU's x > 0 ? x : a x, a slope per channel (or one) that is a parameter."""
    name = low.tensor_name(args[1])
    if name is None or low.buffer_name(args[1]):
        raise low.refuse(node, "a PReLU slope that is not a parameter (computed in forward)")
    if low.layout(node, args[0]) != (0, 1, 1) and args[1].meta["val"].numel() != 1:
        raise low.refuse(node, "PReLU slopes per channel of a value whose batch axis is not first")
    low.emit(node, "prelu", [low.value(node, args[0])], params={"weight": name})


for _aten in _UNARY:  # kept: torch would decompose silu, mish, softplus, hardswish, ...
    lowers(f"aten.{_aten}.default", kept=True)(_unary)


@lowers("aten.elu.default")
def _elu(low, node, args, kw):
    """ELU, and SELU's scaled form: scale * elu(x, alpha)."""
    alpha, scale, input_scale = (list(args[1:]) + [1.0, 1.0, 1.0][len(args) - 1 :])[:3]
    if input_scale != 1:
        raise low.refuse(node, "elu with input_scale other than 1")
    alpha = {"alpha": low.number(node, alpha, "alpha")}
    if scale == 1:
        low.emit(node, "elu", [low.value(node, args[0])], alpha)
        return
    src = low.emit(node, "elu", [low.value(node, args[0])], alpha, part="elu")
    low.emit(node, "affine", [src], {"scale": low.number(node, scale, "scale"), "shift": 0.0})


@lowers("aten.neg.default")
def _neg(low, node, args, kw):
    low.emit(node, "affine", [low.value(node, args[0])], {"scale": -1.0, "shift": 0.0})


@lowers("aten.clone.default", "aten.alias.default")
def _copy(low, node, args, kw):  # a copy or a view: the same values
    low.emit(node, "identity", [low.value(node, args[0])])


@lowers("aten.detach.default", kept=True)
def _detach(low, node, args, kw):
    """x.detach() of what no gradient reaches (a buffer, a constant): the same values; of what
    is computed from the inputs or parameters, refused: the compiled model's backward has no
    place where a gradient stops."""
    todo, seen = [args[0]], set()
    while todo:  # does a parameter or an input reach it?
        at = todo.pop()
        if at.name in seen:
            continue
        seen.add(at.name)
        if low.param_name(at) or at.name in low.user_inputs:
            break
        todo.extend(at.all_input_nodes)
    else:
        low.emit(node, "identity", [low.value(node, args[0])])
        return
    what = low.tensor_name(args[0]) or args[0].name
    raise low.refuse(
        node,
        f"{what!r}.detach() stops the gradient, which the compiled backward cannot do "
        "(compute it without detach, or pass it as an input)",
    )


@lowers(
    "aten.add.Tensor",
    "aten.sub.Tensor",
    "aten.mul.Tensor",
    "aten.div.Tensor",
    "aten.add.Scalar",
    "aten.sub.Scalar",
    "aten.mul.Scalar",
    "aten.div.Scalar",
    "aten.rsub.Scalar",
)
def _arithmetic(low, node, args, kw):
    op = node.target._opname
    a, b = args[0], args[1] if len(args) > 1 else kw.get("other")
    alpha = low.number(node, kw.get("alpha", args[2] if len(args) > 2 else 1), "alpha")
    if op == "rsub":  # b - alpha a
        a, b, op = b, a, "sub"
    for arg in (a, b):
        if isinstance(arg, torch.fx.Node) and not isinstance(arg.meta.get("val"), torch.Tensor):
            raise low.refuse(
                node,
                f"{arg.name!r}, a size (x.size(0), the batch size) as a number: the compiled "
                "model's batch size is free at every call",
            )
    if node.meta["val"].dtype == torch.bool and op in ("add", "mul"):  # masks: or, and
        from rootclad.frontends.aten.logic import logical

        logical(low, node, (a, b), "or" if op == "add" else "and")
        return
    if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node):
        if not low.is_held(a) and not low.is_held(b):
            aligned(low, node, a, b)
        second = _whole(low, node, b, "second")
        if alpha != 1:  # torch.add(a, b, alpha=2): a + 2 b
            attrs = {"scale": alpha, "shift": 0.0}
            second = low.emit(node, "affine", [second], attrs, part="scaled")
        low.emit(node, op, [_whole(low, node, a, "first"), second])
        return
    if alpha != 1 and not isinstance(b, torch.fx.Node):  # x + alpha c
        b = low.number(node, b, "operand") * alpha
    x_first = isinstance(a, torch.fx.Node)
    x, c = (a, b) if x_first else (b, a)
    c = low.number(node, c, "operand")
    x = low.value(node, x)
    if op == "add":
        scale, shift = 1.0, c
    elif op == "sub":
        scale, shift = (1.0, -c) if x_first else (-1.0, c)
    elif op == "mul":
        scale, shift = c, 0.0
    elif x_first:
        if c == 0:
            raise low.refuse(node, "division by the constant 0")
        scale, shift = 1.0 / c, 0.0
    else:  # c / x
        x, scale, shift = low.emit(node, "reciprocal", [x], part="reciprocal"), c, 0.0
    if not x_first:  # c + alpha x, c - alpha x
        scale *= alpha
    low.emit(node, "affine", [x], {"scale": scale, "shift": shift})


def _whole(low, node, x, part: str) -> str:
    """``x`` as an operand of ``node``'s op; a value of the batch with as many values per
    sample as the result, but fewer axes (a squeezed step of a recurrent layer's input), is
    a view in the result's shape: the op then broadcasts nothing."""
    src = low.operand(node, x)
    if low.is_value(x) and low.layout(node, x) is not None:
        shape, out = low.shape(node, x), low.shape(node)
        if shape != out and math.prod(shape) == math.prod(out):
            return low.emit(node, "reshape", [src], {"shape": out}, part=part)
    return src


def aligned(low, node, a, b) -> None:
    """Refuse two values of the batch whose batch axes torch's broadcasting does not align
    (counted from the last axis), or whose samples' rows are arranged differently."""
    (pa, oa, ka), (pb, ob, kb) = low.layout(node, a), low.layout(node, b)
    ra, rb = len(a.meta["val"].shape), len(b.meta["val"].shape)
    if ra - pa != rb - pb or (oa, ka) != (ob, kb):
        raise low.refuse(
            node,
            f"operands {a.name!r} and {b.name!r} whose batch axes torch's broadcasting does "
            "not align",
        )


@lowers("aten.pow.Tensor_Scalar")
def _pow(low, node, args, kw):
    """x ** c: products for an integer c up to 4 in size, square roots for 0.5 and -0.5, else
    the IR's power."""
    x, c = low.value(node, args[0]), low.number(node, args[1], "exponent")
    if c == 0.5:
        low.emit(node, "sqrt", [x])
        return
    if c == -0.5:
        low.emit(node, "rsqrt", [x])
        return
    if not math.isfinite(c) or c != int(c) or not 1 <= abs(c) <= 4:
        low.emit(node, "power", [x], {"exponent": float(c)})
        return
    power = x
    for i in range(int(abs(c)) - 1):
        last = c > 0 and i == int(abs(c)) - 2
        power = low.emit(node, "mul", [power, x], part="" if last else f"power{i + 2}")
    if c < 0:
        low.emit(node, "reciprocal", [power])
    elif c == 1:
        low.emit(node, "identity", [x])


@lowers("aten.linalg_vector_norm.default")
def _norm(low, node, args, kw):
    """The 2-norm over axes: the square root of the sum of squares (weight norm's)."""
    from rootclad.frontends.aten.layout import reduce_over

    x = args[0]
    order = args[1] if len(args) > 1 else kw.get("ord", 2)
    dims = args[2] if len(args) > 2 else kw.get("dim")
    if order != 2 or kw.get("dtype") is not None:
        raise low.refuse(node, f"ord={order} (the 2-norm is supported)")
    squares = low.emit(node, "mul", [low.value(node, x), low.value(node, x)], part="squares")
    dims = [dims] if isinstance(dims, int) else dims
    low.emit(node, "sqrt", [reduce_over(low, node, x, dims, "sum", squares, "sum")])
