"""Elementwise ops. Each is one functor (include/rootclad/ops/activations.h) holding its value
and its derivative, which every backend runs: adding one is its functor there, a line here,
its ONNX op (frontends/onnx/ops.py) and a test case (tests/fixtures/op_cases.py).

``saves`` says what the functor's derivative reads: the input (``("in",)``) or, where that is
cheaper, only the output (``("out",)``; the GPU then fuses the op into its producer)."""

from __future__ import annotations

import math

from rootclad.ir.graph import IRError, expect
from rootclad.ir.ops.common import F, arg, same_shape
from rootclad.ir.registry import OpSpec, register


def elementwise(name, summary, functor, modules=(), functions=(), functor_args=lambda a: (),
                from_module=None, from_call=None, saves=("in",), monotone=None, params=(),
                infer=same_shape):  # fmt: skip
    """Register an elementwise op computed by ``functor``; with ``params=("weight",)`` the
    functor takes one parameter value per channel (per-sample axis 0), or one for all."""
    return register(
        OpSpec(
            name,
            "elementwise",
            summary,
            infer,
            params=params,
            saves=saves,
            functor=functor,
            functor_args=functor_args,
            monotone=monotone,
            modules=modules,
            from_module=from_module,
            functions=functions,
            from_call=from_call,
        )
    )


def _always(attrs) -> bool:
    return True


elementwise("relu", "ReLU", "Relu", ("ReLU",), ("torch.relu", F + "relu", "Tensor.relu"),
            saves=("out",), monotone=_always)  # fmt: skip
elementwise("tanh", "Tanh", "Tanh", ("Tanh",), ("torch.tanh", F + "tanh", "Tensor.tanh"),
            saves=("out",), monotone=_always)  # fmt: skip
elementwise("sigmoid", "Sigmoid", "Sigmoid", ("Sigmoid",),
            ("torch.sigmoid", F + "sigmoid", "Tensor.sigmoid"), saves=("out",),
            monotone=_always)  # fmt: skip
elementwise("silu", "SiLU (x * sigmoid(x))", "Silu", ("SiLU",), (F + "silu",))
elementwise("abs", "torch.abs: |x|, the gradient sign(x) (0 at 0)", "Abs", (),
            ("torch.abs", "Tensor.abs"))  # fmt: skip
# standalone math: torch's functions and methods. exp and sign commute with a max pool; log,
# log1p and sqrt do not where a window holds a value outside their domain (torch's pool of
# their NaN is NaN), so they are not marked monotone.
elementwise(
    "exp", "torch.exp", "Exp", (), ("torch.exp", "Tensor.exp"), saves=("out",), monotone=_always
)
elementwise(
    "log", "torch.log (NaN below 0, -inf at 0, as torch)", "Log", (), ("torch.log", "Tensor.log")
)
elementwise("log1p", "torch.log1p", "Log1p", (), ("torch.log1p", "Tensor.log1p"))
elementwise("erf", "torch.erf", "Erf", (), ("torch.erf", "torch.special.erf", "Tensor.erf"))


# trigonometric and hyperbolic functions and their inverses (NaN outside an inverse's domain,
# as torch)
_TRIGONOMETRIC = ("sin", "cos", "tan", "asin", "acos", "atan")
for _name in (*_TRIGONOMETRIC, "sinh", "cosh", "asinh", "acosh", "atanh"):
    _calls = (f"torch.{_name}", f"Tensor.{_name}")
    elementwise(_name, f"torch.{_name}", _name.capitalize(), (), _calls)


def _power_infer(node, shapes, graph):
    p = node.attrs.get("exponent")
    finite = isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p)
    expect(finite, node, f"power's attr 'exponent' is a finite number, not {p!r}")
    return same_shape(node, shapes, graph)


elementwise(
    "power",
    "x ** p for a number p (x ** 2 is a product; NaN below 0 for p not an integer, as torch)",
    "Power",
    functor_args=lambda a: (float(a["exponent"]),),
    infer=_power_infer,
)
elementwise("sqrt", "torch.sqrt", "Sqrt", (), ("torch.sqrt", "Tensor.sqrt"), saves=("out",))
elementwise(
    "rsqrt",
    "torch.rsqrt: 1 / sqrt(x)",
    "Rsqrt",
    (),
    ("torch.rsqrt", "Tensor.rsqrt"),
    saves=("out",),
)
elementwise(
    "reciprocal",
    "torch.reciprocal: 1 / x (and a number divided by a tensor)",
    "Reciprocal",
    (),
    ("torch.reciprocal", "Tensor.reciprocal"),
    saves=("out",),
)
elementwise(
    "sign",
    "torch.sign: -1, 0 or 1; no gradient",
    "Sign",
    (),
    ("torch.sign", "Tensor.sign"),
    monotone=_always,
)
elementwise(
    "equal",
    "x == value (or !=, negate) as a mask of 1s and 0s: ids == PAD; no gradient",
    "Equal",
    functor_args=lambda a: (float(a["value"]), int(a["negate"])),
)
# torch.lt, le, gt, ge of a value and a number, in the functor's order
COMPARISONS = ("lt", "le", "gt", "ge")


def _compare_infer(node, shapes, graph):
    op, value = node.attrs.get("op"), node.attrs.get("value")
    expect(op in COMPARISONS, node, f"compare's attr 'op' is one of {COMPARISONS}, not {op!r}")
    expect(
        isinstance(value, (int, float)) and not isinstance(value, bool) and value == value,
        node,
        f"compare's attr 'value' is a number (not NaN), not {value!r}",
    )
    return same_shape(node, shapes, graph)


elementwise(
    "compare",
    "x < value (op 'lt'; or 'le', 'gt', 'ge') as a mask of 1s and 0s; no gradient",
    "Compare",
    functor_args=lambda a: (float(a["value"]), COMPARISONS.index(a["op"])),
    infer=_compare_infer,
)
elementwise(
    "leaky_relu",
    "LeakyReLU",
    "LeakyRelu",
    ("LeakyReLU",),
    (F + "leaky_relu",),
    functor_args=lambda a: (float(a["negative_slope"]),),
    from_module=lambda mod, where: {"negative_slope": float(mod.negative_slope)},
    from_call=lambda args, kw, where: {
        "negative_slope": float(arg(args, kw, 0, "negative_slope", 0.01))
    },
    monotone=lambda a: a["negative_slope"] >= 0,
)
elementwise(
    "elu",
    "ELU",
    "Elu",
    ("ELU",),
    (F + "elu",),
    functor_args=lambda a: (float(a["alpha"]),),
    from_module=lambda mod, where: {"alpha": float(mod.alpha)},
    from_call=lambda args, kw, where: {"alpha": float(arg(args, kw, 0, "alpha", 1.0))},
)
elementwise(
    "softplus",
    "Softplus (beta, threshold)",
    "Softplus",
    ("Softplus",),
    (F + "softplus",),
    functor_args=lambda a: (float(a["beta"]), float(a["threshold"])),
    from_module=lambda mod, where: {"beta": float(mod.beta), "threshold": float(mod.threshold)},
    from_call=lambda args, kw, where: {
        "beta": float(arg(args, kw, 0, "beta", 1.0)),
        "threshold": float(arg(args, kw, 1, "threshold", 20.0)),
    },
)


def _gelu_attrs(approximate, where):
    if approximate not in ("none", "tanh"):
        raise IRError(f"{where}: approximate={approximate!r} (only 'none' or 'tanh')")
    return {"approximate": approximate}


elementwise(
    "gelu",
    "GELU (exact or tanh approximation)",
    "Gelu",
    ("GELU",),
    (F + "gelu",),
    functor_args=lambda a: (int(a["approximate"] == "tanh"),),
    from_module=lambda mod, where: _gelu_attrs(mod.approximate, where),
    from_call=lambda args, kw, where: _gelu_attrs(kw.get("approximate", "none"), where),
)
elementwise(
    "affine",
    "x * scale + shift with constant numbers (x + 1, 2 * x, x / 4, 1 - x, -x)",
    "Affine",
    functor_args=lambda a: (float(a["scale"]), float(a["shift"])),
    saves=(),
)


def _clamp_call(args, kw, where):
    """torch.clamp / clip with number bounds (either may be None: unbounded)."""
    lo, hi = arg(args, kw, 0, "min", None), arg(args, kw, 1, "max", None)
    for what, v in (("min", lo), ("max", hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise IRError(f"{where}: clamp's {what} must be a number (a tensor bound is not "
                          "supported)")  # fmt: skip
    if lo is None and hi is None:
        raise IRError(f"{where}: clamp needs a min or a max")
    lo, hi = -math.inf if lo is None else float(lo), math.inf if hi is None else float(hi)
    if lo > hi:  # torch then gives max everywhere: not a clamp, and not monotone
        raise IRError(f"{where}: clamp's min {lo} is above its max {hi}")
    return {"min_val": lo, "max_val": hi}


def _hardtanh_call(args, kw, where):
    """F.hardtanh(x, min_val=-1, max_val=1) and F.relu6(x) (``inplace`` changes nothing here)."""
    lo, hi = float(arg(args, kw, 0, "min_val", -1.0)), float(arg(args, kw, 1, "max_val", 1.0))
    if lo > hi:
        raise IRError(f"{where}: hardtanh's min_val {lo} is above its max_val {hi}")
    return {"min_val": lo, "max_val": hi}


def _bounds(a):
    return float(a["min_val"]), float(a["max_val"])


elementwise(
    "hardtanh",
    "Hardtanh / ReLU6: x clamped to [min_val, max_val], no gradient on the bounds",
    "Hardtanh",
    ("Hardtanh", "ReLU6"),
    (F + "hardtanh",),
    functor_args=_bounds,
    from_module=lambda mod, where: {"min_val": float(mod.min_val), "max_val": float(mod.max_val)},
    from_call=_hardtanh_call,
    monotone=_always,
)
elementwise(
    "relu6",
    "F.relu6: x clamped to [0, 6] (the module ReLU6 is a Hardtanh)",
    "Hardtanh",
    (),
    (F + "relu6",),
    functor_args=lambda a: (0.0, 6.0),
    from_call=lambda args, kw, where: {},
    monotone=_always,
)
elementwise(
    "clamp",
    "torch.clamp / clip: x clamped to [min_val, max_val], the gradient passing on the bounds",
    "Clamp",
    (),
    ("torch.clamp", "torch.clip", "Tensor.clamp", "Tensor.clip"),
    functor_args=_bounds,
    from_call=_clamp_call,
    monotone=_always,
)
elementwise(
    "hardsigmoid",
    "Hardsigmoid: alpha x + beta clamped to [0, 1] (torch: alpha 1/6, beta 1/2)",
    "Hardsigmoid",
    ("Hardsigmoid",),
    (F + "hardsigmoid",),
    functor_args=lambda a: (float(a["alpha"]), float(a["beta"])),
    from_module=lambda mod, where: {"alpha": 1 / 6, "beta": 0.5},
    from_call=lambda args, kw, where: {"alpha": 1 / 6, "beta": 0.5},
    monotone=_always,
)
elementwise("hardswish", "Hardswish: x relu6(x + 3) / 6", "Hardswish", ("Hardswish",),
            (F + "hardswish",))  # fmt: skip
elementwise("mish", "Mish: x tanh(softplus(x))", "Mish", ("Mish",), (F + "mish",))
_SELU = {"alpha": 1.6732632423543772848170429916717, "scale": 1.0507009873554804934193349852946}
elementwise(
    "selu",
    "SELU: scale (x > 0 ? x : alpha (exp(x) - 1)), torch's constants",
    "Selu",
    ("SELU",),
    (F + "selu", "torch.selu"),
    functor_args=lambda a: (float(a["alpha"]), float(a["scale"])),
    from_module=lambda mod, where: dict(_SELU),
    from_call=lambda args, kw, where: dict(_SELU),
)


def _prelu_infer(node, shapes, graph):
    (shape,) = shapes
    w = graph.param(node.params["weight"])
    channels = shape[0] if shape else 1
    expect(len(shape) >= 1, node, f"expected input (C, ...), got per-sample shape {shape}")
    expect(w.shape in ((1,), (channels,)), node,
           f"weight has shape {w.shape}, expected (1,) or ({channels},) for {channels} "
           "channels")  # fmt: skip
    return shape


elementwise("prelu", "PReLU: x > 0 ? x : a x, a slope per channel (or one)", "PRelu",
            ("PReLU",), params=("weight",), infer=_prelu_infer)  # fmt: skip

register(
    OpSpec(
        "dropout",
        "elementwise",
        "Dropout (a counter-based mask, the same on any thread)",
        same_shape,
        saves=(),  # the mask is drawn again from the seed
        random=True,
        modules=("Dropout",),
        from_module=lambda mod, where: {"p": float(mod.p)},
    )
)


def _normal_call(args, kw, where):
    """torch.randn_like(x): only x's shape and type are read."""
    extra = {k: v for k, v in kw.items() if k not in ("dtype", "device", "layout", "pin_memory")}
    if len(args) > 1 or extra or kw.get("requires_grad"):
        raise IRError(f"{where}: torch.randn_like takes the tensor alone here, got {args} {kw}")
    return {}


register(
    OpSpec(
        "normal",
        "elementwise",
        "torch.randn_like: a standard normal draw per element (counter-based: the same on any "
        "thread or device, drawn again each call, in training and eval as torch's); the input "
        "gives the shape only and takes no gradient",
        same_shape,
        saves=(),
        random=True,
        functions=("torch.randn_like",),
        from_call=_normal_call,
    )
)


def _stochastic_depth_call(args, kw, where):
    """torchvision.ops.stochastic_depth(input, p, mode, training): its training flag is the
    value fx saw when tracing (the module's self.training); the compiled model follows its own
    mode instead, as nn.Dropout does."""
    p, mode = arg(args, kw, 0, "p", None), arg(args, kw, 1, "mode", None)
    if not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise IRError(f"{where}: p={p!r} must be a probability")
    if mode not in ("row", "batch"):
        raise IRError(f"{where}: mode={mode!r} must be 'row' or 'batch'")
    return {"p": float(p), "whole_batch": int(mode == "batch")}


register(
    OpSpec(
        "stochastic_depth",
        "elementwise",
        "torchvision's stochastic_depth (StochasticDepth): in training each sample's whole "
        "value kept with probability 1 - p and scaled by 1 / (1 - p) ('row'), or the batch's "
        "('batch'); the identity in eval mode",
        same_shape,
        saves=(),  # the mask is drawn again from the seed
        random=True,
        functions=("torchvision.ops.stochastic_depth.stochastic_depth",),
        from_call=_stochastic_depth_call,
    )
)
