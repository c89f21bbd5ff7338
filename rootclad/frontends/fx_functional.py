"""The ``torch.nn.functional`` forms of layers in a traced model: ``F.linear``,
``F.conv1d/2d/3d`` and ``F.group_norm`` with the model's parameters as weight and bias (each
named as the parameter itself, so that its gradient is that parameter's),
``F.max_pool1d/2d/3d``, ``F.avg_pool1d/2d/3d`` and ``F.dropout``. Each is the IR node its
module gives: the module is built from the call's arguments and read by the registry's
``from_module``, so a functional form accepts and refuses what its module does, naming the node.

``F.pad`` in constant mode and the ``nn.ConstantPad1d/2d/3d`` and ``nn.ZeroPad1d/2d/3d``
layers are one ``pad`` node per padded axis (a ``slice`` where a count is negative)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rootclad.frontends import fx_norms
from rootclad.ir.graph import IRError, Node
from rootclad.ir.ops.shape import pad_steps
from rootclad.ir.registry import OPS

# F's function -> (the module class, the op, the names of its arguments after the input)
_WEIGHTED = {
    F.linear: (nn.Linear, "linear", ("weight", "bias")),
    F.conv1d: (nn.Conv1d, "conv1d", ("weight", "bias", "stride", "padding", "dilation", "groups")),
    F.conv2d: (nn.Conv2d, "conv2d", ("weight", "bias", "stride", "padding", "dilation", "groups")),
    F.conv3d: (nn.Conv3d, "conv3d", ("weight", "bias", "stride", "padding", "dilation", "groups")),
}  # fmt: skip
_POOLS = {
    F.max_pool1d: (nn.MaxPool1d, ("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                  "return_indices")),
    F.max_pool2d: (nn.MaxPool2d, ("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                  "return_indices")),
    F.max_pool3d: (nn.MaxPool3d, ("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                  "return_indices")),
    F.avg_pool1d: (nn.AvgPool1d, ("kernel_size", "stride", "padding", "ceil_mode",
                                  "count_include_pad")),
    F.avg_pool2d: (nn.AvgPool2d, ("kernel_size", "stride", "padding", "ceil_mode",
                                  "count_include_pad", "divisor_override")),
    F.avg_pool3d: (nn.AvgPool3d, ("kernel_size", "stride", "padding", "ceil_mode",
                                  "count_include_pad", "divisor_override")),
}  # fmt: skip


def handles(target) -> bool:
    try:
        return (target in _WEIGHTED or target in _POOLS
                or target in (F.dropout, F.group_norm, F.pad))  # fmt: skip
    except TypeError:  # an unhashable target
        return False


def names_parameter(user, param_node) -> bool:
    """Whether ``user`` takes ``param_node`` as the weight or bias of a functional layer
    (which names the parameter itself: no value of it is needed)."""
    return (user.op == "call_function" and handles(user.target)
            and (user.target in _WEIGHTED or user.target is F.group_norm)
            and bool(user.args) and user.args[0] is not param_node)  # fmt: skip


def lower(low, fx_node, args, kw, where) -> None:
    t = fx_node.target
    x = args[0]
    if not low.is_tensor(x):
        raise IRError(f"{where}: its input is not a tensor")
    if t is F.dropout:
        p = args[1] if len(args) > 1 else kw.get("p", 0.5)
        training = args[2] if len(args) > 2 else kw.get("training", True)
        if not training or p == 0:  # fixed when fx traced it
            return low.add(fx_node.name, "identity", [x])
        return low.add(fx_node.name, "dropout", [x], {"p": float(p)})
    if t is F.pad:
        bound = dict(zip(("pad", "mode", "value"), args[1:], strict=False)) | kw
        if bound.get("mode", "constant") != "constant":
            raise IRError(f"{where}: mode={bound['mode']!r}; rootclad pads with a constant only")
        return pad(low, fx_node.name, x, bound["pad"], bound.get("value") or 0.0, where)
    if t is F.group_norm:
        bound = dict(zip(("num_groups", "weight", "bias", "eps"), args[1:], strict=False)) | kw
        names = []
        for role in ("weight", "bias"):
            value = bound.get(role)
            if value is not None and (not isinstance(value, torch.fx.Node)
                                      or value.name not in low.attr_params):  # fmt: skip
                raise IRError(f"{where}: its {role} must be a parameter of the model")
            names.append(None if value is None else low.attr_params[value.name])
        channels = low.shape(x)[1]
        return fx_norms.group_norm(low, fx_node.name, x, int(bound["num_groups"]), channels,
                                   float(bound.get("eps", 1e-5)), *names, where)  # fmt: skip
    if t in _POOLS:
        cls, names = _POOLS[t]
        bound = dict(zip(names, args[1:], strict=False)) | kw
        mod = _build(cls, bound, where)
        attrs = OPS[_op_of(cls)].from_module(mod, where)
        return low.add(fx_node.name, _op_of(cls), [x], attrs)
    cls, op, names = _WEIGHTED[t]
    bound = dict(zip(names, args[1:], strict=False)) | kw
    params = {}
    for role in ("weight", "bias"):
        value = bound.pop(role, None)
        if value is None:
            continue
        if not isinstance(value, torch.fx.Node) or value.name not in low.attr_params:
            raise IRError(f"{where}: its {role} must be a parameter of the model")
        params[role] = low.attr_params[value.name]
    if "weight" not in params:
        raise IRError(f"{where}: a weight is needed")
    w = low.traced.get_parameter(params["weight"])
    if cls is nn.Linear:
        attrs = {}
    else:
        groups = bound.get("groups", 1)
        if isinstance(bound.get("padding"), str) and bound["padding"] != "valid":
            raise IRError(f"{where}: padding={bound['padding']!r}; give an integer padding")
        mod = cls(w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]), device="meta",
                  bias="bias" in params, **{k: v for k, v in bound.items()
                                             if k in ("stride", "padding", "dilation", "groups")})  # fmt: skip
        attrs = OPS[op].from_module(mod, where)
    low.nodes.append(Node(fx_node.name, op, [x.name], fx_node.name, attrs, params))


def _op_of(cls) -> str:
    return next(name for name, spec in OPS.items() if cls.__name__ in spec.modules)


def _build(cls, bound, where):
    try:
        return cls(**bound)
    except (TypeError, ValueError) as exc:
        raise IRError(f"{where}: arguments {bound} not understood ({exc})") from None


def pad(low, out, x, flat, value, where) -> None:
    """``x`` (an fx node) padded as ``F.pad(x, flat, value=value)``: ``flat`` holds (before,
    after) pairs from the last axis backwards; the batch axis is never padded."""
    shape = tuple(low.shape(x)[1:])
    if not all(isinstance(p, int) for p in flat) or len(flat) % 2:
        raise IRError(f"{where}: padding {flat!r}; give (before, after) counts per axis")
    pairs = [(0, 0)] * len(shape)
    for k in range(len(flat) // 2):
        pair, axis = (flat[2 * k], flat[2 * k + 1]), len(shape) - 1 - k
        if axis >= 0:
            pairs[axis] = pair
        elif pair != (0, 0):
            raise IRError(f"{where}: padding {flat!r} reaches the batch axis of a tensor of "
                          f"per-sample shape {shape}; rootclad keeps samples apart")  # fmt: skip
    steps = pad_steps(shape, pairs, value) or [("identity", {})]
    v = x.name
    for i, (op, attrs) in enumerate(steps):
        name = out if i == len(steps) - 1 else f"{out}__{op}{i}"
        low.nodes.append(Node(name, op, [v], name, attrs, {}))
        v = name


def _pad_module(low, fx_node, mod, module_node) -> None:
    where = f"module {fx_node.target!r} ({type(mod).__name__})"
    if len(fx_node.args) != 1 or fx_node.kwargs or not low.is_tensor(fx_node.args[0]):
        raise IRError(f"{where} is called with {len(fx_node.args)} arguments; it takes one tensor")
    pad(low, fx_node.name, fx_node.args[0], list(mod.padding), float(mod.value), where)


LAYERS = {c: _pad_module for c in (nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d)}
