"""The IR: a dataflow graph of named values with static per-sample shapes.

A :class:`Graph` has one or more inputs, nodes in topological order (each reads named values
and writes one new value) and one output. Shapes here exclude the batch axis, which stays a
run-time argument. Front-ends (:mod:`rootclad.frontends`: torch.export, ONNX) build a graph; :meth:`Graph.validate`
checks it and infers every shape through the op registry (:mod:`rootclad.ir.registry`), naming the
node at fault, so nothing unsupported ever reaches the C++ compiler.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
from dataclasses import dataclass, field

from rootclad.ir.registry import OPS, supported_ops


class IRError(ValueError):
    """A model cannot be compiled; the message names the node and what is supported."""


LOSSES = ("bce_with_logits", "cross_entropy", "mse", "nll", "huber")
CLASS_INDEX_LOSSES = ("cross_entropy", "nll")  # targets: one class index per sample
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Param:
    name: str  # as in the torch module's named_parameters()
    shape: tuple[int, ...]
    persistent: bool = True  # a buffer registered with persistent=False: not in state_dict()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Node:
    name: str  # where it came from: the module path (or fx node name)
    op: str
    inputs: list[str] = field(default_factory=list)  # names of the values it reads
    output: str = ""  # the name of the value it writes (default: the node's name)
    attrs: dict = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # role -> Param.name
    buffers: dict[str, str] = field(default_factory=dict)  # role -> buffer name (not trained)
    in_shapes: list[tuple[int, ...]] = field(default_factory=list)  # set by validate()
    out_shape: tuple[int, ...] = ()

    def __post_init__(self):
        self.output = self.output or self.name

    @property
    def in_shape(self) -> tuple[int, ...]:
        """The shape of the first input (most ops have one)."""
        return self.in_shapes[0]

    def describe(self) -> str:
        return f"{self.name} ({self.op})"


@dataclass
class Graph:
    inputs: list[str]
    input_shapes: list[tuple[int, ...]]
    nodes: list[Node]
    output: str
    params: list[Param]
    dtype: str = "float32"
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # set by validate()
    # state that is not trained (BatchNorm's running statistics), named as torch's buffers
    buffers: list[Param] = field(default_factory=list)
    # the inputs that are masks: torch.bool in the model, 0s and 1s here (none: no masks)
    masks: tuple[bool, ...] = ()
    # the inputs that are indices (an integer type in the model, exact integers here): per
    # input, () or per position of a sample (flat) the fewest rows of the Embeddings reading
    # it (0: read by none)
    indices: tuple[tuple[int, ...], ...] = ()
    # a model returning several tensors: each one's key (its place in the tuple or list, or
    # its dict key) and per-sample shape, in order; the output is their concatenation, flat
    # per sample (none: one output). loss_part: the one the loss reads.
    parts: tuple[tuple[int | str, tuple[int, ...]], ...] = ()
    container: str = ""  # "tuple", "list" or "dict" (with parts)
    loss_part: int = 0
    # values the model computes from no input and no parameter (the export front-end's folded
    # constants: torch.arange, masks), by buffer name: buffers (not persistent) the compiled
    # model fills itself
    constants: dict = field(default_factory=dict, repr=False, compare=False)
    # the model's layers whose forward read self.training in the capture (the export front-end:
    # frontends/aten/modes.py), captured in the mode ``training_mode``
    mode_reads: tuple[str, ...] = ()
    training_mode: bool = True
    # params and buffers by name, set by validate(): param() runs once per node
    by_name: dict[str, Param] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def chain(cls, input_shape, nodes: list[Node], params: list[Param], dtype="float32"):
        """A graph in which each node reads the previous node's output (or the input)."""
        prev = "x"
        for node in nodes:
            node.inputs = [prev]
            prev = node.output
        return cls(["x"], [tuple(input_shape)], nodes, prev, params, dtype)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of the first input (the only one for single-input models)."""
        return self.input_shapes[0]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.shapes[self.output]

    @property
    def loss_columns(self) -> tuple[int, tuple[int, ...]]:
        """(first column, per-sample shape) of the output the loss reads, in the output's
        flat row: the whole output for a model with one."""
        if not self.parts:
            return 0, self.output_shape
        col = sum(math.prod(shape) for _, shape in self.parts[: self.loss_part])
        return col, self.parts[self.loss_part][1]

    def ops(self) -> list:
        """The registry entry of each node, in order."""
        return [OPS[n.op] for n in self.nodes]

    def param(self, name: str) -> Param:
        """A parameter or buffer by name (of a graph that validate() has seen)."""
        return self.by_name[name]

    @property
    def batch_statistics(self) -> bool:
        """Whether an op mixes the samples of a batch (BatchNorm, in training mode): the chunks
        of a batch split over threads then share their sums in it."""
        return any(OPS[n.op].mixes_batch for n in self.nodes)

    def fingerprint(self) -> str:
        """A content hash: equal graphs give equal C++ and share one compiled library."""
        desc = {
            "inputs": list(zip(self.inputs, self.input_shapes, strict=True)),
            "output": self.output,
            **({"parts": self.parts, "loss_part": self.loss_part} if self.parts else {}),
            "dtype": self.dtype,
            "params": [(p.name, p.shape) for p in self.params],
            "buffers": [(p.name, p.shape) for p in self.buffers],
            "nodes": [
                (
                    n.name,
                    n.op,
                    n.inputs,
                    n.output,
                    sorted(n.attrs.items()),
                    sorted(n.params.items()),
                    sorted(n.buffers.items()),
                )
                for n in self.nodes
            ],
        }
        return hashlib.sha256(json.dumps(desc, default=str).encode()).hexdigest()[:12]

    def validate(self) -> None:
        """Check the graph and infer every value's shape; errors name the node."""
        if self.dtype not in DTYPES:
            raise IRError(f"dtype {self.dtype!r} is not supported; use one of {DTYPES}")
        if not self.nodes:
            raise IRError("the model has no layers to compile")
        shapes = dict(zip(self.inputs, map(tuple, self.input_shapes), strict=True))
        for name, shape in shapes.items():
            if 0 in shape:
                raise IRError(f"input {name!r} has per-sample shape {shape}: an empty axis")
        self.by_name = {p.name: p for p in self.params + self.buffers}
        for node in self.nodes:
            spec = OPS.get(node.op)
            if spec is None:
                raise IRError(f"{node.describe()}: op not supported; supported: {supported_ops()}")
            if node.output in shapes:
                raise IRError(f"{node.describe()}: value {node.output!r} is written twice")
            for name in node.inputs:
                if name not in shapes:
                    raise IRError(
                        f"{node.describe()}: reads {name!r}, which no earlier node writes "
                        "(nodes must be in topological order)"
                    )
            arity = spec.arity
            if arity is not None and len(node.inputs) != arity:
                raise IRError(f"{node.describe()}: takes {arity} inputs, got {len(node.inputs)}")
            if arity is None and not node.inputs:
                raise IRError(f"{node.describe()}: takes at least one input")
            for role, name in node.params.items():
                if role not in spec.params:
                    raise IRError(f"{node.describe()}: has no parameter {role!r}")
                computed = f"its {role} {name!r} is no parameter or buffer of the model"
                expect(name in self.by_name, node, computed)
            for role in node.buffers:
                if role not in spec.buffers:
                    raise IRError(f"{node.describe()}: has no buffer {role!r}")
            for key, value in node.attrs.items():
                why = "an op's attributes are numbers, booleans and words ([A-Za-z0-9_]*)"
                expect(_plain(value), node, f"attribute {key!r} is {value!r}: {why}")
            node.in_shapes = [shapes[name] for name in node.inputs]
            node.out_shape = tuple(spec.infer(node, node.in_shapes, self))
            expect(0 not in node.out_shape, node, f"its output has per-sample shape "
                   f"{node.out_shape}: an empty axis")  # fmt: skip
            shapes[node.output] = node.out_shape
        if self.output not in shapes:
            raise IRError(f"the model's output {self.output!r} is not computed by any node")
        if self.output in self.inputs:
            raise IRError(f"the model returns its input {self.output!r} unchanged")
        self.shapes = shapes
        if self.parts:
            total = sum(math.prod(shape) for _, shape in self.parts)
            if shapes[self.output] != (total,) or not 0 <= self.loss_part < len(self.parts):
                raise IRError(f"the model's outputs {self.parts} do not fill its output "
                              f"{self.output!r} of shape {shapes[self.output]}")  # fmt: skip


_WORD = re.compile(r"[A-Za-z0-9_]*")


def _plain(value) -> bool:
    """An attribute value the emitters may write into C++: a number, a boolean, None, a word
    (a mode's name) or a tuple, list or dict of them. Anything else (text from a file or a
    module, an object) never reaches generated code."""
    if value is None or isinstance(value, (bool, numbers.Real)):
        return True
    if isinstance(value, str):
        return bool(_WORD.fullmatch(value))
    if isinstance(value, (tuple, list)):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(k) and _plain(v) for k, v in value.items())
    return False


def expect(cond: bool, node: Node, msg: str) -> None:
    """Raise an :class:`IRError` naming ``node`` unless ``cond``."""
    if not cond:
        raise IRError(f"{node.describe()}: {msg}")
