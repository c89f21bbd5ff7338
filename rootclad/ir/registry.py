"""The op registry: what each op *is*, one entry per op, in no backend's terms.

An entry (:class:`OpSpec`) says how many inputs the op reads, which parameters and buffers it
owns, how its output shape follows from its inputs (checking them, naming the node), what its
derivative reads of the forward (``saves``), the properties the passes and backends decide by
(``view``, ``mixes_batch``, ``random``, an elementwise op's functor), and which ``torch.nn``
modules and torch functions lower to it. The families fill it (:mod:`rootclad.ir.ops`:
dense, conv, pool, elementwise, binary, shape, norm); the backends say how each op runs
(:mod:`rootclad.codegen.cpu_ops`, :mod:`rootclad.codegen.cuda_ops`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class OpSpec:
    name: str
    family: str  # dense, conv, pool, elementwise, binary, shape, norm
    summary: str  # one line, for error messages and docs
    infer: Callable  # (node, input shapes, graph) -> per-sample output shape; checks the inputs
    arity: int | None = 1  # None: one or more
    params: tuple[str, ...] = ()  # parameter roles, in the torch module's order
    buffers: tuple[str, ...] = ()  # buffer roles (torch buffers: not trained)
    # what the op's derivative reads of the forward: "in" (its inputs), "out". The arena
    # planner lets other values reuse the rest once the forward is past it, so a missing
    # entry gives wrong gradients (ROOTCLAD_CHECK_PLAN=1 turns them into NaN); a backend adds
    # the scratch its own pullback reads (codegen/cpu_ops.py)
    saves: tuple[str, ...] = ("in",)
    flops: Callable | None = None  # (node, graph) -> multiply-adds x 2 of one sample's forward
    view: bool = False  # the output is the input, reshaped: no memory, no kernel
    mixes_batch: bool = False  # in training its output depends on the whole batch (BatchNorm)
    random: bool = False  # draws from the call's seed (Dropout's mask)
    # an elementwise op: the functor holding its value and derivative
    # (include/rootclad/ops/activations.h), and its arguments from the node's attrs
    functor: str = ""
    functor_args: Callable = lambda attrs: ()
    monotone: Callable | None = None  # elementwise: (attrs) -> non-decreasing in its input
    # a max over windows: a non-decreasing op before it may run after it, on fewer values
    # (optimize.pool_before_activation)
    swaps_with_monotone: bool = False
    # the torch forms that lower to it: nn classes and the attrs they give (raising IRError),
    # functions / Tensor methods ("Tensor.relu") and the attrs their arguments give. An axis
    # comes as torch numbers it, batch axis included, in attrs "dim"; the front-end turns it
    # into "axis", the per-sample axis (0 = the first after B)
    modules: tuple[str, ...] = ()
    from_module: Callable | None = None  # (module, where) -> attrs
    functions: tuple[str, ...] = ()
    from_call: Callable | None = None  # (extra positional args, kwargs, where) -> attrs


OPS: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} registered twice")
    if spec.modules and spec.from_module is None:
        spec.from_module = lambda mod, where: {}
    if spec.functions and spec.from_call is None:
        spec.from_call = lambda args, kwargs, where: {}
    OPS[spec.name] = spec
    return spec


def supported_ops() -> str:
    return ", ".join(OPS)


def supported_modules() -> str:
    return ", ".join(m for spec in OPS.values() for m in spec.modules)
