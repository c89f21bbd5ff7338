"""ATen ops of layout and reduction: views (a sample's rows where torch merged the batch axis
with another), expand, permute (kept aside, and lowered by the pieces taken, where it moves the
batch axis), cat, slice, select, split, unbind, constant padding, mean/sum/amax/amin over
per-sample axes, and bmm between values."""

from __future__ import annotations

import math

from rootclad.frontends.aten.table import lowers


@lowers(
    "aten.view.default",
    "aten.reshape.default",
    "aten._unsafe_view.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.flatten.using_ints",
)
def _view(low, node, args, kw):
    """A new shape of the same values: per sample, the shape torch gives (its batch axis
    checked to stay first and whole)."""
    x = args[0]
    if x.name in low.moved:  # the squeeze of dim 0 of one row of a permuted value
        _, _, first, last = low.moved[x.name]
        if last - first != 1:
            raise low.refuse(node, "a view of rows of a value whose batch axis was moved")
        _select_moved(low, x.name, node, 0, "")
        return
    if math.prod(low.shape(node, x)) != math.prod(low.shape(node)):
        raise low.refuse(node, "a view that moves values between samples")
    low.emit(node, "reshape", [low.value(node, x)], {"shape": low.shape(node)})


@lowers("aten.expand.default")
def _expand(low, node, args, kw):
    """Axes of size 1 repeated (the batch axis stays as it is)."""
    x, out = args[0], low.shape(node)
    if low.is_held(x):  # a parameter to the batch: p.expand(B, -1, ...)
        low.emit(node, "expand", [low.held(node, x, len(out))], {"shape": out})
        return
    if len(low.shape(node, x)) != len(out):
        raise low.refuse(node, "an expand that adds axes (unsqueeze first)")
    low.emit(node, "expand", [low.value(node, x)], {"shape": out})


@lowers("aten.permute.default")
def _permute(low, node, args, kw):
    perm = [p + len(args[1]) if p < 0 else p for p in args[1]]
    if perm[0] != 0 and perm[1] == 0 and _pieces_taken(node) and not low.merged(node, args[0]):
        size = args[0].meta["val"].shape[perm[0]]  # qkv.permute(2, 0, ...).unbind(0)
        low.moved[node.name] = (args[0], perm, 0, int(size))  # lowered by each piece taken
        return
    if perm[0] != 0:
        raise low.refuse(node, f"permutation {tuple(perm)} moves the batch axis")
    kept = (0,) if low.merged(node, args[0]) else ()  # a sample's rows stay first
    sample = kept + tuple(p - (not kept) for p in perm[1:])
    low.emit(node, "permute", [low.value(node, args[0])], {"perm": sample})


@lowers("aten.cat.default")
def _cat(low, node, args, kw):
    parts = args[0]
    dim = args[1] if len(args) > 1 else kw.get("dim", 0)
    axis = low.axis(node, parts[0], dim)
    low.emit(node, "cat", [low.value(node, p) for p in parts], {"axis": axis})


@lowers("aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default")
def _reduce(low, node, args, kw):
    """A mean, sum, amax or amin over per-sample axes: the axes moved last, the rest and them
    made two axes, each row averaged (global_avgpool, scaled for a sum) or its maximum taken
    (amax, whose gradient ties share as torch's; amin is -amax(-x)), in torch's shape."""
    x, aten = args[0], node.target._opname
    dims = args[1] if len(args) > 1 else kw.get("dim")
    if kw.get("dtype") is not None or dims in (None, [], ()):
        raise low.refuse(node, "a reduction over every axis or into another dtype")
    shape = low.shape(node, x)
    axes = sorted({low.axis(node, x, d) for d in ([dims] if isinstance(dims, int) else dims)})
    rest = [a for a in range(len(shape)) if a not in axes]
    inner, outer = math.prod(shape[a] for a in axes), math.prod(shape[a] for a in rest)
    src = low.value(node, x)
    negate = {"scale": -1.0, "shift": 0.0}
    if aten == "amin":
        src = low.emit(node, "affine", [src], negate, part="negated")
    if rest + axes != list(range(len(shape))):
        src = low.emit(node, "permute", [src], {"perm": tuple(rest + axes)}, part="permuted")
    src = low.emit(node, "reshape", [src], {"shape": (outer, inner)}, part="rows")
    pool = "global_avgpool" if aten in ("mean", "sum") else "amax"
    src = low.emit(node, pool, [src], part="pooled")
    if aten in ("sum", "amin"):
        scale = {"scale": float(inner), "shift": 0.0} if aten == "sum" else negate
        src = low.emit(node, "affine", [src], scale, part="scaled")
    low.emit(node, "reshape", [src], {"shape": low.shape(node)})


@lowers("aten.slice.Tensor")
def _slice(low, node, args, kw):
    x, dim = args[0], args[1] if len(args) > 1 else 0
    if x.name in low.moved and dim == 0:  # rows of a permuted value's first axis: moved too
        source, perm, first, last = low.moved[x.name]
        a, b, _ = slice(*(list(args[2:4]) + [None] * 2)[:2]).indices(last - first)
        low.moved[node.name] = (source, perm, first + a, first + b)
        return
    size = low.shape(node, x)
    if dim in (0, -len(size) - 1):  # x[:, ...]: the whole batch axis, as a view
        whole = (list(args[2:]) + [0, None, 1][len(args) - 2 :])[:3]
        if whole[0] in (0, None) and whole[2] == 1 and (whole[1] is None or whole[1] >= 2**62):
            low.emit(node, "identity", [low.value(node, x)])
            return
    axis = low.axis(node, x, dim)
    start, stop, step = (list(args[2:]) + [None, None, 1][len(args) - 2 :])[:3]
    start, stop, step = slice(start, stop, step).indices(size[axis])
    if (start, stop, step) == (0, size[axis], 1):
        low.emit(node, "identity", [low.value(node, x)])
        return
    low.emit(
        node,
        "slice",
        [low.value(node, x)],
        {"axis": axis, "start": start, "stop": stop, "step": step},
    )


@lowers("aten.constant_pad_nd.default")
def _pad(low, node, args, kw):
    """F.pad with a constant: one pad op per padded axis, the last axis first (torch's order
    of the counts); negative counts (cropping) are refused."""
    x, counts = args[0], list(args[1])
    value = low.number(node, args[2] if len(args) > 2 else kw.get("value", 0.0), "value")
    rank = len(low.shape(node, x))
    torch_rank = len(x.meta["val"].shape)
    if len(counts) % 2 or len(counts) // 2 >= torch_rank or min(counts, default=0) < 0:
        raise low.refuse(node, f"padding {counts}: pairs of counts >= 0 for per-sample axes")
    src = low.value(node, x)
    pairs = [(rank - 1 - i, counts[2 * i], counts[2 * i + 1]) for i in range(len(counts) // 2)]
    pairs = [p for p in pairs if p[1] or p[2]]
    for i, (axis, before, after) in enumerate(pairs):
        attrs = {"axis": axis, "before": before, "after": after, "value": value}
        src = low.emit(node, "pad", [src], attrs, part="" if i == len(pairs) - 1 else f"pad{i}")
    if not pairs:
        low.emit(node, "identity", [src])


@lowers("aten.bmm.default")
def _bmm(low, node, args, kw):
    """A product of two values, per sample (their merged rows the product's batch)."""
    a, b = (low.value(node, v) for v in args[:2])
    if low.rows(node, args[0]) != low.rows(node, args[1]):
        raise low.refuse(node, "operands of different rows per sample")
    low.emit(node, "matmul", [a, b])


def _pieces_taken(node) -> bool:
    """Every user of ``node`` takes pieces of its first axis: select or unbind of dim 0, a
    slice of dim 0 (step 1) whose users do too, or the squeeze of dim 0 of a piece of one."""

    def dim(u, at=1):
        return u.args[at] if len(u.args) > at else u.kwargs.get("dim", 0)

    def takes(u):
        op = getattr(u.target, "_opname", "")
        if op in ("select", "unbind"):
            return dim(u) == 0
        if op == "slice":
            step = u.args[4] if len(u.args) > 4 else 1
            return dim(u) == 0 and step == 1 and _pieces_taken(u)
        if op == "squeeze":
            return list(dim(u)) == [0] if isinstance(dim(u), (list, tuple)) else dim(u) == 0
        return False

    return bool(node.users) and all(takes(u) for u in node.users)


def _piece(low, node, x, axis: int, start: int, stop: int, drop: bool, part: str) -> str:
    """Rows start:stop of per-sample ``axis`` of value ``x`` (the axis dropped: a select)."""
    shape = low.shape(node, x)
    src = low.value(node, x)
    if (start, stop) != (0, shape[axis]):
        attrs = {"axis": axis, "start": start, "stop": stop, "step": 1}
        src = low.emit(node, "slice", [src], attrs, part=f"{part}slice")
    out = shape[:axis] + ((stop - start,) if not drop else ()) + shape[axis + 1 :]
    return low.emit(node, "reshape", [src], {"shape": out}, part=part)


def _select_moved(low, source, node, index: int, part: str) -> str:
    """Piece ``index`` of a permuted value (``source``, in ``low.moved``) whose first axis
    (perm[0] of the value before) is not the batch's: that axis's row of the value before the
    permutation, its other axes then permuted."""
    x, perm, start, stop = low.moved[source]
    index = index + (stop - start) if index < 0 else index
    axis = low.axis(node, x, perm[0])
    piece = _piece(low, node, x, axis, start + index, start + index + 1, True, f"{part}row")
    rest = [p - (p > perm[0]) for p in perm[1:]]  # torch's axes of the piece, batch first
    sample = tuple(p - 1 for p in rest[1:])
    if sample == tuple(range(len(sample))):
        return low.emit(node, "identity", [piece], part=part)
    return low.emit(node, "permute", [piece], {"perm": sample}, part=part)


@lowers("aten.select.int")
def _select(low, node, args, kw):
    x, dim, index = args[0], args[1], args[2]
    if x.name in low.moved and dim == 0:
        _select_moved(low, x.name, node, index, "")
        return
    axis = low.axis(node, x, dim)
    size = low.shape(node, x)[axis]
    index = index + size if index < 0 else index
    _piece(low, node, x, axis, index, index + 1, True, "")


@lowers("aten.unbind.int")
def _unbind(low, node, args, kw):
    x, dim = args[0], args[1] if len(args) > 1 else kw.get("dim", 0)
    if x.name in low.moved and dim == 0:
        count = len(node.meta["val"])
        low.tuples[node.name] = [
            _select_moved(low, x.name, node, i, f"piece{i}") for i in range(count)
        ]
        return
    axis = low.axis(node, x, dim)
    pieces = range(low.shape(node, x)[axis])
    low.tuples[node.name] = [
        _piece(low, node, x, axis, i, i + 1, True, f"piece{i}") for i in pieces
    ]


@lowers("aten.split_with_sizes.default", "aten.split.Tensor")
def _split(low, node, args, kw):
    x, sizes = args[0], args[1]
    dim = args[2] if len(args) > 2 else kw.get("dim", 0)
    axis = low.axis(node, x, dim)
    total = low.shape(node, x)[axis]
    if isinstance(sizes, int):  # split(size): pieces of that size, the last one shorter
        sizes = [min(sizes, total - s) for s in range(0, total, sizes)]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    low.tuples[node.name] = [
        _piece(low, node, x, axis, a, a + n, False, f"piece{i}")
        for i, (a, n) in enumerate(zip(starts, sizes, strict=True))
    ]
