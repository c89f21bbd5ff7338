"""Shape ops: views of their input (reshape, identity), copies (permute, cat, slice,
expand), and indexing by computed indices (topk's indices, gather by them)."""

from __future__ import annotations

import math

from rootclad.ir.graph import expect
from rootclad.ir.ops.binary import MAX_BROADCAST_DIMS, broadcast_geometry
from rootclad.ir.ops.common import numel, same_shape
from rootclad.ir.registry import OpSpec, register

MAX_PERMUTE_AXES = 4  # the permute kernels' (ops/shape.h) most per-sample axes


def _reshape_infer(node, shapes, graph):
    (shape,) = shapes
    target = list(node.attrs["shape"])
    expect(target.count(-1) <= 1, node, f"shape {tuple(target)} has more than one -1")
    known = math.prod(d for d in target if d != -1)
    if -1 in target:
        expect(
            known > 0 and numel(shape) % known == 0,
            node,
            f"cannot reshape per-sample shape {shape} to {tuple(target)}",
        )
        target[target.index(-1)] = numel(shape) // known
    expect(
        math.prod(target) == numel(shape),
        node,
        f"cannot reshape per-sample shape {shape} ({numel(shape)} values) to {tuple(target)}",
    )
    return tuple(target)


register(
    OpSpec(
        "reshape",
        "shape",
        "reshape / view / flatten of the per-sample shape (no copy)",
        _reshape_infer,
        view=True,
        saves=(),
    )
)
register(
    OpSpec(
        "identity",
        "shape",
        "Identity (no copy)",
        same_shape,
        view=True,
        saves=(),
        modules=("Identity",),
    )
)


def merged_permutation(shape, perm):
    """The same copy over the fewest axes: size-1 axes dropped, and axes that stay neighbours in
    order merged into one (Swin's (0, 2, 1, 3, 4) of 5 axes is (0, 2, 1, 3) of 4). The data are
    laid out alike, so the kernels run the merged form."""
    kept = [a for a in range(len(shape)) if shape[a] != 1]
    renumber = {a: i for i, a in enumerate(kept)}
    shape = [shape[a] for a in kept]
    perm = [renumber[p] for p in perm if p in renumber]
    runs = []  # runs of input axes, in output order
    for p in perm:
        if runs and runs[-1][-1] + 1 == p:
            runs[-1].append(p)
        else:
            runs.append([p])
    by_input = sorted(range(len(runs)), key=lambda r: runs[r][0])
    merged_shape = tuple(math.prod(shape[a] for a in runs[r]) for r in by_input)
    position = {r: i for i, r in enumerate(by_input)}
    merged_perm = tuple(position[r] for r in range(len(runs)))
    return (merged_shape or (1,)), (merged_perm or (0,))


def _permute_infer(node, shapes, graph):
    (shape,) = shapes
    perm = node.attrs["perm"]
    expect(
        sorted(perm) == list(range(len(shape))),
        node,
        f"permutation {tuple(perm)} of the per-sample axes does not fit shape {shape}",
    )
    merged, _ = merged_permutation(shape, perm)
    expect(
        len(merged) <= MAX_PERMUTE_AXES,
        node,
        f"at most {MAX_PERMUTE_AXES} per-sample axes can be permuted (after merging the axes "
        f"that stay neighbours and dropping those of size 1), got {tuple(perm)} of {shape}",
    )
    return tuple(shape[p] for p in perm)


register(
    OpSpec(
        "permute",
        "shape",
        "permute / transpose of per-sample axes (a copy)",
        _permute_infer,
        saves=(),
    )
)


def _cat_infer(node, shapes, graph):
    dim = node.attrs["axis"]
    first = shapes[0]
    expect(0 <= dim < len(first), node, f"axis {dim} is not a per-sample axis of {first}")
    for s in shapes[1:]:
        expect(
            len(s) == len(first)
            and all(x == y for i, (x, y) in enumerate(zip(s, first, strict=True)) if i != dim),
            node,
            f"cannot concatenate per-sample shapes {[tuple(x) for x in shapes]} along axis "
            f"{dim} (the batch axis excluded): the other axes must agree",
        )
    return tuple(sum(s[dim] for s in shapes) if i == dim else d for i, d in enumerate(first))


register(
    OpSpec(
        "cat",
        "shape",
        "torch.cat of tensors along a per-sample axis",
        _cat_infer,
        arity=None,
        saves=(),
    )
)


def _slice_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    axis, start, stop, step = a["axis"], a["start"], a["stop"], a["step"]
    expect(0 <= axis < len(shape), node, f"axis {axis} is not a per-sample axis of {shape}")
    expect(
        step >= 1 and 0 <= start < stop <= shape[axis],
        node,
        f"slice {start}:{stop}:{step} does not fit axis {axis} of per-sample shape {shape}",
    )
    return tuple(len(range(start, stop, step)) if i == axis else d for i, d in enumerate(shape))


register(
    OpSpec(
        "slice",
        "shape",
        "x[:, a:b:s] and Tensor.chunk / split / unbind along a per-sample axis (a copy)",
        _slice_infer,
        saves=(),
    )
)


def _pad_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    axis, before, after = a["axis"], a["before"], a["after"]
    expect(0 <= axis < len(shape), node, f"axis {axis} is not a per-sample axis of {shape}")
    value = a.get("value")
    expect(before >= 0 and after >= 0 and isinstance(value, float) and math.isfinite(value),
           node, f"padding ({before}, {after}) with value {value!r}: two counts of at least 0 "
           "and a finite number")  # fmt: skip
    return tuple(before + d + after if i == axis else d for i, d in enumerate(shape))


register(
    OpSpec(
        "pad",
        "shape",
        "F.pad / ONNX Pad with a constant along a per-sample axis (the adjoint of a slice)",
        _pad_infer,
        saves=(),
    )
)


def pad_steps(shape, pads, value: float = 0.0) -> list[tuple[str, dict]]:
    """The ``slice`` and ``pad`` nodes (op, attrs) that pad per-sample ``shape`` by ``pads``,
    one (before, after) per axis, as F.pad and ONNX Pad do: a negative count crops."""
    steps = []
    for axis, ((before, after), n) in enumerate(zip(pads, shape, strict=True)):
        if before < 0 or after < 0:
            start, stop = max(-before, 0), n - max(-after, 0)
            steps.append(("slice", {"axis": axis, "start": start, "stop": stop, "step": 1}))
        if before > 0 or after > 0:
            steps.append(("pad", {"axis": axis, "before": max(before, 0),
                                  "after": max(after, 0), "value": float(value)}))  # fmt: skip
    return steps


def _parameter_infer(node, shapes, graph):
    names = [*node.params.values(), *node.buffers.values()]
    expect(len(names) == 1, node, "reads one parameter (weight) or buffer (value)")
    w = graph.param(names[0])
    shape, start = tuple(node.attrs["shape"]), node.attrs.get("start", 0)
    expect(
        start + math.prod(shape) <= math.prod(w.shape) and start >= 0,
        node,
        f"values [{start}, {start + math.prod(shape)}) of a tensor of shape {w.shape}",
    )
    expect(
        "start" in node.attrs or math.prod(shape) == math.prod(w.shape),
        node,
        f"parameter of shape {w.shape} read as per-sample shape {shape}",
    )
    return shape


register(
    OpSpec(
        "parameter",
        "shape",
        "a parameter or buffer read directly (layer scale, class token, position embedding), or "
        "a contiguous block of it (pe[:, :L]): the same value for every sample",
        _parameter_infer,
        arity=0,
        params=("weight",),
        buffers=("value",),
        saves=(),
    )
)


def _expand_infer(node, shapes, graph):
    (shape,) = shapes
    out = tuple(node.attrs["shape"])
    expect(
        len(out) == len(shape) and all(d == o or d == 1 for d, o in zip(shape, out, strict=True)),
        node,
        f"cannot expand per-sample shape {shape} to {out}: only axes of size 1 grow",
    )
    dims, _, _ = broadcast_geometry(out, shape, out)
    expect(len(dims) <= MAX_BROADCAST_DIMS, node, f"expanding {shape} to {out} needs "
           f"{len(dims)} loop axes; at most {MAX_BROADCAST_DIMS} are supported")  # fmt: skip
    return out


register(
    OpSpec(
        "expand",
        "shape",
        "Tensor.expand / expand_as / repeat of size-1 axes of a value (a copy; its gradient "
        "sums over the copies)",
        _expand_infer,
        saves=(),
    )
)


def gather_geometry(node):
    """(P, N, M, Q) of gather: x(P, N, Q) and index / out(P, M, Q) per sample, N and M the
    gathered axis of x and of the index."""
    x, idx, axis = node.in_shapes[0], node.in_shapes[1], node.attrs["axis"]
    return numel(x[:axis]), x[axis], idx[axis], numel(x[axis + 1 :])


def _gather_infer(node, shapes, graph):
    x, idx = shapes
    axis = node.attrs["axis"]
    expect(0 <= axis < len(x), node, f"axis {axis} is not a per-sample axis of {x}")
    expect(
        len(idx) == len(x)
        and all(
            a == b for i, (a, b) in enumerate(zip(x, idx, strict=True)) if i != axis
        ),  # fmt: skip
        node,
        f"index of per-sample shape {idx} for values {x}: the index must match the values on "
        f"every axis but {axis} (expand it: idx.expand(...)); torch's smaller index is not "
        "supported",
    )
    return tuple(idx)


register(
    OpSpec(
        "gather",
        "shape",
        "torch.gather(x, dim, index) of a per-sample axis, by indices that topk computed; the "
        "gradient reaches x (summed where positions are gathered twice), none the indices",
        _gather_infer,
        arity=2,
        saves=("in",),
    )
)


def _topk_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    axis, k = a["axis"], a["k"]
    expect(0 <= axis < len(shape), node, f"axis {axis} is not a per-sample axis of {shape}")
    expect(1 <= k <= shape[axis], node, f"k={k} of an axis of {shape[axis]} values")
    expect(isinstance(a.get("largest"), bool), node, "topk needs attr 'largest' (a bool)")
    return tuple(k if i == axis else d for i, d in enumerate(shape))


register(
    OpSpec(
        "topk",
        "shape",
        "the indices of Tensor.topk (sorted; NaN largest, ties to the lower index), held as "
        "exact integers; they carry no gradient (topk's values are a gather by them)",
        _topk_infer,
        saves=(),
    )
)
