"""A traced model's output: one tensor, or several returned as a tuple, a list or a dict of
tensors (a classifier's logits beside a regression, an encoder's output beside its pooled
one). Several become one value: each flattened per sample, then concatenated; the graph
records their keys and shapes (``Graph.parts``), the compiled model splits its output back
into them, and the loss reads one of them (``Graph.loss_part``, the first unless the caller
chooses another)."""

from __future__ import annotations

import math

import torch

from rootclad.ir.graph import IRError, Node

OUTPUTS = "rc_outputs"  # the concatenation's name


def lower(low, output, known: set[str]) -> tuple[str, tuple, str]:
    """(the graph's output value, its parts, their container: "" for one tensor)."""
    if isinstance(output, torch.fx.Node):
        _check(low, output, "the output", known)
        return output.name, (), ""
    if isinstance(output, (tuple, list)) and output:
        items = list(enumerate(output))
        container = "tuple" if isinstance(output, tuple) else "list"
    elif isinstance(output, dict) and output and all(isinstance(k, str) for k in output):
        items, container = list(output.items()), "dict"
    else:
        raise IRError(
            f"the model returns {_kind(output)} {output!r}; rootclad compiles models "
            "that return a tensor, or a tuple, list or dict (with string keys) of tensors"
        )
    out = OUTPUTS
    while out in known or any(n.output.startswith(out) for n in low.nodes):
        out += "_"  # a module of the model named so
    parts, flat = [], []
    for key, value in items:
        what = f"output {key!r}"
        if not isinstance(value, torch.fx.Node):
            raise IRError(
                f"the model's {what} is {_kind(value)} {value!r}; each output must be "
                "a tensor (nested tuples and dicts, numbers and None are not compiled)"
            )
        _check(low, value, what, known)
        shape = tuple(low.shape(value))[1:]
        parts.append((key, shape))
        name = value.name
        if len(shape) != 1:
            name = f"{out}_{len(flat)}"
            low.nodes.append(_node(name, "reshape", [value.name], {"shape": (math.prod(shape),)}))
        flat.append(name)
    low.nodes.append(_node(out, "cat", flat, {"axis": 0}))
    return out, tuple(parts), container


def _kind(value) -> str:
    """A container's name as the user wrote it (fx holds them as immutable_list/_dict)."""
    for kind in (tuple, list, dict):
        if isinstance(value, kind):
            return kind.__name__
    return type(value).__name__


def _node(name, op, inputs, attrs) -> Node:
    return Node(name, op, list(inputs), name, dict(attrs), {})


def _check(low, value, what: str, known: set[str]) -> None:
    """The returned value must be one the IR holds per sample with torch's shape."""
    if value.name in low.swapped:
        raise IRError(
            f"the model's {what} (fx node {value.name!r}) has its batch axis second "
            "(batch_first=False); return it with the batch first (x.transpose(0, 1))"
        )
    if value.name not in known:
        raise IRError(
            f"the model's {what} (fx node {value.name!r}) is not a tensor of floats rootclad "
            "computes per sample (a shape, an index, a mask or a constant); return values "
            "computed from the inputs"
        )
