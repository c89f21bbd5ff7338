"""How each op of the registry runs as device kernels (include/rootclad/device_kernels.h):
the C++ statements of its forward and backward in a device program (codegen/cuda.py), written
against a :class:`DeviceSite` (where its values, adjoints and parameters are). An elementwise
op needs no entry: its functor runs through the generic unary kernels, and one whose
derivative reads only its output may be fused into a producer that can apply it as it writes
(:class:`DeviceOp` ``fuses_activation``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rootclad.codegen.cpu_ops import (
    adaptive_geometry,
    binary_kind,
    broadcast_padded,
    conv1d_geometry,
    conv_transpose_geometry,
    layer_norm_rows,
    matmul_args,
    parametric_geometry,
    upsample_geometry,
    volume_geometry,
)
from rootclad.codegen.cxx import functor_value
from rootclad.codegen.shape_geometry import (
    cat_parts,
    pad_geometry,
    permute_geometry,
    slice_geometry,
)
from rootclad.ir.graph import IRError, Node
from rootclad.ir.ops.shape import gather_geometry
from rootclad.ir.registry import OPS

BN_CHUNKS = 64  # must match BN_CHUNKS in include/rootclad/device/norm.h
# a one-group convolution with at least this many taps C*KH*KW gets a workspace, so that it
# runs as products (cuBLAS) at large batches (device_kernels.h: conv_gemm_applies); fewer taps
# stay direct (im2col would copy each input that many times)
CONV_GEMM_MIN_DEPTH = 32


@dataclass(frozen=True)
class DeviceSite:
    """C++ expressions for one node in a device program (codegen/cuda.py): its output and
    inputs, their adjoints (``d_ins[i]`` may be "nullptr": not wanted), a parameter and its
    gradient by role (``p("weight")``, ``dp("weight")``), a buffer by role (``b(...)``), the
    op's scratch (``scratch``: batch-independent; ``sample_scratch``: so many values per
    sample) and its place in the graph (``index``); the program's variables ``B`` (the batch
    size), ``training`` and ``seed`` (dropout's, per call)."""

    out: str
    ins: tuple[str, ...]
    d_out: str
    d_ins: tuple[str, ...]
    params: dict
    d_params: dict
    buffers: dict = field(default_factory=dict)
    scratch: str = "nullptr"
    sample_scratch: str = "nullptr"
    workspace: str = "nullptr"
    index: int = 0
    # an activation fused into this op (its functor's value; out and d_out are then the
    # activation's): the forward applies it, the backward reads d_out through dy()
    act: str = ""

    def fwd_act(self) -> str:
        """The forward call's last argument: the fused activation, if any."""
        return f", {self.act}" if self.act else ""

    def dy(self) -> str:
        """The output adjoint as the backward kernels read it (through a fused activation)."""
        return f"act_grad({self.d_out}, {self.out}, {self.act})" if self.act else self.d_out

    # a missing role: a typed null, so the kernels' templates still deduce T
    def b(self, role: str) -> str:
        return self.buffers.get(role, "(T*)nullptr")

    def p(self, role: str) -> str:
        return self.params.get(role, "(T*)nullptr")

    def dp(self, role: str) -> str:
        return self.d_params.get(role, "(T*)nullptr")


@dataclass(frozen=True)
class DeviceScratch:
    """What a device hook asks of the program's scratch: ``shared`` values (whatever the
    batch size; at DeviceSite.scratch), ``per_sample`` values for each sample (at
    DeviceSite.sample_scratch), and a workspace that the op uses only within each call, as a
    C++ expression of the batch size ``B`` giving its values (at DeviceSite.workspace: one
    region for all ops, as large as the largest asks at that batch size)."""

    shared: int = 0
    per_sample: int = 0
    workspace: str = ""


@dataclass(frozen=True)
class DeviceOp:
    # (node, graph, DeviceSite) -> (forward statements, backward statements[, DeviceScratch])
    hook: Callable
    # its kernels can apply an activation as they write their output (DeviceSite.act)
    fuses_activation: bool = False


def _n(shape) -> int:
    return math.prod(shape)


def _parametric_device(node, graph, d):
    """An elementwise op with a parameter per channel (or one)."""
    C, S, A = parametric_geometry(node, graph)
    op = functor_value(node)
    dims = f"(long)B, {C}, (long){S}, {A}, {op}"
    fwd = [f"parametric_forward(on, {d.out}, {d.ins[0]}, {d.p('weight')}, {dims});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"parametric_backward_input(on, {d.d_ins[0]}, {d.d_out}, {d.ins[0]}, {d.out}, "
                   f"{d.p('weight')}, {dims});")  # fmt: skip
    if d.dp("weight") != "(T*)nullptr":
        bwd.append(f"parametric_backward_param(on, {d.dp('weight')}, {d.d_out}, {d.ins[0]}, "
                   f"{d.out}, {d.p('weight')}, {dims});")  # fmt: skip
    return fwd, bwd


def _unary_device(node, graph, d):
    n = f"(long)B * {_n(node.in_shape)}"
    op = functor_value(node)
    fwd = [f"unary_forward(on, {d.out}, {d.ins[0]}, {n}, {op});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"unary_backward(on, {d.d_ins[0]}, {d.d_out}, {d.ins[0]}, {d.out}, {n}, {op});")
    return fwd, bwd


def _weighted_device(d, kernel: str, dims: str, work: bool = False):
    """An op with a weight and a bias on the device: ``{kernel}_forward`` and
    ``{kernel}_backward`` (the input's adjoint, a typed null when not wanted; the parameters'),
    ``dims`` last, then the workspace where ``work``; the backward reads the output adjoint
    through a fused activation."""
    act = d.fwd_act() or (", NoAct{}" if work else "")
    tail = f", {d.workspace}" if work else ""
    fwd = [f"{kernel}_forward(on, {d.out}, {d.ins[0]}, {d.p('weight')}, {d.p('bias')}, {dims}"
           f"{act}{tail});"]  # fmt: skip
    d_inp = "(T*)nullptr" if d.d_ins[0] == "nullptr" else d.d_ins[0]
    bwd = [f"{kernel}_backward(on, {d_inp}, {d.dp('weight')}, {d.dp('bias')}, {d.dy()}, "
           f"{d.ins[0]}, {d.p('weight')}, {dims}{tail});"]  # fmt: skip
    return fwd, bwd


def _conv_device(d, geometry: str, C: int, taps: int, groups: int):
    """A convolution on the device (conv2d's kernels; Conv1d with H = 1) over the ``geometry``
    C++ expression; a one-group layer with CONV_GEMM_MIN_DEPTH taps or more (C x KH x KW) gets
    a workspace for a chunk's columns and channel-major output (conv_gemm_workspace) and runs
    as products where the batch is large enough."""
    work = groups == 1 and C * taps >= CONV_GEMM_MIN_DEPTH
    fwd, bwd = _weighted_device(d, "conv2d", f"B, {geometry}", work)
    return fwd, bwd, DeviceScratch(workspace=f"conv_gemm_workspace(B, {geometry})" if work else "")


def _linear_device(node, graph, d):
    C, OC = node.in_shape[-1], node.out_shape[-1]
    return _weighted_device(d, "linear", f"B * {_n(node.in_shape) // C}, {C}, {OC}")


def _matmul_device(node, graph, d):
    g = f"Matmul{{{', '.join(map(str, matmul_args(node)))}}}"
    fwd = [f"matmul_forward(on, {d.out}, {d.ins[0]}, {d.ins[1]}, (long)B, {g});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"matmul_backward_a(on, {d.d_ins[0]}, {d.d_out}, {d.ins[1]}, (long)B, {g});")
    if d.d_ins[1] != "nullptr":
        bwd.append(f"matmul_backward_b(on, {d.d_ins[1]}, {d.d_out}, {d.ins[0]}, (long)B, {g});")
    return fwd, bwd


def _cdist_device(node, graph, d):
    (P, M), (R, _) = node.in_shapes
    at = f"{d.out}, {d.ins[0]}, {d.ins[1]}, (long)B, {P}, {R}, {M}"
    fwd = [f"cdist_forward(on, {at});"]
    bwd = [f"cdist_backward_{x}(on, {d.d_ins[i]}, {d.d_out}, {at});"
           for i, x in enumerate("ab") if d.d_ins[i] != "nullptr"]  # fmt: skip
    return fwd, bwd


def _conv1d_device(node, graph, d):
    C, L, OC, _, K = conv1d_geometry(node, graph)
    a = node.attrs
    G = a.get("groups", 1)
    geo = (C, L, OC, K, a["stride"], a["padding"], a["dilation"], G)
    return _conv_device(d, f"conv1d_shape({', '.join(map(str, geo))})", C, K, G)


def _pool_device(node, d, shape: str):
    """Max and average pooling (1-D: H = 1) on the device over the geometry C++ expression."""
    C = node.in_shape[0]
    kind = node.op[:3]  # max or avg
    extra = "" if kind == "max" else f", {node.attrs['count_include_pad']}"
    reads = f"{d.ins[0]}, " if kind == "max" else ""
    fwd = [f"{kind}pool2d_forward(on, {d.out}, {d.ins[0]}, (long)B * {C}, {shape}{extra}"
           f"{d.fwd_act()});"]  # fmt: skip
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"{kind}pool2d_backward(on, {d.d_ins[0]}, {d.dy()}, {reads}(long)B * {C}, "
                   f"{shape}{extra});")  # fmt: skip
    return fwd, bwd


def _pool1d_device(node, graph, d):
    L, a = node.in_shape[1], node.attrs
    return _pool_device(node, d, f"pool2d_shape(1, {L}, 1, {a['kernel_size']}, 1, "
                                 f"{a['stride']}, 0, {a['padding']}, {a['ceil_mode']})")  # fmt: skip


def _pool2d_device(node, graph, d):
    _, H, Wd = node.in_shape
    geo = (H, Wd, *(v for k in ("kernel_size", "stride", "padding") for v in node.attrs[k]),
           node.attrs["ceil_mode"])  # fmt: skip
    return _pool_device(node, d, f"pool2d_shape({', '.join(map(str, geo))})")


def _volume(node, graph) -> str:
    return f"::rootclad::Vol{{{', '.join(map(str, volume_geometry(node, graph)))}}}"


def _conv3d_device(node, graph, d):
    C, OC, G = node.in_shape[0], node.out_shape[0], node.attrs["groups"]
    shape = f"(long)B, {C}, {OC}, {G}, {_volume(node, graph)}"
    fwd = [f"conv3d_forward(on, {d.out}, {d.ins[0]}, {d.p('weight')}, {d.p('bias')}, {shape});"]
    bwd = [f"conv3d_backward_params(on, {d.dp('weight')}, {d.dp('bias')}, {d.d_out}, {d.ins[0]}, "
           f"{shape});"]  # fmt: skip
    if d.d_ins[0] != "nullptr":
        bwd.append(f"conv3d_backward_input(on, {d.d_ins[0]}, {d.d_out}, {d.p('weight')}, {shape});")
    return fwd, bwd


def _pool3d_device(node, graph, d):
    rows = f"(long)B * {node.in_shape[0]}"
    if node.op == "avgpool3d":
        rows += f", {node.attrs['count_include_pad']}"
    shape = f"{rows}, {_volume(node, graph)}"
    fwd = [f"{node.op}_forward(on, {d.out}, {d.ins[0]}, {shape});"]
    reads = f"{d.ins[0]}, " if node.op == "maxpool3d" else ""
    bwd = [f"{node.op}_backward(on, {d.d_ins[0]}, {d.d_out}, {reads}{shape});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


def _adaptive_device(node, graph, d):
    C, geo = adaptive_geometry(node)
    shape = f"(long)B * {C}, Adaptive{{{', '.join(map(str, geo))}}}"
    fwd = [f"{node.op}_forward(on, {d.out}, {d.ins[0]}, {shape});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        is_max = int(node.op == "adaptive_maxpool")
        bwd.append(f"adaptive_pool_backward(on, {d.d_ins[0]}, {d.d_out}, {d.ins[0]}, {shape}, "
                   f"{is_max});")  # fmt: skip
    return fwd, bwd


def _upsample_device(node, graph, d):
    C, geo, (sh, sw) = upsample_geometry(node, graph)
    shape = f"(long)B * {C}, Upsample<T>{{{', '.join(map(str, geo))}, T({sh!r}), T({sw!r})}}"
    fwd = [f"upsample_forward(on, {d.out}, {d.ins[0]}, {shape});"]
    bwd = [f"upsample_backward(on, {d.d_ins[0]}, {d.d_out}, {shape});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


def _global_pool_device(node, graph, d):
    C, L = node.in_shape[0], _n(node.in_shape[1:])
    rows = f"(long)B * {C}, {L}"
    fwd = [f"{node.op}_forward(on, {d.out}, {d.ins[0]}, {rows});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"{node.op}_backward(on, {d.d_ins[0]}, {d.d_out}, {rows});")
    return fwd, bwd


def _amax_device(node, graph, d):
    rows = f"(long)B * {node.in_shape[0]}, {_n(node.in_shape[1:])}"
    fwd = [f"amax_forward(on, {d.out}, {d.ins[0]}, {rows});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"amax_backward(on, {d.d_ins[0]}, {d.d_out}, {d.ins[0]}, {rows});")
    return fwd, bwd


def _conv_transpose_device(node, graph, d):
    C, H, Wd, OC, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, G = conv_transpose_geometry(node, graph)
    conv = (OC, OH, OW, C, KH, KW, SH, SW, PH, PW, DH, DW, G)  # the convolution it inverts
    g = f"conv2d_shape({', '.join(map(str, conv))})"
    fwd = [f"conv_transpose2d_forward(on, {d.out}, {d.ins[0]}, {d.p('weight')}, {d.p('bias')}, "
           f"B, {g});"]  # fmt: skip
    bwd = [f"conv_transpose2d_backward_params(on, {d.dp('weight')}, {d.dp('bias')}, {d.d_out}, "
           f"{d.ins[0]}, B, {g});"]  # fmt: skip
    if d.d_ins[0] != "nullptr":
        bwd.append(f"conv_transpose2d_backward_input(on, {d.d_ins[0]}, {d.d_out}, "
                   f"{d.p('weight')}, B, {g});")  # fmt: skip
    return fwd, bwd


def _conv2d_device(node, graph, d):
    C, H, Wd = node.in_shape
    KH, KW = graph.param(node.params["weight"]).shape[2:]
    a = node.attrs
    OC = node.out_shape[0]
    geo = (C, H, Wd, OC, KH, KW, *a["stride"], *a["padding"], *a["dilation"], a["groups"])
    shape = f"conv2d_shape({', '.join(map(str, geo))})"
    return _conv_device(d, shape, C, KH * KW, a["groups"])


def _stochastic_depth_device(node, graph, d):
    """The CPU's mask: the same node seed, each sample's index in the batch."""
    per = _n(node.in_shape)
    a = node.attrs
    mask = (f"(long)B * {per}, {per}, training ? T({float(a['p'])!r}) : T(0), "
            f"::rootclad::dropout_hash(seed, {d.index}), {a['whole_batch']}")  # fmt: skip
    fwd = [f"sample_dropout_forward(on, {d.out}, {d.ins[0]}, {mask});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"sample_dropout_backward(on, {d.d_ins[0]}, {d.d_out}, {mask});")
    return fwd, bwd


def _dropout_device(node, graph, d):
    """The CPU's mask (dropout_mask.h): the same node seed, each element's index in the batch."""
    n = f"(long)B * {_n(node.in_shape)}"
    mask = f"training ? T({float(node.attrs['p'])!r}) : T(0), ::rootclad::dropout_hash(seed, {d.index})"
    fwd = [f"dropout_forward(on, {d.out}, {d.ins[0]}, {n}, {mask});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"dropout_backward(on, {d.d_ins[0]}, {d.d_out}, {n}, {mask});")
    return fwd, bwd


def _normal_device(node, graph, d):
    """The CPU's draws (dropout_mask.h): the same node seed, each element's index in the batch;
    no gradient."""
    n = f"(long)B * {_n(node.out_shape)}"
    return [f"normal_forward(on, {d.out}, {n}, ::rootclad::dropout_hash(seed, {d.index}));"], []


def _binary_device(node, graph, d):
    """Same-shape add / sub: add_forward; the rest (mul, div, broadcasting): binary_forward."""
    a, b = node.in_shapes
    if node.op in ("add", "sub") and tuple(a) == tuple(b):
        n = f"(long)B * {_n(a)}"
        sign = "T(1)" if node.op == "add" else "T(-1)"
        fwd = [f"add_forward(on, {d.out}, {d.ins[0]}, {d.ins[1]}, {n}, {sign}{d.fwd_act()});"]
        bwd = [f"add_backward(on, {dx}, {d.dy()}, {n}, {s});"
               for dx, s in zip(d.d_ins, ("T(1)", sign), strict=True) if dx != "nullptr"]  # fmt: skip
        return fwd, bwd
    dims, sa, sb = broadcast_padded(node)
    g = (f"Broadcast{{{{{', '.join(map(str, dims))}}}, {{{', '.join(map(str, sa))}}}, "
         f"{{{', '.join(map(str, sb))}}}, {_n(a)}, {_n(b)}}}")  # fmt: skip
    kind = binary_kind(node)
    fwd = [f"binary_forward(on, {d.out}, {d.ins[0]}, {d.ins[1]}, (long)B, {g}, {kind}"
           f"{d.fwd_act()});"]  # fmt: skip
    bwd = [f"binary_backward(on, {dx}, {d.dy()}, {d.ins[0]}, {d.ins[1]}, (long)B, {g}, {kind}, "
           f"{which});" for which, dx in enumerate(d.d_ins) if dx != "nullptr"]  # fmt: skip
    return fwd, bwd


def _permute_device(node, graph, d):
    dims, st = permute_geometry(node)
    g = (f"Permute{{{{{', '.join(map(str, dims))}}}, {{{', '.join(map(str, st))}}}, "
         f"{_n(node.in_shape)}}}")  # fmt: skip
    fwd = [f"permute_forward(on, {d.out}, {d.ins[0]}, (long)B, {g});"]
    bwd = [f"permute_backward(on, {d.d_ins[0]}, {d.d_out}, (long)B, {g});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


def _cat_device(node, graph, d):
    outer, n_out, parts = cat_parts(node)
    fwd, bwd = [], []
    for x, dx, (n_in, off) in zip(d.ins, d.d_ins, parts, strict=True):
        shape = f"(long)B * {outer}, {n_in}, {n_out}, {off}"
        fwd.append(f"cat_part_forward(on, {d.out}, {x}, {shape});")
        if dx != "nullptr":
            bwd.append(f"cat_part_backward(on, {dx}, {d.d_out}, {shape});")
    return fwd, bwd


def _slice_device(node, graph, d):
    rows, geo = slice_geometry(node)
    shape = f"(long)B * {rows}, Slice{{{', '.join(map(str, geo))}}}"
    fwd = [f"slice_forward(on, {d.out}, {d.ins[0]}, {shape});"]
    bwd = [f"slice_backward(on, {d.d_ins[0]}, {d.d_out}, {shape});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


def _pad_device(node, graph, d):
    rows, geo = pad_geometry(node)
    shape = f"(long)B * {rows}, Pad{{{', '.join(map(str, geo))}}}"
    fwd = [f"pad_forward(on, {d.out}, {d.ins[0]}, {shape}, T({float(node.attrs['value'])!r}));"]
    bwd = [f"pad_backward(on, {d.d_ins[0]}, {d.d_out}, {shape});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


def _expand_device(node, graph, d):
    dims, st, _ = broadcast_padded(node)
    g = f"Expand{{{{{', '.join(map(str, dims))}}}, {{{', '.join(map(str, st))}}}, {_n(node.in_shape)}}}"
    fwd = [f"expand_forward(on, {d.out}, {d.ins[0]}, (long)B, {g});"]
    bwd = [f"expand_backward(on, {d.d_ins[0]}, {d.d_out}, (long)B, {g});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


def _topk_device(node, graph, d):
    shape, a = node.in_shape, node.attrs
    R, Q = _n(shape[: a["axis"]]), _n(shape[a["axis"] + 1 :])
    geo = f"(long)B * {R}, {shape[a['axis']]}, {a['k']}, {Q}, {int(a['largest'])}"
    return [f"topk_forward(on, {d.out}, {d.ins[0]}, {geo});"], []  # no gradient


def _gather_device(node, graph, d):
    P, N, M, Q = gather_geometry(node)
    geo = f"(long)B * {P}, {N}, {M}, {Q}"
    fwd = [f"gather_forward(on, {d.out}, {d.ins[0]}, {d.ins[1]}, {geo});"]
    bwd = [f"gather_backward(on, {d.d_ins[0]}, {d.d_out}, {d.ins[1]}, {geo});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []  # none to the indices


def _parameter_device(node, graph, d):
    n, start = _n(node.out_shape), node.attrs.get("start", 0)  # a block of the tensor
    if "value" in node.buffers:  # a buffer: no gradient
        return [f"parameter_forward(on, {d.out}, {d.b('value')} + {start}, (long)B, {n}L);"], []
    fwd = [f"parameter_forward(on, {d.out}, {d.p('weight')} + {start}, (long)B, {n}L);"]
    bwd = []
    if "weight" in d.d_params:  # parameter gradients wanted (not an input-gradient program)
        bwd.append(f"parameter_backward(on, {d.dp('weight')} + {start}, {d.d_out}, (long)B, "
                   f"{n}L);")  # fmt: skip
    return fwd, bwd


def _embedding_device(node, graph, d):
    V, D = graph.param(node.params["weight"]).shape
    n = f"(long)B * {_n(node.in_shape)}"
    fwd = [f"embedding_forward(on, {d.out}, {d.ins[0]}, {d.p('weight')}, {n}, {V}, {D});"]
    bwd = []
    if "weight" in d.d_params:  # the indices get no gradient
        bwd.append(f"embedding_backward(on, {d.dp('weight')}, {d.d_out}, {d.ins[0]}, {n}, {V}, "
                   f"{D}, {node.attrs['padding_idx']});")  # fmt: skip
    return fwd, bwd


def _softmax_device(node, graph, d):
    shape, axis = node.in_shape, node.attrs["axis"]
    lines = f"(long)B * {_n(shape[:axis])}, {shape[axis]}, {_n(shape[axis + 1 :])}"
    log_form = {"softmax": 0, "log_softmax": 1, "safe_softmax": 2}[node.op]
    fwd = [f"softmax_forward(on, {d.out}, {d.ins[0]}, {lines}, {log_form});"]
    bwd = [f"softmax_backward(on, {d.d_ins[0]}, {d.d_out}, {d.out}, {lines}, {log_form});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


def _layer_norm_device(node, graph, d):
    rows = f"(long)B * {layer_norm_rows(node)}, {_n(node.attrs['normalized_shape'])}"
    stats = d.sample_scratch  # each row's mean and 1/std
    fwd = [f"layer_norm_forward(on, {d.out}, {stats}, {d.ins[0]}, {d.p('weight')}, "
           f"{d.p('bias')}, {rows}, T({float(node.attrs['eps'])!r}));"]  # fmt: skip
    bwd = [f"layer_norm_backward_params(on, {d.dp('weight')}, {d.dp('bias')}, {d.d_out}, "
           f"{d.ins[0]}, {stats}, {rows});"]  # fmt: skip
    if d.d_ins[0] != "nullptr":
        bwd.append(f"layer_norm_backward_input(on, {d.d_ins[0]}, {d.d_out}, {d.ins[0]}, {stats}, "
                   f"{d.p('weight')}, {rows});")  # fmt: skip
    return fwd, bwd, DeviceScratch(per_sample=2 * layer_norm_rows(node))


def _batch_norm_device(node, graph, d):
    C, S = node.in_shape[0], _n(node.in_shape[1:])
    a = node.attrs
    shape = f"(long)B, {C}, {S}"
    fwd = [
        f"batch_norm_stats(on, {d.scratch}, {d.ins[0]}, {d.b('running_mean')}, "
        f"{d.b('running_var')}, {d.b('num_batches_tracked')}, {shape}, T({a['eps']!r}), "
        f"T({a['momentum']!r}), training);",
        f"batch_norm_apply(on, {d.out}, {d.ins[0]}, {d.scratch}, {d.p('weight')}, {d.p('bias')}, "
        f"{shape});",
    ]
    bwd = [f"batch_norm_backward_reduce(on, {d.scratch}, {d.dp('weight')}, {d.dp('bias')}, "
           f"{d.d_out}, {d.ins[0]}, {shape});"]  # fmt: skip
    if d.d_ins[0] != "nullptr":
        batch = "training" if "running_mean" in node.buffers else "1"  # the batch's statistics
        bwd.append(f"batch_norm_backward_input(on, {d.d_ins[0]}, {d.d_out}, {d.ins[0]}, "
                   f"{d.scratch}, {d.p('weight')}, {shape}, {batch});")  # fmt: skip
    # per channel: mean, 1/std, the two sums; and 3 partial results per chunk of the batch
    return fwd, bwd, DeviceScratch(shared=4 * C + 3 * C * BN_CHUNKS)


DEVICE_OPS: dict[str, DeviceOp] = {
    "linear": DeviceOp(_linear_device, fuses_activation=True),
    "matmul": DeviceOp(_matmul_device),
    "cdist": DeviceOp(_cdist_device),
    "upsample": DeviceOp(_upsample_device),
    "conv1d": DeviceOp(_conv1d_device, fuses_activation=True),
    "conv2d": DeviceOp(_conv2d_device, fuses_activation=True),
    "conv_transpose1d": DeviceOp(_conv_transpose_device),
    "conv_transpose2d": DeviceOp(_conv_transpose_device),
    "maxpool1d": DeviceOp(_pool1d_device, fuses_activation=True),
    "avgpool1d": DeviceOp(_pool1d_device, fuses_activation=True),
    "maxpool2d": DeviceOp(_pool2d_device, fuses_activation=True),
    "avgpool2d": DeviceOp(_pool2d_device, fuses_activation=True),
    "conv3d": DeviceOp(_conv3d_device),
    "maxpool3d": DeviceOp(_pool3d_device),
    "avgpool3d": DeviceOp(_pool3d_device),
    "adaptive_avgpool": DeviceOp(_adaptive_device),
    "adaptive_maxpool": DeviceOp(_adaptive_device),
    "global_avgpool": DeviceOp(_global_pool_device),
    "amax": DeviceOp(_amax_device),
    "dropout": DeviceOp(_dropout_device),
    "stochastic_depth": DeviceOp(_stochastic_depth_device),
    "normal": DeviceOp(_normal_device),
    "add": DeviceOp(_binary_device, fuses_activation=True),
    "sub": DeviceOp(_binary_device, fuses_activation=True),
    "mul": DeviceOp(_binary_device, fuses_activation=True),
    "div": DeviceOp(_binary_device, fuses_activation=True),
    "masked_fill": DeviceOp(_binary_device),
    "permute": DeviceOp(_permute_device),
    "cat": DeviceOp(_cat_device),
    "slice": DeviceOp(_slice_device),
    "pad": DeviceOp(_pad_device),
    "expand": DeviceOp(_expand_device),
    "topk": DeviceOp(_topk_device),
    "gather": DeviceOp(_gather_device),
    "parameter": DeviceOp(_parameter_device),
    "embedding": DeviceOp(_embedding_device),
    "softmax": DeviceOp(_softmax_device),
    "log_softmax": DeviceOp(_softmax_device),
    "safe_softmax": DeviceOp(_softmax_device),
    "layer_norm": DeviceOp(_layer_norm_device),
    "batch_norm": DeviceOp(_batch_norm_device),
}
_UNARY = DeviceOp(_unary_device)
_PARAMETRIC = DeviceOp(_parametric_device)


def device_op(node: Node) -> DeviceOp | None:
    """How ``node`` runs as device kernels (None: it has none yet)."""
    op = DEVICE_OPS.get(node.op)
    if op is None and OPS[node.op].functor:
        return _PARAMETRIC if OPS[node.op].params else _UNARY
    return op


def _fusable(spec) -> bool:
    return bool(spec.functor) and not spec.params and spec.saves == ("out",)


def fusable_activation(node: Node) -> str:
    """The functor a producer may apply for ``node`` (an elementwise op whose derivative reads
    only its output), or "" when it is no such op."""
    return functor_value(node) if _fusable(OPS[node.op]) else ""


def fusable_functors() -> set[str]:
    """The functors a producer may apply (the device runtime keeps its fusing kernels for each:
    include/rootclad/device_runtime.cpp, ROOTCLAD_FUSABLE_ACTIVATIONS)."""
    return {spec.functor for spec in OPS.values() if _fusable(spec)}


def device_ops() -> list[str]:
    """The ops that have device kernels."""
    return [name for name, spec in OPS.items() if spec.view or spec.functor or name in DEVICE_OPS]


def require_device_op(node: Node) -> DeviceOp:
    op = device_op(node)
    if op is None:
        raise IRError(f"{node.describe()}: op {node.op!r} has no device kernel yet; device ops: "
                      f"{', '.join(device_ops())}")  # fmt: skip
    return op
