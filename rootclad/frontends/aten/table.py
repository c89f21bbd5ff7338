"""The table of ATen lowerings: each family's file registers its ops with ``@lowers``."""

from __future__ import annotations

from collections.abc import Callable

import torch

# ATen overload name ("aten.relu.default") -> lowering(low, node, args, kwargs)
LOWERINGS: dict[str, Callable] = {}

# the ATen ops of the layers rootclad runs as one fused op, kept out of torch's decompositions
# (filled by the lowerings registered with kept=True)
KEPT: set[str] = set()

# ATen op -> whether its lowering takes a node of the program torch.export captured, before
# any decomposition (a composite op, such as matmul, lowered in its common forms only: the
# others leave the program to torch's decomposition)
AS_IS: dict[str, Callable] = {}


def lowers(*names: str, kept: bool = False, as_is: Callable | None = None):
    def register(fn):
        for name in names:
            if name in LOWERINGS:
                raise ValueError(f"{name} is lowered twice")
            LOWERINGS[name] = fn
            if kept:
                KEPT.add(name)
            if as_is is not None:
                AS_IS[name] = as_is
        return fn

    return register


def op_name(target) -> str:
    """``aten.relu.default`` for an OpOverload, the function's name otherwise."""
    name = getattr(target, "name", None)
    if callable(name):  # OpOverload.name() -> "aten::relu" (overload: .default)
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def batch_rows(size, batch) -> int | None:
    """k where ``size`` is k times the batch size (the symbol itself, not a number that equals
    the example's batch), else None."""
    if not isinstance(size, torch.SymInt):
        return None
    ratio = size.node.expr / batch.node.expr
    return int(ratio) if ratio.is_Integer and int(ratio) >= 1 else None
