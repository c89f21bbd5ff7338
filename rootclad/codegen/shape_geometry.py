"""The geometry of the shape ops' kernels (ops/shape.h, device/shape.h): what the CPU's calls
(cpu_ops.py) and the device's (cuda_ops.py) pass them, from a node's shapes and attributes."""

from __future__ import annotations

import math

from rootclad.ir.ops.shape import merged_permutation


def _n(shape) -> int:
    return math.prod(shape)


def permute_geometry(node):
    """Output dims and per-axis input strides over the fewest axes, padded to 4 axes."""
    shape, perm = merged_permutation(node.in_shape, node.attrs["perm"])
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    dims = [shape[p] for p in perm]
    st = [strides[p] for p in perm]
    pad = 4 - len(dims)
    return [1] * pad + dims, [0] * pad + st


def cat_parts(node):
    """Rows per sample, the output's row length, and (row length, offset) of each input."""
    dim = node.attrs["axis"]
    parts, off = [], 0
    for s in node.in_shapes:
        parts.append((_n(s[dim:]), off))
        off += _n(s[dim:])
    return _n(node.out_shape[:dim]), _n(node.out_shape[dim:]), parts


def slice_geometry(node):
    """Rows per sample, then N, M, I, start, step of slice_forward (ops/shape.h)."""
    shape, a = node.in_shape, node.attrs
    axis = a["axis"]
    rows, inner = _n(shape[:axis]), _n(shape[axis + 1 :])
    return rows, (shape[axis], node.out_shape[axis], inner, a["start"], a["step"])


def pad_geometry(node):
    """Rows per sample, then M, N, I, before of pad_forward (ops/shape.h)."""
    shape, axis = node.in_shape, node.attrs["axis"]
    rows, inner = _n(shape[:axis]), _n(shape[axis + 1 :])
    return rows, (shape[axis], node.out_shape[axis], inner, node.attrs["before"])
