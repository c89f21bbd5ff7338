"""The capture: a torch module as torch.export's program of core ATen ops (the batch axis
dynamic), which :mod:`rootclad.frontends.aten.lowering` walks."""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
import warnings

import torch
import torch.fx.traceback as fx_traceback
from torch import nn

from rootclad.frontends.aten.table import KEPT, LOWERINGS, op_name
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
    torchvision's stochastic depth."""
    return isinstance(mod, nn.modules.dropout._DropoutNd) or type(mod).__name__ == "StochasticDepth"


def _examples(example_input) -> tuple[torch.Tensor, ...]:
    xs = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    # a batch of one would be specialised (torch.export fixes sizes 0 and 1): two of it
    return tuple(torch.cat([x, x]) if x.shape[0] == 1 else x for x in xs)


def _dynamic(module: nn.Module, xs: tuple, batch) -> tuple:
    """torch.export's dynamic shapes: every input's first axis is the batch (those a forward
    takes as ``*rest`` as one tuple)."""
    import inspect

    kinds = [p.kind for p in inspect.signature(module.forward).parameters.values()]
    rest = next((i for i, k in enumerate(kinds) if k == inspect.Parameter.VAR_POSITIONAL), None)
    axes = tuple({0: batch} for _ in xs)
    return axes if rest is None or rest >= len(xs) else (*axes[:rest], axes[rest:])


def export_program(module: nn.Module, example_input):
    """``module`` captured by torch.export (batch axis dynamic) in its own mode, as torch.fx
    traces it, but for dropout and stochastic depth, captured as in training (in eval mode
    they would vanish; compiled, they obey cm.train() and cm.eval()); decomposed into core ATen
    ops but for the layers in :data:`KEPT`."""
    xs = _examples(example_input)
    batch = torch.export.Dim("batch", min=1)
    # captured as in training (switched for the capture, not on a copy: the old weight norm's
    # modules cannot be copied); p >= 1: torch writes zeros, no draw to switch off
    switched = [m for m in module.modules() if _training_only(m) and not m.training]
    for mod in module.modules():
        if _training_only(mod) and float(getattr(mod, "p", 0)) >= 1:
            raise IRError(f"{type(mod).__name__}(p={mod.p}): every value dropped")
    table = torch.export.default_decompositions()
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
            with fx_traceback.preserve_node_meta(), _quiet("torch._subclasses.fake_tensor"):
                program = torch.export.export(
                    module, xs, dynamic_shapes=_dynamic(module, xs, batch), strict=False
                )
        except IRError:  # a forward of rootclad's own (an ONNX file's) refusing a node
            raise
        except Exception as exc:  # torch's own message names the line that failed
            raise IRError(
                f"torch.export could not capture {type(module).__name__}: "
                f"{type(exc).__name__}: {str(exc)[:2000]}"
            ) from exc
        finally:
            for mod in switched:
                mod.training = False
        return _decomposed(program, table), module, xs


def _decomposed(program, table):
    """``program`` in the ops the lowering takes: torch's run_decompositions (a second trace,
    which also makes the program functional), but where the program mutates nothing and
    rootclad lowers every op in it as it stands (a reshape, a kept layer), which is the program
    as it is (most ONNX files' and small models': half the capture's time)."""
    sig = program.graph_signature
    if not (sig.buffers_to_mutate or sig.user_inputs_to_mutate) and all(
        _lowered_as_is(node) for node in program.graph.nodes if node.op == "call_function"
    ):
        return program
    with _cia_ops_listed_once():
        return program.run_decompositions(table)


def _lowered_as_is(node) -> bool:
    """Whether the lowering takes ``node`` before any decomposition: an op it lowers that
    writes nothing (not in-place, no out argument), or shape arithmetic."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):  # on torch's symbols: sizes
        return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, int, bool))
    schema = target._schema
    if schema.is_mutable or any(a.alias_info and a.alias_info.is_write for a in schema.arguments):
        return False
    name = op_name(target)
    return name in LOWERINGS or name.startswith("aten.sym_")
