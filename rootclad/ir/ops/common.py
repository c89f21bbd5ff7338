"""Helpers the op families share: sizes, torch's int-or-tuple arguments, call arguments."""

from __future__ import annotations

import math

from rootclad.ir.graph import IRError


def numel(shape) -> int:
    return math.prod(shape)


def same_shape(node, shapes, graph) -> tuple:
    return shapes[0]


def ints(value, n: int, what: str, where: str):
    """A module's int-or-tuple attribute: an int for n = 1, an n-tuple of ints otherwise."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * n
    if len(values) != n:
        raise IRError(f"{where}: {what}={value!r} is not a {n}-d value")
    values = tuple(int(v) for v in values)
    return values[0] if n == 1 else values


def arg(args, kwargs, i: int, name: str, default):
    """Argument ``i`` of a torch function call, by position or by ``name``."""
    return args[i] if len(args) > i else kwargs.get(name, default)


F = "torch.nn.functional."
