"""Elementwise ops. Each is one functor (include/rootclad/ops/activations.h) holding its value
and its derivative, which every backend runs: adding one is its functor there, a line here,
its ONNX form (frontends/onnx/layers.py) and a test case (tests/fixtures/op_cases.py).

``saves`` says what the functor's derivative reads: the input (``("in",)``) or, where that is
cheaper, only the output (``("out",)``; the GPU then fuses the op into its producer)."""

from __future__ import annotations

from rootclad.ir.graph import IRError
from rootclad.ir.ops.common import F, arg, same_shape
from rootclad.ir.registry import OpSpec, register


def elementwise(name, summary, functor, modules=(), functions=(), functor_args=lambda a: (),
                from_module=None, from_call=None, saves=("in",), monotone=None):  # fmt: skip
    """Register an elementwise op computed by ``functor``."""
    return register(
        OpSpec(
            name,
            "elementwise",
            summary,
            same_shape,
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
