"""The walk over an exported program, and the interface each ATen op's lowering gets.

A lowering is registered for one or more ATen overloads (``@lowers("aten.relu.default")``) and
called as ``lowering(low, node, args, kwargs)``: ``node`` is the exported program's
``torch.fx.Node``, ``args``/``kwargs`` its arguments as torch recorded them (other nodes stay
``torch.fx.Node``). It reads values through :class:`Lowering` (``value``, ``shape``,
``param_name``, ``module_of``, ``number``) and adds IR nodes with ``emit`` only; the last node it
emits is the ATen node's value (its per-sample shape is checked against torch's). It returns
nothing, or raises :class:`IRError` through ``low.refuse``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from rootclad.frontends.aten import (  # noqa: F401 (the lowerings, by family)
    draws,
    indexing,
    layers,
    layout,
    logic,
    norms,
    pointwise,
    writes,
)
from rootclad.frontends.aten.capture import export_program
from rootclad.frontends.aten.constants import fold
from rootclad.frontends.aten.indexing import index_bounds, sample_offsets
from rootclad.frontends.aten.modules import parameter_aliases, persistent
from rootclad.frontends.aten.outputs import outputs
from rootclad.frontends.aten.table import LOWERINGS, batch_rows, op_name
from rootclad.ir.graph import Graph, IRError, Node, Param
from rootclad.ir.optimize import simplify


class Lowering:
    """The exported program being lowered: the IR nodes so far and what they are made from."""

    def __init__(self, module: nn.Module, program, dtype: str, examples=()):
        self.module, self.program, self.dtype = module, program, dtype
        self.examples = tuple(examples)  # the inputs torch.export captured the model with
        signature = program.graph_signature
        self.params = dict(signature.inputs_to_parameters)  # placeholder -> parameter name
        self.buffers = dict(signature.inputs_to_buffers)
        self.user_inputs = list(signature.user_inputs)
        self.aliases = parameter_aliases(module)
        self.nodes: list[Node] = []
        self.names: dict[str, str] = {}  # ATen node name -> IR value name
        self.tuples: dict[str, list[str | None]] = {}  # ATen node of several results -> values
        placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        self.batch = placeholders[self.user_inputs[0]].meta["val"].shape[0]
        self.expected: dict[str, tuple[int, ...]] = {}
        self.held_values: dict[tuple, str] = {}  # (parameter, per-sample shape) -> its value
        self.layouts: dict[str, tuple[int, int, int] | None] = {}  # ATen node -> layout()
        # the constants: ATen node -> its value (_fold); those read, by buffer name
        self.folded: dict[str, torch.Tensor] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self.constant_names: dict[str, str] = {}  # folded ATen node -> its buffer
        self.data: set[str] = set()  # the nodes computed from the model's inputs
        self.sizes: dict[str, int] = {}  # each size torch computed on the example (_run)
        self.integers: set[str] = set()  # integer inputs and what moves their values
        # indices plus the sample's number times a count (indexing.sample_offsets): the sum ->
        # (the indices, the count); the nodes making the offsets, which nothing else reads
        self.offsets: dict[str, tuple] = {}
        self.offset_nodes: set[str] = set()

    # -- what a lowering reads ------------------------------------------------------------
    def where(self, node) -> str:
        path, mod = self.module_of(node)
        onnx = (node.meta.get("custom") or {}).get("onnx")  # an ONNX file's node (its replay)
        inside = f" in module {path!r} ({type(mod).__name__})" if path else ""
        if not path and not onnx:
            inside = f" in the model ({type(mod).__name__})"
        aten = f"ATen op {op_name(node.target)} (node {node.name!r}{inside})"
        return f"{onnx}, as {aten}" if onnx else aten

    def module_of(self, node) -> tuple[str, nn.Module]:
        """The innermost module whose forward made ``node`` ('' and the root: the model's)."""
        stack = node.meta.get("nn_module_stack") or {}
        for path, _ in reversed(list(stack.values())):
            try:
                return path, self.module.get_submodule(path) if path else self.module
            except AttributeError:
                continue
        return "", self.module

    def refuse(self, node, why: str) -> IRError:
        return IRError(f"{self.where(node)}: {why}")

    def param_name(self, arg) -> str | None:
        """The parameter ``arg`` is (its name in named_parameters()), or None."""
        if isinstance(arg, torch.fx.Node):
            return self.params.get(arg.name)
        return None

    def tensor_name(self, arg) -> str | None:
        """The parameter or buffer ``arg`` is, by its first name (a tensor two layers hold has
        one), or None."""
        name = self.param_name(arg) or self.buffer_name(arg)
        return self.canonical(name) if name else None

    def canonical(self, name: str) -> str:
        return self.aliases.get(name, name)

    def buffer_name(self, arg) -> str | None:
        return self.buffers.get(arg.name) if isinstance(arg, torch.fx.Node) else None

    def is_value(self, arg) -> bool:
        return isinstance(arg, torch.fx.Node) and arg.name in self.names

    def is_held(self, arg) -> bool:
        """Whether ``arg`` is the same for every sample: a parameter, a buffer, a constant
        (folded: computed from neither), or a value computed from them (its shape has no batch
        axis; it is computed for each sample and its gradient summed over the batch)."""
        return isinstance(arg, torch.fx.Node) and (
            self.param_name(arg) is not None
            or self.buffer_name(arg) is not None
            or arg.name in self.folded
            or arg.name in self.names
            and self.layout(arg, arg) is None
        )

    def sample_constant(self, node, arg) -> torch.Tensor:
        """A sample's values of constant ``arg`` (all of it where it has no batch axis; where
        it has, every sample's must be equal), in its per-sample shape."""
        value, at = self.folded[arg.name], self.layout(node, arg)
        if at is not None:
            p, o, k = at
            dims = value.shape
            rows = value.reshape(math.prod(dims[:p]) * o, -1, k * math.prod(dims[p + 1 :]))
            if not bool((rows == rows[:, :1]).all()):
                raise self.refuse(node, f"constant {arg.name!r} differs from sample to sample")
            value = rows[:, 0]
        return value.reshape(self.shape(node, arg))

    def constant(self, arg):
        """The value of a constant tensor ``arg`` (torch's, as it computed it on the example;
        see :meth:`_fold`), or None where ``arg`` is not one."""
        return self.folded.get(arg.name) if isinstance(arg, torch.fx.Node) else None

    def value(self, node, arg) -> str:
        """The IR value of tensor argument ``arg``, in its own shape (a sample's: see
        :meth:`shape`)."""
        if self.is_value(arg):
            return self.names[arg.name]
        if self.is_held(arg):
            return self._read(node, arg, self.shape(node, arg))
        raise self.refuse(node, f"operand {getattr(arg, 'name', arg)!r} is not a tensor")

    def operand(self, node, arg) -> str:
        """``arg``'s value as an operand of ``node``'s op: a value of the batch as it is; one
        the same for every sample, aligned as torch broadcasts it against ``node``'s result
        (its size at the batch axis, 1, dropped)."""
        at = self.layout(node)
        if at is None or self.layout(node, arg) is not None:
            return self.value(node, arg)
        shape = self.shape(node, arg)
        rank = len(node.meta["val"].shape)
        where = getattr(arg, "name", arg)
        if len(shape) > rank:
            raise self.refuse(node, f"{where!r} of shape {shape} has more axes than the result")
        shape = (1,) * (rank - len(shape)) + shape
        p, o, k = at
        if shape[p] != 1:
            raise self.refuse(
                node, f"{where!r} of shape {shape} meets the batch axis with {shape[p]} rows"
            )
        if o * k == 1:
            shape = shape[:p] + shape[p + 1 :]
        if self.is_value(arg):
            src = self.names[arg.name]
            if shape == self.shape(node, arg):
                return src
            return self.emit(node, "reshape", [src], {"shape": shape}, part=f"{arg.name}_aligned")
        return self._read(node, arg, shape)

    def held_as(self, node, arg, shape: tuple[int, ...], part: str) -> str:
        """``arg``, the same for every sample, as a value of ``shape`` (its values in order: a
        channel's weights as (C, 1, 1))."""
        if self.layout(node, arg) is not None:
            raise self.refuse(node, f"{arg.name!r} differs from sample to sample")
        if not self.is_value(arg):
            return self._read(node, arg, tuple(shape))
        return self.emit(node, "reshape", [self.names[arg.name]], {"shape": shape}, part=part)

    def _read(self, node, arg, shape: tuple[int, ...]) -> str:
        """A parameter, buffer or folded constant read whole as a value of ``shape``."""
        name = self.param_name(arg) or self.buffer_name(arg)
        role = (
            {"params": {"weight": name}} if self.param_name(arg) else {"buffers": {"value": name}}
        )
        if name is None:
            name = self._constant_buffer(node, arg)
            role = {"buffers": {"value": name}}
        key = (name, shape)
        if key not in self.held_values:
            made = f"{node.name}__{arg.name}"
            while made in self.held_values.values():  # read in two shapes by one node
                made += "_"
            self.nodes.append(Node(made, "parameter", [], made, {"shape": shape}, **role))
            self.held_values[key] = made
        return self.held_values[key]

    def constant_value(self, node, value: torch.Tensor, shape, part: str) -> str:
        """A constant a lowering makes (an index), read as a value of ``shape``."""
        name = self._new_constant(f"{node.name}__{part}", value)
        attrs = {"shape": tuple(shape)}
        return self.emit(node, "parameter", [], attrs, buffers={"value": name}, part=part)

    def _new_constant(self, stem: str, value: torch.Tensor) -> str:
        made = f"constant.{stem}"
        taken = dict(self.module.named_parameters()) | dict(self.module.named_buffers())
        while made in taken or made in self.constants:  # a module may name a buffer so too
            made += "_"
        self.constants[made] = value
        return made

    def _constant_buffer(self, node, arg) -> str:
        """The name of the compiled model's buffer holding folded constant ``arg`` (a sample's
        values, where it has the batch axis: every sample's must be equal)."""
        if arg.name in self.constant_names:
            return self.constant_names[arg.name]
        made = self._new_constant(arg.name, self.sample_constant(node, arg))
        self.constant_names[arg.name] = made
        return made

    def layout(self, node, arg=None) -> tuple[int, int, int]:
        """Where ``arg``'s samples are (default: ``node``'s result's): ``(p, o, k)``, torch's
        axis p holds o * B * k rows, sample b's at i * B * k + b * k + r (i < o, r < k). The
        model's inputs are (0, 1, 1); x.view(B * k, ...) gives k rows per sample, and a view
        of a value whose batch axis a permutation moved may give o > 1. A sample's values are
        those rows of axis p, the other axes whole, in that order (its per-sample shape: axis
        p of o * k, dropped where 1)."""
        subject = node if arg is None else arg
        if subject.name not in self.layouts:
            self.layouts[subject.name] = self._derived_layout(node, subject)
        return self.layouts[subject.name]

    def _derived_layout(self, node, subject) -> tuple[int, int, int] | None:
        dims = tuple(getattr(subject.meta.get("val"), "shape", ()))
        found = [(p, k) for p, d in enumerate(dims) if (k := batch_rows(d, self.batch))]
        if not found and subject.name not in self.data:
            return None  # the same for every sample
        if len(found) != 1:
            raise self.refuse(
                node,
                f"{subject.name!r} has shape {dims}, with no axis of the batch (or the batch "
                "times a number) though it is computed from the inputs: an op over the "
                "batch axis mixes the samples",
            )
        (p, rows), outer = found[0], 1
        # an op that keeps the samples' rows as they are: its operands' arrangement (views and
        # permutations, which change it, set theirs)
        reads = list(subject.all_input_nodes)
        if op_name(subject.target) == "getitem":  # a result of a layer's: the layer's operands
            reads = list(reads[0].all_input_nodes)
        operands = {
            at[1] for a in reads if a.name in self.names and (at := self.layout(subject, a))
        }
        if len(operands) > 1:
            raise self.refuse(node, "operands whose samples' rows are arranged differently")
        if operands:
            outer = operands.pop()
        if rows % outer:
            raise self.refuse(node, f"{subject.name!r} splits the rows of a sample")
        return p, outer, rows // outer

    def rows(self, node, arg=None) -> int:
        """How many rows of the batch axis each sample holds (o * k of :meth:`layout`)."""
        at = self.layout(node, arg)
        return 1 if at is None else at[1] * at[2]

    def merged(self, node, arg=None) -> bool:
        return self.rows(node, arg) > 1

    def shape(self, node, arg=None) -> tuple[int, ...]:
        """The per-sample shape of ``arg`` (default: of ``node``'s result): torch's shape with
        its batch axis dropped, or holding the rows of a sample where it holds several."""
        subject = node if arg is None else arg
        at = self.layout(node, arg)
        dims = tuple(subject.meta["val"].shape)
        if at is None:
            return tuple(int(d) for d in dims)
        p, o, k = at
        try:
            rest = [int(d) for i, d in enumerate(dims) if i != p]
        except TypeError as exc:  # a symbolic size past the batch axis
            raise self.refuse(
                node,
                f"{subject.name!r} has shape {dims}: a per-sample size "
                "that depends on the batch size",
            ) from exc
        return tuple(rest[:p] + ([o * k] if o * k > 1 else []) + rest[p:])

    def axis(self, node, arg, dim: int) -> int:
        """The per-sample axis of torch's ``dim`` of ``arg`` (refused: the batch axis)."""
        rank = len(arg.meta["val"].shape)
        full = dim + rank if dim < 0 else dim
        at = self.layout(node, arg)
        if at is None and 0 <= full < rank:
            return full
        p = at[0] if at else 0
        if not 0 <= full < rank or full == p:
            raise self.refuse(node, f"dim={dim} is the batch axis or out of range")
        return full if self.merged(node, arg) or full < p else full - 1

    def batch_first(self, node, arg, what: str) -> None:
        """Refuse ``arg`` unless its batch axis is torch's first, one row per sample."""
        if self.layout(node, arg) != (0, 1, 1):
            raise self.refuse(
                node,
                f"a {what} of a value whose batch axis torch moved or merged with another",
            )

    def number(self, node, arg, what: str) -> float:
        if isinstance(arg, bool) or not isinstance(arg, (int, float)):
            raise self.refuse(node, f"{what} {arg!r} is not a number")
        return float(arg)

    # -- what a lowering adds ---------------------------------------------------------------
    def emit(
        self,
        node,
        op: str,
        inputs: list[str],
        attrs=None,
        params=None,
        buffers=None,
        part: str = "",
    ) -> str:
        """An IR node made for ATen ``node`` (``part``: a name for a step before the last);
        the last one emitted without ``part`` is ``node``'s value."""
        name = f"{node.name}__{part}" if part else node.name
        self.nodes.append(
            Node(
                name,
                op,
                list(inputs),
                name,
                dict(attrs or {}),
                dict(params or {}),
                dict(buffers or {}),
            )
        )
        if not part:
            self.names[node.name] = name
        return name

    # -- the walk ---------------------------------------------------------------------------
    def graph(self) -> Graph:
        """The IR of what the model's outputs read (in training, torch.export also returns the
        running statistics BatchNorm updates, which the compiled model updates itself)."""
        every = self.program.graph.nodes
        results = next(n for n in every if n.op == "output").args[0]
        specs = self.program.graph_signature.output_specs
        # the state the compiled model keeps is BatchNorm's, updated by it; an input written
        # in place (nn.ReLU(inplace=True) first) is the caller's tensor, which it leaves as is
        for spec in specs:
            if spec.kind.name in ("USER_OUTPUT", "USER_INPUT_MUTATION"):
                continue
            if not self._batch_norm_state(spec.target):
                raise IRError(
                    f"torch.export: the model writes {spec.target or spec.arg.name!r} in "
                    f"forward ({spec.kind.name.lower()}); the compiled model would not: "
                    "rootclad compiles models whose forward writes only BatchNorm's running "
                    "statistics"
                )
        outs = [r for r, o in zip(results, specs, strict=True) if o.kind.name == "USER_OUTPUT"]
        if not all(isinstance(o, torch.fx.Node) for o in outs):
            raise IRError(
                "torch.export: the model returns None or numbers beside its tensors; "
                "rootclad compiles models that return tensors"
            )
        needed, todo = set(), list(outs)
        while todo:
            node = todo.pop()
            if node.name not in needed:
                needed.add(node.name)
                todo.extend(node.all_input_nodes)
        fold(self, needed)
        indices = index_bounds(self, self.sizes)
        sample_offsets(self)
        inputs, shapes = [], []
        for node in every:
            if node.name in self.folded:
                continue  # read where an op takes it
            if node.op == "placeholder" and node.name in self.user_inputs:
                inputs.append(node.name)
                shapes.append(self.shape(node))
                self.names[node.name] = node.name
            elif node.op == "call_function" and node.name in needed:
                self._call(node)
        output, parts, container = outputs(self, outs)
        self.nodes = _read_by(self.nodes, output)
        masks = tuple(
            self.program.graph.find_nodes(op="placeholder", target=n)[0].meta["val"].dtype
            == torch.bool
            for n in inputs
        )
        graph = Graph(
            inputs,
            shapes,
            self.nodes,
            output,
            [],
            self.dtype,
            masks=masks if any(masks) else (),
            indices=indices,
            parts=parts,
            container=container,
        )
        graph.constants = dict(self.constants)
        return graph

    def _batch_norm_state(self, name) -> bool:
        """Whether buffer ``name`` is a BatchNorm layer's running statistics or batch count."""
        path, _, leaf = (name or "").rpartition(".")
        try:
            mod = self.module.get_submodule(path)
        except AttributeError:
            return False
        stats = ("running_mean", "running_var", "num_batches_tracked")
        return isinstance(mod, nn.modules.batchnorm._BatchNorm) and leaf in stats

    def _call(self, node) -> None:
        name = op_name(node.target)
        if name == "getitem":  # one result of an op of several (a kept layer's first)
            src, i = node.args
            values = self.tuples.get(src.name)
            if values is None or values[i] is None:
                if not node.users:
                    return
                raise self.refuse(node, f"result {i} of {src.name!r} is not computed")
            self.names[node.name] = values[i]
            return
        if name.startswith("aten.sym_") or _is_shape_arithmetic(node):
            return  # sizes: torch.export keeps them symbolic; the lowerings read shapes
        if node.name in self.offset_nodes:
            return
        if node.name in self.offsets:  # local indices: the value of the sum's other term
            local = self.offsets[node.name][0]
            self.names[node.name] = self.names[local.name]
            self.layouts[node.name] = self.layout(node, local)
            return
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and free_unbacked_symbols(val):
            raise self.refuse(
                node,
                f"a result whose shape depends on the values (torch.nonzero, boolean masking, "
                f"unique): shape {tuple(val.shape)}",
            )
        if isinstance(val, torch.Tensor) and any(d == 0 for d in val.shape):
            raise self.refuse(node, f"an empty result of shape {tuple(val.shape)}")
        lowering = LOWERINGS.get(name)
        if lowering is None:
            raise self.refuse(
                node,
                f"not supported (rootclad lowers {len(LOWERINGS)} ATen ops, listed in "
                "rootclad.frontends.aten.table.LOWERINGS)",
            )
        try:
            lowering(self, node, node.args, node.kwargs)
        except IRError:
            raise
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
            raise self.refuse(
                node, f"arguments {node.args} {dict(node.kwargs)} not understood ({exc!r})"
            ) from exc
        if node.name in self.names and not isinstance(node.meta.get("val"), (tuple, list)):
            self.expected[self.names[node.name]] = self.shape(node)


def _read_by(nodes: list[Node], output: str) -> list[Node]:
    """``nodes`` but those the output does not read (a value a later lowering read otherwise:
    the weight a convolution of a scaled parameter reads unscaled)."""
    needed, keep = {output}, []
    for n in reversed(nodes):
        if n.output in needed:
            keep.append(n)
            needed.update(n.inputs)
    return keep[::-1]


def _is_shape_arithmetic(node) -> bool:
    val = node.meta.get("val")
    return (
        isinstance(val, (torch.SymInt, torch.SymFloat, int, float))
        or val is None
        and not (node.users)
    )


class _Alone(nn.Module):
    """A layer compiled alone that returns more than a model built on it reads: a recurrent
    layer's output sequence (torch returns it beside the last states), multi-head attention
    of one input attending to itself (its output, not the averaged weights)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, *xs):
        if isinstance(self.layer, nn.MultiheadAttention):
            return self.layer(*xs * 3, need_weights=False)[0]
        return self.layer(*xs)[0]


def _alone(module: nn.Module, example_input) -> nn.Module:
    one = not isinstance(example_input, (tuple, list))
    if isinstance(module, nn.RNNBase) or isinstance(module, nn.MultiheadAttention) and one:
        return _Alone(module)
    return module


def graph_from_export(module: nn.Module, example_input, dtype: str) -> Graph:
    """The validated graph of ``module`` captured by torch.export; refused, naming the ATen
    op and module, where an op has no lowering."""
    captured, reads = _alone(module, example_input), []
    program, model, examples = export_program(captured, example_input, reads)
    low = Lowering(model, program, dtype, examples)
    graph = low.graph()
    if captured is not module:  # the layer's own names, not the wrapper's
        for node in graph.nodes:
            node.params = {r: n.removeprefix("layer.") for r, n in node.params.items()}
    aliases = parameter_aliases(module)
    for node in graph.nodes:
        node.params = {r: aliases.get(n, n) for r, n in node.params.items()}
        node.buffers = {r: aliases.get(n, n) for r, n in node.buffers.items()}
    graph.params = [Param(n, tuple(p.shape)) for n, p in module.named_parameters()]
    used = {b for node in graph.nodes for b in node.buffers.values()}
    graph.buffers = [
        Param(n, tuple(b.shape), persistent(module, n))
        for n, b in module.named_buffers()
        if n in used
    ] + [Param(n, tuple(c.shape), False) for n, c in graph.constants.items()]
    try:
        graph.validate()
    except IRError as exc:  # an IR node's check: named with the ATen node (and file node) too
        made = {n.name: n for n in program.graph.nodes}.get(str(exc).split(" ")[0].split("__")[0])
        if made is None:
            raise
        raise IRError(f"{low.where(made)}: {exc}") from exc
    for node in graph.nodes:  # the IR's shapes are torch's: a lowering that differs is a bug
        want = low.expected.get(node.output)
        if want is not None and tuple(node.out_shape) != want:
            raise IRError(
                f"{node.describe()}: rootclad infers the per-sample shape "
                f"{node.out_shape}, torch gives {want}"
            )
    graph = simplify(graph)
    graph.mode_reads, graph.training_mode = tuple(reads), module.training
    return graph
