"""ATen ops of layers: the fused layers torch.export keeps whole (and BatchNorm's and dropout's
core ops), lowered as the module that called them through the registry's ``from_module``, each
hyperparameter and tensor of the call checked against the layer's; and softmax."""

from __future__ import annotations

import torch
from torch import nn

from rootclad.frontends.aten.modules import module_node
from rootclad.frontends.aten.table import lowers
from rootclad.ir.graph import IRError

# a kept ATen op -> the module classes that call it, and its weight's argument position (None:
# a layer without parameters; the tensors each op takes from its layer: _TENSORS)
_LAYERS = {
    "linear": ((nn.Linear,), 1),
    "conv1d": ((nn.Conv1d,), 1),
    "conv2d": ((nn.Conv2d,), 1),
    "layer_norm": ((nn.LayerNorm,), 2),
    "_native_batch_norm_legit_no_training": ((nn.modules.batchnorm._BatchNorm,), 1),
    "_native_batch_norm_legit_functional": ((nn.modules.batchnorm._BatchNorm,), 1),
    "_native_batch_norm_legit": ((nn.modules.batchnorm._BatchNorm,), 1),  # no_stats (norms.py)
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
    **{
        f"upsample_nearest{d}d": lambda size, scale: _upsample(size, scale, "nearest")
        for d in (1, 2)
    },
    "upsample_linear1d": lambda size, align, scale: _upsample(size, scale, "linear", align),
    "upsample_bilinear2d": lambda size, align, scale: _upsample(size, scale, "bilinear", align),
}


def _upsample(size, scale, mode, align=None) -> nn.Upsample:
    """The nn.Upsample of F.interpolate's call (torch's op takes a size or the scales)."""
    size, scale = (tuple(v) if v is not None else None for v in (size, scale))
    return nn.Upsample(size, scale, mode, align)


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
    "_native_batch_norm_legit": {1: "weight", 2: "bias"},
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
    aten = node.target._opname
    classes, at = _LAYERS[aten]
    path, mod = low.module_of(node)
    if not isinstance(mod, classes) and aten in _FUNCTIONAL:  # F.max_pool2d(x, 3) and the like
        path, mod = "", _FUNCTIONAL[aten](*args[1:])
    inner = isinstance(mod, (nn.RNNBase, nn.MultiheadAttention))
    if aten == "native_dropout" and inner and args[1] == mod.dropout:
        path, mod = "", nn.Dropout(mod.dropout)  # between recurrent layers, of attention weights
    if aten in _STAND_IN and not _own_tensors(low, node, args, path, mod, classes):
        _functional(low, node, args, aten)  # F.linear(x, w, b) and the like
        return
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
    if aten not in ("linear", "layer_norm", "native_dropout"):  # those act on any sample rows
        low.batch_first(node, args[0], aten)
    elif aten != "native_dropout":
        _over_batch(low, node, args, aten)
    for key, called, own in _hyperparameters(aten, args, mod):
        if called != own:
            raise low.refuse(
                node,
                f"{key}={called} where the layer has {key}={own} (a "
                "forward of its own calling the op otherwise)",
            )
    try:
        made = module_node(path, mod, node.name)
    except IRError as exc:  # (a setting the layer's op refuses: named with the ATen node)
        raise low.refuse(node, str(exc)) from exc
    made.inputs = [low.value(node, args[0])]
    low.nodes.append(made)
    results = node.meta.get("val")
    if isinstance(results, (tuple, list)):  # (out, statistics or indices): the first is read
        low.tuples[node.name] = [made.output] + [None] * (len(results) - 1)
    else:
        low.names[node.name] = made.output


def _own_tensors(low, node, args, path, mod, classes) -> bool:
    """Whether the op is the forward of layer ``mod``: its class, its tensors, its
    hyperparameters."""
    if not isinstance(mod, classes):
        return False
    aten, prefix = node.target._opname, f"{path}." if path else ""
    for at, name in _TENSORS[aten].items():
        called = low.tensor_name(args[at]) if at < len(args) else None
        if called != (
            low.canonical(prefix + name) if getattr(mod, name, None) is not None else None
        ):
            return False
    return all(called == own for _, called, own in _hyperparameters(aten, args, mod))


# the layers a functional call with tensors of its own stands for (F.linear(x, w, b), F.conv2d,
# F.layer_norm): a layer of the call's hyperparameters reading the call's tensors
_STAND_IN = {
    "linear": lambda w, b=None: nn.Linear(w.shape[1], w.shape[0], b is not None, device="meta"),
    **{
        f"conv{d}d": lambda w, b=None, stride=1, padding=0, dilation=1, groups=1, c=c: c(
            w.shape[1] * groups,
            w.shape[0],
            tuple(w.shape[2:]),
            stride,
            padding,
            dilation,
            groups,
            b is not None,
            device="meta",
        )
        for d, c in ((1, nn.Conv1d), (2, nn.Conv2d), (3, nn.Conv3d))
    },
    **{
        f"conv_transpose{d}d": lambda w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, c=c: (
            c(
                w.shape[0],
                w.shape[1] * groups,
                tuple(w.shape[2:]),
                stride,
                padding,
                output_padding,
                groups,
                b is not None,
                dilation,
                device="meta",
            )
        )
        for d, c in ((1, nn.ConvTranspose1d), (2, nn.ConvTranspose2d))
    },
    "layer_norm": lambda shape, w=None, b=None, eps=1e-5, *_: nn.LayerNorm(
        shape, eps, w is not None, b is not None, device="meta"
    ),
}


def _functional(low, node, args, aten):
    """A layer op called with tensors of its own: the layer it stands for, reading them where
    they are parameters or buffers; a linear of weights computed in forward (a slice of a
    packed projection, a transpose) as a product with them."""
    tensors = _TENSORS[aten]
    held = {at: args[at] if at < len(args) else None for at in tensors}
    if all(t is None or low.param_name(t) for t in held.values()):
        shapes = [
            args[at].meta["val"] if at in held and args[at] is not None else args[at]
            for at in range(1, len(args))
        ]
        if aten == "layer_norm":
            shapes[0] = tuple(shapes[0])
        made = module_node("", _STAND_IN[aten](*shapes), node.name)
        made.params = {r: low.tensor_name(held[at]) for at, r in tensors.items() if held[at]}
        if aten.startswith("conv"):
            low.batch_first(node, args[0], aten)
        else:
            _over_batch(low, node, args, aten)
        made.inputs = [low.value(node, args[0])]
        low.nodes.append(made)
        low.names[node.name] = made.output
        return
    if aten in ("conv1d", "conv2d", "conv3d") and _scaled_conv(low, node, args, aten):
        return
    if aten == "layer_norm":  # weights that are no parameters: the plain norm, then them
        _over_batch(low, node, args, aten)
        shape, w, b, eps = (list(args[1:]) + [None, None, 1e-5][max(len(args) - 2, 0) :])[:4]
        plain = _STAND_IN[aten](tuple(shape), None, None, eps)
        made = module_node("", plain, f"{node.name}__plain")
        made.inputs = [low.value(node, args[0])]
        low.nodes.append(made)
        src = made.output
        if w is not None:
            src = low.emit(
                node, "mul", [src, low.operand(node, w)], part="" if b is None else "scaled"
            )
        if b is not None:
            src = low.emit(node, "add", [src, low.operand(node, b)])
        low.names[node.name] = src
        return
    if aten != "linear":
        raise low.refuse(
            node,
            f"a {aten} of tensors computed in forward is not supported yet (but for a "
            "parameter scaled per output channel, as weight norm makes it)",
        )
    _over_batch(low, node, args, aten)
    x, w, b = (list(args) + [None])[:3]
    shape = low.shape(node, x)
    src = low.value(node, x)
    if len(shape) == 1:  # a vector: a one-row matrix
        src = low.emit(node, "reshape", [src], {"shape": (1, *shape)}, part="row")
    weight = low.emit(node, "permute", [low.value(node, w)], {"perm": (1, 0)}, part="weight_t")
    out = low.shape(node)
    last = b is None and len(shape) > 1
    src = low.emit(node, "matmul", [src, weight], part="" if last else "product")
    if len(shape) == 1:
        src = low.emit(node, "reshape", [src], {"shape": out}, part="" if b is None else "rows")
    if b is not None:
        low.emit(node, "add", [src, low.operand(node, b)])


def _per_channel(low, weight):
    """(v, [(s, op), ...]) where ``weight`` is parameter v multiplied (op "mul") or divided
    (op "div") in turn by each s, the same for every sample and one value per output channel
    or one for all (weight norm's g / ||v||, or v / ||v|| * g), else None."""
    if low.param_name(weight):
        return weight, []
    if not isinstance(weight, torch.fx.Node) or weight.target not in _SCALINGS:
        return None
    op = _SCALINGS[weight.target]
    pairs = [weight.args[:2]] + ([weight.args[1::-1]] if op == "mul" else [])
    for w, s in pairs:
        if not (isinstance(w, torch.fx.Node) and isinstance(s, torch.fx.Node) and low.is_held(s)):
            continue
        ws, ss = tuple(w.meta["val"].shape), tuple(s.meta["val"].shape)
        per_channel = len(ss) == len(ws) and ss[:1] in ((1,), ws[:1]) and set(ss[1:]) <= {1}
        if not (per_channel or all(d == 1 for d in ss)):
            continue
        inner = _per_channel(low, w)
        if inner is not None:
            return inner[0], [*inner[1], (s, op)]
    return None


def _scaled_conv(low, node, args, aten) -> bool:
    """conv(x, v * s) + b as conv(x, v) * s + b, where s is one factor per output channel (a
    convolution is linear in its weight): the convolution reads parameter v, its gradient
    reaches s through the product. False where the weight is not of that form."""
    found = _per_channel(low, args[1])
    if found is None or not found[1]:
        return False
    v, factors = found
    b = args[2] if len(args) > 2 else None
    if b is not None and not low.param_name(b):
        return False
    low.batch_first(node, args[0], aten)
    rest = [v.meta["val"], None, *args[3:]]
    made = module_node("", _STAND_IN[aten](*rest), f"{node.name}__unscaled")
    made.params = {"weight": low.tensor_name(v)}
    made.inputs = [low.value(node, args[0])]
    low.nodes.append(made)
    out, src = low.shape(node), made.output
    for i, (s, op) in enumerate(factors):
        column = (out[0] if s.meta["val"].numel() > 1 else 1,) + (1,) * (len(out) - 1)
        scale = low.held_as(node, s, column, part=f"scale{i}")
        last = b is None and i == len(factors) - 1
        src = low.emit(node, op, [src, scale], part="" if last else f"scaled{i}")
    if b is not None:
        bias = low.held_as(node, b, (out[0],) + (1,) * (len(out) - 1), part="bias")
        low.emit(node, "add", [src, bias])
    return True


_SCALINGS = {torch.ops.aten.mul.Tensor: "mul", torch.ops.aten.div.Tensor: "div"}


def _over_batch(low, node, args, aten) -> None:
    """Refuse a linear or layer norm whose axes include the batch axis."""
    at = low.layout(node, args[0])
    acts = 1 if aten == "linear" else len(args[1])
    if at is not None and at[0] >= len(args[0].meta["val"].shape) - acts:
        raise low.refuse(node, f"a {aten} over the batch axis")


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
    "_native_batch_norm_legit": {4: "momentum", 5: "eps"},
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
        if name == "output_size" and isinstance(own, (tuple, list)):  # None: the input's size
            own = tuple(c if o is None else o for o, c in zip(own, called, strict=False))
        out.append((name, _norm(called, dims), _norm(own, dims)))
    return out


def _norm(v, dims):
    if isinstance(v, (bool, float)) or v is None:
        return v
    if isinstance(v, int):
        return (v,) * dims
    return tuple(v)


for _aten in _LAYERS:  # (BatchNorm's and dropout's ops are core ATen ops: nothing to keep)
    if _aten == "_native_batch_norm_legit":  # lowered in norms.py (instance norm's too)
        continue
    _kept = not _aten.startswith(("_native_batch_norm", "native_dropout"))
    lowers(f"aten.{_aten}.{_OVERLOADS.get(_aten, 'default')}", kept=_kept)(_layer)


@lowers("aten.softmax.int", "aten.log_softmax.int", "aten._safe_softmax.default", kept=True)
@lowers("aten._softmax.default", "aten._log_softmax.default")
def _softmax(low, node, args, kw):
    """Softmax and its log; the safe softmax (rows of -inf only give 0s) of attention."""
    if len(args) > 2 and args[2] not in (None, False) or kw.get("dtype") is not None:
        raise low.refuse(node, "a softmax into another dtype")
    aten = node.target._opname
    op = "log_softmax" if "log" in aten else "safe_softmax" if "safe" in aten else "softmax"
    axis = low.axis(node, args[0], args[1])
    low.emit(node, op, [low.value(node, args[0])], {"axis": axis})
