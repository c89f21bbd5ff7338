"""Pooling: max and average over windows (1-D and 2-D), and over all positions (global)."""

from __future__ import annotations

from rootclad.ir.graph import IRError, expect
from rootclad.ir.ops.common import F, arg, ints
from rootclad.ir.registry import OpSpec, register


def _pool_from_module(mod, where, n: int):
    """MaxPool / AvgPool in n = 1 or 2 dimensions, ceil_mode both ways (no dilation or
    indices)."""
    k = ints(mod.kernel_size, n, "kernel_size", where)
    stride = mod.stride if mod.stride is not None else mod.kernel_size
    attrs = {
        "kernel_size": k,
        "stride": ints(stride, n, "stride", where),
        "padding": ints(mod.padding, n, "padding", where),
        "ceil_mode": int(bool(mod.ceil_mode)),
    }
    if type(mod).__name__.startswith("MaxPool"):
        if ints(mod.dilation, n, "dilation", where) != ints(1, n, "", where):
            raise IRError(f"{where}: dilation != 1 is not supported")
        if mod.return_indices:
            raise IRError(f"{where}: return_indices is not supported")
        return attrs
    if getattr(mod, "divisor_override", None):
        raise IRError(f"{where}: divisor_override is not supported")
    attrs["count_include_pad"] = int(mod.count_include_pad)
    return attrs


def pool_out(n: int, k: int, s: int, p: int, ceil_mode: int) -> int:
    """Windows over n positions, as torch counts them (and pool_geometry.h): with ceil_mode the
    last may run past the end but starts inside the input or its left padding."""
    o = (n + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    return o - 1 if ceil_mode and (o - 1) * s >= n + p else o


def _pool1d_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    expect(len(shape) == 2, node, f"expected input (C, L), got per-sample shape {shape}")
    k, s, p = a["kernel_size"], a["stride"], a["padding"]
    expect(p <= k // 2, node, f"padding {p} must be at most half the kernel size {k}")
    lo = pool_out(shape[1], k, s, p, a["ceil_mode"])
    expect(lo >= 1, node, f"input length {shape[1]} is shorter than the kernel {k}")
    return (shape[0], lo)


def _pool2d_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    expect(len(shape) == 3, node, f"expected input (C, H, W), got per-sample shape {shape}")
    out = []
    for i in range(2):
        k, s, p = a["kernel_size"][i], a["stride"][i], a["padding"][i]
        expect(p <= k // 2, node, f"padding {p} must be at most half the kernel size {k}")
        out.append(pool_out(shape[1 + i], k, s, p, a["ceil_mode"]))
    expect(min(out) >= 1, node, f"input {shape[1:]} is smaller than the kernel")
    return (shape[0], *out)


# (op, torch module, dimensions): a max pool's derivative reads where the maximum was
for _name, _module, _n, _infer in (
    ("maxpool1d", "MaxPool1d", 1, _pool1d_infer),
    ("avgpool1d", "AvgPool1d", 1, _pool1d_infer),
    ("maxpool2d", "MaxPool2d", 2, _pool2d_infer),
    ("avgpool2d", "AvgPool2d", 2, _pool2d_infer),
):
    register(
        OpSpec(
            _name,
            "pool",
            f"{_module} (ceil_mode both ways)",
            _infer,
            saves=("in", "out") if _name.startswith("max") else (),
            # maxpool2d would swap too; the 1-D case (the GW CNN's) is the one measured
            swaps_with_monotone=_name == "maxpool1d",
            modules=(_module,),
            from_module=lambda mod, where, n=_n: _pool_from_module(mod, where, n),
        )
    )


def _global_pool_from_module(mod, where):
    size = mod.output_size
    if any(v != 1 for v in (size if isinstance(size, (tuple, list)) else (size,))):
        raise IRError(f"{where}: output_size={size!r}; only global pooling (output_size=1)")
    if getattr(mod, "return_indices", False):
        raise IRError(f"{where}: return_indices is not supported")
    return {}


def _global_pool_call(args, kw, where):
    """F.adaptive_avg_pool1d/2d(x, output_size), F.adaptive_max_pool1d/2d: size 1 only."""
    size = arg(args, kw, 0, "output_size", None)
    if any(v != 1 for v in (size if isinstance(size, (tuple, list)) else (size,))):
        raise IRError(f"{where}: output_size={size!r}; only global pooling (output_size=1)")
    if arg(args, kw, 1, "return_indices", False):
        raise IRError(f"{where}: return_indices is not supported")
    return {}


def _global_pool_infer(node, shapes, graph):
    (shape,) = shapes
    expect(
        len(shape) in (2, 3),
        node,
        f"expected input (C, L) or (C, H, W), got per-sample shape {shape}",
    )
    return (shape[0],) + (1,) * (len(shape) - 1)


for _name, _modules, _functions in (
    ("global_avgpool", ("AdaptiveAvgPool1d", "AdaptiveAvgPool2d"),
     (F + "adaptive_avg_pool1d", F + "adaptive_avg_pool2d")),
    ("global_maxpool", ("AdaptiveMaxPool1d", "AdaptiveMaxPool2d"),
     (F + "adaptive_max_pool1d", F + "adaptive_max_pool2d")),
):  # fmt: skip
    register(
        OpSpec(
            _name,
            "pool",
            f"{' / '.join(_modules)} to size 1: pooling over all positions",
            _global_pool_infer,
            saves=("in", "out") if _name == "global_maxpool" else (),
            modules=_modules,
            from_module=_global_pool_from_module,
            functions=_functions,
            from_call=_global_pool_call,
        )
    )
