"""ATen ops of layers: the fused layers torch.export keeps whole (and BatchNorm's and dropout's
core ops), lowered as the module that called them through the registry's ``from_module``, each
hyperparameter and tensor of the call checked against the layer's; and softmax."""

from __future__ import annotations

from torch import nn

from rootclad.frontends.aten.table import lowers

# a kept ATen op -> the module classes that call it, and its weight's argument position (None:
# a layer without parameters; the tensors each op takes from its layer: _TENSORS)
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
    "upsample_nearest1d": ((nn.Upsample,), None),
    "upsample_nearest2d": ((nn.Upsample,), None),
    "upsample_linear1d": ((nn.Upsample,), None),
    "upsample_bilinear2d": ((nn.Upsample,), None),
    "native_dropout": ((nn.Dropout,), None),
}
_ADAPTIVE = [(k, d, getattr(nn, f"Adaptive{k}Pool{d}d")) for k in ("Avg", "Max") for d in (1, 2, 3)]

# the parameter-free layers a forward may call as functions: the layer the call's arguments
# make (as torch's functional form takes them), lowered as that layer
_FUNCTIONAL = {
    **{
        f"max_pool{d}d": lambda k, s=None, p=0, dil=1, ceil=False, c=c: c(
            k, s or None, p, dil, ceil_mode=ceil
        )
        for d, c in ((1, nn.MaxPool1d), (2, nn.MaxPool2d), (3, nn.MaxPool3d))
    },
    **{
        f"avg_pool{d}d": lambda k, s=None, p=0, ceil=False, inc=True, div=None, c=c: c(
            k, s or None, p, ceil, inc, *([div] if div is not None else [])
        )
        for d, c in ((1, nn.AvgPool1d), (2, nn.AvgPool2d), (3, nn.AvgPool3d))
    },
    **{f"adaptive_{kind.lower()}_pool{d}d": c for kind, d, c in _ADAPTIVE},
}

# the tensors a layer op takes from its layer, by argument position
_OWN = {1: "weight", 2: "bias"}
_STATISTICS = {1: "weight", 2: "bias", 3: "running_mean", 4: "running_var"}
_TENSORS = {
    **{
        a: _OWN
        for a in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d")
    },
    "layer_norm": {2: "weight", 3: "bias"},
    "_native_batch_norm_legit_no_training": _STATISTICS,
    "_native_batch_norm_legit_functional": _STATISTICS,
}

# overloads other than "default"
_OVERLOADS = {
    "conv_transpose2d": "input",
    "upsample_nearest1d": "vec",
    "upsample_nearest2d": "vec",
    "upsample_linear1d": "vec",
    "upsample_bilinear2d": "vec",
}


def _layer(low, node, args, kw):
    """The op as the layer whose forward called it: its weight must be that layer's own."""
    from rootclad.frontends.torch_fx import _module_node

    aten = node.target._opname
    classes, at = _LAYERS[aten]
    path, mod = low.module_of(node)
    if not isinstance(mod, classes) and aten in _FUNCTIONAL:  # F.max_pool2d(x, 3) and the like
        path, mod = "", _FUNCTIONAL[aten](*args[1:])
    if not isinstance(mod, classes):
        raise low.refuse(
            node,
            f"a {aten} that is not the forward of a torch.nn layer (a "
            "functional call with tensors of its own) is not supported yet",
        )
    prefix = f"{path}." if path else ""
    for at, name in _TENSORS.get(aten, {}).items():  # the layer's own, or None where it has none
        called = low.tensor_name(args[at]) if at < len(args) else None
        own = low.canonical(prefix + name) if getattr(mod, name, None) is not None else None
        if called != own:
            raise low.refuse(
                node,
                f"argument {at} is {called or 'None'} where the layer "
                f"{path!r} has {name} {own or 'None'} (a forward of its "
                "own calling the op otherwise)",
            )
    if aten == "_native_batch_norm_legit_functional" and args[5] != mod.training:
        raise low.refuse(node, "batch statistics where the layer would use its running ones")
    if low.merged(node, args[0]) and aten not in ("linear", "layer_norm"):
        raise low.refuse(node, f"a {aten} of a value whose batch axis torch merged with another")
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
    "upsample_linear": {2: "align_corners"},
    "upsample_bilinear": {2: "align_corners"},
    "native_dropout": {1: "p"},
}


def _hyperparameters(aten, args, mod):
    """(name, as called, as the layer has it) for each hyperparameter the call passes."""
    family = next((f for f in _ARGS if aten.startswith(f)), None)
    if aten.startswith("upsample"):  # the op is the mode
        mode = aten.split("_")[1][:-2]  # nearest, linear, bilinear
        if mod.mode != mode:
            return [("mode", mode, mod.mode)]
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
        if name == "align_corners" and own is None:  # torch's default
            own = False
        if name == "p":
            own = float(own)
        out.append((name, _norm(called, dims), _norm(own, dims)))
    return out


def _norm(v, dims):
    if isinstance(v, (bool, float)) or v is None:
        return v
    if isinstance(v, int):
        return (v,) * dims
    return tuple(v)


for _aten in _LAYERS:  # (BatchNorm's and dropout's ops are core ATen ops: nothing to keep)
    _kept = not _aten.startswith(("_native_batch_norm", "native_dropout"))
    lowers(f"aten.{_aten}.{_OVERLOADS.get(_aten, 'default')}", kept=_kept)(_layer)


@lowers("aten.softmax.int", "aten.log_softmax.int", kept=True)
@lowers("aten._softmax.default", "aten._log_softmax.default")
def _softmax(low, node, args, kw):
    if len(args) > 2 and args[2] not in (None, False) or kw.get("dtype") is not None:
        raise low.refuse(node, "a softmax into another dtype")
    op = "log_softmax" if "log" in node.target._opname else "softmax"
    axis = low.axis(node, args[0], args[1])
    low.emit(node, op, [low.value(node, args[0])], {"axis": axis})
