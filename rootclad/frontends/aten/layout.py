"""ATen ops of layout and reduction: views and permutations (per sample, wherever torch moves
the batch axis or merges it with another: Lowering.layout), expand, cat, slice, select, split,
unbind, constant padding, mean/sum/amax/amin over per-sample axes, and products (bmm, matmul)
between values."""

from __future__ import annotations

import math

import torch

from rootclad.frontends.aten.table import batch_rows, lowers
from rootclad.ir.ops.shape import MAX_PERMUTE_AXES, merged_permutation


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
    """A new shape of the same values. Torch's batch axis holds, in order, O blocks (the
    product of the axes before it and its rows outside the batch) of B samples' rows: a view
    keeping O keeps each sample's values together and in order, a reshape per sample; any
    other moves values between samples."""
    x = args[0]
    if low.layout(node, x) is None:  # the same for every sample
        _reshape(low, node, x)
        return
    p, o, _ = low.layout(node, x)
    if node.target._opname == "squeeze":  # x.squeeze(): the batch axis too, at a batch of 1
        rank = len(x.meta["val"].shape)
        dims = node.args[1] if len(node.args) > 1 else range(rank)
        if p in {d % rank for d in ([dims] if isinstance(dims, int) else dims)}:
            raise low.refuse(node, "a squeeze of the batch axis too (x.squeeze(): name the dims)")
    blocks = math.prod(int(d) for d in x.meta["val"].shape[:p]) * o
    dims = tuple(node.meta["val"].shape)
    found = [(i, k) for i, d in enumerate(dims) if (k := batch_rows(d, low.batch))]
    before = math.prod(int(d) for d in dims[: found[0][0]]) if len(found) == 1 else 0
    if not before or blocks % before or found[0][1] % (blocks // before):
        raise low.refuse(node, "a view that moves values between samples")
    q, rows = found[0]
    low.layouts[node.name] = (q, blocks // before, rows // (blocks // before))
    _reshape(low, node, x)


def _reshape(low, node, x) -> None:
    """``x``'s values in ``node``'s per-sample shape (the same value where it is x's)."""
    same = low.shape(node) == low.shape(node, x)
    op, attrs = ("identity", {}) if same else ("reshape", {"shape": low.shape(node)})
    low.emit(node, op, [low.value(node, x)], attrs)


@lowers("aten.expand.default")
def _expand(low, node, args, kw):
    """Axes of size 1 repeated (the batch axis stays as it is)."""
    x, out = args[0], low.shape(node)
    if low.is_held(x):  # a parameter to the batch (p.expand(B, -1, ...)), or a mask to heads
        src, shape = low.operand(node, x), low.shape(node, x)
        if low.layout(node) is None and len(shape) < len(out):
            shape = (1,) * (len(out) - len(shape)) + shape
            src = low.emit(node, "reshape", [src], {"shape": shape}, part="axes")
        low.emit(node, "expand", [src], {"shape": out})
        return
    if len(low.shape(node, x)) != len(out):
        raise low.refuse(node, "an expand that adds axes (unsqueeze first)")
    if low.shape(node, x) == out:  # torch's expand before a product: nothing to repeat
        low.emit(node, "identity", [low.value(node, x)])
        return
    low.emit(node, "expand", [low.value(node, x)], {"shape": out})


@lowers("aten.permute.default")
def _permute(low, node, args, kw):
    """Torch's permutation of the axes, per sample: the batch axis goes where torch puts it
    (kept as the sample's axis of rows where it holds several, else dropped)."""
    rank = len(args[1])
    perm = [d + rank if d < 0 else d for d in args[1]]
    at = low.layout(node, args[0])
    p, o, k = at or (None, 1, 2)  # the same for every sample: torch's permutation
    low.layouts[node.name] = at and (perm.index(p), o, k)
    if o * k > 1:
        sample = tuple(perm)
    else:
        sample = tuple(d - (d > p) for d in perm if d != p)
    if sample == tuple(range(len(sample))):
        low.emit(node, "identity", [low.value(node, args[0])])
        return
    src, shape = low.value(node, args[0]), low.shape(node, args[0])
    if len(merged_permutation(shape, sample)[0]) <= MAX_PERMUTE_AXES:
        low.emit(node, "permute", [src], {"perm": sample})
        return
    steps = _single_moves(sample)  # more axes than the kernels take: one moved at a time
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        src = low.emit(node, "permute", [src], {"perm": step}, part="" if last else f"move{i}")


@lowers("aten.transpose.int")
def _transpose(low, node, args, kw):
    rank = len(node.meta["val"].shape)
    perm = list(range(rank))
    a, b = (d % rank for d in args[1:3])
    perm[a], perm[b] = b, a
    _permute(low, node, (args[0], perm), kw)


def _single_moves(perm) -> list[tuple[int, ...]]:
    """Permutations whose chain is ``perm``, each moving one axis to its place (at most four
    runs of axes that stay neighbours: before, the axis, those it passes, after)."""
    current, steps = list(range(len(perm))), []
    for place, axis in enumerate(perm):
        at = current.index(axis)
        if at != place:
            step = list(range(len(perm)))
            step.insert(place, step.pop(at))
            steps.append(tuple(step))
            current = [current[s] for s in step]
    return steps


@lowers("aten.cat.default")
def _cat(low, node, args, kw):
    parts = args[0]
    dim = args[1] if len(args) > 1 else kw.get("dim", 0)
    if len(parts) == 1:  # one piece, along any axis (a recurrent layer's last state): itself
        low.emit(node, "identity", [low.value(node, parts[0])])
        return
    layouts = [low.layout(node, q) for q in parts]
    rank = len(parts[0].meta["val"].shape)
    if layouts[0] and dim % rank == layouts[0][0]:
        _cat_batches(low, node, parts, layouts)
        return
    axis = low.axis(node, parts[0], dim)
    low.emit(node, "cat", [low.value(node, p) for p in parts], {"axis": axis})


def _cat_batches(low, node, parts, layouts) -> None:
    """torch.cat along the batch axis (a recurrent layer's states of several layers): block i
    of the result is part i, so each sample's rows are its rows of every part in turn (the
    result's layout holds the parts' blocks)."""
    p, _, k = layouts[0]
    if any(at is None or at[0] != p or at[2] != k for at in layouts):
        raise low.refuse(node, "a cat along the batch axis of parts arranged differently")
    low.layouts[node.name] = (p, sum(at[1] for at in layouts), k)
    values = []
    for i, (q, (_, o, _)) in enumerate(zip(parts, layouts, strict=True)):
        src, shape = low.value(node, q), low.shape(node, q)
        if o * k == 1:  # its rows: an axis of one
            shape = shape[:p] + (1,) + shape[p:]
            src = low.emit(node, "reshape", [src], {"shape": shape}, part=f"rows{i}")
        values.append(src)
    low.emit(node, "cat", values, {"axis": p})


@lowers("aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default")
def _reduce(low, node, args, kw):
    """A mean, sum, amax or amin over per-sample axes: the axes moved last, the rest and them
    made two axes, each row averaged (global_avgpool, scaled for a sum) or its maximum taken
    (amax, whose gradient ties share as torch's; amin is -amax(-x)), in torch's shape."""
    dims = args[1] if len(args) > 1 else kw.get("dim")
    if kw.get("dtype") is not None:
        raise low.refuse(node, "a reduction into another dtype")
    reduce_over(low, node, args[0], dims, node.target._opname)


def reduce_over(low, node, x, dims, aten: str, src=None, part: str = "") -> str:
    """``node``'s value (or its step ``part``): ``aten`` (mean, sum, amax or amin) of ``x``
    (or of value ``src`` of its shape) over torch's ``dims``."""
    shape = low.shape(node, x)
    if dims in (None, [], ()):
        if low.layout(node, x) is not None:
            raise low.refuse(node, "a reduction over every axis, the batch's too")
        dims = list(range(len(shape)))  # a value the same for every sample: all of it
    axes = sorted({low.axis(node, x, d) for d in ([dims] if isinstance(dims, int) else dims)})
    rest = [a for a in range(len(shape)) if a not in axes]
    inner, outer = math.prod(shape[a] for a in axes), math.prod(shape[a] for a in rest)
    src = low.value(node, x) if src is None else src
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
    return low.emit(node, "reshape", [src], {"shape": low.shape(node)}, part=part)


@lowers("aten.slice.Tensor")
def _slice(low, node, args, kw):
    x, dim = args[0], args[1] if len(args) > 1 else 0
    size = low.shape(node, x)
    rank = len(x.meta["val"].shape)
    if (
        low.layout(node, x) and dim % rank == low.layout(node, x)[0]
    ):  # x[:, ...]: the whole batch axis, as a view
        whole = (list(args[2:]) + [0, None, 1][len(args) - 2 :])[:3]
        end = whole[1].meta.get("val") if isinstance(whole[1], torch.fx.Node) else whole[1]
        if isinstance(end, torch.SymInt):  # x[:x.shape[0]]: whole where it is the rows' count
            end = None if batch_rows(end, low.batch) == low.rows(node, x) else 0
        if whole[0] in (0, None) and whole[2] == 1 and (end is None or end >= 2**62):
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


def _constant_mode(node) -> bool:
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    return mode == "constant"


@lowers("aten.pad.default", as_is=_constant_mode)
def _pad_of_mode(low, node, args, kw):
    """F.pad as torch.export keeps it (its other modes decompose: reflect, replicate)."""
    value = args[3] if len(args) > 3 else kw.get("value")
    _pad(low, node, (args[0], args[1], 0.0 if value is None else value), {})


@lowers("aten.constant_pad_nd.default")
def _pad(low, node, args, kw):
    """F.pad with a constant: one pad op per padded axis, the last axis first (torch's order
    of the counts); negative counts (cropping) are refused."""
    x, counts = args[0], list(args[1])
    value = low.number(node, args[2] if len(args) > 2 else kw.get("value", 0.0), "value")
    rank = len(x.meta["val"].shape)
    if len(counts) % 2 or len(counts) // 2 >= rank:
        raise low.refuse(node, f"padding {counts}: pairs of counts for per-sample axes")
    src = low.value(node, x)
    pairs = [
        (low.axis(node, x, rank - 1 - i), counts[2 * i], counts[2 * i + 1])
        for i in range(len(counts) // 2)
    ]
    shape = list(low.shape(node, x))
    for axis, before, after in pairs:  # negative counts crop first
        if before < 0 or after < 0:
            start, stop = max(-before, 0), shape[axis] - max(-after, 0)
            if stop <= start:
                raise low.refuse(node, f"padding {counts} crops every value of an axis")
            attrs = {"axis": axis, "start": start, "stop": stop, "step": 1}
            src = low.emit(node, "slice", [src], attrs, part=f"crop{axis}")
            shape[axis] = stop - start
    pairs = [(a, max(b, 0), max(c, 0)) for a, b, c in pairs]
    pairs = [p for p in pairs if p[1] or p[2]]
    for i, (axis, before, after) in enumerate(pairs):
        attrs = {"axis": axis, "before": before, "after": after, "value": value}
        src = low.emit(node, "pad", [src], attrs, part="" if i == len(pairs) - 1 else f"pad{i}")
    if not pairs:
        low.emit(node, "identity", [src])


@lowers("aten.mm.default")
def _mm(low, node, args, kw):
    """A value's rows times a matrix the same for every sample (x @ W)."""
    a, b = args[:2]
    if low.layout(node, b) is not None or low.layout(node, a) is None:
        raise low.refuse(node, "a product whose right operand differs from sample to sample")
    shape = low.shape(node, a)
    src = low.value(node, a)
    if len(shape) == 1:  # a vector per sample: a one-row matrix
        src = low.emit(node, "reshape", [src], {"shape": (1, *shape)}, part="row")
    src = low.emit(node, "matmul", [src, low.value(node, b)], part="product")
    low.emit(node, "reshape", [src], {"shape": low.shape(node)})


# the longest axis a running sum, a product or a running product is written out along (one
# sum or product per element)
MAX_RUNNING_AXIS = 256


@lowers("aten.cumsum.default", "aten.prod.dim_int", "aten.cumprod.default")
def _running(low, node, args, kw):
    """torch.cumsum, torch.prod and torch.cumprod along a per-sample axis: its elements added
    or multiplied in order, each a slice (the running results joined again for cumsum and
    cumprod), as torch's loops: the same values (a NaN or an infinity reaches only what
    follows it) and gradients (zeros among a product's values too)."""
    x, dim = args[0], args[1]
    op = node.target._opname
    if kw.get("dtype") not in (None, x.meta["val"].dtype):
        raise low.refuse(node, f"torch.{op} in another dtype")
    axis, n = low.axis(node, x, dim), low.shape(node, x)[low.axis(node, x, dim)]
    if n > MAX_RUNNING_AXIS:
        raise low.refuse(node, f"torch.{op} along an axis of {n} (at most {MAX_RUNNING_AXIS})")
    src, step = low.value(node, x), {"axis": axis, "step": 1}
    out = low.emit(node, "slice", [src], {**step, "start": 0, "stop": 1}, part="e0")
    products = [out]
    for i in range(1, n):
        element = low.emit(node, "slice", [src], {**step, "start": i, "stop": i + 1}, part=f"e{i}")
        out = low.emit(node, "add" if op == "cumsum" else "mul", [out, element], part=f"p{i}")
        products.append(out)
    if op in ("cumsum", "cumprod"):
        low.emit(node, "cat", products, {"axis": axis})
    else:  # (the axis dropped unless keepdim)
        low.emit(node, "reshape", [out], {"shape": low.shape(node)})


@lowers("aten._cdist_forward.default")
def _cdist(low, node, args, kw):
    """torch.cdist with p=2 between two values of points (P, M), (R, M)."""
    if args[2] != 2:
        raise low.refuse(node, f"p={args[2]} (the Euclidean distance, p=2, is supported)")
    low.emit(node, "cdist", [low.value(node, args[0]), low.value(node, args[1])])


@lowers("aten.bmm.default")
def _bmm(low, node, args, kw):
    """A product of two values, per sample (their merged rows the product's batch)."""
    a, b = (low.value(node, v) for v in args[:2])
    if low.layout(node, args[0]) != low.layout(node, args[1]) or low.layout(node)[0] != 0:
        raise low.refuse(node, "operands whose batch axes differ or are not the first")
    low.emit(node, "matmul", [a, b])


def _batched_matrices(node) -> bool:
    """Whether a matmul is one of the products the lowering takes as it stands: a value's rows
    (the batch axis not the last) times a matrix the same for every sample, or matrices only,
    each operand a value with the batch axis first (the batch, or its multiple, and no other
    axis of it) and two axes more, or one the same for every sample with fewer axes than such
    a value (its axes align with a sample's); two values with as many axes and the same batch
    axis."""
    shapes = [tuple(a.meta["val"].shape) for a in node.args[:2]]
    batched = [any(_sym(d) for d in s) for s in shapes]
    if batched == [True, False] and len(shapes[1]) == 2 and not _sym(shapes[0][-1]):
        return True  # rows times a shared matrix: torch's Linear without a bias
    if any(len(s) < 2 or any(_sym(d) for d in s[1:]) for s in shapes):
        return False
    ranks = [len(s) for s in shapes]
    if all(batched):
        return ranks[0] == ranks[1] > 2 and shapes[0][0].node.expr == shapes[1][0].node.expr
    return any(batched) and 2 < ranks[batched.index(True)] > ranks[batched.index(False)]


def _sym(size) -> bool:
    return isinstance(size, torch.SymInt)


@lowers("aten.matmul.default", as_is=_batched_matrices)
def _matmul(low, node, args, kw):
    """a @ b of the forms :func:`_batched_matrices` takes (the others go through torch's
    decomposition, into bmm and mm): rows times a shared matrix, or each sample's matrices
    multiplied, a shared one broadcast."""
    a, b = args[:2]
    if low.layout(node, b) is None and len(b.meta["val"].shape) == 2:
        _mm(low, node, args, kw)
        return
    at = {low.layout(node, a), low.layout(node, b)} - {None}
    if len(at) != 1 or next(iter(at))[0] != 0 or low.layout(node) not in at:
        raise low.refuse(node, "a product of values whose batch axes differ or are not the first")
    low.emit(node, "matmul", [low.value(node, a), low.value(node, b)])


def _piece(low, node, x, axis: int, start: int, stop: int, drop: bool, part: str) -> str:
    """Rows start:stop of per-sample ``axis`` of value ``x`` (the axis dropped: a select)."""
    shape = low.shape(node, x)
    src = low.value(node, x)
    if (start, stop) != (0, shape[axis]):
        attrs = {"axis": axis, "start": start, "stop": stop, "step": 1}
        src = low.emit(node, "slice", [src], attrs, part=f"{part}slice")
    out = shape[:axis] + ((stop - start,) if not drop else ()) + shape[axis + 1 :]
    return low.emit(node, "reshape", [src], {"shape": out}, part=part)


@lowers("aten.select.int")
def _select(low, node, args, kw):
    x, dim, index = args[0], args[1], args[2]
    axis = low.axis(node, x, dim)
    size = low.shape(node, x)[axis]
    index = index + size if index < 0 else index
    _piece(low, node, x, axis, index, index + 1, True, "")


@lowers("aten.unbind.int")
def _unbind(low, node, args, kw):
    x, dim = args[0], args[1] if len(args) > 1 else kw.get("dim", 0)
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
