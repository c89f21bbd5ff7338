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

import warnings

import torch
from torch import nn

from rootclad.frontends.aten import layers, layout, pointwise  # noqa: F401  (fill LOWERINGS)
from rootclad.frontends.aten.table import KEPT, LOWERINGS, op_name
from rootclad.ir.graph import Graph, IRError, Node, Param
from rootclad.ir.optimize import drop_identities, global_pools, pool_before_activation


def _training_only(mod: nn.Module) -> bool:
    """A module that acts in training only, and vanishes from an eval-mode capture: dropout,
    torchvision's stochastic depth."""
    return isinstance(mod, nn.modules.dropout._DropoutNd) or type(mod).__name__ == "StochasticDepth"


class Lowering:
    """The exported program being lowered: the IR nodes so far and what they are made from."""

    def __init__(self, module: nn.Module, program, dtype: str):
        self.module, self.program, self.dtype = module, program, dtype
        signature = program.graph_signature
        self.params = dict(signature.inputs_to_parameters)  # placeholder -> parameter name
        self.buffers = dict(signature.inputs_to_buffers)
        self.user_inputs = list(signature.user_inputs)
        from rootclad.frontends.torch_fx import parameter_aliases

        self.aliases = parameter_aliases(module)
        self.nodes: list[Node] = []
        self.names: dict[str, str] = {}  # ATen node name -> IR value name
        self.tuples: dict[str, list[str | None]] = {}  # ATen node of several results -> values
        placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        self.batch = placeholders[self.user_inputs[0]].meta["val"].shape[0]
        self.expected: dict[str, tuple[int, ...]] = {}
        self.held_values: dict[tuple, str] = {}  # (parameter, per-sample shape) -> its value
        # a permutation moving the batch axis whose users take pieces of its first axis: the
        # value it permutes, the permutation and the rows taken, lowered by each piece
        # (layout._select_moved)
        self.moved: dict[str, tuple] = {}

    # -- what a lowering reads ------------------------------------------------------------
    def where(self, node) -> str:
        path, mod = self.module_of(node)
        inside = f" in module {path!r} ({type(mod).__name__})" if path else ""
        return f"ATen op {op_name(node.target)} (node {node.name!r}{inside})"

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

    def held(self, node, arg, rank: int) -> str:
        """A parameter or buffer read as a value (the same for every sample) next to values of
        ``rank`` per-sample axes: its shape aligned as torch broadcasts it, a leading axis of 1
        standing for the batch axis."""
        name = self.param_name(arg) or self.buffer_name(arg)
        shape = tuple(int(d) for d in arg.meta["val"].shape)
        if len(shape) == rank + 1:
            if shape[0] != 1:
                raise self.refuse(
                    node, f"{name!r} of shape {shape} meets the batch axis with {shape[0]} rows"
                )
            shape = shape[1:]
        if len(shape) > rank:
            raise self.refuse(node, f"{name!r} of shape {shape} has more axes than a sample")
        shape = (1,) * (rank - len(shape)) + shape
        key = (name, shape)
        if key not in self.held_values:
            role = (
                {"params": {"weight": name}}
                if self.param_name(arg)
                else {"buffers": {"value": name}}
            )
            made = f"{node.name}__{arg.name}"
            self.nodes.append(Node(made, "parameter", [], made, {"shape": shape}, **role))
            self.held_values[key] = made
        return self.held_values[key]

    def is_held(self, arg) -> bool:
        return self.param_name(arg) is not None or self.buffer_name(arg) is not None

    def value(self, node, arg) -> str:
        """The IR value of a tensor argument that carries the batch axis."""
        if self.is_value(arg):
            return self.names[arg.name]
        what = "a parameter" if self.param_name(arg) else repr(getattr(arg, "name", arg))
        raise self.refuse(
            node,
            f"operand {what} is not a value of the batch (the export front-end takes "
            "parameters and buffers as operands of arithmetic and expand, and where a layer "
            "reads them; tensors made in forward not yet)",
        )

    def rows(self, node, arg=None) -> int:
        """How many rows of the value's first axis each sample holds: 1 where that axis is
        the batch, k where torch merged it with another of size k (x.view(B * k, ...)), whose
        rows b*k ... b*k + k - 1 are sample b's. Anything else is refused."""
        subject = node if arg is None else arg
        dims = tuple(getattr(subject.meta.get("val"), "shape", ()))
        k = _batch_rows(dims[0], self.batch) if dims else None
        if k is None:
            raise self.refuse(
                node,
                f"{subject.name!r} has shape {dims}, whose first axis is not "
                "the batch (or the batch times a number)",
            )
        return k

    def merged(self, node, arg=None) -> bool:
        return self.rows(node, arg) > 1

    def shape(self, node, arg=None) -> tuple[int, ...]:
        """The per-sample shape of ``arg`` (default: of ``node``'s result): torch's shape
        without the batch axis, or with the rows of a sample first where it is merged."""
        subject = node if arg is None else arg
        k = self.rows(node, arg)
        dims = tuple(subject.meta["val"].shape)
        try:
            return ((k,) if k > 1 else ()) + tuple(int(d) for d in dims[1:])
        except TypeError as exc:  # a symbolic size past the batch axis
            raise self.refuse(
                node,
                f"{subject.name!r} has shape {dims}: a per-sample size "
                "that depends on the batch size",
            ) from exc

    def axis(self, node, arg, dim: int) -> int:
        """The per-sample axis of torch's ``dim`` of ``arg`` (refused: the batch axis)."""
        rank = len(arg.meta["val"].shape)
        full = dim + rank if dim < 0 else dim
        if not 1 <= full < rank:
            raise self.refuse(node, f"dim={dim} is the batch axis or out of range")
        return full if self.merged(node, arg) else full - 1

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
        user = set(self.program.graph_signature.user_outputs)
        results = next(n for n in every if n.op == "output").args[0]
        outs = [o for o in results if getattr(o, "name", None) in user]
        if len(outs) != 1:
            raise IRError(
                "torch.export: the export front-end compiles models of one output "
                f"tensor so far; this one returns {len(outs)}"
            )
        needed, todo = set(), list(outs)
        while todo:
            node = todo.pop()
            if node.name not in needed:
                needed.add(node.name)
                todo.extend(node.all_input_nodes)
        inputs, shapes = [], []
        for node in every:
            if node.op == "placeholder" and node.name in self.user_inputs:
                if not node.meta["val"].dtype.is_floating_point:  # masks, indices: fx's for now
                    raise IRError(
                        f"torch.export: input {node.name!r} is of type "
                        f"{node.meta['val'].dtype}; the export front-end takes "
                        "floating-point inputs so far (frontend='fx' takes masks "
                        "and indices)"
                    )
                inputs.append(node.name)
                shapes.append(self.shape(node))
                self.names[node.name] = node.name
            elif node.op == "call_function" and node.name in needed:
                self._call(node)
        if len(results) - len(outs) != len(self.program.graph_signature.buffers_to_mutate):
            raise IRError(
                "torch.export: the export front-end compiles models of one output "
                "tensor so far; this one returns others (None or numbers) too"
            )
        if not self.is_value(outs[0]) or self.merged(outs[0]):
            raise IRError(
                "torch.export: the model's output is not a value of the batch (its "
                "first axis is not the batch axis alone)"
            )
        return Graph(inputs, shapes, self.nodes, self.names[outs[0].name], [], self.dtype)

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
        lowering = LOWERINGS.get(name)
        if lowering is None:
            raise self.refuse(
                node,
                f"not supported by the export front-end yet (it lowers "
                f"{len(LOWERINGS)} ATen ops, listed in rootclad.frontends."
                "aten.table.LOWERINGS); frontend='fx' may take the model",
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


def _batch_rows(size, batch) -> int | None:
    """k where ``size`` is k times the batch size (the symbol itself, not a number that equals
    the example's batch), else None."""
    if not isinstance(size, torch.SymInt):
        return None
    ratio = size.node.expr / batch.node.expr
    return int(ratio) if ratio.is_Integer and int(ratio) >= 1 else None


def _is_shape_arithmetic(node) -> bool:
    val = node.meta.get("val")
    return (
        isinstance(val, (torch.SymInt, torch.SymFloat, int, float))
        or val is None
        and not (node.users)
    )


def _examples(example_input) -> tuple[torch.Tensor, ...]:
    xs = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    # a batch of one would be specialised (torch.export fixes sizes 0 and 1): two of it
    return tuple(torch.cat([x, x]) if x.shape[0] == 1 else x for x in xs)


def export_program(module: nn.Module, example_input):
    """``module`` captured by torch.export (batch axis dynamic) in its own mode, as torch.fx
    traces it, but for dropout and stochastic depth, captured as in training (in eval mode
    they would vanish; compiled, they obey cm.train() and cm.eval()); decomposed into core ATen
    ops but for the layers in :data:`KEPT`."""
    import copy

    xs = _examples(example_input)
    batch = torch.export.Dim("batch", min=1)
    model = copy.deepcopy(module)
    for mod in model.modules():  # captured as in training: their ops obey cm.train()/eval()
        if _training_only(mod):
            mod.train()
    table = torch.export.default_decompositions()
    for kept in KEPT:
        _, packet, overload = kept.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    with warnings.catch_warnings():  # torch.export's own deprecation notices (pytree)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.|copyreg")
        try:
            program = torch.export.export(
                model, xs, dynamic_shapes=tuple({0: batch} for _ in xs), strict=False
            )
        except Exception as exc:  # torch's own message names the line that failed
            raise IRError(
                f"torch.export could not capture {type(module).__name__}: "
                f"{type(exc).__name__}: {str(exc)[:2000]}"
            ) from exc
        return program.run_decompositions(table), model


def graph_from_export(module: nn.Module, example_input, dtype: str) -> Graph:
    """The validated graph of ``module`` captured by torch.export; refused, naming the ATen
    op and module, where an op has no lowering."""
    from rootclad.frontends.torch_fx import _persistent, parameter_aliases

    program, model = export_program(module, example_input)
    low = Lowering(model, program, dtype)
    graph = low.graph()
    aliases = parameter_aliases(module)
    for node in graph.nodes:
        node.params = {r: aliases.get(n, n) for r, n in node.params.items()}
        node.buffers = {r: aliases.get(n, n) for r, n in node.buffers.items()}
    graph.params = [Param(n, tuple(p.shape)) for n, p in module.named_parameters()]
    used = {b for node in graph.nodes for b in node.buffers.values()}
    graph.buffers = [
        Param(n, tuple(b.shape), _persistent(module, n))
        for n, b in module.named_buffers()
        if n in used
    ]
    graph.validate()
    for node in graph.nodes:  # the IR's shapes are torch's: a lowering that differs is a bug
        want = low.expected.get(node.output)
        if want is not None and tuple(node.out_shape) != want:
            raise IRError(
                f"{node.describe()}: rootclad infers the per-sample shape "
                f"{node.out_shape}, torch gives {want}"
            )
    return pool_before_activation(global_pools(drop_identities(graph)))  # as torch_fx's
