"""Pooling: max and average over windows (1-D, 2-D and 3-D), and over all positions (global)."""

from __future__ import annotations

from rootclad.ir.graph import IRError, expect
from rootclad.ir.ops.common import F, arg, ints
from rootclad.ir.registry import OpSpec, register


def _pool_from_module(mod, where, n: int):
    """MaxPool / AvgPool in n = 1, 2 or 3 dimensions, ceil_mode both ways (no dilation or
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


def _pool_nd_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    n = len(a["kernel_size"])
    axes = "(C, H, W)" if n == 2 else "(C, D, H, W)"
    expect(len(shape) == n + 1, node, f"expected input {axes}, got per-sample shape {shape}")
    out = []
    for i in range(n):
        k, s, p = a["kernel_size"][i], a["stride"][i], a["padding"][i]
        expect(p <= k // 2, node, f"padding {p} must be at most half the kernel size {k}")
        out.append(pool_out(shape[1 + i], k, s, p, a["ceil_mode"]))
    expect(min(out) >= 1, node, f"input {shape[1:]} is smaller than the kernel")
    return (shape[0], *out)


# (op, torch module, dimensions): a max pool's derivative reads where the maximum was
for _name, _module, _n, _infer in (
    ("maxpool1d", "MaxPool1d", 1, _pool1d_infer),
    ("avgpool1d", "AvgPool1d", 1, _pool1d_infer),
    ("maxpool2d", "MaxPool2d", 2, _pool_nd_infer),
    ("avgpool2d", "AvgPool2d", 2, _pool_nd_infer),
    ("maxpool3d", "MaxPool3d", 3, _pool_nd_infer),
    ("avgpool3d", "AvgPool3d", 3, _pool_nd_infer),
):
    register(
        OpSpec(
            _name,
            "pool",
            f"{_module} (ceil_mode both ways)",
            _infer,
            saves=(
                ("in", "out")
                if _name in ("maxpool1d", "maxpool2d")
                else ("in",)
                if _name == "maxpool3d"
                else ()
            ),  # fmt: skip
            # maxpool2d would swap too; the 1-D case (the GW CNN's) is the one measured
            swaps_with_monotone=_name == "maxpool1d",
            modules=(_module,),
            from_module=lambda mod, where, n=_n: _pool_from_module(mod, where, n),
        )
    )


def _adaptive_size(size, where) -> tuple:
    sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    if any(v is not None and (not isinstance(v, int) or v < 1) for v in sizes):
        raise IRError(f"{where}: output_size={size!r} must be positive numbers (or None)")
    return sizes


def _adaptive_from_module(mod, where):
    if getattr(mod, "return_indices", False):
        raise IRError(f"{where}: return_indices is not supported")
    return {"output_size": _adaptive_size(mod.output_size, where)}


def _adaptive_call(args, kw, where):
    """F.adaptive_avg_pool1d/2d(x, output_size), F.adaptive_max_pool1d/2d."""
    if arg(args, kw, 1, "return_indices", False):
        raise IRError(f"{where}: return_indices is not supported")
    return {"output_size": _adaptive_size(arg(args, kw, 0, "output_size", None), where)}


def _adaptive_infer(node, shapes, graph):
    (shape,) = shapes
    size = node.attrs["output_size"]  # one number: every spatial axis
    size = size * (len(shape) - 1) if len(size) == 1 else size
    expect(
        len(shape) == len(size) + 1,
        node,
        f"expected input (C, L) or (C, H, W) for output size {size}, got per-sample shape {shape}",
    )
    expect(len(shape) < 4 or (node.op == "adaptive_avgpool" and set(size) == {1}), node,
           f"3-d adaptive pooling to {size}: only the average to size 1 (global) is supported")  # fmt: skip
    return (shape[0], *(d if s is None else s for s, d in zip(size, shape[1:], strict=True)))


def _global_pool_infer(node, shapes, graph):
    (shape,) = shapes
    expect(
        len(shape) in (2, 3, 4),
        node,
        f"expected input (C, L), (C, H, W) or (C, D, H, W), got per-sample shape {shape}",
    )
    return (shape[0],) + (1,) * (len(shape) - 1)


# adaptive pooling to any size; average pooling to size 1 the graph pass ir/optimize.py
# global_pools makes the global op (one window per channel), which mean/sum over axes also
# lower to (a global max op would give a NaN window's gradient to another element than torch)
for _name in ("avg", "max"):
    _kind = "Avg" if _name == "avg" else "Max"
    register(
        OpSpec(
            f"adaptive_{_name}pool",
            "pool",
            f"Adaptive{_kind}Pool1d / 2d to any size (torch's windows: floor(o n / O) to "
            "ceil((o + 1) n / O))",
            _adaptive_infer,
            saves=("in",) if _name == "max" else (),
            modules=(f"Adaptive{_kind}Pool1d", f"Adaptive{_kind}Pool2d")
            + (("AdaptiveAvgPool3d",) if _name == "avg" else ()),
            from_module=_adaptive_from_module,
            functions=(F + f"adaptive_{_name}_pool1d", F + f"adaptive_{_name}_pool2d"),
            from_call=_adaptive_call,
        )
    )
register(
    OpSpec(
        "global_avgpool",
        "pool",
        "average over all positions of each channel",
        _global_pool_infer,
        saves=(),
    )
)


register(
    OpSpec(
        "amax",
        "pool",
        "torch.amax / amin over axes (rowed last): the maximum of each row, its gradient shared "
        "evenly among the elements equal to it, as torch's",
        _global_pool_infer,
        saves=("in",),
    )
)


# -- upsampling -----------------------------------------------------------------------------
def _upsample_attrs(size, scale, mode, align, recompute, where):
    if mode not in ("nearest", "linear", "bilinear"):
        raise IRError(f"{where}: mode={mode!r} is not supported; nearest, linear and bilinear are")
    if size is not None and scale is not None:
        raise IRError(f"{where}: give size or scale_factor, not both")
    return {
        "mode": "nearest" if mode == "nearest" else "linear",
        "size": None if size is None else tuple(size) if isinstance(size, (tuple, list)) else (size,),
        "scale_factor": None if scale is None else tuple(float(s) for s in scale)
        if isinstance(scale, (tuple, list)) else (float(scale),),
        "align_corners": bool(align),
        "recompute": bool(recompute),
    }  # fmt: skip


def _upsample_call(args, kw, where):
    """F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor)."""
    if kw.get("antialias"):
        raise IRError(f"{where}: antialias=True is not supported")
    return _upsample_attrs(arg(args, kw, 0, "size", None), arg(args, kw, 1, "scale_factor", None),
                           arg(args, kw, 2, "mode", "nearest"),
                           arg(args, kw, 3, "align_corners", None),
                           arg(args, kw, 4, "recompute_scale_factor", None), where)  # fmt: skip


def _upsample_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    expect(len(shape) in (2, 3), node, f"expected input (C, L) or (C, H, W), got {shape}")
    n = len(shape) - 1
    if a["size"] is not None:
        size = a["size"] * n if len(a["size"]) == 1 else a["size"]
    else:
        scale = a["scale_factor"] * n if len(a["scale_factor"]) == 1 else a["scale_factor"]
        expect(len(scale) == n, node, f"scale_factor {scale} for {n} spatial axes")
        size = tuple(int(d * s) for d, s in zip(shape[1:], scale, strict=True))  # torch: floor
    expect(len(size) == n, node, f"size {size} for {n} spatial axes")
    return (shape[0], *size)


def upsample_scales(node, dtype: str) -> tuple[float, ...]:
    """torch's scale along each spatial axis (upsample_i0 in ops/pool_geometry.h), as the kernel
    type holds it: 2-d nearest in float; 1-d nearest and linear in the model's type (float for
    float32)."""
    import numpy as np

    a = node.attrs
    n = len(node.in_shape) - 1
    nearest_2d = a["mode"] == "nearest" and n == 2
    real = np.float32 if nearest_2d or dtype == "float32" else np.float64
    factors = a["scale_factor"] * n if a["scale_factor"] and len(a["scale_factor"]) == 1 else (
        a["scale_factor"])  # fmt: skip
    out = []
    for i, (d, o) in enumerate(zip(node.in_shape[1:], node.out_shape[1:], strict=True)):
        if a["mode"] == "linear" and a["align_corners"]:
            s = real(d - 1) / real(o - 1) if o > 1 else real(0)
        elif factors and not a["recompute"]:
            s = real(1.0 / factors[i])
        else:
            s = real(d) / real(o)
        out.append(float(s))
    return tuple(out)


register(
    OpSpec(
        "upsample",
        "pool",
        "Upsample / F.interpolate of 1-D or 2-D maps: nearest, or (bi)linear with or without "
        "align_corners (torch's source positions)",
        _upsample_infer,
        saves=(),
        modules=("Upsample",),
        from_module=lambda mod, where: _upsample_attrs(
            mod.size,
            mod.scale_factor,
            mod.mode,
            mod.align_corners,
            getattr(mod, "recompute_scale_factor", None),
            where,
        ),  # fmt: skip
        functions=(F + "interpolate", F + "upsample"),
        from_call=_upsample_call,
    )
)
