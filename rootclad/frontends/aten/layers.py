"""ATen ops of layers and layout: the fused layers torch.export keeps whole (lowered as the
module that called them, through the registry's ``from_module``), softmax, views, permute,
cat, and reductions over per-sample axes."""

from __future__ import annotations

import math

from torch import nn

from rootclad.frontends.aten.table import lowers

# a kept ATen op -> the module classes that call it, and its weight's argument position (None:
# a layer without parameters, lowered when its own forward called it)
_LAYERS = {
    "linear": ((nn.Linear,), 1),
    "conv1d": ((nn.Conv1d,), 1),
    "conv2d": ((nn.Conv2d,), 1),
    "layer_norm": ((nn.LayerNorm,), 2),
    "_native_batch_norm_legit_no_training": ((nn.modules.batchnorm._BatchNorm,), 1),
    "_native_batch_norm_legit_functional": ((nn.modules.batchnorm._BatchNorm,), 1),
    "conv3d": ((nn.Conv3d,), 1),
    "conv_transpose1d": ((nn.ConvTranspose1d,), 1),
    "conv_transpose2d": ((nn.ConvTranspose2d,), 1),
    "max_pool1d": ((nn.MaxPool1d,), None),
    "max_pool3d": ((nn.MaxPool3d,), None),
    "avg_pool3d": ((nn.AvgPool3d,), None),
    "adaptive_max_pool1d": ((nn.AdaptiveMaxPool1d,), None),
    "adaptive_max_pool2d": ((nn.AdaptiveMaxPool2d,), None),
    "adaptive_avg_pool3d": ((nn.AdaptiveAvgPool3d,), None),
    "max_pool2d": ((nn.MaxPool2d,), None),
    "avg_pool1d": ((nn.AvgPool1d,), None),
    "avg_pool2d": ((nn.AvgPool2d,), None),
    "adaptive_avg_pool1d": ((nn.AdaptiveAvgPool1d,), None),
    "adaptive_avg_pool2d": ((nn.AdaptiveAvgPool2d,), None),
}


def _layer(low, node, args, kw):
    """The op as the layer whose forward called it: its weight must be that layer's own."""
    from rootclad.frontends.torch_fx import _module_node

    aten = node.target._opname
    classes, at = _LAYERS[aten]
    path, mod = low.module_of(node)
    prefix = f"{path}." if path else ""
    weight = low.param_name(args[at]) if at is not None and len(args) > at else None
    own = f"{prefix}weight" if getattr(mod, "weight", None) is not None else None
    if not isinstance(mod, classes) or (at is not None and weight != own):
        raise low.refuse(
            node,
            f"a {aten} that is not the forward of a torch.nn layer with its "
            "own weight (a functional call) is not supported yet",
        )
    for key, called, own in _hyperparameters(aten, args, mod):
        if called != own:
            raise low.refuse(
                node,
                f"{key}={called} where the layer has {key}={own} (a "
                "forward of its own calling the op otherwise)",
            )
    made = _module_node(path, mod, node.name)
    made.inputs = [low.value(node, args[0])]
    low.nodes.append(made)
    results = node.meta.get("val")
    if isinstance(results, (tuple, list)):  # (out, statistics or indices): the first is read
        low.tuples[node.name] = [made.output] + [None] * (len(results) - 1)
    else:
        low.names[node.name] = made.output


# the hyperparameters of an ATen layer op, by argument position, and the layer attribute each
# must equal (a subclass whose forward calls the op otherwise is refused); the first family
# whose name starts the op's is its own
_ARGS = {
    "conv_transpose": {3: "stride", 4: "padding", 5: "output_padding", 6: "groups", 7: "dilation"},
    "conv": {3: "stride", 4: "padding", 5: "dilation", 6: "groups"},
    "max_pool": {1: "kernel_size", 2: "stride", 3: "padding", 4: "dilation", 5: "ceil_mode"},
    "avg_pool": {
        1: "kernel_size",
        2: "stride",
        3: "padding",
        4: "ceil_mode",
        5: "count_include_pad",
        6: "divisor_override",
    },
    "adaptive": {1: "output_size"},
    "layer_norm": {1: "normalized_shape", 4: "eps"},
    "_native_batch_norm_legit_no_training": {5: "momentum", 6: "eps"},
    "_native_batch_norm_legit_functional": {6: "momentum", 7: "eps"},
}


def _hyperparameters(aten, args, mod):
    """(name, as called, as the layer has it) for each hyperparameter the call passes."""
    family = next((f for f in _ARGS if aten.startswith(f)), None)
    if family is None:
        return []
    dims = next((int(c) for c in aten if c.isdigit()), 1)
    out = []
    for at, name in _ARGS[family].items():
        if at >= len(args):  # not passed: torch's default, which the layer's forward takes
            continue
        own, called = getattr(mod, name), args[at]
        if name == "stride" and family.endswith("pool") and own is None:
            own = mod.kernel_size  # torch's default stride is the window
        if name == "stride" and family.endswith("pool") and called == []:
            called = own
        if name == "momentum" and own is None:  # a cumulative average: torch passes 0.0
            own = called
        out.append((name, _norm(called, dims), _norm(own, dims)))
    return out


def _norm(v, dims):
    if isinstance(v, (bool, float)) or v is None:
        return v
    if isinstance(v, int):
        return (v,) * dims
    return tuple(v)


for _aten in _LAYERS:  # conv_transpose2d's overload is "input" (its memory format variant)
    # (BatchNorm's ops are what torch decomposes it into: core ops, not kept)
    _kept = not _aten.startswith("_native_batch_norm")
    lowers(f"aten.{_aten}.{'input' if _aten == 'conv_transpose2d' else 'default'}", kept=_kept)(
        _layer
    )


def _axis(low, node, x, dim) -> int:
    """A per-sample axis of ``x`` (torch's numbering counts the batch axis)."""
    rank = len(low.shape(node, x)) + 1
    full = dim + rank if dim < 0 else dim
    if not 1 <= full < rank:
        raise low.refuse(node, f"dim={dim} is the batch axis or out of range")
    return full - 1


@lowers("aten.softmax.int", "aten.log_softmax.int", kept=True)
@lowers("aten._softmax.default", "aten._log_softmax.default")
def _softmax(low, node, args, kw):
    if len(args) > 2 and args[2] not in (None, False) or kw.get("dtype") is not None:
        raise low.refuse(node, "a softmax into another dtype")
    op = "log_softmax" if "log" in node.target._opname else "softmax"
    axis = _axis(low, node, args[0], args[1])
    low.emit(node, op, [low.value(node, args[0])], {"axis": axis})


@lowers(
    "aten.view.default",
    "aten.reshape.default",
    "aten._unsafe_view.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.flatten.using_ints",
)
def _view(low, node, args, kw):
    """A new shape of the same values: per sample, the shape torch gives (its batch axis
    checked to stay first and whole)."""
    x = args[0]
    if math.prod(low.shape(node, x)) != math.prod(low.shape(node)):
        raise low.refuse(node, "a view that moves values between samples")
    low.emit(node, "reshape", [low.value(node, x)], {"shape": low.shape(node)})


@lowers("aten.expand.default")
def _expand(low, node, args, kw):
    """Axes of size 1 repeated (the batch axis stays as it is)."""
    x, out = args[0], low.shape(node)
    if low.is_held(x):  # a parameter to the batch: p.expand(B, -1, ...)
        low.emit(node, "expand", [low.held(node, x, len(out))], {"shape": out})
        return
    if len(low.shape(node, x)) != len(out):
        raise low.refuse(node, "an expand that adds axes (unsqueeze first)")
    low.emit(node, "expand", [low.value(node, x)], {"shape": out})


@lowers("aten.permute.default")
def _permute(low, node, args, kw):
    perm = [p + len(args[1]) if p < 0 else p for p in args[1]]
    if perm[0] != 0:
        raise low.refuse(node, f"permutation {tuple(perm)} moves the batch axis")
    low.emit(node, "permute", [low.value(node, args[0])], {"perm": tuple(p - 1 for p in perm[1:])})


@lowers("aten.cat.default")
def _cat(low, node, args, kw):
    parts = args[0]
    dim = args[1] if len(args) > 1 else kw.get("dim", 0)
    axis = _axis(low, node, parts[0], dim)
    low.emit(node, "cat", [low.value(node, p) for p in parts], {"axis": axis})


@lowers("aten.mean.dim", "aten.sum.dim_IntList")
def _reduce(low, node, args, kw):
    """A mean or sum over per-sample axes: the axes moved last, the rest and them made two
    axes, the average of each row (global_avgpool), scaled for a sum, in torch's shape."""
    x = args[0]
    dims = args[1] if len(args) > 1 else kw.get("dim")
    if kw.get("dtype") is not None or dims in (None, [], ()):
        raise low.refuse(node, "a reduction over every axis or into another dtype")
    shape = low.shape(node, x)
    axes = sorted({_axis(low, node, x, d) for d in dims})
    rest = [a for a in range(len(shape)) if a not in axes]
    inner, outer = math.prod(shape[a] for a in axes), math.prod(shape[a] for a in rest)
    src = low.value(node, x)
    if rest + axes != list(range(len(shape))):
        src = low.emit(node, "permute", [src], {"perm": tuple(rest + axes)}, part="permuted")
    src = low.emit(node, "reshape", [src], {"shape": (outer, inner)}, part="rows")
    src = low.emit(node, "global_avgpool", [src], part="mean")
    if node.target._opname == "sum":
        src = low.emit(node, "affine", [src], {"scale": float(inner), "shift": 0.0}, part="sum")
    low.emit(node, "reshape", [src], {"shape": low.shape(node)})


@lowers("aten.slice.Tensor")
def _slice(low, node, args, kw):
    x, dim = args[0], args[1] if len(args) > 1 else 0
    size = low.shape(node, x)
    if dim in (0, -len(size) - 1):  # x[:, ...]: the whole batch axis, as a view
        whole = (list(args[2:]) + [0, None, 1][len(args) - 2 :])[:3]
        if whole[0] in (0, None) and whole[2] == 1 and (whole[1] is None or whole[1] >= 2**62):
            low.emit(node, "identity", [low.value(node, x)])
            return
    axis = _axis(low, node, x, dim)
    start, stop, step = (list(args[2:]) + [None, None, 1][len(args) - 2 :])[:3]
    start, stop, step = slice(start, stop, step).indices(size[axis])
    if (start, stop, step) == (0, size[axis], 1):
        low.emit(node, "identity", [low.value(node, x)])
        return
    low.emit(
        node,
        "slice",
        [low.value(node, x)],
        {"axis": axis, "start": start, "stop": stop, "step": step},
    )


@lowers("aten.constant_pad_nd.default")
def _pad(low, node, args, kw):
    """F.pad with a constant: one pad op per padded axis, the last axis first (torch's order
    of the counts); negative counts (cropping) are refused."""
    x, counts = args[0], list(args[1])
    value = low.number(node, args[2] if len(args) > 2 else kw.get("value", 0.0), "value")
    rank = len(low.shape(node, x))
    if len(counts) % 2 or len(counts) // 2 > rank or min(counts, default=0) < 0:
        raise low.refuse(node, f"padding {counts}: pairs of counts >= 0 for per-sample axes")
    src = low.value(node, x)
    pairs = [(rank - 1 - i, counts[2 * i], counts[2 * i + 1]) for i in range(len(counts) // 2)]
    pairs = [p for p in pairs if p[1] or p[2]]
    for i, (axis, before, after) in enumerate(pairs):
        attrs = {"axis": axis, "before": before, "after": after, "value": value}
        src = low.emit(node, "pad", [src], attrs, part="" if i == len(pairs) - 1 else f"pad{i}")
    if not pairs:
        low.emit(node, "identity", [src])
