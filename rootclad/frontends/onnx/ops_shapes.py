"""The ONNX table's layout, shape, reduction and index ops (see ops.py)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from rootclad.frontends.onnx.common import text
from rootclad.frontends.onnx.ops import (
    MAX_NUMBERS,
    few,
    ints,
    is_number,
    onnx_op,
    positive_axis,
    tensor,
)


# -- layout ------------------------------------------------------------------------------------
def _shape_of(node, x, shape: list, allowzero: bool) -> list:
    """ONNX's Reshape sizes: 0 copies the input's size (unless allowzero), -1 is inferred."""
    return [x.shape[i] if s == 0 and not allowzero else s for i, s in enumerate(shape)]


@onnx_op("Reshape")
def _reshape(node, ins):
    x, shape = ins
    shape = ints(node, shape, "sizes")
    if is_number(x):
        allow = bool(node.attr("allowzero", 0))
        return np.reshape(x, [int(s) for s in _shape_of(node, x, shape, allow)])
    return x.reshape(_shape_of(node, x, shape, bool(node.attr("allowzero", 0))))


@onnx_op("Flatten")
def _flatten(node, ins):
    x = ins[0]
    axis = positive_axis(node.attr("axis", 1), x.dim())
    return x.reshape(math.prod(x.shape[:axis]), -1) if axis else x.reshape(1, -1)


@onnx_op("Transpose")
def _transpose(node, ins):
    x = ins[0]
    perm = node.attr("perm") or list(range(x.ndim))[::-1]
    return np.transpose(x, perm) if is_number(x) else x.permute(perm)


def _axes(node, ins, at: int = 1) -> list | None:
    """An op's axes: its attribute (older opsets) or its input."""
    axes = node.attr("axes")
    if axes is None and len(ins) > at and ins[at] is not None:
        axes = ints(node, ins[at], "axes")
    return axes


@onnx_op("Squeeze")
def _squeeze(node, ins):
    x, axes = ins[0], _axes(node, ins)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = sorted(positive_axis(a, x.ndim) for a in axes)
    if any(not isinstance(x.shape[a], int) or x.shape[a] != 1 for a in axes):
        raise node.refuse(f"axes {axes} of shape {tuple(x.shape)}: an axis squeezed must be 1")
    if is_number(x):
        return np.squeeze(x, tuple(axes))
    for a in reversed(axes):
        x = x.squeeze(a)
    return x


@onnx_op("Unsqueeze")
def _unsqueeze(node, ins):
    x, axes = ins[0], _axes(node, ins)
    rank = x.ndim + len(axes)
    for a in sorted(positive_axis(a, rank) for a in axes):
        x = np.expand_dims(x, a) if is_number(x) else x.unsqueeze(a)
    return x


@onnx_op("Concat")
def _concat(node, ins):
    axis = node.attr("axis")
    parts = [v for v in ins if v is not None]
    if all(is_number(v) for v in parts):
        few(node, [sum(v.size for v in parts)])
        return np.concatenate(parts, axis)
    like = next(v for v in parts if isinstance(v, torch.Tensor))
    parts = [tensor(node, v, like) for v in parts]
    # an empty part adds nothing (torch's exporter writes a roll by a whole turn as one)
    kept = [v for v in parts if all(d != 0 for d in v.shape if isinstance(d, int))]
    return torch.cat(kept or parts, axis)


@onnx_op("Slice")
def _slice(node, ins):
    x = ins[0]
    starts, ends = ints(node, ins[1], "starts"), ints(node, ins[2], "ends")
    axes = ints(node, ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
    steps = ints(node, ins[4], "steps") if len(ins) > 4 and ins[4] is not None else None
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise node.refuse("starts, ends, axes and steps that differ in length")
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        axis = positive_axis(a, x.ndim)
        if st > 0:  # (Python's slices clamp as ONNX does)
            index[axis] = slice(None if s <= -(2**62) else s, e, st)
            continue
        size = x.shape[axis]
        if isinstance(size, torch.SymInt):
            raise node.refuse("a negative step along the batch axis")
        # backwards, ONNX clamps the start to [0, size - 1] and the end to [-1, size - 1]
        # (-1: past the first element), where Python's start below -size would take nothing
        s, e = (v + int(size) if v < 0 else v for v in (s, e))
        s, e = min(max(s, 0), int(size) - 1), min(max(e, -1), int(size) - 1)
        index[axis] = slice(s, None if e < 0 else e, st)
    if is_number(x):
        return x[tuple(index)]
    for axis, part in enumerate(index):  # torch slices forwards: a flipped axis backwards
        if part.step is not None and part.step < 0:
            size = int(x.shape[axis])
            kept = range(*part.indices(size))
            first = size - 1 - kept[0] if kept else 0
            x = x.flip(axis)
            index[axis] = slice(
                first, first + -part.step * (len(kept) - 1) + 1 if kept else 0, -part.step
            )
    return x[tuple(index)]


@onnx_op("Split")
def _split(node, ins):
    x, axis = ins[0], node.attr("axis", 0)
    sizes = node.attr("split") or (
        ints(node, ins[1], "sizes") if len(ins) > 1 and ins[1] is not None else None
    )
    if sizes is None:
        parts = node.attr("num_outputs") or len(node.outputs)
        size = x.shape[positive_axis(axis, x.ndim)]
        if size % parts and not node.attr("num_outputs"):  # (opset 18's may leave less last)
            raise node.refuse(f"an axis of {size} that does not split evenly into {parts}")
        sizes = [-(-size // parts)] * (parts - 1)
        sizes.append(size - sum(sizes))
    if is_number(x):
        return np.split(x, np.cumsum(sizes)[:-1], axis)
    return list(torch.split(x, sizes, axis))


@onnx_op("Expand")
def _expand(node, ins):
    x, shape = ins[0], ints(node, ins[1], "sizes")
    rank = max(x.ndim, len(shape))
    have = [1] * (rank - x.ndim) + list(x.shape)
    want = [1] * (rank - len(shape)) + shape
    out = [h if w == 1 else w for h, w in zip(have, want, strict=True)]
    if is_number(x) and not any(isinstance(d, torch.SymInt) for d in out):
        return np.broadcast_to(x, few(node, out)).copy()
    return tensor(node, x).reshape(have).expand(out)  # (numbers to the batch's size: a tensor)


@onnx_op("Tile")
def _tile(node, ins):
    reps = ints(node, ins[1], "repeats")
    if is_number(ins[0]):
        few(node, [ins[0].size, *reps])
        return np.tile(ins[0], reps)
    return ins[0].repeat(reps)


@onnx_op("Pad")
def _pad(node, ins):
    x = ins[0]
    mode = text(node.attr("mode", "constant"))
    pads = ints(node, ins[1], "pads") if len(ins) > 1 else node.attr("pads")
    value = float(np.asarray(ins[2]).reshape(())) if len(ins) > 2 and ins[2] is not None else 0.0
    axes = ints(node, ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
    axes = [positive_axis(a, x.ndim) for a in axes] if axes else list(range(x.ndim))
    n = len(axes)
    if len(pads) != 2 * n:
        raise node.refuse(f"{len(pads)} pads for {n} axes (two counts per axis)")
    begin, end = dict(zip(axes, pads[:n], strict=True)), dict(zip(axes, pads[n:], strict=True))
    if not is_number(x) and isinstance(x.shape[0], torch.SymInt) and (begin.get(0) or end.get(0)):
        raise node.refuse("pads the batch axis")
    flat = [p for a in reversed(range(x.ndim)) for p in (begin.get(a, 0), end.get(a, 0))]
    if mode not in ("constant", "reflect", "edge"):
        raise node.refuse(f"mode {mode!r}")
    mode = {"edge": "replicate"}.get(mode, mode)
    while flat and flat[-2:] == [0, 0]:
        flat = flat[:-2]
    return F.pad(x, flat, mode, value) if mode == "constant" else F.pad(x, flat, mode)


# -- shapes, constants, reductions, indices -----------------------------------------------------
@onnx_op("Shape")
def _shape(node, ins):
    shape = np.array(list(ins[0].shape), dtype=object)
    start, end = node.attr("start", 0), node.attr("end")
    return shape[start:end]


@onnx_op("Size")
def _size(node, ins):
    return np.array(math.prod(ins[0].shape), dtype=object)


@onnx_op("Constant")
def _constant(node, ins):
    import onnx

    for key, value in node.attrs.items():
        if key == "value":
            array = np.array(onnx.numpy_helper.to_array(value))
            return torch.from_numpy(array) if array.dtype.kind == "f" else array
        if key in ("value_float", "value_floats"):
            return torch.tensor(value, dtype=torch.float32)
        if key in ("value_int", "value_ints"):
            return np.array(value, dtype=np.int64)
    raise node.refuse(f"a constant given as {sorted(node.attrs)}")


@onnx_op("ConstantOfShape")
def _constant_of_shape(node, ins):
    import onnx

    shape = ints(node, ins[0], "sizes")
    value = node.attrs.get("value")
    fill = np.array(onnx.numpy_helper.to_array(value) if value is not None else 0.0).reshape(())
    concrete = not any(isinstance(s, torch.SymInt) for s in shape)
    if fill.dtype.kind != "f" and concrete and math.prod(shape) <= MAX_NUMBERS:
        return np.full(shape, fill)  # numbers (the rest: a tensor, bounded as every value)
    dtype = torch.bool if np.asarray(fill).dtype == bool else None
    kind = torch.int64 if np.asarray(fill).dtype.kind in "iu" else dtype
    # floats: the model's one float type (as Cast's)
    return torch.full(shape, float(fill) if kind is None else fill.item(), dtype=kind or node.dtype)


@onnx_op("Range")
def _range(node, ins):
    if any(isinstance(v, torch.Tensor) for v in ins):
        raise node.refuse("bounds computed from the data")
    start, limit, delta = (np.asarray(v).reshape(()).item() for v in ins)
    if any(isinstance(v, torch.SymInt) for v in (start, limit, delta)):  # over the batch size
        return torch.arange(start, limit, delta)
    few(node, [max(0, math.ceil((limit - start) / delta)) if delta else math.inf])
    return np.arange(start, limit, delta)


@onnx_op("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceSumSquare")
def _reduce(node, ins):
    x = ins[0]
    axes = _axes(node, ins)
    keep = bool(node.attr("keepdims", 1))
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.ndim))
    if is_number(x):
        fn = {"ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}.get(node.op)
        if fn is None:
            raise node.refuse("of numbers")
        return fn(x, axis=tuple(axes), keepdims=keep)
    if node.op == "ReduceSum":
        return x.sum(axes, keepdim=keep)
    if node.op == "ReduceMean":
        return x.mean(axes, keepdim=keep)
    if node.op == "ReduceSumSquare":
        return (x * x).sum(axes, keepdim=keep)
    if node.op == "ReduceL2":
        return torch.linalg.vector_norm(x, 2, axes, keepdim=keep)
    return x.amax(axes, keep) if node.op == "ReduceMax" else x.amin(axes, keep)


@onnx_op("Gather")
def _gather(node, ins):
    x, index = ins
    rank = x.ndim if is_number(x) else x.dim()
    axis = positive_axis(node.attr("axis", 0), rank)
    if is_number(x) and is_number(index):
        few(node, [*x.shape[:axis], *index.shape, *x.shape[axis + 1 :]])
        return np.take(x, index.astype(np.int64) if index.dtype != object else index, axis)
    x = tensor(node, x)
    if isinstance(x.shape[axis], torch.SymInt):
        raise node.refuse("gathers along the batch axis (rootclad never mixes samples)")
    if is_number(index):
        size = int(x.shape[axis])
        wrong = index[(index < -size) | (index >= size)] if index.dtype != object else []
        if len(wrong):
            raise node.refuse(f"index {wrong[0]} is out of range for an axis of {size}")
        index = np.where(index < 0, index + x.shape[axis], index)  # ONNX counts from the end
        return torch.index_select(x, axis, tensor(node, index.reshape(-1))).reshape(
            [*x.shape[:axis], *index.shape, *x.shape[axis + 1 :]]
        )
    if axis == 0 and x.dim() == 2 and not index.is_floating_point():  # an embedding
        return F.embedding(index, x)
    return torch.index_select(x, axis, index.reshape(-1)).reshape(
        [*x.shape[:axis], *index.shape, *x.shape[axis + 1 :]]
    )


@onnx_op("GatherElements")
def _gather_elements(node, ins):
    return torch.gather(ins[0], node.attr("axis", 0), tensor(node, ins[1]))


@onnx_op("ScatterElements")
def _scatter_elements(node, ins):
    """torch.scatter (reduction none) or scatter_add (add) along an axis; indices from the end
    counted where they are numbers."""
    data, index, updates = ins
    reduction = text(node.attr("reduction", "none"))
    if reduction not in ("none", "add"):
        raise node.refuse(f"reduction {reduction!r} (none and add are supported)")
    data = tensor(node, data)
    axis = positive_axis(node.attr("axis", 0), data.dim())
    if is_number(index):  # (checked as numbers: a tensor made here is torch.export's)
        size = int(data.shape[axis])
        if index.dtype == object or ((index < -size) | (index >= size)).any():
            raise node.refuse(f"indices out of range for an axis of {size}, or sizes")
        index = np.where(index < 0, index + size, index)
    index, updates = tensor(node, index).long(), tensor(node, updates, data)
    if reduction == "add":
        return torch.scatter_add(data, axis, index, updates)
    return torch.scatter(data, axis, index, updates)


@onnx_op("TopK")
def _topk(node, ins):
    k = ints(node, ins[1], "k")[0]
    values, indices = torch.topk(
        ins[0],
        k,
        node.attr("axis", -1),
        bool(node.attr("largest", 1)),
        bool(node.attr("sorted", 1)),
    )
    return [values, indices]


@onnx_op("Trilu")
def _trilu(node, ins):
    k = ints(node, ins[1], "k")[0] if len(ins) > 1 and ins[1] is not None else 0
    x = ins[0]
    if is_number(x):
        return np.triu(x, k) if node.attr("upper", 1) else np.tril(x, k)
    return torch.triu(x, k) if node.attr("upper", 1) else torch.tril(x, k)


def _resize_target(node, x, ins) -> tuple[list, list, bool]:
    """(each axis's scale, each axis's size, whether sizes were given) of a Resize: scales or
    sizes of its ``axes`` (all by default; the others kept), sizes fitted to one scale by
    ``keep_aspect_ratio_policy``, as onnx's reference reads them."""
    rank = x.dim()
    axes = [positive_axis(a, rank) for a in node.attr("axes", list(range(rank)))]
    scales = ins[2] if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size else None
    sizes = ints(node, ins[3], "sizes") if len(ins) > 3 and ins[3] is not None else None
    shape = list(x.shape)
    if sizes is not None:
        size = list(shape)
        for a, n in zip(axes, sizes, strict=True):
            size[a] = n
        if list(size[:2]) != list(shape[:2]):
            raise node.refuse(f"sizes {sizes} that change the batch or the channels")
        scale = [1.0, 1.0, *(int(n) / int(d) for n, d in zip(size[2:], shape[2:], strict=True))]
        policy = text(node.attr("keep_aspect_ratio_policy", "stretch"))
        if policy in ("not_larger", "not_smaller"):
            one = (min if policy == "not_larger" else max)(scale[a] for a in axes)
            if one != 1 and {0, 1} & set(axes):
                raise node.refuse(f"{policy} would scale the batch or the channels by {one}")
            scale = [one if a in axes else 1.0 for a in range(rank)]
            size = [int(one * int(d) + 0.5) if a in axes else d for a, d in enumerate(shape)]
        elif policy != "stretch":
            raise node.refuse(f"keep_aspect_ratio_policy {policy!r}")
        return scale, size, True
    if scales is None:
        raise node.refuse("neither scales nor sizes")
    scale = [1.0] * rank
    for a, f in zip(axes, np.asarray(scales).reshape(-1), strict=True):
        scale[a] = float(f)
    if scale[:2] != [1.0, 1.0]:
        raise node.refuse(f"scales {scale} that change the batch or the channels")
    for d, f in zip(shape[2:], scale[2:], strict=True):
        # onnxruntime counts the output in float32, torch and onnx's reference in double
        ort, own = int(np.float32(d) * np.float32(f)), math.floor(int(d) * f)
        if ort != own:
            raise node.refuse(
                f"scale {f} of an axis of {d}: onnxruntime makes {ort} values, torch "
                f"{own} (float32 and double); give sizes instead"
            )
    size = [math.floor(int(d) * f) for d, f in zip(shape[2:], scale[2:], strict=True)]
    return scale, [*shape[:2], *size], False


def _source(how: str, at: int, scale: float, n_in: int, n_out: int) -> float:
    """The input coordinate ONNX maps output position ``at`` of an axis to."""
    width = scale * n_in
    if how == "align_corners":
        return 0.0 if width == 1 else at * (n_in - 1) / (width - 1)
    if how == "asymmetric":
        return at / scale
    if how == "pytorch_half_pixel" and width == 1:
        return -0.5
    offset = n_in / 2 * (1 - n_out / width) if how == "half_pixel_symmetric" else 0.0
    return offset + (at + 0.5) / scale - 0.5


def _nearest(how: str, rounding: str, scale: float, n_in: int, n_out: int) -> list[int]:
    """The input position each output position of an axis copies (ONNX's nearest_mode: ties
    of round_prefer_floor go down, of round_prefer_ceil up), kept inside the axis."""
    out = []
    for at in range(n_out):
        x = _source(how, at, scale, n_in, n_out)
        below = math.floor(x)
        ratio = x - below
        up = ratio > 0 and (
            rounding == "ceil"
            or rounding == "round_prefer_floor"
            and ratio > 0.5
            or rounding == "round_prefer_ceil"
            and ratio >= 0.5
        )
        out.append(min(max(below + up, 0), n_in - 1))
    return out


_COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners")
_ROUNDINGS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@onnx_op("Resize")
def _resize(node, ins):
    """nearest: each axis's copies (an index_select of positions known when it compiles, any
    coordinate transformation and rounding but tf_crop_and_resize's); linear: torch's
    interpolate (half_pixel, pytorch_half_pixel or aligned corners)."""
    x = tensor(node, ins[0])
    mode = text(node.attr("mode", "nearest"))
    how = text(node.attr("coordinate_transformation_mode", "half_pixel"))
    for name in ("antialias", "exclude_outside"):
        if node.attr(name, 0):
            raise node.refuse(f"{name}={node.attr(name)}")
    scale, size, given = _resize_target(node, x, ins)
    if mode == "nearest":
        rounding = text(node.attr("nearest_mode", "round_prefer_floor"))
        if how not in (*_COORDINATES, "asymmetric") or rounding not in _ROUNDINGS:
            raise node.refuse(f"nearest with {how} coordinates, {rounding}")
        for a in range(2, x.dim()):
            n_in = int(x.shape[a])
            index = _nearest(how, rounding, scale[a], n_in, int(size[a]))
            if index != list(range(n_in)):
                x = torch.index_select(x, a, torch.tensor(index))
        return x
    if mode != "linear" or how not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        raise node.refuse(f"mode {mode!r} with {how} coordinates")
    kind = {3: "linear", 4: "bilinear"}.get(x.dim())
    if kind is None:
        raise node.refuse(f"linear resizing of {x.dim() - 2}-d data")
    for a in range(2, x.dim()):
        n_in, n_out = int(x.shape[a]), int(size[a])
        if how == "pytorch_half_pixel" and n_out == 1 and n_in != 1:  # half_pixel's but there
            raise node.refuse("pytorch_half_pixel coordinates to a size of 1")
        if given and not math.isclose(scale[a] * n_in, n_out, rel_tol=1e-12):
            # (torch maps positions by the sizes' ratio, ONNX by the policy's scale)
            raise node.refuse(f"linear resizing of {n_in} to {n_out} by a scale of {scale[a]}")
    kw = {"size": size[2:]} if given else {"scale_factor": scale[2:]}
    return F.interpolate(x, mode=kind, align_corners=how == "align_corners", **kw)


@onnx_op("GatherND")
def _gather_nd(node, ins):
    data, index = tensor(node, ins[0]), tensor(node, ins[1])
    if node.attr("batch_dims", 0):
        raise node.refuse(f"batch_dims={node.attr('batch_dims')}")
    k = index.shape[-1]
    return data[tuple(index[..., i] for i in range(k))]


@onnx_op("ScatterND")
def _scatter_nd(node, ins):
    data, index, updates = ins
    if text(node.attr("reduction", "none")) != "none":
        raise node.refuse(f"reduction {node.attr('reduction')!r}")
    data, index = tensor(node, data), tensor(node, index)
    k = index.shape[-1]
    if tuple(tensor(node, updates).shape) != (*index.shape[:-1], *data.shape[k:]):
        raise node.refuse(
            f"updates of shape {tuple(updates.shape)} for indices of shape "
            f"{tuple(index.shape)} into {tuple(data.shape)}"
        )
    flat = index.reshape(-1, k)
    out = data.clone()
    out[tuple(flat[:, i] for i in range(k))] = tensor(node, updates, data).reshape(
        flat.shape[0], *data.shape[k:]
    )
    return out
