"""ATen ops that take values by index: index_select, advanced indexing by one index tensor
(x[:, idx], a relative-position table read by an index buffer), gather, embedding of constant
positions, torch.roll (an index_select of constant indices), topk and max/min over an axis
(the IR's topk indices, the values a gather by them), and repeat (tiles of a sample's values).

Indices are constants (computed from neither the inputs nor the parameters: torch.arange, an
index buffer) or topk's; indices computed from the inputs' values otherwise are refused."""

from __future__ import annotations

import torch

from rootclad.frontends.aten.table import batch_rows, lowers


def take(low, node, x, dim: int, index: torch.Tensor, part: str = "", src=None) -> str:
    """``x``'s values (or value ``src``'s, of ``x``'s shape) at positions ``index`` (a constant
    of integers, any shape) of torch's axis ``dim``: the index's axes where that axis was
    (torch.index_select, x[..., index])."""
    axis = low.axis(node, x, dim)
    shape = low.shape(node, x)
    size = shape[axis]
    if index.dtype.is_floating_point or index.dtype == torch.bool or index.numel() == 0:
        raise low.refuse(node, f"an index of {index.dtype} and {index.numel()} values")
    if bool(((index < -size) | (index >= size)).any()):
        raise low.refuse(node, f"an index out of range for an axis of {size}")
    flat = (index.reshape(-1) % size).to(torch.float64)
    n = flat.numel()
    out = shape[:axis] + (n,) + shape[axis + 1 :]
    src = low.value(node, x) if src is None else src
    if torch.equal(flat, torch.arange(size, dtype=torch.float64)):
        taken = low.emit(node, "identity", [src], part=f"{part}taken")
    else:
        held = (1,) * axis + (n,) + (1,) * (len(shape) - axis - 1)
        idx = low.constant_value(node, flat, held, f"{part}index")
        if held != out:
            idx = low.emit(node, "expand", [idx], {"shape": out}, part=f"{part}index_full")
        taken = low.emit(node, "gather", [src, idx], {"axis": axis}, part=f"{part}taken")
    want = shape[:axis] + tuple(index.shape) + shape[axis + 1 :]
    return low.emit(node, "reshape", [taken], {"shape": want}, part=part)


def _index(low, node, arg) -> torch.Tensor:
    """A constant index, a sample's where it has the batch axis (position ids expanded to
    the batch)."""
    if low.constant(arg) is None:
        raise low.refuse(
            node,
            f"index {getattr(arg, 'name', arg)!r} is computed from the inputs' values "
            "(indices must be constants: torch.arange, an index buffer)",
        )
    return low.sample_constant(node, arg)


@lowers("aten.index_select.default")
def _index_select(low, node, args, kw):
    take(low, node, args[0], args[1], _index(low, node, args[2]))


# ops that keep a tensor's values in order (an offset's or an index's views and copies)
_VIEWS = {"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten", "clone"}


def sample_offsets(low) -> None:
    """Find torch.arange(B), the number of each sample (viewed, and scaled by a count N),
    added to indices: weaver's ParticleNet takes the neighbours of all samples at once from
    their points merged into one axis, x.view(B * N, C)[idx + arange(B).view(-1, 1, 1) * N].
    The sum is the indices within each sample's own N rows (``low.offsets``: the sum -> (the
    indices, N)); the nodes making the offset are read by nothing else and lowered to
    nothing. An arange over the batch used otherwise is refused where it is lowered."""
    for node in low.program.graph.nodes:
        name = getattr(node.target, "_opname", "")
        if name != "arange" or node.name not in low.data:
            continue
        bounds = [a.meta.get("val", a) if hasattr(a, "meta") else a for a in node.args]
        if len(bounds) == 1:
            bounds = [0, *bounds]
        if (
            bounds[0] != 0
            or (len(bounds) > 2 and bounds[2] != 1)
            or batch_rows(bounds[1], low.batch) != 1
        ):
            continue
        chain, at, count = [node.name], node, 1
        while len(at.users) == 1:
            (user,) = at.users
            op = getattr(user.target, "_opname", "")
            if op in _VIEWS and user.args[0] is at:
                chain.append(user.name)
            elif op == "mul" and isinstance(user.args[1], int) and user.args[0] is at:
                count *= user.args[1]
                chain.append(user.name)
            elif op == "add" and len(user.args) == 2 and not user.kwargs:
                local = user.args[1] if user.args[0] is at else user.args[0]
                if _indices_of_rows(low, user, local):
                    low.offsets[user.name] = (local, count)
                    low.offset_nodes.update(chain)
                break
            else:
                break
            at = user


def _indices_of_rows(low, total, local) -> bool:
    """Whether ``total`` (``local`` plus offsets) is integer indices of the sample's values,
    of ``local``'s shape, read only as the index of rows (through views): anything else
    reading it would miss the offsets."""
    if not isinstance(local, torch.fx.Node) or local.name not in low.data:
        return False
    if local.name in low.folded or local.name in low.offset_nodes:
        return False
    val = local.meta.get("val")
    if val is None or val.dtype.is_floating_point or val.shape != total.meta["val"].shape:
        return False
    todo = [(user, total) for user in total.users]
    while todo:
        user, read = todo.pop()
        op = getattr(user.target, "_opname", "")
        if op in _VIEWS and user.args[0] is read:
            todo.extend((later, user) for later in user.users)
        elif op != "index" or list(user.args[1]) != [read]:
            return False
    return True


def _offset(low, index) -> int | None:
    """N where ``index`` is (a view of) indices plus the sample's number times N."""
    while index.name not in low.offsets:
        if getattr(index.target, "_opname", "") not in _VIEWS:
            return None
        index = index.args[0]
    return low.offsets[index.name][1]


def _index_range(local) -> int | None:
    """The size of the axis whose topk gave the indices ``local`` (views, permutations and
    slices of them): they are below it; None where they are not topk's."""
    moves = _VIEWS | {"permute", "transpose", "slice", "select", "expand"}
    while local.op == "call_function":
        if getattr(local.target, "__name__", "") == "getitem":
            if local.args[1] != 1:  # topk's values: no indices
                return None
        elif getattr(local.target, "_opname", "") not in moves:
            break
        local = local.args[0]
    if getattr(local.target, "_opname", "") != "topk":
        return None
    dim = local.args[2] if len(local.args) > 2 else local.kwargs.get("dim", -1)
    return int(local.args[0].meta["val"].shape[dim])


def _rows_of_the_sample(low, node, x, index, count: int) -> None:
    """x[idx + sample * N] of x's batch axis holding N rows of each sample: idx's rows of the
    sample's own (a gather along the sample's first axis), where idx, a topk's indices, stays
    below N (torch would read another sample's rows)."""
    at_sum = index
    while at_sum.name not in low.offsets:
        at_sum = at_sum.args[0]
    bound = _index_range(low.offsets[at_sum.name][0])
    if bound is None or bound > count:
        raise low.refuse(
            node,
            f"indices offset by the sample's number times {count} that are no topk's over at "
            f"most {count} values (a topk over {bound}): they may read another sample's rows",
        )
    at = low.layout(node, x)
    if at != (0, 1, count):  # each sample's N rows together, in order
        raise low.refuse(
            node,
            f"indices offset by the sample's number times {count} into a value that does not "
            f"hold {count} rows of each sample in its first axis",
        )
    shape, rows = low.shape(node, x), low.shape(node, index)
    if len(rows) != 1:
        raise low.refuse(node, "offset indices that are not flat (index.view(-1) first)")
    idx = low.emit(node, "reshape", [low.value(node, index)], {"shape": (rows[0], 1)}, part="at")
    if shape[1:] != (1,):
        idx = low.emit(node, "expand", [idx], {"shape": (rows[0], *shape[1:])}, part="at_rows")
    low.emit(node, "gather", [low.value(node, x), idx], {"axis": 0})


@lowers("aten.index.Tensor")
def _index_tensor(low, node, args, kw):
    """x[..., idx, ...]: one index tensor (the other axes whole); indices offset by each
    sample's number into the batch's merged rows (:func:`sample_offsets`)."""
    x, indices = args[0], list(args[1])
    found = [i for i, t in enumerate(indices) if t is not None]
    if len(found) != 1:
        raise low.refuse(node, f"indexing by {len(found)} index tensors (one is supported)")
    count = _offset(low, indices[0]) if found == [0] else None
    if count is not None:
        _rows_of_the_sample(low, node, x, indices[0], count)
        return
    index = _index(low, node, indices[found[0]])
    if index.dtype == torch.bool:
        raise low.refuse(node, "boolean masking (its result's shape depends on the values)")
    take(low, node, x, found[0], index)


@lowers("aten.embedding.default")
def _embedding(low, node, args, kw):
    """An embedding of an integer input of the model (token ids: the IR's embedding, whose
    indices the compiled model checks against index_bounds), or of constant positions (a
    position table read at torch.arange)."""
    weight, index = args[0], args[1]
    if low.constant(index) is not None:
        take(low, node, weight, 0, _index(low, node, index))
        return
    name = low.tensor_name(weight)
    if index.name not in low.integers or name is None:
        raise low.refuse(
            node,
            "an embedding of indices that are not an integer input of the model (sliced or "
            "reshaped) or a constant, or of a weight that is not a parameter",
        )
    rows, dim = (int(d) for d in weight.meta["val"].shape)
    pad = args[2] if len(args) > 2 else kw.get("padding_idx", -1)
    if (args[3] if len(args) > 3 else kw.get("scale_grad_by_freq", False)) is True:
        raise low.refuse(node, "scale_grad_by_freq=True")
    attrs = {"padding_idx": -1 if pad is None or pad < 0 else int(pad)}
    params = {"weight": name}
    low.emit(node, "embedding", [low.value(node, index)], attrs, params=params)


# integers a type holds exactly
EXACT = {"float32": 1 << 24, "float64": 1 << 53}
# what may come between an integer input and an embedding: ops moving values, comparisons
_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}


def index_bounds(low, sizes: dict) -> tuple[tuple[int, ...], ...]:
    """Per model input: () for a float or mask input; for an integer input (the indices of
    embeddings), per position of a sample (flat), the fewest rows of the embeddings reading it
    (0: read by none), against which the compiled model checks every call's indices. Between
    the input and the embeddings only ops moving values (slices, views, permutations) may
    touch the integers (followed by running them on the positions' numbers), comparisons
    (masks) and conversions to floats (an attention mask of 0s and 1s given as integers),
    whose positions must hold integers the model's type holds exactly (|i| < 2^24 in float32:
    a bound of -2^24); anything else computed from them is refused, naming the node."""
    pos, rows, origin, compared = {}, {}, {}, {}
    for n in low.program.graph.nodes:
        val = n.meta.get("val")
        if n.op == "placeholder" and n.name in low.user_inputs:
            if val.dtype.is_floating_point or val.dtype == torch.bool:
                continue
            example = low.examples[low.user_inputs.index(n.name)]
            count = example[0].numel()
            pos[n.name] = torch.arange(count).repeat(example.shape[0]).view(example.shape)
            rows[n.name], origin[n.name] = (
                torch.full((count,), torch.iinfo(torch.int64).max),
                n.name,
            )
            compared[n.name] = torch.zeros(count, dtype=torch.bool)
            continue
        reads = [a for a in n.all_input_nodes if a.name in pos]
        if n.op != "call_function" or not reads:
            continue
        op = getattr(n.target, "_opname", "")
        if not isinstance(val, torch.Tensor):
            continue  # a size (ids.shape[1])
        if op == "embedding" and n.args[1].name in pos:
            weight_rows = int(n.args[0].meta["val"].shape[0])
            if weight_rows > EXACT[low.dtype] or weight_rows >= 1 << 31:
                raise low.refuse(
                    n,
                    f"{weight_rows} rows: more than {low.dtype} (or the "
                    "kernels) index exactly; compile in float64",
                )
            held = rows[origin[n.args[1].name]]
            at = pos[n.args[1].name].reshape(-1).unique()
            held[at] = torch.minimum(held[at], torch.tensor(weight_rows))
        elif op in CARRY and n.args[0].name in pos and len(reads) == 1:
            args, kw = torch.fx.node.map_arg(
                (n.args, n.kwargs), lambda a: pos.get(a.name, sizes.get(a.name))
            )
            pos[n.name], origin[n.name] = n.target(*args, **kw), origin[n.args[0].name]
        elif (
            op in _COMPARE
            or op in ("_to_copy", "to", "type_as")
            and (val.dtype.is_floating_point or val.dtype == torch.bool)
        ):  # a mask of the indices (ids == PAD), or integers made values: held exactly
            for a in reads:
                compared[origin[a.name]][pos[a.name].reshape(-1).unique()] = True
        else:
            raise low.refuse(
                n,
                "computes with integer inputs; rootclad takes them as the indices of "
                "embeddings (sliced or reshaped), and compares them with numbers",
            )
    low.integers = set(pos)
    out = []
    for name in low.user_inputs:
        if name not in rows:
            out.append(())
            continue
        unread = rows[name] == torch.iinfo(torch.int64).max
        held = rows[name].masked_fill(unread, 0)  # 0: any value; -n: |i| < n, compared only
        held = held.masked_fill(unread & compared[name], -EXACT[low.dtype])
        out.append(tuple(int(r) for r in held))
    return tuple(out) if rows else ()


@lowers("aten.gather.default")
def _gather(low, node, args, kw):
    """torch.gather by topk's indices or by a constant."""
    x, dim, index = args[0], args[1], args[2]
    axis = low.axis(node, x, dim)
    value = low.constant(index)
    if value is None and not from_topk(index):
        _index(low, node, index)
    size = low.shape(node, x)[axis]
    if value is not None and bool(((value < 0) | (value >= size)).any()):
        raise low.refuse(node, f"an index out of range for an axis of {size}")
    low.emit(node, "gather", [low.value(node, x), low.value(node, index)], {"axis": axis})


# ops that move or copy indices without changing them
CARRY = {
    "view",
    "_unsafe_view",
    "reshape",
    "unsqueeze",
    "squeeze",
    "expand",
    "clone",
    "permute",
    "slice",
    "select",
    "alias",
}


def from_topk(index) -> bool:
    """Whether ``index`` is indices topk (or sort, max, min) found, moved or copied: exact and in
    range by construction (any other index computed from the values is refused)."""
    return topk_source(index) is not None


def topk_source(index):
    """The topk (sort, max, min) node whose indices ``index`` is, moved or copied; or None."""
    while getattr(index.target, "_opname", "") in CARRY:
        index = index.args[0]
    if getattr(index.target, "__name__", "") != "getitem" or index.args[1] != 1:
        return None
    found = index.args[0]
    return found if getattr(found.target, "_opname", "") in ("topk", "sort", "max", "min") else None


@lowers("aten.topk.default")
def _topk(low, node, args, kw):
    """The indices (the IR's topk), the values a gather by them."""
    x, k = args[0], args[1]
    dim = args[2] if len(args) > 2 else kw.get("dim", -1)
    largest = args[3] if len(args) > 3 else kw.get("largest", True)
    _selected(low, node, x, low.axis(node, x, dim), int(k), bool(largest))


def _selected(low, node, x, axis: int, k: int, largest: bool) -> None:
    """``node``'s values and indices: the IR's topk along ``axis``, the values a gather by it."""
    src = low.value(node, x)
    attrs = {"axis": axis, "k": k, "largest": largest}
    idx = low.emit(node, "topk", [src], attrs, part="indices")
    values = low.emit(node, "gather", [src, idx], {"axis": axis}, part="values")
    low.tuples[node.name] = [values, idx]


@lowers("aten.max.dim", "aten.min.dim")
def _max_dim(low, node, args, kw):
    """torch.max(x, dim): the value and index of the largest (topk of 1, then the axis dropped
    unless keepdim); torch.min(x, dim) as -max(-x, dim), which picks a NaN as torch.min does
    (topk's smallest would pass it by)."""
    keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
    low.tuples[node.name] = _largest(low, node, args[0], args[1], keep, want_values=True)


@lowers("aten.argmax.default", "aten.argmin.default")
def _argmax(low, node, args, kw):
    """torch.argmax(x, dim) and argmin: torch.max(x, dim)'s index alone (over every axis,
    dim=None, it would mix the samples: refused)."""
    dim = args[1] if len(args) > 1 else kw.get("dim")
    if dim is None:
        raise low.refuse(node, "dim=None (over the whole batch; rootclad never mixes samples)")
    keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
    low.names[node.name] = _largest(low, node, args[0], dim, keep, want_values=False)[1]


def _largest(low, node, x, dim, keep, want_values):
    """[values (None unless wanted), indices] of the largest along ``dim`` (of the smallest for
    torch's min and argmin)."""
    axis = low.axis(node, x, dim)
    src = low.value(node, x)
    negate = {"scale": -1.0, "shift": 0.0}
    smallest = node.target._opname in ("min", "argmin")
    if smallest:
        src = low.emit(node, "affine", [src], negate, part="negated")
    attrs = {"axis": axis, "k": 1, "largest": True}
    idx = low.emit(node, "topk", [src], attrs, part="indices")
    values = None
    if want_values:
        values = low.emit(node, "gather", [src, idx], {"axis": axis}, part="values")
        if smallest:
            values = low.emit(node, "affine", [values], negate, part="smallest")
    if not keep:
        shape = low.shape(node, x)
        dropped = shape[:axis] + shape[axis + 1 :]
        if want_values:
            values = low.emit(node, "reshape", [values], {"shape": dropped}, part="value")
        idx = low.emit(node, "reshape", [idx], {"shape": dropped}, part="index")
    return [values, idx]


@lowers("aten.repeat.default")
def _repeat(low, node, args, kw):
    """x.repeat(...): each per-sample axis tiled (a new axis of the count before it, expanded,
    the two merged); a tensor the same for every sample repeated along the batch axis first
    (p.repeat(B), as instance norm's weights) is each sample's."""
    x, rank = args[0], len(node.meta["val"].shape)
    counts = [c.meta["val"] if isinstance(c, torch.fx.Node) else c for c in args[1]]
    at, mine = low.layout(node), low.layout(node, x)
    if at is not None and mine is None:  # p.repeat(B, ...)
        if (
            at[0] != 0
            or low.rows(node)
            != int(x.meta["val"].shape[0] if rank == len(x.meta["val"].shape) else 1)
            or batch_rows(counts[0], low.batch) != 1
        ):
            raise low.refuse(node, "a repeat along the batch axis other than p.repeat(B, ...)")
        counts = [1] + counts[1:]
        shape = (1,) * (rank - len(x.meta["val"].shape)) + low.shape(node, x)
    else:
        shape = low.shape(node, x)
        if at is not None:
            if counts[at[0]] != 1:
                raise low.refuse(node, "a repeat along the batch axis")
            if low.rows(node) == 1:
                counts = counts[: at[0]] + counts[at[0] + 1 :]
    src = low.value(node, x)
    current = [1] * (len(counts) - len(shape)) + list(shape)
    if tuple(current) != tuple(shape):
        src = low.emit(node, "reshape", [src], {"shape": tuple(current)}, part="axes")
    for i, c in enumerate(int(c) for c in counts):
        if c == 1:
            continue
        split = current[:i] + [1, current[i]] + current[i + 1 :]
        src = low.emit(node, "reshape", [src], {"shape": tuple(split)}, part=f"split{i}")
        split[i] = c
        src = low.emit(node, "expand", [src], {"shape": tuple(split)}, part=f"tiles{i}")
        current[i] *= c
        src = low.emit(node, "reshape", [src], {"shape": tuple(current)}, part=f"merged{i}")
    low.emit(node, "reshape", [src], {"shape": low.shape(node)})


@lowers("aten.flip.default")
def _flip(low, node, args, kw):
    """torch.flip: each axis taken in reverse order (a gather by constant indices)."""
    x, dims = args[0], list(args[1])
    src = low.value(node, x)
    for i, dim in enumerate(dims):
        size = low.shape(node, x)[low.axis(node, x, dim)]
        reverse = torch.arange(size - 1, -1, -1)
        src = take(low, node, x, dim, reverse, f"flip{i}", src)
    low.emit(node, "identity", [src])


# the longest axis sorted (topk's selection of every value: n * n comparisons per row)
MAX_SORTED = 1024


@lowers("aten.sort.default", "aten.sort.stable")
def _sort(low, node, args, kw):
    """torch.sort along a per-sample axis: topk of every value (ties in their order, as a stable
    sort; NaN the largest), the values a gather by its indices."""
    x = args[0]
    if node.target._overloadname == "stable":
        dim, descending = kw.get("dim", -1), kw.get("descending", False)
    else:
        dim = args[1] if len(args) > 1 else kw.get("dim", -1)
        descending = args[2] if len(args) > 2 else kw.get("descending", False)
    axis = low.axis(node, x, dim)
    n = low.shape(node, x)[axis]
    if n > MAX_SORTED:  # (topk's selection: n * k comparisons per row)
        raise low.refuse(node, f"a sort along an axis of {n} (at most {MAX_SORTED})")
    _selected(low, node, x, axis, n, bool(descending))
