"""Binary ops of two tensors with torch's broadcasting (the batch axis is shared), and the
masks attention takes (a mask value's)."""

from __future__ import annotations

from rootclad.ir.graph import Node, expect
from rootclad.ir.registry import OpSpec, register

# per-sample dimensions a broadcasting binary op may need once runs of axes that broadcast
# alike are merged (the loop nest every backend writes)
MAX_BROADCAST_DIMS = 3


def broadcast_shapes(node: Node, a: tuple, b: tuple) -> tuple:
    """torch's broadcasting of two per-sample shapes (the batch axis is shared)."""
    n = max(len(a), len(b))
    a1, b1 = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for i, (x, y) in enumerate(zip(a1, b1, strict=True)):
        expect(
            x == y or x == 1 or y == 1,
            node,
            f"shapes {tuple(a)} and {tuple(b)} do not broadcast (axis {i - n} is {x} and {y}; "
            "per-sample shapes, the batch axis excluded)",
        )
        out.append(max(x, y))
    return tuple(out)


def broadcast_geometry(out: tuple, a: tuple, b: tuple):
    """Merge axes so that the loop nest is short: (dims, a strides, b strides), each of
    length MAX_BROADCAST_DIMS or fewer before padding; a broadcast axis has stride 0."""
    n = len(out)
    shapes = [(1,) * (n - len(s)) + tuple(s) for s in (a, b)]
    # per axis: (size, a broadcast?, b broadcast?); size-1 output axes drop out
    axes = [(d, shapes[0][i] == 1, shapes[1][i] == 1) for i, d in enumerate(out) if d != 1]
    merged: list[list] = []
    for d, ab, bb in axes:
        if merged and (merged[-1][1], merged[-1][2]) == (ab, bb):
            merged[-1][0] *= d
        else:
            merged.append([d, ab, bb])
    dims = [m[0] for m in merged] or [1]
    strides = []
    for which in (1, 2):
        st, acc = [0] * len(dims), 1
        for i in range(len(merged) - 1, -1, -1):
            broadcast = merged[i][which]
            st[i] = 0 if broadcast else acc
            acc *= 1 if broadcast else merged[i][0]
        strides.append(st)
    return dims, strides[0], strides[1]


def _binary_infer(node, shapes, graph):
    out = broadcast_shapes(node, *shapes)
    dims, _, _ = broadcast_geometry(out, *shapes)
    expect(
        len(dims) <= MAX_BROADCAST_DIMS,
        node,
        f"broadcasting {tuple(shapes[0])} with {tuple(shapes[1])} needs {len(dims)} loop axes; "
        f"at most {MAX_BROADCAST_DIMS} are supported",
    )
    return out


def _mask_infer(node, shapes, graph):
    expect(
        isinstance(node.attrs.get("keep"), bool),
        node,
        "masked_fill needs attr 'keep': True fills where the mask is 0, False where it is not",
    )
    expect(
        isinstance(node.attrs.get("zero", False), bool),
        node,
        "masked_fill's attr 'zero' is a bool (True: fill with 0, not -inf)",
    )
    out = _binary_infer(node, shapes, graph)
    expect(
        out == tuple(shapes[0]),
        node,
        f"the mask of per-sample shape {tuple(shapes[1])} would broadcast the values "
        f"{tuple(shapes[0])} to {out}; a mask broadcasts against the values, not they against it",
    )
    return out


register(
    OpSpec(
        "masked_fill",
        "binary",
        "a with -inf where the mask b is nonzero (keep=False: masked_fill(b, -inf), a key "
        "padding mask) or zero (keep=True: a boolean attn_mask); zero=True: 0 there "
        "(torch.where(b, a, c) is the sum of two); no gradient reaches b",
        _mask_infer,
        arity=2,
    )
)


for _name, _sym in (("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/")):
    register(
        OpSpec(
            _name,
            "binary",
            f"a {_sym} b of two tensors, with broadcasting (residual additions)",
            _binary_infer,
            arity=2,
            saves=("in",) if _name in ("mul", "div") else (),
        )
    )
