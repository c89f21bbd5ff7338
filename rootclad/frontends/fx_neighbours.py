"""Neighbours in a traced model: ``Tensor.topk``'s indices and ``torch.gather`` by them (the k
nearest neighbours of a point cloud, as ParticleNet's EdgeConv finds them), and ``expand`` /
``expand_as`` / ``repeat`` of a value's size-1 axes.

topk becomes the IR's ``topk`` op, its indices held as exact integers of the model's type
with no gradient; its values, where taken, are a ``gather`` by those indices, so their
gradient reaches the selected places as torch's does. Between topk and the gather that reads
them, the indices may only be sliced, reshaped, permuted and expanded: any other use (an
arithmetic on them, ``x[idx]``, a float op) is refused naming the node, so no index the
kernels did not compute is ever read.
"""

from __future__ import annotations

import builtins
import math
import operator

from rootclad.frontends import fx_slicing, fx_values
from rootclad.ir.graph import IRError, Node

# what may come between topk and the gather that reads its indices
_LAYOUT = {"reshape", "view", "flatten", "expand", "expand_as", "repeat", "unsqueeze",
           "squeeze", "contiguous", "permute", "transpose", "getitem"}  # fmt: skip


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def lower(low, fx_node) -> bool:
    """Lower ``fx_node`` where it is topk, a gather, or takes topk's values or indices;
    False where it is none of this module's (the indices' layout ops are then lowered as any
    value's, and remembered as indices)."""
    if fx_node.op not in ("call_function", "call_method", "call_module", "output"):
        return False
    name = _name(fx_node.target)
    where = f"fx node {fx_node.name!r} ({name})"
    held = [a for a in fx_node.all_input_nodes if a.name in low.index_values]
    if name == "topk" and fx_node.args and low.is_tensor(fx_node.args[0]):
        return _topk(low, fx_node, where)
    if name in ("max", "min") and _max_over_dim(fx_node) and low.is_tensor(fx_node.args[0]):
        return _max(low, fx_node, where, name == "min")
    if fx_node.op == "call_function" and fx_node.target is builtins.getattr:
        src, attr = fx_node.args
        if src.name in low.topks and attr in ("values", "indices"):
            fx_node.target, fx_node.args = (
                operator.getitem,
                (src, ("values", "indices").index(attr)),
            )
    if fx_slicing.is_getitem(fx_node) and fx_node.args[0].name in low.topks:
        if fx_node.args[1] == 1:
            low.index_values.add(fx_node.name)
        return False  # the tuple's value, by fx_slicing
    if name == "gather":
        return _gather(low, fx_node, where)
    if name == "cdist" and fx_node.op == "call_function":
        return _cdist(low, fx_node, where)
    if not held or fx_values.is_static(fx_node):  # idx.size(-1): a number
        return False
    if fx_slicing.is_getitem(fx_node) and fx_node.args[0] not in held:  # x[:, idx]
        raise IRError(f"{where}: indexes by {held[0].name!r}, the indices of a topk; rootclad "
                      "reads them only through torch.gather")  # fmt: skip
    if fx_node.op in ("call_function", "call_method") and name in _LAYOUT:
        if any(a.name not in low.index_values for a in fx_node.all_input_nodes
               if low.is_tensor(a)):  # fmt: skip
            raise IRError(f"{where}: mixes topk's indices {held[0].name!r} with other values")
        low.index_values.add(fx_node.name)
        return False
    raise IRError(
        f"{where}: takes {held[0].name!r}, the indices of a topk; rootclad reads them only "
        "through torch.gather (after slicing, reshaping, permuting or expanding them)"
    )


def _max_over_dim(fx_node) -> bool:
    """x.max(dim) / torch.max(x, dim): (values, indices) of a maximum along an axis."""
    return (len(fx_node.args) > 1 and isinstance(fx_node.args[1], int)) or "dim" in fx_node.kwargs


def _max(low, fx_node, where, minimum=False) -> bool:
    """The values of x.max(dim, keepdim): torch gives the gradient to the index it returns,
    the first maximum; here a max pooling over the axis (permuted last, the rest as rows),
    which does too (for a NaN, the last NaN where torch's max takes the first). x.min(dim):
    -max(-x), the first minimum. Its indices are refused where used."""
    args, kw = fx_values.substitute(list(fx_node.args)), fx_values.substitute(dict(fx_node.kwargs))
    x = args[0]
    dim = args[1] if len(args) > 1 else kw["dim"]
    keepdim = args[2] if len(args) > 2 else kw.get("keepdim", False)
    shape = tuple(low.shape(x)[1:])
    axis = low.axis(dim, x, where)
    rest = [a for a in range(len(shape)) if a != axis]
    name, src = fx_node.name, x.name
    if minimum:
        low.nodes.append(Node(f"{name}__neg", "affine", [src], f"{name}__neg",
                              {"scale": -1.0, "shift": 0.0}))  # fmt: skip
        src = f"{name}__neg"
    if rest + [axis] != list(range(len(shape))):
        low.nodes.append(Node(f"{name}__permuted", "permute", [src], f"{name}__permuted",
                              {"perm": tuple(rest + [axis])}))  # fmt: skip
        src = f"{name}__permuted"
    rows = math.prod(shape[a] for a in rest)
    low.nodes.append(Node(f"{name}__rows", "reshape", [src], f"{name}__rows",
                          {"shape": (rows, shape[axis])}))  # fmt: skip
    low.nodes.append(Node(f"{name}__max", "adaptive_maxpool", [f"{name}__rows"], f"{name}__max",
                          {"output_size": (1,)}))  # fmt: skip
    out = tuple(1 if a == axis else d for a, d in enumerate(shape)) if keepdim else tuple(
        shape[a] for a in rest)  # fmt: skip
    values = f"{name}__values"
    low.nodes.append(Node(values, "reshape", [f"{name}__max"], values, {"shape": out or (1,)}))
    if minimum:
        low.nodes.append(Node(f"{name}__min", "affine", [values], f"{name}__min",
                              {"scale": -1.0, "shift": 0.0}))  # fmt: skip
        values = f"{name}__min"
    low.tuples[name] = [values, None]
    low.topks.add(name)  # .values / .indices as [0] / [1]
    return True


def _topk(low, fx_node, where) -> bool:
    args = fx_values.substitute(list(fx_node.args))
    kw = fx_values.substitute(dict(fx_node.kwargs))
    x = args[0]
    k = args[1] if len(args) > 1 else kw.get("k")
    dim = args[2] if len(args) > 2 else kw.get("dim", -1)
    largest = args[3] if len(args) > 3 else kw.get("largest", True)
    if not isinstance(k, int) or not isinstance(largest, bool):
        raise IRError(f"{where}: k={k!r} and largest={largest!r} must be a number and a bool "
                      "fixed when the model is compiled")  # fmt: skip
    # sorted=False: torch leaves the order unspecified; rootclad's sorted order is one of them
    idx = f"{fx_node.name}__indices"
    low.add(idx, "topk", [x], {"k": k, "largest": largest, "axis": low.axis(dim, x, where)})
    values = None
    if any(_takes(u, 0, "values") for u in fx_node.users):
        values = f"{fx_node.name}__values"
        low.nodes.append(_gather_node(values, x.name, idx, low.axis(dim, x, where)))
    low.tuples[fx_node.name] = [values, idx]
    low.topks.add(fx_node.name)
    return True


def _takes(user, index: int, attr: str) -> bool:
    if fx_slicing.is_getitem(user):
        return user.args[1] == index
    return user.target is builtins.getattr and user.args[1] == attr


def _gather_node(name, x, idx, axis):
    return Node(name, "gather", [x, idx], name, {"axis": axis})


def _gather(low, fx_node, where) -> bool:
    args = fx_values.substitute(list(fx_node.args))
    kw = fx_values.substitute(dict(fx_node.kwargs))
    x = args[0] if args else kw.get("input")
    dim = args[1] if len(args) > 1 else kw.get("dim")
    index = args[2] if len(args) > 2 else kw.get("index")
    if kw.get("sparse_grad"):
        raise IRError(f"{where}: sparse_grad=True is not supported")
    if not low.is_tensor(x) or not low.is_tensor(index):
        raise IRError(f"{where}: gathers something other than a tensor")
    if index.name not in low.index_values:
        raise IRError(f"{where}: its index {index.name!r} is not computed by a topk; rootclad "
                      "gathers by topk's indices only")  # fmt: skip
    if x.name in low.index_values:
        raise IRError(f"{where}: gathers from {x.name!r}, topk's indices; gather the values")
    low.nodes.append(_gather_node(fx_node.name, x.name, index.name, low.axis(dim, x, where)))
    return True


def _cdist(low, fx_node, where) -> bool:
    """torch.cdist(x1, x2) of points (B, P, M) and (B, R, M), p=2 (every compute_mode: torch's
    products and rootclad's differences round otherwise, by far less than the distances)."""
    args = fx_values.substitute(list(fx_node.args))
    kw = fx_values.substitute(dict(fx_node.kwargs))
    a = args[0] if args else kw.get("x1")
    b = args[1] if len(args) > 1 else kw.get("x2")
    p = args[2] if len(args) > 2 else kw.get("p", 2.0)
    if p != 2:
        raise IRError(f"{where}: p={p!r}; rootclad computes Euclidean distances (p=2)")
    for x in (a, b):
        if not low.is_tensor(x) or len(low.shape(x)) != 3 or low.shape(x)[0] != low.batch:
            raise IRError(f"{where}: cdist of {getattr(x, 'name', x)!r}; rootclad takes points "
                          "(B, P, M) of the model's values, the batch axis first")  # fmt: skip
    low.add(fx_node.name, "cdist", [a, b])
    return True


def lower_expand(low, fx_node, name, args, where) -> None:
    """``x.expand(B, ...)`` / ``expand_as`` / ``repeat`` of a value's size-1 per-sample axes
    (the batch axis kept whole), as the IR's ``expand`` (a copy)."""
    x = args[0]
    shape, out = low.shape(x), low.shape(fx_node)
    if name == "repeat":
        reps = list(args[1] if len(args) == 2 and isinstance(args[1], (tuple, list))
                    else args[1:])  # fmt: skip
        if (
            len(reps) != len(shape)
            or reps[0] != 1
            or any(r != 1 and d != 1 for r, d in zip(reps, shape, strict=True))
        ):
            raise IRError(f"{where}: repeat{tuple(reps)} of shape {shape}: only axes of size 1 "
                          "may be repeated, and the batch axis not")  # fmt: skip
    elif len(out) != len(shape) or out[0] != shape[0]:
        raise IRError(f"{where}: expand of shape {shape} to {out}: the batch axis must stay "
                      "first and whole (x.expand(x.size(0), ...) or -1)")  # fmt: skip
    low.add(fx_node.name, "identity" if out == shape else "expand", [x],
            {} if out == shape else {"shape": out[1:]})  # fmt: skip
