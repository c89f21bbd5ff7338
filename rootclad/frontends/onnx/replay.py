"""An ONNX graph run node by node through one table (:data:`rootclad.frontends.onnx.ops.OPS`:
ONNX op -> what torch computes for it), captured by torch.export and lowered by the ATen
front-end like any model (``rootclad.onnx.load(path)``).

No layer is rebuilt and no source is generated: :class:`Replay` holds the file's float
initializers as parameters (integer ones, shapes and indices, stay numbers) and its forward
runs the table over the nodes. Shape arithmetic (Shape, Gather, Concat, ... on integers) runs
on numbers, the batch size as torch.export's symbol, so a Reshape reads its sizes, never a
tensor of them. A node whose op the table lacks is refused before anything runs, naming the
node, its op and the opset; one the table cannot take as written, when it runs."""

from __future__ import annotations

import contextlib
import keyword
import math
import re

import numpy as np
import torch
import torch.fx.traceback as fx_traceback
from torch import nn

from rootclad.frontends.onnx import ops_attention, ops_math, ops_recurrent, ops_shapes  # noqa: F401
from rootclad.frontends.onnx.common import attributes
from rootclad.frontends.onnx.ops import ATTRIBUTES, MAX_NUMBERS, OPS, STATE, STATIC, Node
from rootclad.frontends.onnx.reading import opset
from rootclad.ir.graph import IRError

# each node's torch ops noted with the node (a torch without annotate: refusals name ATen ops)
_annotate = getattr(fx_traceback, "annotate", lambda _: contextlib.nullcontext())
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLOATS = {np.dtype(t) for t in ("float16", "float32", "float64")}


class Replay(nn.Module):
    """The ONNX graph as a torch module that holds its initializers and runs its nodes."""

    def __init__(self, model, where: str, opset: int, budget):
        import onnx

        super().__init__()
        self._where, self._budget = where, budget
        graph = model.graph
        # where each value is read: a float initializer or constant read only as sizes, axes
        # or bounds (ops.STATIC) is a number, any other a parameter (or, from a Constant
        # node, a buffer)
        reads: dict[str, set] = {}
        for proto in graph.node:
            for at, name in enumerate(proto.input):
                static = at in STATIC.get(proto.op_type, ()) or _to_integer(proto)
                kind = "static" if static else "tensor"
                kind = "state" if at in STATE.get(proto.op_type, ()) else kind
                reads.setdefault(name, set()).add(kind)
        self._static = {name for name, kinds in reads.items() if kinds == {"static"}}
        state = {name for name, kinds in reads.items() if kinds == {"state"}}
        self._numbers: dict[str, np.ndarray] = {}  # integer and boolean initializers
        self._tensors: dict[str, str] = {}  # float initializer -> its attribute path
        for init in graph.initializer:
            value = np.array(onnx.numpy_helper.to_array(init))
            if value.dtype in _FLOATS and init.name not in self._static:
                weight = init.name not in state  # (BatchNorm's statistics: buffers)
                self._tensors[init.name] = self._hold(init.name, torch.from_numpy(value), weight)
            else:
                self._numbers[init.name] = value
        self._nodes = []
        for proto in graph.node:  # torch's exporter writes equal weights (a deep copy's) as an
            # Identity of the first: each is a parameter of its own, as in torch
            if proto.op_type != "Identity":
                continue
            held = dict(self.named_parameters()).get(self._tensors.get(proto.input[0], ""))
            if held is not None:
                copied = held.detach().clone()
                self._tensors[proto.output[0]] = self._hold(proto.output[0], copied, True)
        for i, proto in enumerate(graph.node):
            if proto.op_type == "Identity" and proto.output[0] in self._tensors:
                continue
            node = Node(
                proto.name or f"#{i}",
                proto.op_type,
                list(proto.input),
                list(proto.output),
                attributes(proto),
                where,
                opset,
            )
            if proto.domain not in ("", "ai.onnx") or proto.op_type not in OPS:
                raise node.refuse(
                    f"rootclad's ONNX table has no {proto.domain + '.' if proto.domain else ''}"
                    f"{proto.op_type}; it takes: {', '.join(sorted(OPS))}"
                )
            unknown = sorted(set(node.attrs) - ATTRIBUTES.get(proto.op_type, set()))
            if unknown:
                raise node.refuse(f"attribute {', '.join(unknown)} is not supported")
            if proto.op_type == "Constant":  # made once: a number, or a buffer of floats
                value = OPS["Constant"](node, [])
                if isinstance(value, torch.Tensor) and proto.output[0] in self._static:
                    value = value.numpy()
                elif isinstance(value, torch.Tensor):
                    value = self._hold(f"constant_{i}", value, False)  # (not a file's name: no dot)
                node.value = value
            self._nodes.append(node)
        # what some node or the graph's output reads
        self._read = {n for p in graph.node for n in p.input} | {o.name for o in graph.output}
        self._inputs = [i.name for i in graph.input if i.name not in self._numbers]
        self._inputs = [n for n in self._inputs if n not in self._tensors]
        self._outputs = [o.name for o in graph.output]
        self._declared = {  # the shapes the file declares for its values (a str: a symbol)
            # (a dim_value below 0, which some tools write for "any": a symbol too)
            o.name: [
                d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else d.dim_param
                for d in t.shape.dim
            ]
            for o in [*graph.value_info, *graph.output]
            if (t := o.type.tensor_type).HasField("shape")
        }

    def _hold(self, name: str, value: torch.Tensor, parameter: bool) -> str:
        """Register ``value`` at the path ``name`` spells where its parts are plain names (a
        torch export's ``fc1.weight``), else at a flat name made from it; returns the path."""
        parts = name.split(".")
        # a part is a plain name, or a number before the last (a Sequential's 0.weight)
        plain = [_PLAIN.fullmatch(p) and not keyword.iskeyword(p) for p in parts[-1:]]
        plain += [_PLAIN.fullmatch(p) or p.isascii() and p.isdigit() for p in parts[:-1]]
        if not all(plain) or any(keyword.iskeyword(p) for p in parts):
            flat = re.sub(r"\W", "_", name, flags=re.ASCII).strip("_") or "initializer"
            plain = _PLAIN.fullmatch(flat) and not keyword.iskeyword(flat)
            parts = [flat if plain else f"i_{flat}"]
        owner = self
        for part in parts[:-1]:
            child = owner._modules.get(part)
            if child is None and not hasattr(owner, part):
                child = nn.Module()
                owner.add_module(part, child)
            if type(child) is not nn.Module:
                return self._hold(f"i_{len(self._tensors)}_{parts[-1]}", value, parameter)
            owner = child
        last = parts[-1]
        while hasattr(owner, last):
            last += "_"
        if parameter:
            owner.register_parameter(last, nn.Parameter(value))
        else:  # the file's state (BatchNorm's statistics) is saved; a Constant node's is not
            owner.register_buffer(last, value, persistent=not name.startswith("constant_"))
        return ".".join([*parts[:-1], last])

    def forward(self, *xs):
        self._budget.activation_bytes = 0  # (torch.export runs it on tensors of no storage)
        env: dict = dict(zip(self._inputs, xs, strict=True))
        loose: set = set()  # values whose declared shapes are not held against them
        floats = [x for x in xs if x.is_floating_point()] + list(self.parameters())
        dtype = floats[0].dtype if floats else torch.float32
        first = xs[0].shape[0] if xs and xs[0].dim() else 1
        guards = len(first.node.shape_env.guards) if isinstance(first, torch.SymInt) else 0
        self._batch = int(first.node.hint) if isinstance(first, torch.SymInt) else int(first)
        env.update(self._numbers)
        held = dict(self.named_parameters()) | dict(self.named_buffers())
        env.update({name: held[path] for name, path in self._tensors.items()})
        for node in self._nodes:
            if node.op == "Constant":
                value = node.value
                results = [held[value] if isinstance(value, str) else value]
            else:
                node.dtype = dtype
                missing = [n for n in node.inputs if n and n not in env]
                if missing:
                    raise node.refuse(f"reads {missing}, which no node makes before it")
                try:
                    ins = [env[n] if n else None for n in node.inputs]
                    with _annotate({"onnx": f"{self._where}: {node.describe()}"}):
                        results = OPS[node.op](node, ins)
                except IRError:
                    raise
                except KeyError as exc:
                    raise node.refuse(f"not computed as written (KeyError: {exc})") from exc
                except (
                    TypeError,
                    ValueError,
                    IndexError,
                    RuntimeError,
                    AttributeError,
                    ArithmeticError,
                    StopIteration,
                    MemoryError,
                ) as exc:
                    why = f"not computed as written ({type(exc).__name__}: {exc})"
                    raise node.refuse(why) from exc
                if not isinstance(results, (list, tuple)):
                    results = [results]
                missing = [n for n in node.outputs[len(results) :] if n in self._read]
                if missing:
                    raise node.refuse(f"outputs {missing} are not computed")
                results = [_held(r) for r in results]
                self._bounded(node, results)
                # a pool whose last ceil window onnx's shape inference keeps (ops.py) and what
                # is computed from it: the file may declare other sizes than torch gives
                if getattr(node, "declares_more", False) or loose.intersection(node.inputs):
                    loose.update(node.outputs)
                for name, value in zip(node.outputs, results, strict=False):
                    if name not in loose and isinstance(value, torch.Tensor):
                        self._as_declared(name, value, node)
                guards = _batch_kept(node, first, guards)
            for name, value in zip(node.outputs, results, strict=False):
                if name:
                    env[name] = value
        outs = [env[n] for n in self._outputs]
        for name, out in zip(self._outputs, outs, strict=True):
            if not isinstance(out, torch.Tensor) or any(out is h for h in held.values()):
                raise IRError(
                    f"{self._where}: the graph computes nothing from its input: its output "
                    f"{name!r} is a constant"
                )
            if any(out is x for x in xs):
                why = f"the graph computes nothing: its output {name!r} is its input"
                raise IRError(f"{self._where}: {why}")
            if name not in loose:
                self._as_declared(name, out, None)
        return outs[0] if len(outs) == 1 else dict(zip(self._outputs, outs, strict=True))

    def _as_declared(self, name: str, value: torch.Tensor, node) -> None:
        """``value`` has the shape the file declares for ``name`` (a symbol there, or the batch
        size's here, stands for any size); refused naming both shapes where not."""
        want = self._declared.get(name)
        got = [d if isinstance(d, int) else "B" for d in value.shape]
        if want is None:
            return
        if len(want) == len(got) and all(
            not isinstance(w, int) or not isinstance(g, int) or w == g
            for w, g in zip(want, got, strict=True)
        ):
            return
        shown = ", ".join(map(str, got)), ", ".join(str(w) if w != "" else "?" for w in want)
        why = f"gives {name!r} of shape ({shown[0]}), the file declares ({shown[1]})"
        raise node.refuse(why) if node is not None else IRError(f"{self._where}: output {why}")

    def _bounded(self, node, results) -> None:
        """Each tensor a node makes within the limits (per sample: an axis of the batch's size,
        a symbol while torch.export runs the forward, is not counted), before torch computes
        it on real data."""
        what = f"node {node.name!r} ({node.op})'s output"
        for value in results:
            if isinstance(value, np.ndarray) and value.size > MAX_NUMBERS:
                raise node.refuse(f"{value.size} numbers (at most {MAX_NUMBERS})")
            if isinstance(value, torch.Tensor):
                shape = [d for d in value.shape if not isinstance(d, torch.SymInt)]
                if len(shape) < value.dim():  # per sample: a value of the batch
                    sizes = [
                        int(d.node.hint) if isinstance(d, torch.SymInt) else d for d in value.shape
                    ]
                    n = -(-math.prod(sizes) // self._batch)
                    shape = shape if math.prod(shape) == n else [n]
                self._budget.value(what, shape, value.element_size())


def _batch_kept(node, batch, seen: int) -> int:
    """Refuse ``node`` where, while torch.export runs the forward, it fixed or bounded the batch
    size (a Reshape to the example's batch of 2, a Slice of the batch axis): rootclad's model
    takes a batch of any size, and torch's own message would name no node."""
    if not isinstance(batch, torch.SymInt):
        return seen
    env, expr = batch.node.shape_env, batch.node.expr
    size = env.replace(expr)
    if size.is_number:
        raise node.refuse(
            f"fixes the batch size to {size} (it reads the batch axis as a size or mixes it "
            "with another axis); rootclad compiles a model for a batch of any size"
        )
    for guard in env.guards[seen:]:  # a condition some batch sizes fail (an even batch)
        cond = guard.expr
        if expr in cond.free_symbols and not all(_holds(cond.subs(expr, n)) for n in (2, 3, 5, 7)):
            raise node.refuse(
                f"needs {cond} of the batch size {expr} (it mixes the batch axis with another "
                "axis); rootclad compiles a model for a batch of any size"
            )
    bounds = env.var_to_range.get(size)
    if bounds is not None and bounds.upper.is_Integer:  # (torch's int_oo: no bound)
        raise node.refuse(
            f"bounds the batch size to at most {bounds.upper} (it reads the batch axis as a "
            "size); rootclad compiles a model for a batch of any size"
        )
    return len(env.guards)


def _to_integer(proto) -> bool:
    """Whether ``proto`` is a Cast to an integer type (of a float initializer: its value is a
    number then, as the file's shape arithmetic is, not a parameter that never trains)."""
    if proto.op_type != "Cast":
        return False
    to = next((a.i for a in proto.attribute if a.name == "to"), None)
    return to in (2, 3, 4, 5, 6, 7, 12, 13)  # (onnx's unsigned and signed integers)


def _holds(cond) -> bool:
    try:
        return bool(cond)
    except TypeError:  # (undecided: other symbols in it)
        return True


def _held(value):
    """A result as the table takes it: a tensor, or numbers as a numpy array (numpy gives a
    lone number, the batch size's symbol among them, as a scalar)."""
    if value is None or isinstance(value, (torch.Tensor, np.ndarray)):
        return value
    symbolic = isinstance(value, (torch.SymInt, torch.SymFloat))
    return np.array(value, dtype=object if symbolic else None)


def to_replay(model, where: str, budget) -> tuple[nn.Module, list[tuple[int, ...]], torch.dtype]:
    """(the file's graph as a :class:`Replay`, per-sample input shapes, dtype) of what
    :func:`rootclad.frontends.onnx.reading.read` gives."""
    module = Replay(model, where, opset(model, where), budget)
    shapes, dtypes, kinds = [], set(), []
    inits = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        t = inp.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if not dims or any(d is None or d == 0 for d in dims[1:]):
            raise IRError(
                f"{where}: input {inp.name!r} has shape {dims}: rootclad needs a batch "
                "axis first and fixed sizes (not 0) after it"
            )
        budget.value(f"input {inp.name!r}", tuple(dims[1:]), 8)
        shapes.append(tuple(dims[1:]))
        kind = _ELEMENT.get(t.elem_type)
        if kind is None:
            import onnx

            raise IRError(
                f"{where}: input {inp.name!r} has element type "
                f"{onnx.TensorProto.DataType.Name(t.elem_type)}; rootclad takes float32 or "
                "float64 values, int32 or int64 indices and booleans"
            )
        kinds.append(None if kind.is_floating_point else kind)
        if kind.is_floating_point:
            dtypes.add(kind)
    module.input_dtypes = kinds
    return module, shapes, torch.float64 if torch.float64 in dtypes else torch.float32


_ELEMENT = {
    1: torch.float32,
    11: torch.float64,
    10: torch.float32,
    7: torch.int64,
    6: torch.int64,
    9: torch.bool,
}
