"""Pointwise ATen ops: unary math (one IR op each, its attributes read as torch's functional
form reads them), and arithmetic between two values of the batch or a value and a number."""

from __future__ import annotations

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
}


def _unary(low, node, args, kw):
    op = _UNARY[node.target._opname]
    attrs = OPS[op].from_call(args[1:], dict(kw), low.where(node)) if OPS[op].from_call else {}
    low.emit(node, op, [low.value(node, args[0])], attrs)


for _aten in _UNARY:  # kept: torch would decompose silu, mish, softplus, hardswish, ...
    lowers(f"aten.{_aten}.default", kept=True)(_unary)


@lowers("aten.elu.default")
def _elu(low, node, args, kw):
    alpha, scale, input_scale = (list(args[1:]) + [1.0, 1.0, 1.0][len(args) - 1 :])[:3]
    if scale != 1 or input_scale != 1:
        raise low.refuse(node, "elu with scale or input_scale other than 1 (selu's form)")
    low.emit(node, "elu", [low.value(node, args[0])], {"alpha": low.number(node, alpha, "alpha")})


@lowers("aten.neg.default")
def _neg(low, node, args, kw):
    low.emit(node, "affine", [low.value(node, args[0])], {"scale": -1.0, "shift": 0.0})


@lowers("aten.clone.default", "aten.alias.default")
def _copy(low, node, args, kw):  # a copy or a view: the same values
    low.emit(node, "identity", [low.value(node, args[0])])


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
    if kw.get("alpha", args[2] if len(args) > 2 else 1) != 1:
        raise low.refuse(node, "alpha other than 1")
    if op == "rsub":  # b - a
        a, b, op = b, a, "sub"
    if low.is_value(a) and low.is_held(b) or low.is_held(a) and low.is_value(b):
        rank = len(low.shape(node))
        a, b = (low.held(node, v, rank) if low.is_held(v) else low.value(node, v) for v in (a, b))
        low.emit(node, op, [a, b])
        return
    if low.is_value(a) and low.is_value(b):
        ra, rb = len(low.shape(node, a)), len(low.shape(node, b))
        if ra != rb:
            raise low.refuse(
                node,
                f"operands of per-sample ranks {ra} and {rb}; rootclad keeps "
                "the batch axis apart, so both need as many axes",
            )
        low.emit(node, op, [low.value(node, a), low.value(node, b)])
        return
    x_first = low.is_value(a)
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
    low.emit(node, "affine", [x], {"scale": scale, "shift": shift})
