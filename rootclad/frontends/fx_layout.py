"""Layout in a traced model: reshape / view / flatten (the batch axis kept first), squeeze and
unsqueeze of a per-sample axis, permute / transpose of the per-sample axes, sums, means and
extrema over given per-sample axes (a permute, a reshape to rows and the global average pooling
or the rows' amax), and torch.roll (slices and a concatenation)."""

from __future__ import annotations

import math

from rootclad.frontends import fx_slicing
from rootclad.ir.graph import IRError, Node


def reshape(low, fx_node, args, where) -> None:
    x = args[0]
    out = low.shape(fx_node)
    if not out or out[0] != low.batch:
        raise IRError(
            f"{where}: gives shape {out} from {low.shape(x)}: the batch axis must stay first "
            "and whole (use x.size(0) or -1 for it)"
        )
    spec = args[1:]
    if len(spec) == 1 and isinstance(spec[0], (tuple, list)):
        spec = list(spec[0])
    name = fx_node.target if isinstance(fx_node.target, str) else fx_node.target.__name__
    if name in ("reshape", "view") and spec and isinstance(spec[0], int) and spec[0] != -1:
        raise IRError(
            f"{where}: the batch axis is the fixed number {spec[0]}; write x.size(0) or -1 "
            "so that the model takes any batch size"
        )
    low.add(fx_node.name, "reshape", [x], {"shape": out[1:]})


def squeeze(low, fx_node, name, args, kw, where) -> None:
    """squeeze(dim) / unsqueeze(dim) of per-sample axes, as a reshape."""
    x = args[0]
    dims = args[1] if len(args) > 1 else kw.get("dim")
    if dims is None:
        raise IRError(f"{where}: squeeze() without dim would drop the batch axis at batch "
                      "size 1; give the per-sample axes (dim=...)")  # fmt: skip
    rank = len(low.shape(x)) + (name == "unsqueeze")
    for d in dims if isinstance(dims, (tuple, list)) else (dims,):
        if not isinstance(d, int) or d in (0, -rank):
            raise IRError(f"{where}: dim={d!r} is the batch axis or not a number; "
                          "rootclad keeps the batch axis first")  # fmt: skip
    low.add(fx_node.name, "reshape", [x], {"shape": tuple(low.shape(fx_node)[1:])})


def permute(low, fx_node, name, args, kw, where) -> None:
    x = args[0]
    rank = len(low.shape(x))
    if name == "permute":
        perm = args[1:] if len(args) > 2 or not isinstance(args[1], (tuple, list)) else args[1]
        perm = [p + rank if p < 0 else p for p in perm]
        if perm and perm[0] != 0 and fx_slicing.takes_moved_pieces(fx_node, perm):
            low.moved[fx_node.name] = (x, tuple(perm))  # lowered by each piece taken
            return
        if not perm or perm[0] != 0:
            raise IRError(f"{where}: permutation {tuple(perm)} moves the batch axis")
        sample = [p - 1 for p in perm[1:]]
    else:
        d0 = low.axis(args[1] if len(args) > 1 else kw["dim0"], x, where)
        d1 = low.axis(args[2] if len(args) > 2 else kw["dim1"], x, where)
        sample = list(range(rank - 1))
        sample[d0], sample[d1] = sample[d1], sample[d0]
    low.add(fx_node.name, "permute", [x], {"perm": tuple(sample)})


def reduce(low, fx_node, name, args, kw, where) -> None:
    """mean / sum / amax / amin over given per-sample axes, as the global average pooling (or
    the rows' amax) of a (rest, reduced) reshape: the axes to reduce are permuted last where
    they are not. amin is -amax(-x)."""
    x = args[0]
    dims = args[1] if len(args) > 1 else kw.get("dim")
    keepdim = args[2] if len(args) > 2 else kw.get("keepdim", False)
    if dims is None or dims == () or dims == []:
        raise IRError(f"{where}: a {name} over every axis mixes the samples of the batch; "
                      "give the per-sample axes (dim=...)")  # fmt: skip
    if kw.get("dtype") is not None or not isinstance(keepdim, bool):
        raise IRError(f"{where}: dtype= and a keepdim that is not a bool are not supported")
    shape = low.shape(x)[1:]
    axes = sorted({low.axis(d, x, where) for d in (dims if isinstance(dims, (tuple, list))
                                                      else (dims,))})  # fmt: skip
    rest = [a for a in range(len(shape)) if a not in axes]
    inner, outer = math.prod(shape[a] for a in axes), math.prod(shape[a] for a in rest)
    out = fx_node.name
    src = x.name
    if name == "amin":
        low.nodes.append(Node(f"{out}__negated", "affine", [src], f"{out}__negated",
                               {"scale": -1.0, "shift": 0.0}))  # fmt: skip
        src = f"{out}__negated"
    if rest + axes != list(range(len(shape))):
        low.nodes.append(Node(f"{out}__permuted", "permute", [src], f"{out}__permuted",
                               {"perm": tuple(rest + axes)}))  # fmt: skip
        src = f"{out}__permuted"
    low.nodes.append(Node(f"{out}__rows", "reshape", [src], f"{out}__rows",
                           {"shape": (outer, inner)}))  # fmt: skip
    # amax: not a max pooling, which gives a row's gradient to its first maximum; torch shares
    # it among tied maxima
    pool = "global_avgpool" if name in ("mean", "sum") else "amax"
    low.nodes.append(Node(f"{out}__pooled", pool, [f"{out}__rows"], f"{out}__pooled"))
    src = f"{out}__pooled"
    if name == "amin":
        low.nodes.append(Node(f"{out}__min", "affine", [src], f"{out}__min",
                               {"scale": -1.0, "shift": 0.0}))  # fmt: skip
        src = f"{out}__min"
    if name == "sum":
        low.nodes.append(Node(f"{out}__sum", "affine", [src], f"{out}__sum",
                               {"scale": float(inner), "shift": 0.0}))  # fmt: skip
        src = f"{out}__sum"
    low.nodes.append(Node(out, "reshape", [src], out,
                           {"shape": tuple(low.shape(fx_node)[1:])}))  # fmt: skip


def roll(low, fx_node, args, kw, where) -> None:
    """torch.roll along per-sample axes: per axis, the slice from the shift on, then the slice
    before it (torch.cat). Without dims torch rolls the flattened tensor, batch included:
    refused."""
    x = args[0]
    shifts = args[1] if len(args) > 1 else kw.get("shifts")
    dims = args[2] if len(args) > 2 else kw.get("dims")
    if dims is None or dims == () or dims == []:
        raise IRError(f"{where}: a roll without dims rolls the samples of the batch into each "
                      "other; give the per-sample axes (dims=...)")  # fmt: skip
    shifts = list(shifts) if isinstance(shifts, (tuple, list)) else [shifts]
    dims = list(dims) if isinstance(dims, (tuple, list)) else [dims]
    if len(shifts) != len(dims) or not all(isinstance(s, int) for s in shifts):
        raise IRError(f"{where}: shifts {shifts} and dims {dims} must be numbers, one per axis")
    shape = tuple(low.shape(x)[1:])
    moved: dict[int, int] = {}  # an axis named twice moves by both shifts
    for s, d in zip(shifts, dims, strict=True):
        axis = low.axis(d, x, where)
        moved[axis] = moved.get(axis, 0) + s
    if not any(s % shape[a] for a, s in moved.items()):
        return low.add(fx_node.name, "identity", [x])
    emit_roll(low, x.name, shape, moved, fx_node.name)


def emit_roll(low, src: str, shape, shifts: dict[int, int], name: str) -> str:
    """The nodes of torch.roll of value ``src`` (per-sample ``shape``) by ``shifts`` (per-sample
    axis -> shift), the last one named ``name``: per axis that moves, the slice from the shift
    on, then the slice before it, concatenated. At least one axis must move."""
    moves = [(a, (-s) % shape[a]) for a, s in shifts.items() if s % shape[a]]
    for i, (axis, k) in enumerate(moves):
        out = name if i == len(moves) - 1 else f"{name}__roll{i}"
        pieces = []
        for part, (a, b) in enumerate(((k, shape[axis]), (0, k))):
            piece = f"{out}__part{part}"
            attrs = {"axis": axis, "start": a, "stop": b, "step": 1}
            low.nodes.append(Node(piece, "slice", [src], piece, attrs))
            pieces.append(piece)
        low.nodes.append(Node(out, "cat", pieces, out, {"axis": axis}))
        src = out
    return src
