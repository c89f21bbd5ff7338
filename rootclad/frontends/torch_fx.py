"""``torch.nn`` modules -> :class:`Graph`, through ``torch.fx``.

The module is traced with ``torch.fx`` and its example input(s) run through the trace once
(``ShapeProp``), so every value's shape is known while the graph is built. Layers lower by the
op registry (:mod:`rootclad.ir.registry`: each op lists the ``torch.nn`` classes and torch functions
it stands for); the structure of a graph (arithmetic between values, ``torch.cat``,
``reshape``/``view``/``flatten``, ``permute``/``transpose``) is lowered here. Lazy modules
(``LazyLinear``) are materialised by one forward pass first. Anything else is refused with the
module path or fx node, and what is supported."""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch import nn
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from rootclad.frontends import (
    fx_attention,
    fx_constants,
    fx_einsum,
    fx_functional,
    fx_indices,
    fx_layout,
    fx_merged,
    fx_neighbours,
    fx_norms,
    fx_outputs,
    fx_params,
    fx_recurrent,
    fx_slicing,
    fx_values,
    fx_windows,
)
from rootclad.ir.graph import Graph, IRError, Node, Param
from rootclad.ir.ops import OPS, supported_modules
from rootclad.ir.optimize import simplify

_MODULE_OPS = {m: name for name, spec in OPS.items() for m in spec.modules}


def _resolve(path: str):
    """A registry function name -> what fx records as the target: the function object, or
    the method name for ``Tensor.<method>``."""
    if path.startswith("Tensor."):
        return path.removeprefix("Tensor.")
    obj = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


_FUNCTION_OPS = {_resolve(f): name for name, spec in OPS.items() for f in spec.functions
                 if f.startswith(("torch.", "Tensor."))}  # fmt: skip
# functions of other packages (torchvision's stochastic_depth), by their dotted name: matched
# without importing the package
_NAMED_OPS = {f: name for name, spec in OPS.items() for f in spec.functions
              if not f.startswith(("torch.", "Tensor."))}  # fmt: skip


def _dotted(target) -> str:
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', '')}"


class _Value(NamedTuple):  # a value the lowering made itself, read by name as fx nodes are
    name: str


_ARITH = {
    "add": "add", "iadd": "add", "__add__": "add", "__radd__": "add",
    "sub": "sub", "isub": "sub", "__sub__": "sub", "__rsub__": "rsub",
    "mul": "mul", "imul": "mul", "__mul__": "mul", "__rmul__": "mul",
    "truediv": "div", "itruediv": "div", "div": "div", "__truediv__": "div",
    "__rtruediv__": "rdiv", "__rdiv__": "rdiv",
}  # fmt: skip
_STRUCTURE = (
    "arithmetic between tensors (+ - * / with broadcasting, and with numbers), x ** 2, torch.cat, torch.einsum, "
    "reshape/view/flatten, squeeze/unsqueeze, permute/transpose, contiguous, x[:, a:b] and chunk/split/unbind "
    "along per-sample axes, expand/repeat of size-1 axes, topk and torch.gather by its indices"
)


# layers that lower to several ops: their class -> the lowering
_COMPOSITE = {**fx_attention.LAYERS, **fx_norms.LAYERS, **fx_recurrent.LAYERS,
              **fx_functional.LAYERS}  # fmt: skip


def _persistent(module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf not in module.get_submodule(owner)._non_persistent_buffers_set


def _composite(mod):
    return next((f for c, f in _COMPOSITE.items() if isinstance(mod, c)), None)


def supported_layers() -> str:
    functions = sorted({f.split(".")[-1] for spec in OPS.values() for f in spec.functions})
    return (
        f"{supported_modules()}, {', '.join(c.__name__ for c in _COMPOSITE)}, and Sequential "
        "containers of them; functions: "
        f"{', '.join(functions)}; {_STRUCTURE}"
    )


def _examples(example_input) -> tuple[torch.Tensor, ...]:
    xs = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    if not xs:
        raise IRError("example_input is empty; give one tensor per model input")
    for x in xs:
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise IRError(
                "example_input must be a tensor with a batch axis first, e.g. (B, C, L) (or a "
                "tuple of such tensors, one per model input)"
            )
    if len({int(x.shape[0]) for x in xs}) != 1:
        raise IRError(
            f"the example inputs have different batch sizes {[int(x.shape[0]) for x in xs]}"
        )
    return xs


def graph_from_module(module: nn.Module, example_input, dtype: str) -> Graph:
    """Trace ``module`` and return its validated graph (per-sample shapes from the example)."""
    xs = _examples(example_input)
    if any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in module.modules()):
        ready = [p for p in module.parameters() if not isinstance(p, nn.UninitializedParameter)]
        with torch.no_grad():
            module(*(x.to(ready[0].dtype) if ready and x.dtype != torch.bool else x for x in xs))
    params = [Param(name, tuple(p.shape)) for name, p in module.named_parameters()]
    if _composite(module) or isinstance(module, nn.Embedding):  # traced as one call
        # (a layer of several ops; an Embedding, whose input fx_indices must see)
        try:
            lowering = _FxLowering(fx_attention.Root(module), xs, params, dtype)
            graph = lowering.graph()
        except IRError as exc:  # named as the user's layer, not the wrapper's
            msg = (
                str(exc).replace("'block.", "'").replace("'block'", f"'' ({type(module).__name__})")
            )
            raise IRError(msg.replace("Root.forward", f"{type(module).__name__}.forward")) from exc
        for node in graph.nodes:
            node.params = {r: n.removeprefix("block.") for r, n in node.params.items()}
        expected = lowering.expected
    elif _is_torch_layer(module):
        # fx would trace into the layer's own forward (F.linear on get_attr weights): a bare
        # layer is the one-node graph itself
        if len(xs) != 1:
            raise IRError(f"{type(module).__name__} takes one input, {len(xs)} were given")
        node = _module_node("", module, type(module).__name__)
        if "dim" in node.attrs:  # torch's numbering, batch axis included
            rank, dim = xs[0].dim(), node.attrs.pop("dim")
            full = dim + rank if dim < 0 else dim
            if not 1 <= full < rank:
                raise IRError(f"{node.describe()}: dim={dim} is not a per-sample axis")
            node.attrs["axis"] = full - 1
        graph = Graph.chain(tuple(xs[0].shape[1:]), [node], params, dtype)
        expected = {}
    else:
        lowering = _FxLowering(module, xs, params, dtype)
        graph = lowering.graph()
        expected = lowering.expected
    aliases = parameter_aliases(module)  # a Parameter two layers hold: one, by its first name
    for node in graph.nodes:
        node.params = {r: aliases.get(n, n) for r, n in node.params.items()}
        node.buffers = {r: aliases.get(n, n) for r, n in node.buffers.items()}
    used = {b for node in graph.nodes for b in node.buffers.values()}
    graph.buffers = [Param(n, tuple(b.shape), _persistent(module, n))
                     for n, b in module.named_buffers() if n in used]  # fmt: skip
    graph.validate()
    for node in graph.nodes:  # the IR's shapes are torch's: a lowering that differs is a bug
        want = expected.get(node.output)
        if want is not None and tuple(node.out_shape) != want:
            raise IRError(
                f"{node.describe()}: rootclad infers the per-sample shape {node.out_shape}, "
                f"torch gives {want}; this form of the operation is not supported"
            )
    return simplify(graph)


def parameter_aliases(module: nn.Module) -> dict[str, str]:
    """{other name: first name} of each parameter and buffer the module reaches by several
    paths (a layer used twice, or one Parameter held by two layers)."""
    out = {}
    for named in (module.named_parameters, module.named_buffers):
        first = {id(p): n for n, p in named()}
        out.update({n: first[id(p)] for n, p in named(remove_duplicate=False) if first[id(p)] != n})
    return out


def _is_torch_layer(module: nn.Module) -> bool:
    """A torch.nn layer (what torch.fx treats as a leaf), not a container."""
    return type(module).__module__.startswith("torch.nn") and not isinstance(
        module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    )


def _module_node(path: str, mod: nn.Module, name: str) -> Node:
    """The node of a torch.nn layer, by the first class in its MRO the registry knows."""
    kind = type(mod)
    where = f"module {path!r} ({kind.__module__}.{kind.__name__})"
    op = next(
        (
            _MODULE_OPS[c.__name__]
            for c in kind.__mro__
            if c.__module__.startswith("torch.nn") and c.__name__ in _MODULE_OPS
        ),
        None,
    )
    if op is None:
        raise IRError(f"{where} is not supported; supported layers: {supported_layers()}")
    # inplace=True: a new value all the same (fx_values.check_inplace: nothing reads the old)
    spec = OPS[op]
    attrs = spec.from_module(mod, where)
    prefix = f"{path}." if path else ""  # the root layer's parameters have no prefix
    roles = {r: prefix + r for r in spec.params if getattr(mod, r, None) is not None}
    buffers = {r: prefix + r for r in spec.buffers if getattr(mod, r, None) is not None}
    return Node(name, op, attrs=attrs, params=roles, buffers=buffers)


def _hashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def _fx_name(target) -> str:
    if isinstance(target, str):
        return f"Tensor.{target}"
    module = getattr(target, "__module__", None) or ""
    qual = getattr(target, "__name__", str(target))
    if module in ("_operator", "operator"):
        return f"operator.{qual}"
    if module.startswith("torch.nn.functional"):
        return f"torch.nn.functional.{qual}"
    if module.startswith("torch") or target in vars(torch).values():
        return f"torch.{qual}"
    return f"{module}.{qual}"


def _functions_in_eval_mode(traced) -> None:
    """stochastic_depth's training flag is the module's mode that fx saw when tracing, a
    constant; the compiled op follows the compiled model's mode instead (as nn.Dropout), and
    the trace runs the example in eval mode, where the flag is False."""
    for n in traced.graph.nodes:
        if n.op == "call_function" and _NAMED_OPS.get(_dotted(n.target)) == "stochastic_depth":
            if len(n.args) > 3:
                n.args = (*n.args[:3], False, *n.args[4:])
            else:
                n.kwargs = {**n.kwargs, "training": False}
    traced.recompile()


class _ShapeProp(torch.fx.Interpreter):
    """Runs the trace on the example input, noting each tensor's metadata in
    ``node.meta["tensor_meta"]`` (as torch's ShapeProp) and each other value in
    ``node.meta[key]`` (numbers from shapes: fx_values); a failure names the fx node, its op
    and its inputs' shapes. With ``key="rc_value_alt"`` (the run at another batch size) only
    the other values are noted."""

    def __init__(self, module, key="rc_value"):
        # every value kept to the end: memory is not reused, so equal storages mean aliases
        super().__init__(module, garbage_collect_values=False)
        self.extra_traceback = False
        self.key = key

    def run_node(self, n):
        try:
            result = super().run_node(n)
        except Exception as exc:
            shapes = [
                tuple(a.meta["tensor_meta"].shape)
                for a in n.all_input_nodes
                if hasattr(a.meta.get("tensor_meta"), "shape")
            ]
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if n.op == "call_module":
                kind = type(self.module.get_submodule(n.target))
                what = f"module {n.target!r} ({kind.__module__}.{kind.__name__})"
            else:
                what = f"fx node {n.name!r} ({_fx_name(n.target)})"
            raise IRError(
                f"{what} fails on the example input, with inputs of shapes {shapes} (batch "
                f"axis first): {msg}"
            ) from exc
        if isinstance(result, torch.Tensor):
            if self.key == "rc_value":
                n.meta["tensor_meta"] = _extract_tensor_metadata(result)
                n.meta["rc_storage"] = result.untyped_storage().data_ptr()
            else:
                fx_constants.record_alt(n, result)
        elif isinstance(result, (int, float, bool, str, tuple, list, torch.Size, torch.dtype,
                                 torch.device, type(None))):  # fmt: skip
            n.meta[self.key] = result
        if self.key == "rc_value":
            fx_constants.record(self, n, result)
        return result


class _FxLowering:
    """Walks one fx graph, adding a :class:`Node` per tensor-valued fx node."""

    def __init__(self, module, xs, params, dtype):
        self.module, self.xs, self.params, self.dtype = module, xs, params, dtype
        try:
            self.traced = fx_values.symbolic_trace(module, len(xs))
        except Exception as exc:  # fx raises many types; the user needs the reason and the model
            raise IRError(
                f"cannot trace {type(module).__name__} with torch.fx: {exc}. rootclad compiles "
                "modules torch.fx can trace (no data-dependent control flow) made of: "
                f"{supported_layers()}"
            ) from exc
        _functions_in_eval_mode(self.traced)
        placeholders = [n for n in self.traced.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(xs):
            names = [p.name for p in placeholders]
            raise IRError(
                f"{type(module).__name__}.forward takes {len(placeholders)} inputs {names}, but "
                f"example_input gives {len(xs)}; pass a tuple with one tensor per input"
            )
        # in eval mode, so that the shapes come without side effects on the user's module
        # (BatchNorm would count the example in its running statistics); modes restored
        modes = {m: m.training for m in (*self.traced.modules(), *module.modules())}
        try:
            self.traced.eval()
            module.eval()
            # input copies (a layer may overwrite one); the same draws in each run, the caller's
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                traced = _ShapeProp(self.traced).run(*(x.clone() for x in xs))
                # once more with one sample more: which numbers depend on the batch size
                more = tuple(torch.cat([x, x[:1]]) for x in xs)
                try:
                    _ShapeProp(self.traced, "rc_value_alt").run(*more)
                except IRError:  # a model bound to its batch size: the checks below say so
                    pass
                eager = torch.manual_seed(0) and module(*(x.clone() for x in xs))
        finally:
            for m, mode in modes.items():
                m.training = mode
        # an in-place call whose result is unused still overwrites: kept, so that
        # check_inplace sees what reads the old value afterwards
        self.traced.graph.eliminate_dead_code(
            is_impure_node=lambda n: (
                n.is_impure() or fx_values.in_place_input(n, self._module_of(n)) is not None
            )
        )
        fx_values.check_trace(module, traced, eager)
        fx_values.check_inplace(self.traced)
        fx_params.drop_kept_values(self)
        self.nodes: list[Node] = []
        self.splits: dict[str, dict] = {}  # chunk / split / unbind nodes: their pieces
        self.moved: dict[str, tuple] = {}  # permutes that move the batch axis, then unbound
        self.tuples: dict[str, list] = {}  # a layer's tuple output: its values' names (or None)
        self.swapped: dict[str, fx_slicing.Swapped] = {}  # batch axis second: held per sample
        self.window_tables: dict[str, tuple] = {}  # Swin's relative position bias: its table
        self.offsets: dict[str, int] = {}  # arange over the batch (times rows): fx_merged.py
        self.merged: dict[str, tuple] = {}  # ... and the values numbered across the batch
        self.zero_states: set[str] = set()  # torch.zeros given as a recurrent layer's state
        self.attr_params: dict[str, str] = {}  # get_attr node -> the parameter it reads
        self.param_shapes: dict[str, tuple] = {}  # ... read as a value: its per-sample shape
        self.module_node = _module_node  # a layer's IR node (for the hooks that lower layers)
        self.constants: set[str] = set()  # tensors computed without inputs: causal masks
        self.topks: set[str] = set()  # topk nodes (a tuple of values and indices)
        self.index_values: set[str] = set()  # topk's indices, and layouts of them
        self.batch = int(xs[0].shape[0])

    # -- helpers ----------------------------------------------------------------------------
    def _module_of(self, fx_node):
        return self.traced.get_submodule(fx_node.target) if fx_node.op == "call_module" else None

    def shape(self, fx_node) -> tuple[int, ...]:
        meta = fx_node.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape"):
            raise IRError(f"fx node {fx_node.name!r} does not give one tensor")
        return tuple(meta.shape)

    def axis(self, dim, fx_input, where: str) -> int:
        """torch's dim (batch axis counted) on ``fx_input`` -> the per-sample axis."""
        rank = len(self.shape(fx_input))
        if not isinstance(dim, int):
            raise IRError(f"{where}: dim={dim!r} must be a number")
        full = dim + rank if dim < 0 else dim
        if not 0 <= full < rank:
            raise IRError(f"{where}: dim={dim} is out of range for a {rank}-d tensor")
        if full == 0:
            raise IRError(f"{where}: dim={dim} is the batch axis; rootclad keeps samples apart")
        return full - 1

    def add(self, name: str, op: str, inputs, attrs=None, params=None) -> None:
        self.nodes.append(
            Node(name, op, [i.name for i in inputs], name, dict(attrs or {}), dict(params or {}))
        )

    def is_tensor(self, arg) -> bool:
        return isinstance(arg, torch.fx.Node) and "tensor_meta" in arg.meta

    def unsupported(self, fx_node, why: str = "") -> IRError:
        what = _fx_name(fx_node.target)
        return IRError(
            f"operation {what!r} at fx node {fx_node.name!r} is not supported{why}; supported "
            f"layers: {supported_layers()}"
        )

    # -- the walk ---------------------------------------------------------------------------
    def graph(self) -> Graph:
        fx_params.check_batch_axes(self)
        indices = fx_indices.bounds(self)
        inputs, output = [], None
        for fx_node in self.traced.graph.nodes:
            if fx_node.op == "placeholder":
                inputs.append(fx_node.name)
            elif fx_recurrent.lower(self, fx_node):  # batch axis second, or a zero state
                continue
            elif fx_merged.lower(self, fx_node):  # weaver's idx + idx_base, rows[idx, :]
                continue
            elif fx_neighbours.lower(self, fx_node):  # topk, gather by its indices
                continue
            elif fx_windows.lower(self, fx_node):  # torchvision's Swin Transformer
                continue
            elif fx_params.lower_buffer(self, fx_node):  # a buffer as data, a block of one
                continue
            elif fx_constants.lower(self, fx_node):  # lowered where a mask takes it
                continue
            elif fx_node.op == "output":
                output = fx_node.args[0]
            elif fx_node.op == "get_attr":
                fx_params.lower_get_attr(self, fx_node)
            elif fx_node.op == "call_module":
                self.call_module(fx_node)
            elif fx_slicing.is_getitem(fx_node) and fx_node.args[0].name in self.tuples:
                fx_slicing.lower_getitem(self, fx_node, self.splits)
            elif fx_slicing.is_split(fx_node):  # lowered by each getitem of a piece
                self.splits[fx_node.name] = fx_slicing.split_pieces(self, fx_node)
            elif self.is_tensor(fx_node):
                try:
                    self.call_function(fx_node)
                except (IndexError, KeyError, TypeError, AttributeError) as exc:
                    raise IRError(
                        f"fx node {fx_node.name!r} ({_fx_name(fx_node.target)}): arguments "
                        f"{fx_node.args} {fx_node.kwargs} not understood ({exc!r}); pass "
                        "tensors and dims positionally"
                    ) from exc
            elif not fx_values.is_static(fx_node):
                raise self.unsupported(fx_node)
        known = {*inputs, *(n.output for n in self.nodes)}
        output, parts, container = fx_outputs.lower(self, output, known)
        shapes = [tuple(x.shape[1:]) for x in self.xs]
        # torch's per-sample shape of every value, which the IR's inference must reproduce
        self.expected = {
            n.name: tuple(n.meta["tensor_meta"].shape[1:])
            for n in self.traced.graph.nodes
            if hasattr(n.meta.get("tensor_meta"), "shape") and n.name not in self.param_shapes
        }
        masks = tuple(x.dtype == torch.bool for x in self.xs)
        return Graph(inputs, shapes, self.nodes, output, self.params, self.dtype,
                     masks=masks if any(masks) else (), indices=indices, parts=parts,
                     container=container)  # fmt: skip

    def call_module(self, fx_node) -> None:
        mod = self.traced.get_submodule(fx_node.target)
        if lower := _composite(mod):
            return lower(self, fx_node, mod, _module_node)
        tensors = [a for a in fx_node.args if isinstance(a, torch.fx.Node)]
        if len(tensors) != 1 or len(fx_node.args) != 1 or fx_node.kwargs:
            raise IRError(
                f"module {fx_node.target!r} is called with {len(fx_node.args)} arguments; "
                "layers take one tensor"
            )
        node = _module_node(fx_node.target, mod, fx_node.target)
        node.inputs, node.output = [tensors[0].name], fx_node.name
        if "dim" in node.attrs:
            node.attrs["axis"] = self.axis(
                node.attrs.pop("dim"), tensors[0], f"module {fx_node.target!r}"
            )
        self.nodes.append(node)

    def call_function(self, fx_node) -> None:
        t = fx_node.target
        if fx_slicing.is_getitem(fx_node):
            return fx_slicing.lower_getitem(self, fx_node, self.splits)
        args, kw = fx_values.substitute(list(fx_node.args)), fx_values.substitute(fx_node.kwargs)
        where = f"fx node {fx_node.name!r} ({_fx_name(t)})"
        if fx_values.in_place_input(fx_node) is not None:  # a new value all the same
            kw.pop("inplace", None)
            if isinstance(t, str):  # x.relu_() -> x.relu()
                t = t.removesuffix("_")
            elif (i := fx_values.inplace_position(t)) is not None and len(args) > i:
                args = args[:i] + args[i + 1 :]  # F.relu(x, True): no flag left
        name = t if isinstance(t, str) else getattr(t, "__name__", "")
        op = _FUNCTION_OPS.get(t) if _hashable(t) else None
        op = op or (_NAMED_OPS.get(_dotted(t)) if not isinstance(t, str) else None)
        if op is not None and args and self.is_tensor(args[0]):
            attrs = OPS[op].from_call(args[1:], kw, where)
            if "dim" in attrs:
                attrs["axis"] = self.axis(attrs.pop("dim"), args[0], where)
            return self.add(fx_node.name, op, [args[0]], attrs)
        if fx_functional.handles(t):
            return fx_functional.lower(self, fx_node, args, kw, where)
        if name in _ARITH or t in (torch.add, torch.sub, torch.mul, torch.div, torch.neg,
                                   operator.neg) or name == "neg":  # fmt: skip
            return self.arithmetic(fx_node, _ARITH.get(name, name), args, kw, where)
        if name in ("pow", "__pow__", "square") and args and self.is_tensor(args[0]):
            power = 2 if name == "square" else (args[1] if len(args) > 1 else kw.get("exponent"))
            if type(power) not in (int, float):
                raise IRError(f"{where}: a power {power!r}; rootclad computes x ** a number")
            if power == 2:
                return self.add(fx_node.name, "mul", [args[0], args[0]])
            return self.add(fx_node.name, "power", [args[0]], {"exponent": float(power)})
        if t in (torch.cat, torch.concat) or name == "cat":
            tensors = args[0] if args else kw.get("tensors")
            dim = args[1] if len(args) > 1 else kw.get("dim", 0)
            if not all(self.is_tensor(x) for x in tensors):
                raise IRError(f"{where}: torch.cat of something other than tensors")
            return self.add(
                fx_node.name, "cat", tensors, {"axis": self.axis(dim, tensors[0], where)}
            )
        if name in fx_indices.COMPARISONS:
            return fx_indices.lower_comparison(self, fx_node, name, args, where)
        if name == "einsum":
            return fx_einsum.lower(self, fx_node, args, kw, where)
        if fx_attention.handles(name):
            return fx_attention.lower_call(self, fx_node, name, args, kw, where)
        if name in ("reshape", "view", "flatten"):
            return fx_layout.reshape(self, fx_node, args, where)
        if name == "expand" and args and args[0].name in self.param_shapes:
            return fx_params.lower_expand(self, fx_node, args, where)
        if name in ("expand", "expand_as", "repeat") and args and self.is_tensor(args[0]):
            return fx_neighbours.lower_expand(self, fx_node, name, args, where)
        if t is torch.nn.functional.layer_norm:
            return fx_params.lower_layer_norm(self, fx_node, args, kw, where)
        if name in ("squeeze", "unsqueeze") and args and self.is_tensor(args[0]):
            return fx_layout.squeeze(self, fx_node, name, args, kw, where)
        if name in ("permute", "transpose"):
            return fx_layout.permute(self, fx_node, name, args, kw, where)
        if name == "contiguous":
            return self.add(fx_node.name, "identity", [args[0]])
        if name == "roll" and args and self.is_tensor(args[0]):
            return fx_layout.roll(self, fx_node, args, kw, where)
        if name in ("mean", "sum", "amax", "amin") and args and self.is_tensor(args[0]):
            return fx_layout.reduce(self, fx_node, name, args, kw, where)
        raise self.unsupported(fx_node)

    def arithmetic(self, fx_node, op, args, kw, where) -> None:
        if kw.get("alpha", 1) != 1 or kw.get("rounding_mode") is not None:
            raise IRError(f"{where}: alpha / rounding_mode are not supported")
        if op == "neg":
            return self.add(fx_node.name, "affine", args[:1], {"scale": -1.0, "shift": 0.0})
        a, b = args[0], args[1] if len(args) > 1 else kw.get("other")
        if self.is_tensor(a) and self.is_tensor(b):
            if op == "add" and fx_attention.is_mask(a) and fx_attention.is_mask(b):
                raise IRError(f"{where}: + of two torch.bool masks is torch's logical or, which "
                              "rootclad does not compile (a * b, their and, is supported)")  # fmt: skip
            for x in (a, b):
                if x.name in self.param_shapes:  # a parameter: the same for every sample
                    continue
                if len(self.shape(x)) == 0 or self.shape(x)[0] != self.batch:
                    raise IRError(
                        f"{where}: operand {x.name!r} has shape {self.shape(x)}, without the "
                        "batch axis; both operands must carry it"
                    )
            a, b = fx_params.align(self, fx_node, a, b)
            if len(fx_params.sample_shape(self, a)) != len(fx_params.sample_shape(self, b)):
                # torch aligns whole shapes from the right: a lower-rank operand's batch axis
                # would meet a per-sample axis, which rootclad keeps apart
                raise IRError(
                    f"{where}: operands of shapes {self.shape(a)} and {self.shape(b)} have "
                    "different ranks; reshape one so that both have the same number of axes"
                )
            if op in ("rsub", "rdiv"):  # b - a, b / a
                a, b = b, a
            op = {"rsub": "sub", "rdiv": "div"}.get(op, op)
            return self.add(fx_node.name, op, [a, b])
        x, c = (a, b) if self.is_tensor(a) else (b, a)
        if isinstance(c, torch.fx.Node) and fx_values.is_static(c):
            raise IRError(f"{where}: operand {c.name!r} is the batch size or depends on it; "
                          "rootclad compiles a model for any batch size")  # fmt: skip
        if not isinstance(c, (int, float)) or isinstance(c, bool):
            raise IRError(f"{where}: operand {c!r} is neither a tensor nor a number")
        c = float(c)
        x_first = x is a and op not in ("rsub", "rdiv")
        if op == "add":
            scale, shift = 1.0, c
        elif op in ("sub", "rsub"):
            scale, shift = (1.0, -c) if x_first else (-1.0, c)
        elif op == "mul":
            scale, shift = c, 0.0
        elif x_first:  # x / c
            if c == 0:
                raise IRError(f"{where}: division by the constant 0")
            scale, shift = 1.0 / c, 0.0
        else:  # c / x: c times x's reciprocal
            self.add(f"{fx_node.name}_reciprocal", "reciprocal", [x])
            if c == 1.0:
                return self.add(fx_node.name, "identity", [_Value(f"{fx_node.name}_reciprocal")])
            x, scale, shift = _Value(f"{fx_node.name}_reciprocal"), c, 0.0
        self.add(fx_node.name, "affine", [x], {"scale": scale, "shift": shift})
