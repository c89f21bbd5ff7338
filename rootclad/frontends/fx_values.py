"""What an fx trace computes besides tensors, and what it overwrites.

Two questions the torch front-end asks of a traced module before lowering it:

- **Numbers.** fx records the shape bookkeeping of a ``forward`` as nodes: ``x.shape``,
  ``x.size(1)``, ``c // 2``, ``h * w``, ``torch._assert(c % g == 0, ...)``. rootclad's shapes
  are static, so these are numbers known at compile time (``static``). One computed from the
  batch axis (``tainted``: ``x.size(0)``, ``x.shape[0]``, ``x.numel()`` and arithmetic on
  them), or that changes when the example runs again with one sample more, stays a node:
  only reshape's batch slot may use it.
- **In-place operations.** ``ReLU(inplace=True)``, ``F.relu(x, inplace=True)`` and
  ``x.relu_()`` overwrite their input. rootclad computes a new value instead, which is the
  same thing as long as nothing made before the overwrite in the same storage is read after
  it; :func:`check_inplace` refuses a graph where something is, naming both nodes. fx records
  ``out += identity`` as an out-of-place add, which :func:`check_trace` guards instead: the
  trace must compute what the module computes.
"""

from __future__ import annotations

import inspect
import operator
import re

import torch

from rootclad.ir.graph import IRError

# fx nodes that may compute a number from shapes (never from a tensor's values)
STATIC_METHODS = ("size", "dim", "ndimension", "numel", "nelement")
STATIC_ATTRS = ("shape", "ndim", "dtype", "device", "is_cuda")
STATIC_FUNCTIONS = {
    getattr, len, torch._assert,
    operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
    operator.truediv, operator.mod, operator.pow, operator.neg, operator.pos, operator.eq,
    operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.and_,
    operator.or_, operator.not_, operator.truth, operator.contains,
}  # fmt: skip


def target_name(node: torch.fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def is_tensor(value) -> bool:
    return isinstance(value, torch.fx.Node) and "tensor_meta" in value.meta


def _tensor_args(node) -> list:
    return [a for a in node.all_input_nodes if is_tensor(a)]


def is_static(node: torch.fx.Node) -> bool:
    """A number (or tuple, bool, None, dtype) the trace computed from shapes and constants."""
    if is_tensor(node) or "rc_value" not in node.meta:
        return False
    if node.op == "call_method":
        return node.target in STATIC_METHODS
    if node.op != "call_function" or node.target not in STATIC_FUNCTIONS:
        return False
    if node.target is getattr:
        return node.args[1] in STATIC_ATTRS
    # operators on numbers and shapes only: every node input a number itself
    return all(is_static(a) for a in node.all_input_nodes)


def _takes_batch_axis(index, rank: int) -> bool:
    """Whether ``shape[index]`` reads position 0 of a shape of ``rank`` entries."""
    if isinstance(index, slice):
        return 0 in range(rank)[index]
    return isinstance(index, int) and index in (0, -rank)


def tainted(node: torch.fx.Node) -> bool:
    """Computed from the batch size: x.size(0), x.size(), x.shape and x.numel() carry it,
    shape[0] and slices through 0 keep it, and so does any arithmetic on such a number."""
    if node.op == "call_method":
        if node.target in ("numel", "nelement"):
            return True
        if node.target == "size":
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            rank = len(node.args[0].meta["tensor_meta"].shape)
            return dim is None or dim in (0, -rank)
        return False
    if node.target is getattr:
        return node.args[1] == "shape"
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        source = node.args[0]
        if (
            source.op == "call_method"
            and source.target == "size"
            or (source.target is getattr and source.args[1] == "shape")
        ):
            return _takes_batch_axis(node.args[1], len(source.meta["rc_value"]))
    return any(tainted(a) for a in node.all_input_nodes if is_static(a))


def batch_dependent(node: torch.fx.Node) -> bool:
    """The number is computed from the batch size (``tainted``), or came out different in the
    run at one sample more (or that run did not reach it)."""
    if tainted(node) or "rc_value_alt" not in node.meta:
        return True
    try:
        return bool(node.meta["rc_value"] != node.meta["rc_value_alt"])
    except Exception:  # values that do not compare (a tensor slipped through): not constant
        return True


def substitute(value):
    """``value`` (an fx argument) with every constant static node replaced by its number; a
    node that depends on the batch size is left as it is."""
    if isinstance(value, torch.fx.Node):
        if is_static(value) and not batch_dependent(value):
            return value.meta["rc_value"]
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(substitute(v) for v in value)
    if isinstance(value, dict):
        return {k: substitute(v) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(substitute(value.start), substitute(value.stop), substitute(value.step))
    return value


def in_place_input(node: torch.fx.Node, module=None):
    """The tensor ``node`` overwrites, or None: a layer with ``inplace=True``, a function
    given ``inplace=True``, a method ending in ``_`` (``relu_``). (fx never records ``+=`` on a
    tensor as such: a Proxy has no ``__iadd__``, so Python falls back to ``+``.)"""
    tensors = _tensor_args(node)
    if not tensors:
        return None
    if node.op == "call_module":
        return tensors[0] if getattr(module, "inplace", False) else None
    if node.op == "call_method":
        t = node.target
        return tensors[0] if t.endswith("_") and not t.startswith("_") else None
    i = inplace_position(node.target)
    if node.kwargs.get("inplace") is True or (i is not None and len(node.args) > i
                                               and node.args[i] is True):  # fmt: skip
        return tensors[0]  # F.relu(x, True), F.leaky_relu(x, 0.1, True)
    return None


def inplace_position(target) -> int | None:
    """The position of a function's ``inplace`` parameter (F.relu: 1), or None."""
    try:
        names = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):  # builtins without a signature take no inplace
        return None
    return names.index("inplace") if "inplace" in names else None


def check_inplace(traced: torch.fx.GraphModule) -> None:
    """Refuse an in-place operation when a tensor sharing memory with what it overwrites, made
    before it, is read after it: the compiled model would read the value from before the
    overwrite. What shares memory is what shared it in the run on the example (``rc_storage``:
    views, layers that return their input, the overwrite's own result)."""
    nodes = list(traced.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    for n in nodes:
        if n.op not in ("call_module", "call_method", "call_function"):
            continue
        module = traced.get_submodule(n.target) if n.op == "call_module" else None
        source = in_place_input(n, module)
        if source is None:
            continue
        storage = source.meta.get("rc_storage")
        before = [m for m in nodes[: pos[n]] if storage is not None
                  and m.meta.get("rc_storage") == storage] or [source]  # fmt: skip
        for m in before:
            late = [u for u in m.users if pos[u] > pos[n] and not is_static(u)]
            if late:
                raise IRError(
                    f"fx node {n.name!r} ({target_name(n)}) overwrites {m.name!r} in place, and "
                    f"{late[0].name!r} ({target_name(late[0])}) reads {m.name!r} afterwards: the "
                    "compiled model would read the value from before the overwrite; use what the "
                    "operation returns (h = h.relu_()), or make it out of place (inplace=False, "
                    "x = x + y)"
                )


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def check_trace(module, traced_out, eager_out) -> None:
    """The trace must compute what the module computes, on the example input: torch.fx records
    ``y += 1`` on a tensor another name still holds as an out-of-place add, and a graph
    that differs from the module would be compiled faithfully and be wrong."""
    for a, b in zip(_tensors(traced_out), _tensors(eager_out), strict=False):
        a, b = a.detach(), b.detach()  # a parameter returned as it is still asks for gradients
        if a.shape != b.shape or not a.is_floating_point():
            continue
        scale = float(b.abs().nan_to_num(0, 0, 0).max()) if b.numel() else 0.0
        tol = (1e-9 if b.dtype == torch.float64 else 1e-4) * max(scale, 1e-30)
        diff = (a - b).abs().nan_to_num(0, 0, 0)
        same_nan = torch.equal(a.isnan(), b.isnan())
        if not same_nan or (diff.numel() and float(diff.max()) > tol):
            raise IRError(
                f"torch.fx's trace of {type(module).__name__} computes something else than the "
                f"module on the example input (largest difference {float(diff.max()):.3g} at "
                f"output scale {scale:.3g}): most often an in-place operation (y += x, "
                "y.mul_(2)) on a tensor that another name still refers to, which fx records as "
                "out of place; write it out of place (y = y + x); or forward branches on "
                "self.training, and fx kept the branch of the mode it traced in"
            )


class _Tracer(torch.fx.Tracer):
    # a buffer read in forward is a value of the trace (get_attr), so that pe[:, :x.size(1)]
    # traces (fx's default hands forward the tensor itself, which a size cannot slice)
    proxy_buffer_attributes = True


def _check_names(module) -> None:
    """Refuse a layer, parameter or buffer name torch.fx cannot write into the Python source of
    its trace: fx quotes a name that is not an identifier without escaping it, and Python reads
    a non-ASCII identifier as its NFKC form, another name. rootclad itself writes such names
    into C++ only as comments and string literals (codegen/cxx.py)."""
    named = (module.named_modules, module.named_parameters, module.named_buffers)
    for name in (n for walk in named for n, _ in walk(remove_duplicate=False)):
        if not re.fullmatch(r"[ -~]*", name) or '"' in name or "\\" in name:
            raise IRError(
                f"{type(module).__name__}: the name {name!r} holds a quote, a backslash or a "
                "character that is not printable ASCII, which torch.fx cannot trace; rename "
                "that layer or tensor"
            )


def symbolic_trace(module, n: int):
    """torch.fx's trace of ``module`` called with ``n`` inputs: forward's later arguments
    that have defaults (timm's ``attn_mask=None``) are fixed at them. Buffers are values of
    the trace; a forward that uses one as a Python number (``if self.initialized:``) is traced
    with fx's default, which hands it the tensor. The module's buffers are as they were
    afterwards; a forward that assigns one (``self.steps += 1``) is refused."""
    _check_names(module)
    buffers = [(m, dict(m._buffers)) for m in module.modules()]
    try:
        tracer = _Tracer()
        graph = tracer.trace(module, concrete_args=_defaults(module, n))
        traced = torch.fx.GraphModule(tracer.root, graph, type(module).__name__)
    except Exception:  # noqa: BLE001 - any failure of the proxying trace: fx's default
        _restore(buffers)
        traced = torch.fx.symbolic_trace(module, concrete_args=_defaults(module, n))
    assigned = _restore(buffers)
    if assigned:
        raise IRError(f"{type(module).__name__}.forward assigns its buffer {assigned[0]!r}; "
                      "rootclad compiles forwards that read their buffers")  # fmt: skip
    _drop_fixed_arguments(traced, n)
    return traced


def _restore(buffers) -> list[str]:
    """Put each module's buffers back as they were; the names of those forward replaced."""
    replaced = []
    for m, saved in buffers:
        for name, value in saved.items():
            if m._buffers.get(name) is not value:
                replaced.append(name)
                m._buffers[name] = value
    return replaced


def _defaults(module, n: int) -> dict | None:
    """forward's arguments after the examples' that have defaults (timm's attn_mask=None):
    fixed at their defaults while tracing."""
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None
    rest = [p for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][n:]  # fmt: skip
    fixed = {p.name: p.default for p in rest if p.default is not p.empty}
    return fixed or None


def _drop_fixed_arguments(traced, n: int) -> None:
    """The placeholders fx keeps for arguments fixed at their defaults, and the guards that
    check them, go: the compiled model takes the examples' inputs only."""
    graph = traced.graph
    for ph in [p for p in graph.nodes if p.op == "placeholder"][n:]:
        guards = set()
        stack = list(ph.users)
        while stack:  # the checks fx adds (eq, _assert, _assert_is_none) and nothing else
            user = stack.pop()
            guards.add(user)
            stack.extend(u for u in user.users if u not in guards)
        if any(g.op != "call_function" or "assert" not in getattr(g.target, "__name__", "")
               and g.target is not operator.eq for g in guards):  # fmt: skip
            return  # used by the model itself: the input count check names it
        for g in sorted(guards, key=lambda g: -list(graph.nodes).index(g)):
            graph.erase_node(g)
        graph.erase_node(ph)
    traced.recompile()
