"""ATen ops that write values into positions of a tensor, as torch.export's functionalization
gives in-place assignment: copy (y[:, 0] = v), slice_scatter (y[:, 2:4] = v, y[..., ::2] *= 3),
index_put (y[:, idx] = v, y[:, idx] += v, index_add, index_copy, index_fill, y[mask] = c),
scatter, scatter_add, scatter(reduce="add") and scatter_reduce's sum.

Positions known when the model compiles (slices, constant indices) are written with gathers of
the written values, one for each time a position is written; a scatter's indices may also be
topk's (sort's, max's, min's), each compared with every position of the axis (a mask per
index). A position written twice without adding is refused: torch leaves which write wins
undefined."""

from __future__ import annotations

import math

import torch

from rootclad.frontends.aten.indexing import from_topk, topk_source
from rootclad.frontends.aten.logic import as_result, converted, number, select
from rootclad.frontends.aten.table import lowers

# the most times one position may be written while adding (a gather each), and the most
# comparisons per sample of a scatter by topk's indices (each index with each position)
MAX_WRITES = 64
MAX_COMPARED = 1 << 18
MAX_SUMMED = 64  # topk's k in such a scatter (the values at a position added one by one)


@lowers("aten.copy.default")
def _copy(low, node, args, kw):
    """dst.copy_(src): src's values broadcast to dst's shape (dst gives only its shape and
    dtype)."""
    src = args[1]  # (in dst's dtype: converted as .to() converts)
    converted(low, node, as_result(low, node, src, "src"), src.meta["val"].dtype)


@lowers("aten.slice_scatter.default")
def _slice_scatter(low, node, args, kw):
    """x with src written at a slice of one axis: the parts of x before and after it and src
    joined (step 1); every step-th position written otherwise."""
    x, src = args[0], args[1]
    dim, start, end, step = (list(args[2:]) + [0, None, None, 1][len(args) - 2 :])[:4]
    dim, start = kw.get("dim", dim), kw.get("start", start)
    end, step = kw.get("end", end), kw.get("step", step)
    at, rank = low.layout(node), len(node.meta["val"].shape)
    if at is not None and dim % rank == at[0]:  # the whole batch axis written: src
        if low.layout(node, src) != at or low.shape(node, src) != low.shape(node):
            raise low.refuse(node, "a write into part of the batch axis")
        low.emit(node, "identity", [low.value(node, src)])
        return
    axis, shape = low.axis(node, x, dim), low.shape(node)
    start, stop, step = slice(start, end, step).indices(shape[axis])
    along = torch.arange(start, stop, step)
    values = _values(low, node, src, _along(shape, axis, len(along)))
    base = as_result(low, node, x, "x")
    if step != 1:
        _write(low, node, base, values, _positions(shape, axis, _spread(along, shape, axis)))
        return
    parts, span = [], {"axis": axis, "step": 1}
    if start > 0:
        parts.append(low.emit(node, "slice", [base], {**span, "start": 0, "stop": start}, part="a"))
    parts.append(values)
    if stop < shape[axis]:
        rest = {**span, "start": stop, "stop": shape[axis]}
        parts.append(low.emit(node, "slice", [base], rest, part="b"))
    if len(parts) == 1:
        low.emit(node, "identity", parts)
    else:
        low.emit(node, "cat", parts, {"axis": axis})


@lowers("aten.index_put.default")
def _index_put(low, node, args, kw):
    """x[..., idx] = v (accumulate: +=) with one constant index of one axis, or x[mask] = v
    with a mask of x's shape and one value."""
    x, indices, values = args[0], list(args[1]), args[2]
    adding = bool(args[3] if len(args) > 3 else kw.get("accumulate", False))
    found = [i for i, t in enumerate(indices) if t is not None]
    if len(found) != 1:
        raise low.refuse(node, f"a write by {len(found)} index tensors (one is supported)")
    index = indices[found[0]]
    if index.meta["val"].dtype == torch.bool:
        _masked_write(low, node, x, index, values, adding)
        return
    if low.constant(index) is None:
        raise low.refuse(
            node,
            f"index {index.name!r} is computed from the inputs' values (the positions written "
            "must be constants: torch.arange, an index buffer)",
        )
    if index.meta["val"].dim() != 1 or low.layout(node, index) is not None:
        raise low.refuse(node, "a write by an index of several axes (one is supported)")
    if index.meta["val"].dtype not in (torch.int64, torch.int32):
        raise low.refuse(node, f"a write by an index of {index.meta['val'].dtype}")
    axis, shape = low.axis(node, x, found[0]), low.shape(node)
    along = _in_range(low, node, low.sample_constant(node, index).reshape(-1), shape[axis], True)
    src = _values(low, node, values, _along(shape, axis, len(along)))
    base = as_result(low, node, x, "x")
    positions = _positions(shape, axis, _spread(along, shape, axis))
    _write(low, node, base, src, positions, adding=adding, onto=adding)


def _masked_write(low, node, x, mask, values, adding: bool) -> None:
    """x[mask] = v (v where the mask holds, x elsewhere) or x[mask] += v, v one value."""
    if tuple(mask.meta["val"].shape) != tuple(node.meta["val"].shape):
        raise low.refuse(node, "a write by a mask not of the written tensor's shape")
    if math.prod(values.meta["val"].shape) != 1:
        raise low.refuse(node, "a write of many values by a mask (their count depends on it)")
    cond = as_result(low, node, mask, "mask")
    value = number(low, node, values)
    if value is not None and math.isnan(value):  # (as torch.where's branch: no C++ literal)
        raise low.refuse(node, "a write of NaN by a mask")
    if value is None:
        fill = as_result(low, node, values, "value")
    else:
        fill = low.emit(node, "affine", [cond], {"scale": 0.0, "shift": value}, part="value")
    base = as_result(low, node, x, "x")
    if adding:
        kept = low.emit(node, "masked_fill", [fill, cond], {"keep": True, "zero": True}, part="add")
        low.emit(node, "add", [base, kept])
    else:
        select(low, node, cond, fill, base)


@lowers(
    "aten.scatter.src",
    "aten.scatter.value",
    "aten.scatter.reduce",
    "aten.scatter.value_reduce",
    "aten.scatter_add.default",
    "aten.scatter_reduce.two",
)
def _scatter(low, node, args, kw):
    """torch.scatter (of values or one value), scatter_add, scatter(reduce="add") and
    scatter_reduce(reduce="sum"; include_self=False: a position written holds only the sum),
    by a constant index or topk's."""
    x, dim, index, src = args[:4]
    reduce = "sum" if node.target._opname == "scatter_add" else None
    reduce = args[4] if len(args) > 4 else kw.get("reduce", reduce)
    onto = bool(args[5] if len(args) > 5 else kw.get("include_self", True))
    if reduce not in (None, "add", "sum"):
        raise low.refuse(node, f"a scatter reducing by {reduce!r} (sum and add are supported)")
    adding = reduce is not None
    at = low.layout(node)
    if low.layout(node, index) != at:
        raise low.refuse(node, "an index whose batch axis is not the written tensor's")
    axis, shape, held = low.axis(node, x, dim), low.shape(node), low.shape(node, index)
    if len(held) != len(shape) or any(
        h > s for i, (h, s) in enumerate(zip(held, shape, strict=True)) if i != axis
    ):
        raise low.refuse(node, f"an index of per-sample shape {held} for values {shape}")
    values = _values(low, node, src, held, leading=True)
    base = as_result(low, node, x, "x")
    if low.constant(index) is not None:
        along = _in_range(low, node, low.sample_constant(node, index), shape[axis], False)
        positions = _positions(shape, axis, along)
        _write(low, node, base, values, positions, adding=adding, onto=adding and onto)
        return
    if not from_topk(index):
        raise low.refuse(
            node,
            f"index {index.name!r} is computed from the inputs' values (a scatter's indices "
            "must be constants or topk's)",
        )
    if not adding and _topk_dim(index) != dim % len(node.meta["val"].shape):
        raise low.refuse(
            node,
            "a scatter by topk's indices that may repeat along its axis (copied along it, "
            "or topk's along another axis): which write wins is left open",
        )
    if held != shape[:axis] + (held[axis],) + shape[axis + 1 :] or held[axis] > MAX_SUMMED:
        raise low.refuse(node, f"topk's indices of per-sample shape {held} for {shape}")
    if _topk_range(index) > shape[axis]:
        raise low.refuse(
            node,
            f"topk's indices among {_topk_range(index)} positions written into an axis of "
            f"{shape[axis]} (torch fails when one is past it)",
        )
    idx = low.value(node, index)
    _compared(low, node, base, values, idx, held, axis, adding=adding, onto=adding and onto)


# ops that keep an index's values distinct along the axis they were distinct along
_DISTINCT = ("clone", "alias", "slice", "unsqueeze", "expand")


def _topk_dim(index) -> int | None:
    """The axis of ``index`` along which its values are distinct, where it is topk's (sort's,
    or max's and min's with keepdim) indices, copied, sliced, unsqueezed or expanded along
    other axes; else None."""
    chain = []
    while getattr(index.target, "_opname", "") in _DISTINCT:
        chain.append(index)
        index = index.args[0]
    found = topk_source(index) if getattr(index.target, "__name__", "") == "getitem" else None
    if found is None:
        return None
    rank, name = len(index.meta["val"].shape), found.target._opname
    if name in ("max", "min") and not (found.args[2] if len(found.args) > 2 else False):
        return None
    dim = _dim_of(found) % rank
    for step in reversed(chain):  # the axis followed up through the copies
        before, after = step.args[0].meta["val"].shape, step.meta["val"].shape
        if step.target._opname == "unsqueeze":
            dim += int(step.args[1] % len(after) <= dim)
        elif step.target._opname == "expand":
            added = len(after) - len(before)
            if before[dim] != after[dim + added]:  # copies along it: no longer distinct
                return None
            dim += added
    return dim


def _dim_of(found) -> int:
    """The dim topk (sort, max, min) node ``found`` ran along."""
    at = 2 if found.target._opname == "topk" else 1
    return found.args[at] if len(found.args) > at else found.kwargs.get("dim", -1)


def _topk_range(index) -> int:
    """The size of the axis topk (sort, max, min) chose ``index`` from: its values are below."""
    found = topk_source(index)
    return int(found.args[0].meta["val"].shape[_dim_of(found)])


def _in_range(low, node, along: torch.Tensor, size: int, negative: bool) -> torch.Tensor:
    """Integer positions of an axis of ``size`` (from the end where ``negative`` allows)."""
    low_end = -size if negative else 0
    if along.dtype.is_floating_point or bool(((along < low_end) | (along >= size)).any()):
        raise low.refuse(node, f"an index of {along.dtype} or out of range for an axis of {size}")
    return along % size


def _along(shape, axis: int, count: int) -> tuple[int, ...]:
    return tuple(shape[:axis]) + (count,) + tuple(shape[axis + 1 :])


def _spread(along: torch.Tensor, shape, axis: int) -> torch.Tensor:
    """Positions of one axis (1-d) as the axis's coordinate of every value written there."""
    held = (1,) * axis + (len(along),) + (1,) * (len(shape) - axis - 1)
    return along.reshape(held).expand(_along(shape, axis, len(along)))


def _positions(shape, axis: int, along: torch.Tensor) -> torch.Tensor:
    """The flat per-sample position, in a value of ``shape``, of each value written: its own
    coordinates but along ``axis``, where ``along`` (of the written values' shape) says."""
    coords = torch.meshgrid(*(torch.arange(n) for n in along.shape), indexing="ij")
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    flat = sum(c * s for c, s in zip(coords, strides, strict=True))
    return flat + (along.long() - coords[axis]) * strides[axis]


def _values(low, node, arg, shape: tuple[int, ...], leading: bool = False) -> str:
    """The values ``arg`` written, of the written positions' per-sample ``shape``: one value
    filled, one the same for every sample broadcast, a sample's as they are (``leading``: their
    leading part along each axis, as scatter reads its src)."""
    value = number(low, node, arg)
    if value is not None and (not isinstance(arg, torch.fx.Node) or low.layout(node, arg) is None):
        return low.constant_value(node, torch.full(shape, value), shape, "values")
    if low.layout(node, arg) is None:
        if low.layout(node) is not None and not low.is_held(arg):
            raise low.refuse(node, f"values {arg.name!r} are not a tensor")
        have = _aligned(low, node, arg, len(shape))
        src = low.held_as(node, arg, have, "values_held")
    elif low.layout(node, arg) != low.layout(node):
        raise low.refuse(node, f"values {arg.name!r} whose batch axis is not the written one's")
    else:
        have, src = low.shape(node, arg), low.value(node, arg)
        if len(have) < len(shape):
            have = (1,) * (len(shape) - len(have)) + tuple(have)
            src = low.emit(node, "reshape", [src], {"shape": have}, part="values_axes")
    if len(have) != len(shape) or leading and any(h < s for h, s in zip(have, shape, strict=True)):
        raise low.refuse(node, f"values of per-sample shape {tuple(have)} written into {shape}")
    for i, (h, s) in enumerate(zip(have, shape, strict=True)):
        if leading and h > s:
            step = {"axis": i, "start": 0, "stop": s, "step": 1}
            src = low.emit(node, "slice", [src], step, part=f"values_part{i}")
    if leading or tuple(have) == tuple(shape):
        return src
    return low.emit(node, "expand", [src], {"shape": shape}, part="values_full")


def _aligned(low, node, arg, rank: int) -> tuple[int, ...]:
    """The shape of ``arg``, the same for every sample, aligned with the written positions'
    per-sample axes (torch broadcasts it against the result: its batch axis, 1, dropped)."""
    dims = tuple(int(d) for d in arg.meta["val"].shape)
    at = low.layout(node)
    if at is None:
        return (1,) * (rank - len(dims)) + dims
    dims = (1,) * (rank + 1 - len(dims)) + dims
    if dims[at[0]] != 1 or low.rows(node) != 1:
        raise low.refuse(node, f"values of shape {dims} meet the batch axis")
    return dims[: at[0]] + dims[at[0] + 1 :]


def _write(low, node, base, values, positions, adding=False, onto=False) -> None:
    """``node``'s value: ``base`` with ``values`` written at ``positions`` (flat per sample, of
    the values' shape), summed where ``adding``, onto the base where ``onto``. A gather of the
    values for each time a position is written."""
    shape = low.shape(node)
    m, flat = math.prod(shape), positions.reshape(-1)
    counts = torch.bincount(flat, minlength=m)
    rounds = int(counts.max()) if flat.numel() else 0
    if rounds > 1 and not adding:
        raise low.refuse(node, "a position written twice (torch leaves which write wins open)")
    if rounds > MAX_WRITES:
        raise low.refuse(node, f"a position written {rounds} times (at most {MAX_WRITES})")
    order = torch.argsort(flat, stable=True)
    ordered = flat[order]
    nth = torch.arange(len(flat)) - torch.searchsorted(ordered, ordered)
    src = low.emit(node, "reshape", [values], {"shape": (len(flat),)}, part="flat_values")
    terms = []
    for t in range(rounds):
        at, by = ordered[nth == t], order[nth == t]
        index, hit = torch.zeros(m, dtype=torch.float64), torch.zeros(m, dtype=torch.float64)
        index[at], hit[at] = by.to(torch.float64), 1.0
        idx = low.constant_value(node, index, (m,), f"write{t}")
        term = low.emit(node, "gather", [src, idx], {"axis": 0}, part=f"written{t}")
        if not bool(hit.all()):
            mask = low.constant_value(node, hit, (m,), f"hit{t}")
            term = low.emit(
                node, "masked_fill", [term, mask], {"keep": True, "zero": True}, part=f"w{t}"
            )
        terms.append(term)
    written = (counts > 0).to(torch.float64)
    if onto or not bool(written.all()):
        kept = low.emit(node, "reshape", [base], {"shape": (m,)}, part="flat_base")
        if not onto and bool(written.any()):
            mask = low.constant_value(node, written, (m,), "written")
            kept = low.emit(
                node, "masked_fill", [kept, mask], {"keep": False, "zero": True}, part="kept"
            )
        terms.insert(0, kept)
    out = terms[0]
    for i, term in enumerate(terms[1:]):
        out = low.emit(node, "add", [out, term], part=f"sum{i}")
    low.emit(node, "reshape", [out], {"shape": shape})


def _compared(low, node, base, values, idx, held, axis, adding=False, onto=False) -> None:
    """``node``'s value: ``base`` with ``values`` written at topk's indices ``idx`` (of
    per-sample shape ``held``) along ``axis``: each index compared with each position of the
    axis, each value kept where it is equal, the kept values added over the indices."""
    shape = low.shape(node)
    n = shape[axis]
    wide = held[: axis + 1] + (n,) + held[axis + 1 :]  # (..., index, position, ...)
    if math.prod(wide) > MAX_COMPARED:
        raise low.refuse(
            node,
            f"a scatter by topk's indices of {math.prod(wide)} comparisons (at most "
            f"{MAX_COMPARED} per sample)",
        )
    lifted = held[: axis + 1] + (1,) + held[axis + 1 :]
    iota = (1,) * (axis + 1) + (n,) + (1,) * (len(held) - axis - 1)
    index = low.emit(node, "reshape", [idx], {"shape": lifted}, part="index")
    index = low.emit(node, "expand", [index], {"shape": wide}, part="index_wide")
    where = low.constant_value(node, torch.arange(n, dtype=torch.float64).reshape(iota), iota, "at")
    where = low.emit(node, "expand", [where], {"shape": wide}, part="at_wide")
    diff = low.emit(node, "sub", [index, where], part="diff")
    hit = low.emit(node, "equal", [diff], {"value": 0.0, "negate": False}, part="hit")
    src = low.emit(node, "reshape", [values], {"shape": lifted}, part="values_lifted")
    src = low.emit(node, "expand", [src], {"shape": wide}, part="values_wide")
    kept = low.emit(node, "masked_fill", [src, hit], {"keep": True, "zero": True}, part="kept")
    total = _sum_axis(low, node, kept, wide, axis, "total")
    if onto:
        low.emit(node, "add", [base, total])
        return
    written = _sum_axis(low, node, hit, wide, axis, "count")
    rest = low.emit(
        node, "masked_fill", [base, written], {"keep": False, "zero": True}, part="rest"
    )
    low.emit(node, "add", [total, rest])


def _sum_axis(low, node, value, shape, axis: int, part: str) -> str:
    """``value`` (of per-sample ``shape``) summed over ``axis``, the axis dropped: its slices
    added in order (a value written once is that value, exactly)."""
    step = {"axis": axis, "step": 1}
    out = low.emit(node, "slice", [value], {**step, "start": 0, "stop": 1}, part=f"{part}_0")
    for i in range(1, shape[axis]):
        piece = {**step, "start": i, "stop": i + 1}
        piece = low.emit(node, "slice", [value], piece, part=f"{part}_s{i}")
        out = low.emit(node, "add", [out, piece], part=f"{part}_{i}")
    dropped = shape[:axis] + shape[axis + 1 :]
    return low.emit(node, "reshape", [out], {"shape": dropped}, part=part)
