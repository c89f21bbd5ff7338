"""Indexing across the whole batch, as weaver's ParticleNet writes its neighbours' features:

    idx_base = torch.arange(0, batch_size, device=x.device).view(-1, 1, 1) * num_points
    idx = (idx + idx_base).view(-1)              # topk's indices, numbered across the batch
    fts = x.transpose(2, 1).reshape(-1, num_dims)  # the points of every sample, as rows
    fts = fts[idx, :].view(batch_size, num_points, k, num_dims)

Sample b's indices are offset by b * num_points, and its rows start at row b * num_points:
each sample reads its own rows only, which is a per-sample ``gather``. This module follows
those values, holding each per sample: the batch offsets (``arange`` over the batch size,
times a number), topk's indices plus them, flattened, the rows of a value whose batch axis is
merged with its first per-sample axis, the rows taken by such indices, and the ``view`` that
gives the batch axis back. The offsets' stride must be the rows' count per sample (else a
sample would read another's rows); any other use of these values is refused naming the node.
"""

from __future__ import annotations

import math
import operator

import torch

from rootclad.frontends import fx_slicing, fx_values
from rootclad.ir.graph import IRError, Node

_VIEWS = ("view", "reshape", "flatten", "unsqueeze")


def is_batch_arange(low, n) -> bool:
    """torch.arange(0, B) or arange(B), B the batch size (it follows the batch size)."""
    if n.op != "call_function" or n.target is not torch.arange:
        return False
    args = list(n.args)
    if n.kwargs.get("step", 1) != 1 or len(args) not in (1, 2) or (len(args) == 2 and args[0]):
        return False
    end = args[-1] if args else n.kwargs.get("end")
    return (
        isinstance(end, torch.fx.Node)
        and fx_values.is_static(end)
        and end.meta.get("rc_value") == low.batch
        and end.meta.get("rc_value_alt") == low.batch + 1
    )


def _name(n) -> str:
    return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")


def lower(low, fx_node) -> bool:
    """Lower ``fx_node`` where it makes or reads one of the values above; False otherwise."""
    if fx_node.op not in ("call_function", "call_method", "call_module", "output"):
        return False
    if fx_values.is_static(fx_node):  # fts.size(-1): a number
        return False
    where = f"fx node {fx_node.name!r} ({_name(fx_node)})"
    if is_batch_arange(low, fx_node):
        low.offsets[fx_node.name] = 1
        return True
    held = [a for a in fx_node.all_input_nodes
            if a.name in low.offsets or a.name in low.merged]  # fmt: skip
    if not held:
        return fx_node.op != "call_module" and _merge_rows(low, fx_node)
    x = held[0]
    if x.name in low.offsets:
        return _offsets(low, fx_node, x, where)
    kind = low.merged[x.name][0]
    if kind == "global" and _name(fx_node) in _VIEWS and len(low.shape(fx_node)) == 1:
        _, idx, stride, axis = low.merged[x.name]
        count = math.prod(low.shape(x)[1:])
        name = f"{fx_node.name}__indices"
        low.nodes.append(Node(name, "reshape", [idx], name, {"shape": (count,)}))
        low.merged[fx_node.name] = ("index", name, stride, axis)
        return True
    if kind == "rows" and fx_slicing.is_getitem(fx_node) and fx_node.args[0] is x:
        return _take(low, fx_node, x, where)
    if kind == "rows" and _name(fx_node) in ("view", "reshape") and not _fixed_batch(fx_node):
        out = low.shape(fx_node)
        _, value, _ = low.merged[x.name]
        if out and out[0] == low.batch and math.prod(out) == math.prod(low.shape(x)):
            low.add(fx_node.name, "reshape", [_Value(value)], {"shape": tuple(out[1:])})
            return True
    if kind == "rows" and fx_slicing.is_getitem(x):
        raise IRError(f"{where}: takes {x.name!r}, rows taken across the batch (rows[idx, :]); "
                      "rootclad follows them only into a view that gives the batch axis back, "
                      "its size x.size(0) or -1 (.view(B, N, k, C))")  # fmt: skip
    if kind == "rows":
        src = x.args[0]
        raise IRError(f"fx node {x.name!r} ({_name(x)}) gives shape {tuple(low.shape(x))} from "
                      f"{tuple(low.shape(src))}: the batch axis must stay first and whole (use "
                      "x.size(0) or -1); rootclad follows such rows only into rows[idx, :] by "
                      f"topk's indices plus the batch offsets (weaver's), not into {where}")  # fmt: skip
    raise IRError(f"{where}: takes {x.name!r}, topk's indices numbered across the batch "
                  "(weaver's idx + idx_base); rootclad follows them only flattened (view(-1)) "
                  "into rows[idx, :]")  # fmt: skip


def _fixed_batch(fx_node) -> bool:
    """view / reshape whose batch size is a number written in the model (not x.size(0), -1):
    the model would mix samples at another batch size."""
    spec = list(fx_node.args[1:])
    if len(spec) == 1 and isinstance(spec[0], (tuple, list)):
        spec = list(spec[0])
    return bool(spec) and isinstance(spec[0], int) and spec[0] != -1


class _Value:
    """An IR value by name, where :meth:`add` takes fx nodes."""

    def __init__(self, name: str):
        self.name = name


def _offsets(low, fx_node, x, where) -> bool:
    """The batch offsets: reshaped to (B, 1, ...), times a number, or added to topk's
    indices."""
    stride = low.offsets[x.name]
    name = _name(fx_node)
    if fx_node.op == "output" or not low.is_tensor(fx_node):
        raise IRError(f"{where}: takes {x.name!r}, offsets over the batch (torch.arange(0, B)); "
                      "rootclad compiles them reshaped, times a number of rows, and added to "
                      "topk's indices")  # fmt: skip
    out = low.shape(fx_node)
    if name in _VIEWS and out and out[0] == low.batch and math.prod(out) == low.batch:
        low.offsets[fx_node.name] = stride
        return True
    other = [a for a in fx_node.args if a is not x]
    if name in ("mul", "__mul__") or fx_node.target is operator.mul:
        (n,) = fx_values.substitute(other) if len(other) == 1 else (None,)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            low.offsets[fx_node.name] = stride * n
            return True
    if name in ("add", "__add__") or fx_node.target is operator.add:
        idx = other[0] if len(other) == 1 else None
        if getattr(idx, "name", None) in low.index_values:
            shape = tuple(low.shape(idx))
            # (B, 1, ..., 1) against indices of as many axes: each sample its own offset
            if tuple(low.shape(x)) == (low.batch,) + (1,) * (len(shape) - 1) and out == shape:
                low.merged[fx_node.name] = ("global", idx.name, stride, _topk_axis(idx))
                return True
    raise IRError(f"{where}: takes {x.name!r}, offsets over the batch (torch.arange(0, B)); "
                  "rootclad compiles them reshaped, times a number of rows, and added to "
                  "topk's indices")  # fmt: skip


def _topk_axis(idx) -> int | None:
    """The length of the axis the topk whose indices ``idx`` holds ran over (its indices lie
    below it), following the layout ops back; None where not found."""
    n = idx
    while n is not None and not (fx_slicing.is_getitem(n) and _name(n.args[0]) == "topk"):
        n = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
    if n is None:
        return None
    topk = n.args[0]
    x = topk.args[0]
    dim = topk.args[2] if len(topk.args) > 2 else topk.kwargs.get("dim", -1)
    return int(x.meta["tensor_meta"].shape[fx_values.substitute(dim)])


def _merge_rows(low, fx_node) -> bool:
    """x.reshape(-1, C): a value (B, R, *rest) as the rows (B * R, *rest)."""
    if _name(fx_node) not in ("view", "reshape") or not low.is_tensor(fx_node.args[0]):
        return False
    if _fixed_batch(fx_node):  # x.reshape(20, C): refused by fx_layout
        return False
    x = fx_node.args[0]
    shape, out = low.shape(x), low.shape(fx_node)
    if len(shape) < 2 or shape[0] != low.batch or not out or out[0] == low.batch:
        return False
    if out[0] != low.batch * shape[1] or tuple(out[1:]) != tuple(shape[2:]):
        return False
    if x.name in low.index_values or x.name in low.swapped:
        return False
    low.merged[fx_node.name] = ("rows", x.name, shape[1])
    return True


def _take(low, fx_node, rows, where) -> bool:
    """rows[idx] / rows[idx, :]: each sample's indices read its own rows (a gather)."""
    spec = fx_node.args[1]
    spec = spec if isinstance(spec, tuple) else (spec,)
    index, rest = spec[0], spec[1:]
    if any(s != slice(None) for s in rest) or getattr(index, "name", None) not in low.merged:
        raise IRError(f"{where}: indexes rows numbered across the batch by {spec!r}; rootclad "
                      "takes rows[idx] and rows[idx, :] by topk's indices plus the batch "
                      "offsets")  # fmt: skip
    entry = low.merged[index.name]
    _, value, count = low.merged[rows.name]
    if entry[0] != "index":
        raise IRError(f"{where}: indexes by {index.name!r}, topk's indices numbered across the "
                      "batch; rootclad follows them only flattened (view(-1)) into rows[idx, :]")  # fmt: skip
    _, idx, stride, axis = entry
    if axis is None or axis > count:
        raise IRError(f"{where}: indices of a topk over {axis} values, offset by {count} a "
                      "sample: a sample would read another's rows")  # fmt: skip
    if stride != count:
        raise IRError(f"{where}: indices offset by {stride} a sample read rows of {count} a "
                      "sample; each sample would read another's rows")  # fmt: skip
    per_row = math.prod(low.shape(rows)[1:])
    m = math.prod(low.shape(index)) // low.batch
    name = fx_node.name
    nodes = [
        Node(f"{name}__rows", "reshape", [value], f"{name}__rows", {"shape": (count, per_row)}),
        Node(f"{name}__col", "reshape", [idx], f"{name}__col", {"shape": (m, 1)}),
        Node(f"{name}__idx", "expand", [f"{name}__col"], f"{name}__idx", {"shape": (m, per_row)}),
        Node(f"{name}__taken", "gather", [f"{name}__rows", f"{name}__idx"], f"{name}__taken",
             {"axis": 0}),
    ]  # fmt: skip
    low.nodes.extend(nodes)
    low.merged[name] = ("rows", f"{name}__taken", m)
    return True
