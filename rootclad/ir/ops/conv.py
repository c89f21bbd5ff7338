"""Convolutions: Conv1d, Conv2d and Conv3d, zero padding, any stride, dilation and groups; and
ConvTranspose1d/2d."""

from __future__ import annotations

from rootclad.ir.graph import IRError, expect
from rootclad.ir.ops.common import ints, numel
from rootclad.ir.registry import OpSpec, register


def _conv_from_module(mod, where, n: int):
    """Conv1d, Conv2d and Conv3d (n = 1, 2, 3): zero padding, numbers (or 'valid') only."""
    if mod.padding_mode != "zeros":
        raise IRError(f"{where}: padding_mode={mod.padding_mode!r} (only 'zeros')")
    if isinstance(mod.padding, str):
        if mod.padding != "valid":
            raise IRError(f"{where}: padding={mod.padding!r}; give an integer padding")
        pad = ints(0, n, "padding", where)
    else:
        pad = ints(mod.padding, n, "padding", where)
    return {
        "stride": ints(mod.stride, n, "stride", where),
        "padding": pad,
        "dilation": ints(mod.dilation, n, "dilation", where),
        "groups": int(mod.groups),
    }


def _conv_flops(node, graph) -> int:
    return 2 * numel(node.out_shape) * numel(graph.param(node.params["weight"]).shape[1:])


def _conv1d_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    w = graph.param(node.params["weight"])
    expect(len(shape) == 2, node, f"expected input (C, L), got per-sample shape {shape}")
    groups = a.get("groups", 1)
    expect(
        shape[0] == w.shape[1] * groups,
        node,
        f"expected {w.shape[1] * groups} input channels, got {shape[0]} (shape {shape})",
    )
    k, s, p, d = w.shape[2], a["stride"], a["padding"], a["dilation"]
    lo = (shape[1] + 2 * p - d * (k - 1) - 1) // s + 1
    expect(lo >= 1, node, f"input length {shape[1]} is shorter than the kernel")
    return (w.shape[0], lo)


register(
    OpSpec(
        "conv1d",
        "conv",
        "Conv1d (zero padding, any stride/padding/dilation/groups)",
        _conv1d_infer,
        params=("weight", "bias"),
        saves=("in",),
        flops=_conv_flops,
        modules=("Conv1d",),
        from_module=lambda mod, where: _conv_from_module(mod, where, 1),
    )
)


def conv2d_out(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_nd_infer(node, shapes, graph):
    """Conv2d and Conv3d: n spatial axes, as many as the stride has."""
    (shape,) = shapes
    a = node.attrs
    n = len(a["stride"])
    w = graph.param(node.params["weight"])
    axes = "(C, H, W)" if n == 2 else "(C, D, H, W)"
    expect(len(shape) == n + 1, node, f"expected input {axes}, got per-sample shape {shape}")
    expect(
        shape[0] == w.shape[1] * a["groups"],
        node,
        f"expected {w.shape[1] * a['groups']} input channels, got {shape[0]} (shape {shape})",
    )
    out = [
        conv2d_out(shape[1 + i], w.shape[2 + i], a["stride"][i], a["padding"][i], a["dilation"][i])
        for i in range(n)
    ]
    expect(min(out) >= 1, node, f"input {shape[1:]} is smaller than the kernel {w.shape[2:]}")
    return (w.shape[0], *out)


register(
    OpSpec(
        "conv2d",
        "conv",
        "Conv2d (zero padding, any stride/padding/dilation/groups)",
        _conv_nd_infer,
        params=("weight", "bias"),
        saves=("in",),
        flops=_conv_flops,
        modules=("Conv2d",),
        from_module=lambda mod, where: _conv_from_module(mod, where, 2),
    )
)


register(
    OpSpec(
        "conv3d",
        "conv",
        "Conv3d (zero padding, any stride/padding/dilation/groups; direct loops)",
        _conv_nd_infer,
        params=("weight", "bias"),
        saves=("in",),
        flops=_conv_flops,
        modules=("Conv3d",),
        from_module=lambda mod, where: _conv_from_module(mod, where, 3),
    )
)


def _conv_transpose_from_module(mod, where, n: int):
    """ConvTranspose1d (n = 1) and ConvTranspose2d (n = 2): zero padding; each geometry an
    n-tuple (of one for n = 1)."""
    if mod.padding_mode != "zeros":
        raise IRError(f"{where}: padding_mode={mod.padding_mode!r} (only 'zeros')")
    geometry = {k: ints(getattr(mod, k), n, k, where)
                for k in ("stride", "padding", "output_padding", "dilation")}  # fmt: skip
    return {k: v if n > 1 else (v,) for k, v in geometry.items()} | {"groups": int(mod.groups)}


def conv_transpose_out(n, k, s, p, d, op):
    return (n - 1) * s - 2 * p + d * (k - 1) + op + 1


def _conv_transpose_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    n = len(a["stride"])
    w = graph.param(node.params["weight"])  # (in channels, out channels / groups, *kernel)
    axes = "(C, L)" if n == 1 else "(C, H, W)"
    expect(len(shape) == n + 1, node, f"expected input {axes}, got per-sample shape {shape}")
    expect(shape[0] == w.shape[0], node,
           f"expected {w.shape[0]} input channels, got {shape[0]} (shape {shape})")  # fmt: skip
    out = [conv_transpose_out(shape[1 + i], w.shape[2 + i], a["stride"][i], a["padding"][i],
                              a["dilation"][i], a["output_padding"][i]) for i in range(n)]  # fmt: skip
    expect(min(out) >= 1, node, f"input {shape[1:]} gives an empty output {tuple(out)}")
    return (w.shape[1] * a["groups"], *out)


def _conv_transpose_flops(node, graph) -> int:
    return 2 * numel(node.in_shape) * numel(graph.param(node.params["weight"]).shape[1:])


for _n, _name in ((1, "ConvTranspose1d"), (2, "ConvTranspose2d")):
    register(
        OpSpec(
            f"conv_transpose{_n}d",
            "conv",
            f"{_name} (zero padding, any stride/padding/output_padding/dilation/groups): the "
            "input gradient of a convolution",
            _conv_transpose_infer,
            params=("weight", "bias"),
            saves=("in",),
            flops=_conv_transpose_flops,
            modules=(_name,),
            from_module=lambda mod, where, n=_n: _conv_transpose_from_module(mod, where, n),
        )
    )
