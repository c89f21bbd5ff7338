"""Slicing in a traced model, lowered to the IR's ``slice`` op (a copy of a strided range
along one per-sample axis) and ``reshape``.

- ``x[:, a:b]``, ``x[..., ::2]``, ``x[:, 0]``, ``x[:, None]``: one ``slice`` per sliced axis,
  then a reshape where an integer index drops an axis or ``None`` adds one;
- ``x.chunk(n, dim)``, ``x.split(size_or_sizes, dim)``, ``x.unbind(dim)`` (methods and
  ``torch.*`` functions): fx records the call, which gives a tuple, and one ``getitem`` per
  piece used; the call itself lowers to nothing, each ``getitem`` to the ``slice`` of its piece.
  The pieces' sizes are the ones torch's own run of the example gave.

The batch axis is never indexed: it stays whole and first. A tensor whose batch axis torch
puts second (a sequence with batch_first=False, h_n / c_n) is held per sample as a
:class:`Swapped` (fx_recurrent.py makes and takes them; fx_attention.py's layers too).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from rootclad.frontends import fx_values
from rootclad.ir.graph import IRError, Node


@dataclass
class Swapped:
    """A tensor whose batch axis is torch's axis 1: per sample, ``n`` rows of shape
    ``sample``, as one value (n, *sample) or as one (1, *sample) value per row, whichever was
    made; the other is made (once) when asked for."""

    n: int
    sample: tuple
    whole: str | None = None
    rows: list | None = None

    def value(self, emit) -> str:
        if self.whole is None:
            self.whole = (self.rows[0] if self.n == 1 else
                          emit("cat", self.rows, {"axis": 0}))  # fmt: skip
        return self.whole

    def row(self, emit, i: int) -> str:
        """Row ``i`` as (1, *sample)."""
        if self.rows is None:
            self.rows = [None] * self.n
        if self.rows[i] is None:
            self.rows[i] = emit("slice", [self.whole],
                                {"axis": 0, "start": i, "stop": i + 1, "step": 1})  # fmt: skip
        return self.rows[i]


SPLITS = ("chunk", "split", "unbind")


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def is_split(fx_node) -> bool:
    """A chunk / split / unbind whose run gave a tuple of tensors."""
    value = fx_node.meta.get("rc_value")
    return (
        fx_node.op in ("call_method", "call_function")
        and _name(fx_node.target) in SPLITS
        and isinstance(value, (tuple, list))
        and all(isinstance(v, torch.Tensor) for v in value)
    )


def split_pieces(low, fx_node) -> dict:
    """The pieces of a split node: its source, per-sample axis and [(start, size)], sizes
    from the example's run; ``drop``: unbind, whose pieces lose the axis."""
    name = _name(fx_node.target)
    where = f"fx node {fx_node.name!r} ({name})"
    for user in fx_node.users:
        if not is_getitem(user):
            raise IRError(f"{where}: its pieces go to fx node {user.name!r} together; rootclad "
                          "takes them one by one (a, b = x.chunk(2, 1))")  # fmt: skip
    args, kw = fx_values.substitute(list(fx_node.args)), fx_values.substitute(fx_node.kwargs)
    x = args[0] if args else kw.get("input", kw.get("tensor", kw.get("self")))
    if isinstance(x, torch.fx.Node) and x.name in low.moved:  # checked by takes_moved_pieces
        return {"moved": x.name}
    if not low.is_tensor(x):
        raise IRError(f"{where}: splits something other than a tensor")
    args = [x, *args[1:]] if args else [x]
    sizes = (
        args[1]
        if len(args) > 1 and name != "unbind"
        else kw.get("chunks", kw.get("split_size_or_sections", kw.get("split_size")))
    )
    if any(isinstance(v, torch.fx.Node)
           for v in (sizes if isinstance(sizes, (tuple, list)) else (sizes,))):  # fmt: skip
        raise IRError(f"{where}: its sizes depend on the batch size; rootclad splits by numbers "
                      "fixed when the model is compiled")  # fmt: skip
    pos = 1 if name == "unbind" else 2
    dim = args[pos] if len(args) > pos else kw.get("dim", 0)
    axis = low.axis(dim, x, where)
    sizes = [1 if name == "unbind" else int(v.shape[axis + 1]) for v in fx_node.meta["rc_value"]]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return {"x": x, "axis": axis, "pieces": list(zip(starts, sizes, strict=True)),
            "drop": name == "unbind"}  # fmt: skip


def lower_getitem(low, fx_node, splits: dict) -> None:
    """``getitem`` of a split's piece, or indexing of a tensor."""
    src, index = fx_node.args[0], fx_values.substitute(fx_node.args[1])
    where = f"fx node {fx_node.name!r} (operator.getitem)"
    if isinstance(src, torch.fx.Node) and src.name in low.tuples:  # a layer's tuple output
        value = low.tuples[src.name][index] if isinstance(index, int) else None
        if value is None:
            raise IRError(f"{where}: output {index!r} of {src.name!r} is not supported (of "
                          "nn.MultiheadAttention, the attention's output [0] is; its weights "
                          "are not)")  # fmt: skip
        if isinstance(value, list):  # (h_n, c_n) of an LSTM
            low.tuples[fx_node.name] = value
        elif not isinstance(value, str):  # batch axis second (Swapped)
            low.swapped[fx_node.name] = value
        else:
            low.nodes.append(Node(fx_node.name, "identity", [value], fx_node.name))
        return None
    out_shape = tuple(low.shape(fx_node)[1:])
    if isinstance(src, torch.fx.Node) and src.name in low.moved:  # qkv[0] of a moved permute
        return _moved_piece(low, fx_node.name, low.moved[src.name], index, out_shape)
    if isinstance(src, torch.fx.Node) and src.name in splits:
        split = splits[src.name]
        if not isinstance(index, int):
            raise IRError(f"{where}: pieces of {src.name!r} taken by {index!r}; take them one by "
                          "one (a, b = x.chunk(2, 1))")  # fmt: skip
        if "moved" in split:
            return _moved_piece(low, fx_node.name, low.moved[split["moved"]], index, out_shape)
        start, size = split["pieces"][index]
        slices = [(split["axis"], start, start + size, 1)]
        return _emit(low, fx_node.name, split["x"], slices, out_shape, split["drop"])
    if not low.is_tensor(src):
        raise low.unsupported(fx_node, " (indexing of something other than a tensor)")
    rank = len(low.shape(src))
    items = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(i, torch.fx.Node) for i in items) or any(
        isinstance(i, slice)
        and any(isinstance(v, torch.fx.Node) for v in (i.start, i.stop, i.step))
        for i in items
    ):
        raise IRError(f"{where}: the index {index!r} is a tensor or depends on the batch size; "
                      "rootclad slices by numbers fixed when the model is compiled")  # fmt: skip
    if any(not isinstance(i, (slice, int, type(None), type(Ellipsis))) or isinstance(i, bool)
           for i in items):  # fmt: skip
        raise IRError(f"{where}: index {index!r}: slices, integers, None and ... only")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        items[at : at + 1] = [slice(None)] * (rank - used)
    if not items or not (isinstance(items[0], slice) and items[0].start in (None, 0)
                         and items[0].stop is None and items[0].step in (None, 1)):  # fmt: skip
        raise IRError(f"{where}: index {index!r} takes from the batch axis; rootclad keeps "
                      "every sample (write x[:, ...])")  # fmt: skip
    shape = low.shape(src)[1:]
    slices, reshaped, axis = [], False, 0
    for item in items[1:]:
        if item is None:
            reshaped = True
            continue
        n = shape[axis]
        if isinstance(item, int):
            i = item + n if item < 0 else item
            slices.append((axis, i, i + 1, 1))
            reshaped = True
        else:
            start, stop, step = item.indices(n)
            if (start, stop, step) != (0, n, 1):
                slices.append((axis, start, stop, step))
        axis += 1
    _emit(low, fx_node.name, src, slices, out_shape, reshaped)


def takes_moved_pieces(fx_node, perm) -> bool:
    """A permute that moves the batch axis to second place, whose every user takes pieces
    along the new first axis (timm's ``qkv.permute(2, 0, 3, 1, 4).unbind(0)``, or ``qkv[0]``):
    each piece is the source's slice along that axis, permuted with the batch axis first."""
    if len(perm) < 2 or perm[1] != 0:
        return False
    for user in fx_node.users:
        if is_getitem(user):
            if not isinstance(user.args[1], int):
                return False
        elif not (_name(user.target) == "unbind" and user.op in ("call_method", "call_function")
                  and (user.args[1:2] or (user.kwargs.get("dim", 0),))[0] == 0
                  and all(is_getitem(u) for u in user.users)):  # fmt: skip
            return False
    return True


def _moved_piece(low, out: str, moved, index: int, out_shape) -> None:
    """Piece ``index`` along the first axis of ``src.permute(perm)`` (perm[1] = 0): the
    source's slice along axis perm[0], then the rest of the permutation."""
    src, perm = moved
    taken = perm[0]  # an axis of the source, batch axis counted
    n = low.shape(src)[taken]
    i = index + n if index < 0 else index
    if not 0 <= i < n:
        raise IRError(f"fx node {out!r}: piece {index} of an axis of {n}")
    rest = [p - (p > taken) for p in perm[1:]]  # over the source without that axis
    _emit(low, f"{out}__piece", src, [(taken - 1, i, i + 1, 1)], (), False)
    shape = tuple(d for a, d in enumerate(low.shape(src)[1:]) if a != taken - 1)
    low.nodes.append(Node(f"{out}__dropped", "reshape", [f"{out}__piece"], f"{out}__dropped",
                          {"shape": shape}))  # fmt: skip
    low.nodes.append(Node(out, "permute", [f"{out}__dropped"], out,
                          {"perm": tuple(p - 1 for p in rest[1:])}))  # fmt: skip


def _emit(low, out: str, src, slices, out_shape, reshape: bool) -> None:
    name = src.name
    if not slices and not reshape:
        low.nodes.append(Node(out, "identity", [name], out))
        return
    for k, (axis, start, stop, step) in enumerate(slices):
        last = k == len(slices) - 1 and not reshape
        node = out if last else f"{out}__slice{k}"
        attrs = {"axis": axis, "start": start, "stop": stop, "step": step}
        low.nodes.append(Node(node, "slice", [name], node, attrs))
        name = node
    if reshape:
        low.nodes.append(Node(out, "reshape", [name], out, {"shape": out_shape}))


def is_getitem(fx_node) -> bool:
    return fx_node.op == "call_function" and fx_node.target is operator.getitem
