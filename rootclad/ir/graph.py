"""A small typed graph: ops with attributes over tensors with static per-sample shapes.

Front-ends (``from_torch``, later ONNX) build a :class:`Graph`; the emitter turns it into
C++. Shapes here exclude the batch axis, which stays a run-time argument. All validation
happens while the graph is built, so nothing unsupported ever reaches the C++ compiler.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field


class IRError(ValueError):
    """A model cannot be compiled; the message names the node and what is supported."""


# op -> the parameter roles it takes (in arena order)
SUPPORTED_OPS: dict[str, tuple[str, ...]] = {
    "linear": ("weight", "bias"),
    "conv1d": ("weight", "bias"),
    "maxpool1d": (),
    "avgpool1d": (),
    "relu": (),
    "leaky_relu": (),
    "tanh": (),
    "sigmoid": (),
    "gelu": (),
    "flatten": (),
    "dropout": (),
    "identity": (),
}

LOSSES = ("bce_with_logits", "cross_entropy", "mse")
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Param:
    name: str  # as in the torch module's named_parameters()
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Node:
    name: str  # where it came from: the module path (or fx node name)
    op: str
    attrs: dict = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # role -> Param.name
    in_shape: tuple[int, ...] = ()
    out_shape: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{self.name} ({self.op})"


@dataclass
class Graph:
    input_shape: tuple[int, ...]
    nodes: list[Node]
    params: list[Param]
    dtype: str = "float32"

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.nodes[-1].out_shape if self.nodes else self.input_shape

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def fingerprint(self) -> str:
        """A content hash: equal graphs give equal C++ and share one compiled library."""
        desc = {
            "input": self.input_shape,
            "dtype": self.dtype,
            "params": [(p.name, p.shape) for p in self.params],
            "nodes": [
                (n.name, n.op, sorted(n.attrs.items()), sorted(n.params.items()))
                for n in self.nodes
            ],
        }
        return hashlib.sha256(json.dumps(desc, default=str).encode()).hexdigest()[:12]

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise IRError(f"dtype {self.dtype!r} is not supported; use one of {DTYPES}")
        if not self.nodes:
            raise IRError("the model has no layers to compile")
        shape = tuple(self.input_shape)
        for node in self.nodes:
            if node.op not in SUPPORTED_OPS:
                raise IRError(
                    f"{node.describe()}: op not supported; supported: {', '.join(SUPPORTED_OPS)}"
                )
            node.in_shape = shape
            node.out_shape = infer_shape(node, shape, self)
            shape = node.out_shape


def _expect(cond: bool, node: Node, msg: str) -> None:
    if not cond:
        raise IRError(f"{node.describe()}: {msg}")


def infer_shape(node: Node, shape: tuple[int, ...], graph: Graph) -> tuple[int, ...]:
    """The per-sample output shape of ``node`` for a per-sample input ``shape``."""
    a = node.attrs
    op = node.op
    if op == "linear":
        w = graph.param(node.params["weight"])
        _expect(
            len(shape) >= 1 and shape[-1] == w.shape[1],
            node,
            f"expected input (..., {w.shape[1]}), got per-sample shape {shape}",
        )
        return (*shape[:-1], w.shape[0])
    if op == "conv1d":
        w = graph.param(node.params["weight"])
        _expect(len(shape) == 2, node, f"expected input (C, L), got per-sample shape {shape}")
        _expect(
            shape[0] == w.shape[1],
            node,
            f"expected {w.shape[1]} input channels, got {shape[0]} (shape {shape})",
        )
        k, s, p, d = w.shape[2], a["stride"], a["padding"], a["dilation"]
        lo = (shape[1] + 2 * p - d * (k - 1) - 1) // s + 1
        _expect(lo >= 1, node, f"input length {shape[1]} is shorter than the kernel")
        return (w.shape[0], lo)
    if op in ("maxpool1d", "avgpool1d"):
        _expect(len(shape) == 2, node, f"expected input (C, L), got per-sample shape {shape}")
        k, s, p = a["kernel_size"], a["stride"], a["padding"]
        _expect(p <= k // 2, node, f"padding {p} must be at most half the kernel size {k}")
        lo = (shape[1] + 2 * p - k) // s + 1
        _expect(lo >= 1, node, f"input length {shape[1]} is shorter than the kernel {k}")
        return (shape[0], lo)
    if op == "flatten":
        return (math.prod(shape),)
    return shape  # elementwise ops and dropout keep the shape
