"""``torch.nn`` modules -> :class:`Graph`, through ``torch.fx``.

``torch.nn.Sequential`` and any ``torch.fx``-traceable module built from the supported layers
are accepted. Lazy modules (``LazyLinear``) are materialised by one forward pass of the
example input first. Anything else is refused with the module path and type.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from rootclad.ir.graph import Graph, IRError, Node, Param
from rootclad.ir.optimize import pool_before_activation

SUPPORTED_MODULES = (
    "Linear, LazyLinear, Conv1d (groups=1, zero padding), MaxPool1d, AvgPool1d, ReLU, LeakyReLU, "
    "Tanh, Sigmoid, GELU, Flatten, Dropout, Identity, and Sequential containers of them"
)

_ELEMENTWISE_FUNCS = {
    F.relu: "relu",
    torch.relu: "relu",
    torch.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    F.gelu: "gelu",
    F.leaky_relu: "leaky_relu",
    F.tanh: "tanh",
    F.sigmoid: "sigmoid",
}
_ELEMENTWISE_METHODS = {"relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid"}


def _int1(value, what: str, path: str) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise IRError(f"{path}: {what}={value!r} is not a 1-d value")
        value = value[0]
    return int(value)


def _module_node(path: str, mod: nn.Module) -> Node:
    kind = type(mod)
    where = f"module {path!r} ({kind.__module__}.{kind.__name__})"

    def params(*roles):
        prefix = f"{path}." if path else ""  # the root layer's parameters have no prefix
        return {r: prefix + r for r in roles if getattr(mod, r, None) is not None}

    if isinstance(mod, nn.Linear):
        return Node(path, "linear", {}, params("weight", "bias"))
    if isinstance(mod, nn.Conv1d):
        if mod.groups != 1:
            raise IRError(f"{where}: groups={mod.groups} is not supported (only groups=1)")
        if mod.padding_mode != "zeros":
            raise IRError(f"{where}: padding_mode={mod.padding_mode!r} (only 'zeros')")
        if isinstance(mod.padding, str):
            if mod.padding != "valid":
                raise IRError(f"{where}: padding={mod.padding!r}; give an integer padding")
            pad = 0
        else:
            pad = _int1(mod.padding, "padding", where)
        attrs = {
            "stride": _int1(mod.stride, "stride", where),
            "padding": pad,
            "dilation": _int1(mod.dilation, "dilation", where),
        }
        return Node(path, "conv1d", attrs, params("weight", "bias"))
    if isinstance(mod, (nn.MaxPool1d, nn.AvgPool1d)):
        if mod.ceil_mode:
            raise IRError(f"{where}: ceil_mode=True is not supported")
        k = _int1(mod.kernel_size, "kernel_size", where)
        s = _int1(mod.stride if mod.stride is not None else k, "stride", where)
        attrs = {"kernel_size": k, "stride": s, "padding": _int1(mod.padding, "padding", where)}
        if isinstance(mod, nn.MaxPool1d):
            if _int1(mod.dilation, "dilation", where) != 1 or mod.return_indices:
                raise IRError(f"{where}: dilation != 1 and return_indices are not supported")
            return Node(path, "maxpool1d", attrs)
        if getattr(mod, "divisor_override", None):
            raise IRError(f"{where}: divisor_override is not supported")
        attrs["count_include_pad"] = int(mod.count_include_pad)
        return Node(path, "avgpool1d", attrs)
    if isinstance(mod, nn.ReLU):
        return Node(path, "relu")
    if isinstance(mod, nn.LeakyReLU):
        return Node(path, "leaky_relu", {"negative_slope": float(mod.negative_slope)})
    if isinstance(mod, nn.Tanh):
        return Node(path, "tanh")
    if isinstance(mod, nn.Sigmoid):
        return Node(path, "sigmoid")
    if isinstance(mod, nn.GELU):
        return Node(path, "gelu", {"approximate": mod.approximate})
    if isinstance(mod, nn.Flatten):
        if mod.start_dim != 1 or mod.end_dim != -1:
            raise IRError(f"{where}: only Flatten(start_dim=1, end_dim=-1) is supported")
        return Node(path, "flatten")
    if isinstance(mod, nn.Dropout):
        return Node(path, "dropout", {"p": float(mod.p)})
    if isinstance(mod, nn.Identity):
        return Node(path, "identity")
    raise IRError(f"{where} is not supported; supported layers: {SUPPORTED_MODULES}")


def _function_node(fx_node) -> Node:
    name = fx_node.name
    target = fx_node.target
    kwargs = dict(fx_node.kwargs)
    if fx_node.op == "call_function" and target in _ELEMENTWISE_FUNCS:
        op = _ELEMENTWISE_FUNCS[target]
        if op == "leaky_relu":
            slope = fx_node.args[1] if len(fx_node.args) > 1 else kwargs.get("negative_slope", 0.01)
            return Node(name, op, {"negative_slope": float(slope)})
        if op == "gelu":
            return Node(name, op, {"approximate": kwargs.get("approximate", "none")})
        return Node(name, op)
    if fx_node.op == "call_function" and target is torch.flatten:
        start = fx_node.args[1] if len(fx_node.args) > 1 else kwargs.get("start_dim", 0)
        end = fx_node.args[2] if len(fx_node.args) > 2 else kwargs.get("end_dim", -1)
        if (start, end) == (1, -1):
            return Node(name, "flatten")
    if fx_node.op == "call_method" and target in _ELEMENTWISE_METHODS:
        return Node(name, _ELEMENTWISE_METHODS[target])
    if fx_node.op == "call_method" and target == "flatten":
        start = fx_node.args[1] if len(fx_node.args) > 1 else kwargs.get("start_dim", 0)
        end = fx_node.args[2] if len(fx_node.args) > 2 else kwargs.get("end_dim", -1)
        if (start, end) == (1, -1):
            return Node(name, "flatten")
    what = getattr(target, "__name__", str(target))
    if target in (operator.add, torch.add, operator.mul, torch.cat):
        hint = " (rootclad compiles chains of single-input layers; no residual adds or concat)"
    else:
        hint = ""
    raise IRError(
        f"operation {what!r} at fx node {name!r} is not supported{hint}; supported layers: "
        f"{SUPPORTED_MODULES}, and torch.relu/tanh/sigmoid/flatten(x, 1), F.gelu, F.leaky_relu"
    )


def graph_from_module(module: nn.Module, example_input: torch.Tensor, dtype: str) -> Graph:
    """Trace ``module`` and return its validated graph (per-sample shapes from the example)."""
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 2:
        raise IRError("example_input must be a tensor with a batch axis first, e.g. (B, C, L)")
    has_lazy = any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in module.modules())
    if has_lazy:
        with torch.no_grad():
            module(
                example_input.to(
                    next(
                        iter(
                            [
                                p
                                for p in module.parameters()
                                if not isinstance(p, nn.UninitializedParameter)
                            ]
                            + [example_input]
                        )
                    ).dtype
                )
            )
    if _is_torch_layer(module):
        # fx would trace into the layer's own forward (F.linear on get_attr weights): a bare
        # layer is the one-node chain itself
        nodes = [_module_node("", module)]
        nodes[0].name = type(module).__name__
    else:
        nodes = _chain_from_fx(module)
    params = [Param(name, tuple(p.shape)) for name, p in module.named_parameters()]
    graph = Graph(tuple(example_input.shape[1:]), nodes, params, dtype)
    graph.validate()
    return pool_before_activation(graph)


def _is_torch_layer(module: nn.Module) -> bool:
    """A torch.nn layer (what torch.fx treats as a leaf), not a container."""
    return type(module).__module__.startswith("torch.nn") and not isinstance(
        module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    )


def _chain_from_fx(module: nn.Module) -> list[Node]:
    try:
        traced = torch.fx.symbolic_trace(module)
    except Exception as exc:  # fx raises many types; the user needs the reason and the model
        raise IRError(
            f"cannot trace {type(module).__name__} with torch.fx: {exc}. rootclad compiles "
            f"nn.Sequential or fx-traceable modules made of: {SUPPORTED_MODULES}"
        ) from exc

    nodes: list[Node] = []
    current = None  # the fx node whose value flows through the chain
    for fx_node in traced.graph.nodes:
        if fx_node.op == "placeholder":
            if current is not None:
                raise IRError(
                    f"the model takes more than one input ({fx_node.name!r}); "
                    "rootclad compiles single-input models"
                )
            current = fx_node
            continue
        if fx_node.op == "output":
            result = fx_node.args[0]
            if result is not current:
                raise IRError(f"the model returns {result!r}, not the last layer's output")
            break
        if fx_node.op == "get_attr":
            raise IRError(
                f"fx node {fx_node.name!r} reads attribute {fx_node.target!r} directly; "
                "only parameters of supported layers can be compiled"
            )
        inputs = [a for a in fx_node.all_input_nodes]
        if inputs != [current]:
            raise IRError(
                f"fx node {fx_node.name!r} ({fx_node.target}) takes {[a.name for a in inputs]}, "
                f"but rootclad compiles chains in which each layer takes the previous output "
                f"({current.name!r}); residual connections (x + f(x)), branches and "
                "concatenations are not supported"
            )
        if fx_node.op == "call_module":
            nodes.append(_module_node(fx_node.target, traced.get_submodule(fx_node.target)))
        else:
            nodes.append(_function_node(fx_node))
        current = fx_node
    return nodes
