"""Integer inputs in a traced model: the indices of ``nn.Embedding``.

A model input of an integer type (token ids, particle types) is held as exact integers of
the model's type, like a mask's 0s and 1s; it has no gradient (topk's indices, the other
integers a model may hold, are fx_neighbours.py's). Between the input and the
Embeddings reading it, only slicing and reshaping (``x[:, 0]``, ``view``, ``squeeze``,
``permute``, ...) may touch it: anything else computed from integers (arithmetic, a
conversion to float, an Embedding of a value computed otherwise) is refused, naming the node.
Each position of an integer input records the fewest rows of the Embeddings reading it (the
positions followed through the slicing and reshaping by running them on the positions'
numbers), against which the compiled model checks every call's indices; a position that no
Embedding reads takes any value.
"""

from __future__ import annotations

import math
import operator

import torch
from torch import nn

from rootclad.frontends import fx_merged, fx_values, fx_windows
from rootclad.ir.graph import IRError

# what may come between an integer input and an Embedding
PASSING = ("reshape", "view", "flatten", "squeeze", "unsqueeze", "permute", "transpose",
           "contiguous")  # fmt: skip
EXACT = {"float32": 1 << 24, "float64": 1 << 53}  # integers a type holds exactly


def _dtype(fx_node):
    return getattr(fx_node.meta.get("tensor_meta"), "dtype", None)


def _integer(fx_node) -> bool:
    d = _dtype(fx_node)
    return d is not None and not d.is_floating_point and d != torch.bool


def bounds(low) -> tuple[tuple[int, ...], ...]:
    """Per model input: () for a float or mask input; for indices, per position of a sample
    (flat), the fewest rows of the Embeddings reading it. Refuses what rootclad does not
    compile of integer values."""
    pos: dict[str, torch.Tensor] = {}  # an integer value -> the input positions it holds
    origin: dict[str, str] = {}  # ... and the input they are of
    rows: dict[str, torch.Tensor] = {}
    computed: set[str] = set()  # topk's indices and what is made of them (fx_neighbours.py)
    for n in low.traced.graph.nodes:
        if fx_windows.reads_for_windows(n):  # Swin's relative position index: checked there
            continue
        if fx_merged.is_batch_arange(low, n):  # offsets over the batch: fx_merged.py
            computed.add(n.name)
            continue
        if fx_values.target_name(n).endswith("topk") or (
            _integer(n) and any(a.name in computed for a in n.all_input_nodes)
        ):
            computed.add(n.name)
            continue
        mod = low.traced.get_submodule(n.target) if n.op == "call_module" else None
        reads = [a for a in n.all_input_nodes if a.name in origin]
        what = f"fx node {n.name!r} ({fx_values.target_name(n)})"
        if isinstance(mod, nn.Embedding):
            src = n.args[0] if n.args else None
            if getattr(src, "name", None) not in origin:
                raise IRError(f"module {n.target!r} (nn.Embedding) reads "
                              f"{getattr(src, 'name', src)!r}, which is not an integer input of "
                              "the model (or a slice or reshape of one); rootclad takes indices "
                              "as inputs")  # fmt: skip
            if mod.num_embeddings > EXACT[low.dtype]:
                raise IRError(f"module {n.target!r}: {mod.num_embeddings} rows; {low.dtype} holds "
                              f"indices up to {EXACT[low.dtype]} exactly: compile in float64")  # fmt: skip
            if mod.num_embeddings >= 1 << 31:
                raise IRError(f"module {n.target!r}: {mod.num_embeddings} rows; the kernels "
                              "index at most 2^31 - 1")  # fmt: skip
            held = rows[origin[src.name]]
            at = pos[src.name][0].reshape(-1)  # the positions this Embedding reads
            held[at] = torch.minimum(held[at], torch.tensor(mod.num_embeddings))
            continue
        if n.op == "placeholder" and _integer(n):
            shape = tuple(n.meta["tensor_meta"].shape)
            count = math.prod(shape[1:])
            origin[n.name] = n.name
            pos[n.name] = torch.arange(count).repeat(shape[0]).view(shape)
            rows[n.name] = torch.full((count,), torch.iinfo(torch.int64).max)
        elif _integer(n) and reads and _passes(n):
            tensors = [a for a in n.all_input_nodes if a is not n.args[0]
                       and hasattr(a.meta.get("tensor_meta"), "shape")]  # fmt: skip
            if tensors or n.args[0].name not in origin:
                raise IRError(f"{what} takes indices by the tensor "
                              f"{(tensors or [n.args[0]])[0].name!r}; rootclad slices indices by "
                              "numbers fixed when compiling")  # fmt: skip
            origin[n.name] = origin[n.args[0].name]
            pos[n.name] = _run(n, pos)
        elif _integer(n) and not fx_values.is_static(n):
            raise IRError(f"{what} computes integers; rootclad compiles integer values only as "
                          "the indices of nn.Embedding: an input of the model, sliced or "
                          "reshaped")  # fmt: skip
        elif reads and n.op != "output" and not hasattr(n.meta.get("tensor_meta"), "shape"):
            continue  # a shape query (ids.size(0), ids.device)
        elif reads and is_comparison(n):
            continue  # a mask: ids == PAD (torch_fx.py lowers it)
        elif reads and n.op != "output":
            raise IRError(f"{what} reads {reads[0].name!r}, integer indices; rootclad takes "
                          "integer inputs as the indices of nn.Embedding only (through slicing "
                          "and reshaping)")  # fmt: skip
        elif reads:
            raise IRError(f"the model returns {reads[0].name!r}, integer indices; it must "
                          "return values computed from them")  # fmt: skip
    out = []
    for p in (n for n in low.traced.graph.nodes if n.op == "placeholder"):
        if p.name not in rows:
            out.append(())
            continue
        unread = rows[p.name] == torch.iinfo(torch.int64).max
        if bool(unread.all()):
            raise IRError(f"input {p.name!r} is of {_dtype(p)}, read by no nn.Embedding; give "
                          "the model floating values (or bool masks)")  # fmt: skip
        out.append(tuple(int(r) for r in rows[p.name].masked_fill(unread, 0)))
    return tuple(out) if rows else ()


def _run(n, pos):
    """The positions an integer slicing or reshaping node holds: the node run on them."""
    args = torch.fx.node.map_arg(
        (n.args, n.kwargs), lambda a: pos[a.name] if a.name in pos else a.meta["rc_value"]
    )
    fn = getattr(torch.Tensor, n.target) if n.op == "call_method" else n.target
    return fn(*args[0], **args[1])


# x == c, x != c (the IR's equal), and x < c, <=, >, >= (its compare)
ORDERS = {
    **{c: c for c in ("lt", "le", "gt", "ge")},
    **{f"__{c}__": c for c in ("lt", "le", "gt", "ge")},
}
COMPARISONS = ("eq", "ne", "__eq__", "__ne__", *ORDERS)


def is_comparison(n) -> bool:
    """``x == c`` / ``x != c`` of a tensor and a number (a mask)."""
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return (n.op in ("call_function", "call_method") and name in COMPARISONS
            and len(n.args) == 2 and isinstance(n.args[1], (int, float))
            and not isinstance(n.args[1], bool))  # fmt: skip


def lower_comparison(low, fx_node, name, args, where) -> None:
    """``x == c`` / ``x != c``: the IR's ``equal``; ``x < c`` and the other orders: its
    ``compare`` (a mask of 1s and 0s, no gradient)."""
    if not is_comparison(fx_node) or not low.is_tensor(args[0]):
        raise IRError(f"{where}: a comparison rootclad compiles is of a tensor and a number "
                      "(ids == PAD, x != 0): a mask")  # fmt: skip
    if args[1] != args[1]:
        raise IRError(f"{where}: a comparison with NaN (never equal); compare with a number")
    if name in ORDERS:
        low.add(fx_node.name, "compare", [args[0]], {"op": ORDERS[name], "value": float(args[1])})
        return
    low.add(fx_node.name, "equal", [args[0]],
            {"value": float(args[1]), "negate": name in ("ne", "__ne__")})  # fmt: skip


def _passes(n) -> bool:
    if n.op not in ("call_function", "call_method"):  # a module named "flatten" is no method
        return False
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return n.target is operator.getitem or name in PASSING
