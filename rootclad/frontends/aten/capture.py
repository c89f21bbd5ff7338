"""The capture: a torch module as torch.export's program of core ATen ops (the batch axis
dynamic), which :mod:`rootclad.frontends.aten.lowering` walks."""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import re
import threading
import warnings
from pathlib import Path

import torch
import torch.fx.traceback as fx_traceback
from torch import nn

from rootclad.frontends.aten.draws import own_ops
from rootclad.frontends.aten.modes import training_reads
from rootclad.frontends.aten.table import AS_IS, KEPT, LOWERINGS, op_name
from rootclad.ir.graph import IRError

_ONCE = threading.Lock()


@contextlib.contextmanager
def _cia_ops_listed_once():
    """torch.export lists the dispatcher's composite ops (populating ``torch.ops``) once per
    op namespace, twice in a decomposition: about 50 walks of some 5,000 registrations, a third
    of a small model's capture. Nothing registers an op while one capture runs, so within it
    the first walk stands for the rest (torch cannot keep it across calls: a library loaded
    between two captures may register more)."""
    from torch._export import utils

    walk, walked = utils._materialize_cpp_cia_ops, []

    def once() -> None:
        if not walked:
            walk()
            walked.append(True)

    with _ONCE:
        utils._materialize_cpp_cia_ops = once
        try:
            yield
        finally:
            utils._materialize_cpp_cia_ops = walk


def _run_decompositions(program, table: dict):
    """torch's ``program.run_decompositions(table)``, telling torch only of the composite ops
    it must treat otherwise than the dispatcher would (those kept whole, and those ``table``
    decomposes its own way; the others decompose as the dispatcher decomposes them either
    way). torch re-registers the Python kernels of every composite op it is told of around
    each decomposition (525 ops in torch 2.13): 0.23 s of a small model's 0.1 s otherwise."""
    from torch.export import exported_program

    with _cia_ops_listed_once():
        composite = exported_program._collect_all_valid_cia_ops()
        kept = composite - set(table)
        ours = _recurrent_decompositions().keys()
        own = {op: fn for op, fn in table.items() if op in composite and op in ours}
        rest = {op: fn for op, fn in table.items() if op not in composite}
        listed, me = exported_program._collect_all_valid_cia_ops, threading.get_ident()

        def told() -> set:  # (another thread's decomposition, outside rootclad: torch's list)
            return kept | set(own) if threading.get_ident() == me else listed()

        exported_program._collect_all_valid_cia_ops = told
        try:
            return program.run_decompositions({**rest, **own})
        finally:
            exported_program._collect_all_valid_cia_ops = listed


@contextlib.contextmanager
def _quiet(name: str):
    """The logger ``name`` quiet but for critical messages while the block runs (a filter of
    its own: another thread's capture adds and removes its own)."""
    log = logging.getLogger(name)

    def critical(record) -> bool:
        return record.levelno >= logging.CRITICAL

    log.addFilter(critical)
    try:
        yield
    finally:
        log.removeFilter(critical)


def _training_only(mod: nn.Module) -> bool:
    """A module that acts in training only, and vanishes from an eval-mode capture: dropout,
    a recurrent layer's between its layers, attention's of its weights (torchvision's
    stochastic depth is captured
    as one op in either mode: draws.own_ops)."""
    return isinstance(mod, nn.modules.dropout._DropoutNd) or (
        isinstance(mod, (nn.RNNBase, nn.MultiheadAttention)) and mod.dropout > 0
    )


@contextlib.contextmanager
def _unaliased(module: nn.Module):
    """Each layer registered under one name while the block runs: a layer held twice
    (``self.again = self.bn``) is an attribute under its other names, which forward reads as
    before (torch 2.13's decomposition fails on a buffer written under two names)."""
    moved = []
    seen = set()
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)  # (they call what they list)
    for parent in module.modules():
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            stateful = next(child.buffers(), None) is not None
            if id(child) in seen and stateful and not isinstance(parent, containers):
                moved.append((parent, dict(parent._modules), name, child))
            seen.add(id(child))
    for parent, _, name, child in moved:
        del parent._modules[name]
        object.__setattr__(parent, name, child)
    try:
        yield
    finally:
        for parent, order, name, _ in reversed(moved):
            object.__delattr__(parent, name)
            parent._modules.clear()
            parent._modules.update(order)


def _stack(node) -> list[tuple[str, str]]:
    """The layers (path, class) whose forward made ``node``, outermost first."""
    return list((node.meta.get("nn_module_stack") or {}).values())


def _check_layer(path: str, mod: nn.Module) -> None:
    """Refuse, naming the layer, options of torch's layers the compiled model has no kernel
    for and which torch.export would capture as something else than they are."""
    where = f"module {path!r} ({type(mod).__name__})"
    if _training_only(mod) and float(getattr(mod, "p", 0)) >= 1:
        raise IRError(f"{type(mod).__name__}(p={mod.p}): every value dropped")
    mode = getattr(mod, "padding_mode", "zeros")
    if isinstance(mod, nn.modules.conv._ConvNd) and mode != "zeros":
        raise IRError(f"{where}: padding_mode={mode!r} (zero padding is supported)")
    if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.training and mod.momentum is None:
        raise IRError(f"{where}: momentum=None (a cumulative average) in training")


def _layer_by_layer(impl):
    """torch's decomposition ``impl`` of a recurrent layer of several layers, one layer at a
    time with torch's dropout between them in training: torch 2.13's own drops it (its test
    ``num_layers < i - 1`` is never true), which eager torch does not."""

    def decomposed(x, hx, params, biases, layers, dropout, train, bidirectional, batch_first):
        if not (dropout and train and layers > 1):
            return impl(x, hx, params, biases, layers, dropout, train, bidirectional, batch_first)
        lstm = isinstance(hx, (list, tuple))
        states = list(hx) if lstm else [hx]
        dirs = 2 if bidirectional else 1
        projected = lstm and states[0].shape[-1] != states[1].shape[-1]
        per = (2 + 2 * biases + projected) * dirs  # tensors per layer, as nn.LSTM lists them
        finals = []
        for i in range(layers):
            mine = [s[i * dirs : (i + 1) * dirs] for s in states]
            weights = params[i * per : (i + 1) * per]
            first = mine if lstm else mine[0]
            x, *last = impl(x, first, weights, biases, 1, 0.0, train, bidirectional, batch_first)
            finals.append(last)
            if i < layers - 1:
                x = torch.dropout(x, dropout, True)
        return (x, *(torch.cat([f[j] for f in finals]) for j in range(len(states))))

    return decomposed


def _recurrent_decompositions() -> dict:
    from torch._decomp import decompositions as d

    aten = torch.ops.aten
    return {
        aten.lstm.input: _layer_by_layer(d.lstm_impl),
        aten.gru.input: _layer_by_layer(d.gru_impl),
        aten.rnn_tanh.input: _layer_by_layer(d.rnn_tanh_input),
        aten.rnn_relu.input: _layer_by_layer(d.rnn_relu_input),
    }


def _examples(example_input) -> tuple[torch.Tensor, ...]:
    xs = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    # a batch of one would be specialised (torch.export fixes sizes 0 and 1): two of it
    return tuple(torch.cat([x, x]) if x.shape[0] == 1 else x for x in xs)


def _materialise(module: nn.Module, xs: tuple) -> None:
    """Lazy layers (LazyLinear) given their parameters' shapes: one forward on the example,
    in the parameters' type, as torch's own first call does."""
    ready = [p for p in module.parameters() if not isinstance(p, nn.UninitializedParameter)]
    dtype = ready[0].dtype if ready else None
    modes = [(m, m.training) for m in module.modules()]
    try:  # in eval mode (no running statistics moved), the caller's random state kept
        with torch.no_grad(), torch.random.fork_rng():
            module.eval()(*(x.to(dtype) if dtype and x.is_floating_point() else x for x in xs))
    finally:
        for m, training in modes:
            m.training = training


def _dynamic(module: nn.Module, xs: tuple, batch) -> tuple:
    """torch.export's dynamic shapes: every input's first axis is the batch (those a forward
    takes as ``*rest`` as one tuple)."""
    import inspect

    kinds = [p.kind for p in inspect.signature(module.forward).parameters.values()]
    rest = next((i for i, k in enumerate(kinds) if k == inspect.Parameter.VAR_POSITIONAL), None)
    axes = tuple({0: batch} for _ in xs)
    return axes if rest is None or rest >= len(xs) else (*axes[:rest], axes[rest:])


def export_program(module: nn.Module, example_input, reads: list | None = None):
    """``module`` captured by torch.export (batch axis dynamic) in its own mode, but for
    dropout, captured as in training (in eval mode it would vanish; compiled, it obeys
    cm.train() and cm.eval()); decomposed into core ATen ops but for the layers in
    :data:`KEPT`. ``reads`` gets the layers whose forward read ``self.training``."""
    xs = _examples(example_input)
    if any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in module.modules()):
        _materialise(module, xs)
    batch = torch.export.Dim("batch", min=1)
    # captured as in training (switched for the capture, not on a copy: the old weight norm's
    # modules cannot be copied); p >= 1: torch writes zeros, no draw to switch off
    switched = [m for m in module.modules() if _training_only(m) and not m.training]
    table = torch.export.default_decompositions()
    table.update(_recurrent_decompositions())
    for kept in KEPT:
        _, packet, overload = kept.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    with warnings.catch_warnings():  # torch.export's own deprecation notices (pytree)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.|copyreg")
        # the recurrent layers' own weights list, which torch rebuilds in forward
        warnings.filterwarnings("ignore", message=r"The tensor attributes self\.\S*_flat_weights")
        # the old nn.utils.weight_norm's weight, which its hook computes in the captured graph
        warnings.filterwarnings("ignore", message=r"The tensor attribute self\.\S+ was assigned")
        try:
            for mod in switched:
                mod.training = True
            # (what an ONNX file's replay notes; torch's log of a failing op, which the
            # refusal below names, quiet)
            quiet = _quiet("torch._subclasses.fake_tensor")
            spied = training_reads(module, [] if reads is None else reads)
            with (
                fx_traceback.preserve_node_meta(),
                quiet,
                own_ops(module),
                _unaliased(module),
                spied,
            ):
                program = torch.export.export(
                    module, xs, dynamic_shapes=_dynamic(module, xs, batch), strict=False
                )
        except IRError:  # a forward of rootclad's own (an ONNX file's) refusing a node
            raise
        except Exception as exc:  # torch's own message names the line that failed
            failing = _failing_layer(module, exc)
            if failing:  # a layer's option torch.export cannot capture (momentum=None)
                _check_layer(*failing[:2])
            raise IRError(
                f"torch.export could not capture {type(module).__name__}{_failed_in(module, exc)}"
                f": {_fixed_batch(module, xs, exc)}{type(exc).__name__}: {str(exc)[:2000]}"
            ) from exc
        finally:
            for mod in switched:
                mod.training = False
        used = {p for n in program.graph.nodes for p, _ in _stack(n)}
        for path, mod in module.named_modules():  # the layers forward calls
            if path in used:
                _check_layer(path, mod)
        _no_gradient_blocks(program, module)
        try:
            return _decomposed(program, table), module, xs
        except Exception as exc:  # torch's own decomposition failing (a layer held twice)
            raise IRError(
                f"torch.export could not decompose {type(module).__name__} into core ATen "
                f"ops: {type(exc).__name__}: {str(exc)[:2000]}"
            ) from exc


def _floats(node) -> bool:
    """Whether ``node`` makes a floating-point tensor (or a tuple holding one)."""
    made = node.meta.get("val")
    made = made if isinstance(made, (tuple, list)) else [made]
    return any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in made)


def _reached(graph, reached: set[str]) -> set[str]:
    """``reached`` and the floating-point values of ``graph`` computed from them (a shape, an
    index, a comparison carry no gradient)."""
    reached = set(reached)
    for node in graph.nodes:
        if node.op == "call_function" and _floats(node):
            if any(a.name in reached for a in node.all_input_nodes):
                reached.add(node.name)
    return reached


def _no_gradient_blocks(program, module: nn.Module) -> None:
    """Refuse a ``torch.no_grad()`` block in forward whose floating-point results are computed
    from the values of an input or a parameter: the compiled backward has no place where a
    gradient stops (torch.export keeps the block as one node, which the decomposition inlines
    without a trace). A block of indices (a k-nearest-neighbour search), of shapes or of
    buffers stops nothing."""
    sig = program.graph_signature
    reached = _reached(program.graph, {*sig.user_inputs, *sig.inputs_to_parameters})
    for node in program.graph.nodes:
        if node.target is not torch.ops.higher_order.wrap_with_set_grad_enabled or node.args[0]:
            continue
        block = getattr(program.graph_module, node.args[1].target)
        inner = [n for n in block.graph.nodes if n.op == "placeholder"]
        args = node.args[2:]
        named = [getattr(a, "name", None) for a in args]
        given = {p.name for p, a in zip(inner, named, strict=True) if a in reached}
        values = _reached(block.graph, given)
        outputs = block.graph.output_node().all_input_nodes
        if any(o.name in values and _floats(o) for o in outputs):
            path, cls = ([("", "")] + _stack(node))[-1]
            where = f"module {path!r} ({cls.rsplit('.', 1)[-1]})" if path else "the model"
            traces = (n.meta.get("stack_trace") for n in block.graph.nodes)  # its first line
            trace = next((t for t in traces if t), "")
            frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', trace)
            own = [f for f in frames if f"{os.sep}torch{os.sep}" not in f[0]]
            line = f", at {Path(own[-1][0]).name}:{own[-1][1]} {own[-1][2]!r}" if own else ""
            raise IRError(
                f"{type(module).__name__}: a torch.no_grad() block in {where}{line} "
                "stops the gradient of what an input or a parameter reaches, which the "
                "compiled backward cannot do (compute it outside the block, or pass it as an "
                "input)"
            )


def _failing_layer(module: nn.Module, exc: Exception) -> tuple | None:
    """(path, layer, file, line): the innermost layer whose forward was running where ``exc``
    was raised, or None."""
    paths = {id(m): p for p, m in module.named_modules()}
    found, tb = None, exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if tb.tb_frame.f_code.co_name == "forward" and id(owner) in paths:
            found = (paths[id(owner)], owner, tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


def _failed_in(module: nn.Module, exc: Exception) -> str:
    """' (in module 'path' (Class), file:line)': where :func:`_failing_layer` says, or ''."""
    found = _failing_layer(module, exc)
    if found is None:
        return ""
    path, owner, file, line = found
    where = f"module {path!r}" if path else "the model"
    return f" (in {where} ({type(owner).__name__}), {Path(file).name}:{line})"


def _fixed_batch(module: nn.Module, xs: tuple, exc: Exception) -> str:
    """What makes a forward fix the batch size, where torch.export says it does: the line of
    the model's that did (an op reading the batch axis as another), and a time-first recurrent
    layer given a batch-first input."""
    if "Constraints violated (batch)" not in str(exc):
        return ""
    time_first = [
        f"{path!r} ({type(m).__name__}) has batch_first=False: it reads axis 0 as time; give it "
        "x.transpose(0, 1) or build it with batch_first=True"
        for path, m in module.named_modules()
        if isinstance(m, nn.RNNBase) and not m.batch_first
    ]
    line = _fixing_line(module, xs)
    why = "; ".join(([line] if line else []) + time_first)
    return f"its forward fixes the batch size ({why or 'an op reads the batch axis'}): "


def _fixing_line(module: nn.Module, xs: tuple) -> str:
    """The model's own line at which torch fixed the batch size to the example's, found by
    capturing again with torch's log of the guard it added (and its stack), or ''."""
    import re

    import torch.fx.experimental._config as shapes_config

    def guards(**patch) -> list:
        log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
        found, handlers, level = [], log.handlers[:], log.level

        class Keep(logging.Handler):
            def emit(self, record):
                found.append(record)

        log.handlers, log.propagate = [Keep()], False
        log.setLevel(logging.INFO)
        try:
            with shapes_config.patch(**patch), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                batch = torch.export.Dim("batch", min=1)
                dims = _dynamic(module, xs, batch)
                torch.export.export(module, xs, dynamic_shapes=dims, strict=False)
        except Exception:
            pass
        finally:
            log.handlers, log.propagate = handlers, True
            log.setLevel(level)
        return found

    added = (re.search(r"eval (.*\bs\d+\b.*) \[guard added\]", r.getMessage()) for r in guards())
    guard = next((m.group(1) for m in added if m), None)  # the first on the batch size
    if guard is None:
        return ""
    stacks = [r.stack_info or "" for r in guards(extended_debug_guard_added=guard)]
    frames = re.findall(
        r'File "([^"]+)", line (\d+), in \S+\n(?!\s*File ")\s*(.*)', "".join(stacks)
    )
    package = str(Path(__file__).resolve().parents[2])
    ours = [i for i, f in enumerate(frames) if f[0].startswith(package)]
    inner = frames[ours[-1] + 1 :] if ours else []  # what rootclad's call to torch ran
    own = [f for f in inner if f"{os.sep}torch{os.sep}" not in f[0]]
    if not own:
        return ""
    path, number, code = own[-1]
    return f"at {Path(path).name}:{number}, {code.strip()!r}"


def _decomposed(program, table):
    """``program`` in the ops the lowering takes: torch's run_decompositions (a second trace,
    which also makes the program functional), but where the program mutates nothing and
    rootclad lowers every op in it as it stands (a reshape, a kept layer) or folds it (a
    constant: :mod:`rootclad.frontends.aten.constants`), which is the program as it is (most
    ONNX files' and small models': half the capture's time)."""
    sig = program.graph_signature
    variable = _variable(program)
    if not (sig.buffers_to_mutate or sig.user_inputs_to_mutate) and all(
        _lowered_as_is(node) if node.name in variable else not _writes(node)
        for node in program.graph.nodes
        if node.op == "call_function"
    ):
        return program
    return _run_decompositions(program, table)


def _variable(program) -> set[str]:
    """The nodes computed from the inputs, the parameters, the floating-point buffers (which a
    compiled model may load anew) or a random draw: the others are constants, which the
    lowering folds whatever their ops."""
    sig = program.graph_signature
    read = {*sig.user_inputs, *sig.inputs_to_parameters}
    out = set()
    for node in program.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            floating = isinstance(val, torch.Tensor) and val.is_floating_point()
            if node.name in read or node.name in sig.inputs_to_buffers and floating:
                out.add(node.name)
        elif node.op == "call_function" and (
            any(a.name in out for a in node.all_input_nodes)
            or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
        ):
            out.add(node.name)
    return out


def _writes(node) -> bool:
    """Whether ``node``'s op writes a tensor (in place, or an out argument): a constant
    written after it is read must be made functional before it is folded."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or schema.name == "aten::detach_":  # (torch.tensor's: no values written)
        return False
    return schema.is_mutable or any(
        a.alias_info and a.alias_info.is_write for a in schema.arguments
    )


def _lowered_as_is(node) -> bool:
    """Whether the lowering takes ``node`` before any decomposition: an op it lowers that
    writes nothing (not in-place, no out argument), shape arithmetic, or a check of torch's
    (a node nothing reads, which the lowering skips)."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):  # on torch's symbols: sizes
        return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, int, bool))
    schema = target._schema
    if schema.is_mutable or any(a.alias_info and a.alias_info.is_write for a in schema.arguments):
        return False
    if node.meta.get("val") is None and not node.users:  # a check of torch's: nothing lowered
        return True
    name = op_name(target)
    if name in AS_IS:
        return AS_IS[name](node)
    return name in LOWERINGS or name.startswith("aten.sym_")
