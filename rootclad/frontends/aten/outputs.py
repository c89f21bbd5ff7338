"""A captured program's outputs as the graph's: one tensor, or a tuple, list or dict (by
string keys) of them, each a value of the batch with its batch axis first."""

from __future__ import annotations

import math

import torch

from rootclad.ir.graph import IRError, Node

_ORDINALS = {1: "second", 2: "third", 3: "fourth"}


def outputs(low, outs) -> tuple[str, tuple, str]:
    """(the graph's output value, its parts, their container): one tensor, or a tuple,
    list or dict of them (each flattened per sample, then concatenated; the compiled
    model splits them back)."""
    tree = low.program.call_spec.out_spec
    if tree.is_leaf():
        items, container = [(0, outs[0])], ""
    elif tree.type in (tuple, list, dict) and all(c.is_leaf() for c in tree.children()):
        keys = tree.context if tree.type is dict else range(len(outs))
        items, container = list(zip(keys, outs, strict=True)), tree.type.__name__
        if not items or tree.type is dict and not all(isinstance(k, str) for k in keys):
            raise IRError(
                f"torch.export: the model returns {tree.type.__name__} {list(keys)}: "
                "rootclad compiles models that return tensors (a dict of them by string "
                "keys, which loss_output names)"
            )
    else:
        raise IRError(
            f"torch.export: the model returns {tree}; rootclad compiles models that "
            "return a tensor, or a tuple, list or dict of tensors (not nested)"
        )
    for key, out in items:
        if not low.is_value(out) or low.layout(out) != (0, 1, 1):
            what = "output" if not container else f"output {key!r}"
            made = isinstance(out, torch.fx.Node) and (out.meta.get("custom") or {}).get("onnx")
            what += f" (made by {made})" if made else ""
            raise IRError(f"torch.export: the model's {what} {_not_batch_first(low, out)}")
        if out.op == "placeholder" and low.names[out.name] == out.name:  # an input: a copy
            made = f"{out.name}_returned"
            low.nodes.append(Node(made, "identity", [low.names[out.name]], made))
            low.names[out.name] = made
    if not container:
        return low.names[outs[0].name], (), ""
    made, flat, parts = "rc_outputs", [], []
    while any(n.output.startswith(made) for n in low.nodes):
        made += "_"
    for i, (key, out) in enumerate(items):
        shape, name = low.shape(out), low.names[out.name]
        if len(shape) != 1:
            name = f"{made}_{i}"
            attrs = {"shape": (math.prod(shape),)}
            low.nodes.append(Node(name, "reshape", [low.names[out.name]], name, attrs))
        flat.append(name)
        parts.append((key, shape))
    low.nodes.append(Node(made, "cat", flat, made, {"axis": 0}))
    return made, tuple(parts), container


def _not_batch_first(low, out) -> str:
    """Why ``out`` is no output of the batch: what it is, and where its batch axis is."""
    shape = tuple(getattr(out.meta.get("val"), "shape", ()))
    at = low.layout(out) if low.is_value(out) else None
    if at is None:
        return f"of shape {shape} is the same for every sample (computed from no input)"
    p, o, k = at
    if o * k > 1:
        return (
            f"of shape {shape} holds {o * k} rows of each sample in axis {p}: the batch "
            "axis must stay first and hold one row per sample (a view back to (B, ...))"
        )
    return (
        f"of shape {shape} has its batch axis at axis {p}, not first (the batch axis is the "
        f"{_ORDINALS.get(p, str(p + 1) + 'th')}): rootclad's outputs have the batch axis "
        "first (a transpose, or an index of the other axes, before returning it)"
    )
