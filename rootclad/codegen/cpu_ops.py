"""How each op of the registry runs on the CPU: which kernels of ``include/rootclad`` it calls,
with which arguments, and the scratch memory they use.

A kernel call is written once, as the forward call's argument list (:class:`Call`); the
emitter (:mod:`rootclad.codegen.cpu`) derives the pullback call from it by Clad's convention:
the same arguments, then one adjoint per argument (the gradient region of each tensor, a dummy
for each scalar). An elementwise op needs no entry: its functor (the registry's
``OpSpec.functor``) runs through the generic ``unary_forward`` kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rootclad.codegen.cxx import functor_value
from rootclad.codegen.shape_geometry import (
    cat_parts,
    pad_geometry,
    permute_geometry,
    slice_geometry,
)
from rootclad.ir.graph import Graph, IRError, Node
from rootclad.ir.ops.binary import MAX_BROADCAST_DIMS, broadcast_geometry
from rootclad.ir.ops.dense import matmul_geometry
from rootclad.ir.ops.pool import upsample_scales
from rootclad.ir.ops.shape import gather_geometry
from rootclad.ir.registry import OPS

# Conv1d runs directly (no im2col scratch) for stride 1 or at most this many taps C*K;
# must match CONV1D_DIRECT_MAX_TAPS in include/rootclad/ops/conv1d.h.
CONV1D_DIRECT_MAX_TAPS = 32
# must match MAX_TAPS and MIN_ROW of conv2d_s1 in include/rootclad/ops/conv2d_direct.h
CONV2D_DIRECT_MAX_TAPS = 288
CONV2D_DIRECT_MIN_ROW = 16


@dataclass(frozen=True)
class Arg:
    """One argument of a kernel call.

    kind: ``out`` (the node's output), ``in`` (input ``ref``), ``param`` (parameter role
    ``ref``, null when the layer has none), ``buffer`` (buffer role ``ref``: state that is not
    trained, null when the layer has none), ``scratch`` (the node's scratch region ``ref``),
    ``functor`` (an elementwise functor, ``ref`` its C++ value), or a scalar: ``int``,
    ``real``, ``u64``, ``long`` (``ref`` a C++ expression; ``B`` is the chunk's batch).
    ``nullable``: an input whose gradient may be skipped (null) when it is a model input and
    no input gradient is asked for; only for kernels that accept that.
    """

    kind: str
    ref: object = None
    nullable: bool = False
    offset: int = 0  # param / buffer: values into the tensor (a block of it)


OUT = Arg("out")


def IN(i: int = 0, nullable: bool = False) -> Arg:
    return Arg("in", i, nullable)


def W(role: str, offset: int = 0) -> Arg:
    return Arg("param", role, offset=offset)


def BUF(role: str, offset: int = 0) -> Arg:
    return Arg("buffer", role, offset=offset)


def SCRATCH(key: str) -> Arg:
    return Arg("scratch", key)


def INT(expr) -> Arg:
    return Arg("int", str(expr))


def REAL(value) -> Arg:
    """A float constant (written T(value)) or a C++ expression of type T."""
    return Arg("real", f"T({value!r})" if isinstance(value, (int, float)) else value)


def U64(expr) -> Arg:
    return Arg("u64", str(expr))


def LONG(expr) -> Arg:
    return Arg("long", str(expr))


@dataclass(frozen=True)
class Call:
    kernel: str  # rootclad::<kernel>_forward, and <kernel>_forward_pullback
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Site:
    """Where a node sits in the graph, for the ops whose calls depend on it."""

    index: int  # position in the graph's node list (seeds dropout's mask)


@dataclass(frozen=True)
class CpuOp:
    calls: Callable[[Node, Graph, Site], list[Call]]
    # per-sample sizes of the scratch regions its kernels use, and those its pullback reads
    scratch: Callable[[Node, Graph], dict[str, int]] | None = None
    scratch_saves: tuple[str, ...] = ()
    # runs on whole chunks: the micro-batched head of the forward ends before the first such
    # op (a Linear's product over all rows; BatchNorm's statistics)
    whole_chunk: bool = False
    # train_step's sweep at small batches may update its parameters as soon as their
    # gradient is formed: (rendered arguments, the output's adjoint, each parameter role's
    # optimizer state) -> the statement in place of the pullback
    fused_update: Callable | None = None
    # the values one chunk shares with the others per call, when a batch is split into chunks
    # over threads (BatchNorm's sums)
    sync_values: Callable[[Node], int] | None = None


def _n(shape) -> int:
    return math.prod(shape)


def _unary_calls(node, graph, site):
    f = Arg("functor", functor_value(node))
    return [Call("unary", (OUT, IN(0), INT(f"B * {_n(node.in_shape)}"), f))]


def parametric_geometry(node, graph):
    """(C, S, A): channels (per-sample axis 0), positions per channel, parameter values."""
    C, S = node.in_shape[0], _n(node.in_shape[1:])
    return C, S, graph.param(node.params["weight"]).numel


def _parametric_calls(node, graph, site):
    """An elementwise op with a parameter per channel (or one): parametric_forward."""
    C, S, A = parametric_geometry(node, graph)
    f = Arg("functor", functor_value(node))
    return [Call("parametric", (OUT, IN(0), W("weight"), INT("B"), INT(C), INT(S), INT(A), f))]


# -- dense ----------------------------------------------------------------------------------
def _linear_calls(node, graph, site):
    C, OC = node.in_shape[-1], node.out_shape[-1]
    R = f"B * {_n(node.in_shape) // C}"
    return [Call("linear", (OUT, IN(0, True), W("weight"), W("bias"), INT(R), INT(C), INT(OC)))]


def _linear_update(rendered, d_out: str, states: dict) -> str:
    """Linear's backward and optimizer update in one (rootclad/linear_update.h)."""
    (_, _), (IN, D_IN), (W, _), (BIAS, DB), (R, _), (C, _), (OC, _) = rendered
    (WM, WV), (BM, BV) = states["weight"], states["bias"]
    return (f"::rootclad::linear_backward_update({D_IN}, {d_out}, {IN}, {W}, {BIAS}, {R}, {C}, "
            f"{OC}, {WM}, {WV}, {DB}, {BM}, {BV}, cfg, step);")  # fmt: skip


# -- convolutions ---------------------------------------------------------------------------
def matmul_args(node):
    """G, M, K, N, then each operand's values per sample and group stride (ops/dense.h)."""
    a, b = node.in_shapes
    G, M, K, N, sa, sb = matmul_geometry(a, b)
    return G, M, K, N, _n(a), sa, _n(b), sb


def _cdist_calls(node, graph, site):
    (P, M), (R, _) = node.in_shapes
    args = (OUT, IN(0, nullable=True), IN(1, nullable=True), INT("B"), INT(P), INT(R), INT(M))
    return [Call("cdist", args)]


def _matmul_calls(node, graph, site):
    return [Call("matmul", (OUT, IN(0), IN(1), INT("B"), *map(INT, matmul_args(node))))]


def conv1d_geometry(node, graph):
    C, L = node.in_shape
    OC, LO = node.out_shape
    K = graph.param(node.params["weight"]).shape[2]
    return C, L, OC, LO, K


def _conv1d_scratch(node, graph):
    """im2col's columns and product; the direct paths (stride 1 or few taps) need none.
    Grouped convolutions run as a Conv2d of height 1 (conv2d.h): columns only, none for a
    depthwise one."""
    C, _, OC, LO, K = conv1d_geometry(node, graph)
    groups = node.attrs.get("groups", 1)
    if groups != 1:
        return {"cols": 0 if depthwise(C, groups) else C * K * LO}
    direct = node.attrs["stride"] == 1 or C * K <= CONV1D_DIRECT_MAX_TAPS
    return {"tmp": 0 if direct else OC * LO, "cols": 0 if direct else C * K * LO}


def _conv1d_calls(node, graph, site):
    C, L, OC, _, K = conv1d_geometry(node, graph)
    a = node.attrs
    if a.get("groups", 1) != 1:
        geometry = (1, L, OC, 1, K, 1, a["stride"], 0, a["padding"], 1, a["dilation"])
        args = (OUT, SCRATCH("cols"), IN(0, True), W("weight"), W("bias"), INT("B"), INT(C))
        return [Call("conv2d", args + tuple(map(INT, geometry)) + (INT(a["groups"]),))]
    dims = (INT("B"), INT(C), INT(L), INT(OC), INT(K)) + tuple(
        INT(a[k]) for k in ("stride", "padding", "dilation")
    )
    args = (OUT, SCRATCH("tmp"), SCRATCH("cols"), IN(0, True), W("weight"), W("bias"), *dims)
    return [Call("conv1d", args)]


def _conv2d_calls(node, graph, site):
    C, H, Wd = node.in_shape
    OC = node.out_shape[0]
    a = node.attrs
    KH, KW = graph.param(node.params["weight"]).shape[2:]
    geometry = (H, Wd, OC, KH, KW, *a["stride"], *a["padding"], *a["dilation"], a["groups"])
    args = (OUT, SCRATCH("cols"), IN(0, True), W("weight"), W("bias"), INT("B"), INT(C))
    return [Call("conv2d", args + tuple(map(INT, geometry)))]


def conv_transpose_geometry(node, graph) -> tuple[int, ...]:
    """(C, H, W, OC, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, G) of a ConvTranspose1d/2d, the
    1-d one as H = OH = KH = 1 (conv2d.h: conv_transpose2d)."""
    a = node.attrs
    k = graph.param(node.params["weight"]).shape[2:]
    one = len(k) == 1
    C, *hw = node.in_shape
    OC, *ohw = node.out_shape

    def pad(v, fill):  # the 1-d layer's values after a first axis of 1
        return (fill, *v) if one else tuple(v)

    return (C, *pad(hw, 1), OC, *pad(ohw, 1), *pad(k, 1), *pad(a["stride"], 1),
            *pad(a["padding"], 0), *pad(a["dilation"], 1), a["groups"])  # fmt: skip


def _conv_transpose_calls(node, graph, site):
    args = (OUT, SCRATCH("cols"), IN(0, True), W("weight"), W("bias"), INT("B"))
    return [Call("conv_transpose2d", args + tuple(map(INT, conv_transpose_geometry(node, graph))))]


def _conv_transpose_scratch(node, graph):
    """The columns weight^T @ input (forward) and im2col of the output's adjoint (backward,
    in their adjoint): OC x KH x KW x H x W per sample."""
    C, H, Wd, OC, _, _, KH, KW, *_ = conv_transpose_geometry(node, graph)
    return {"cols": OC * KH * KW * H * Wd}


def depthwise(C: int, groups: int) -> bool:
    """conv2d_direct.h's conv2d_dw::applies: one input channel per group, run without columns."""
    return groups > 1 and C == groups


def pointwise(kernel, attrs) -> bool:
    """conv2d_direct.h's conv2d_pw::applies: 1x1, stride 1, no padding, one group: a product on
    the activation, without columns."""
    return (
        tuple(kernel) == (1, 1)
        and tuple(attrs["stride"]) == (1, 1)
        and tuple(attrs["padding"]) == (0, 0)
        and attrs["groups"] == 1
    )


def _conv2d_scratch(node, graph):
    """im2col's columns, which the direct paths (conv2d_direct.h: conv2d_s1, conv2d_dw and
    conv2d_pw's applies) do without."""
    C, _, Wd = node.in_shape
    KH, KW = graph.param(node.params["weight"]).shape[2:]
    a = node.attrs
    OH = node.out_shape[1]
    direct = (
        (
            tuple(a["stride"]) == (1, 1)
            and a["groups"] == 1
            and C * KH * KW <= CONV2D_DIRECT_MAX_TAPS
            and OH * (Wd + 2 * a["padding"][1]) >= CONV2D_DIRECT_MIN_ROW
        )
        or depthwise(C, a["groups"])
        or pointwise((KH, KW), a)
    )
    return {"cols": 0 if direct else C * KH * KW * _n(node.out_shape[1:])}


# -- pooling --------------------------------------------------------------------------------
def _pool1d_calls(node, graph, site):
    C, L = node.in_shape
    a = node.attrs
    args = [OUT, IN(0), INT(f"B * {C}"), INT(L)]
    args += [INT(a["kernel_size"]), INT(a["stride"]), INT(a["padding"])]
    if node.op == "avgpool1d":
        args.append(INT(a["count_include_pad"]))
    args.append(INT(a["ceil_mode"]))
    return [Call(node.op, tuple(args))]


def _pool2d_calls(node, graph, site):
    C, H, Wd = node.in_shape
    a = node.attrs
    args = [OUT, IN(0), INT(f"B * {C}"), INT(H), INT(Wd)]
    args += [INT(v) for key in ("kernel_size", "stride", "padding") for v in a[key]]
    if node.op == "avgpool2d":
        args.append(INT(a["count_include_pad"]))
    args.append(INT(a["ceil_mode"]))
    return [Call(node.op, tuple(args))]


def volume_geometry(node, graph) -> tuple[int, ...]:
    """(D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW) of a Conv3d or a
    3-d pooling (ops/volume_geometry.h's Vol; pools have dilation 1)."""
    a = node.attrs
    if node.op == "conv3d":
        k, dilation = graph.param(node.params["weight"]).shape[2:], a["dilation"]
    else:
        k, dilation = a["kernel_size"], (1, 1, 1)
    return (*node.in_shape[1:], *node.out_shape[1:], *k, *a["stride"], *a["padding"], *dilation)


def _conv3d_calls(node, graph, site):
    C, OC = node.in_shape[0], node.out_shape[0]
    args = (OUT, IN(0, True), W("weight"), W("bias"), INT("B"), INT(C), INT(OC))
    args += (INT(node.attrs["groups"]), *map(INT, volume_geometry(node, graph)))
    return [Call("conv3d", args)]


def _pool3d_calls(node, graph, site):
    args = [OUT, IN(0), INT(f"B * {node.in_shape[0]}")]
    if node.op == "avgpool3d":
        args.append(INT(node.attrs["count_include_pad"]))
    return [Call(node.op, (*args, *map(INT, volume_geometry(node, graph))))]


def _amax_calls(node, graph, site):
    C, L = node.in_shape[0], _n(node.in_shape[1:])
    return [Call("amax", (OUT, IN(0), INT(f"B * {C}"), INT(L)))]


def _global_pool_calls(node, graph, site):
    """The 1-d pool with one window spanning each channel's H*W (or L) values."""
    C, L = node.in_shape[0], _n(node.in_shape[1:])
    kernel = node.op.replace("global_", "") + "1d"
    args = [OUT, IN(0), INT(f"B * {C}"), INT(L), INT(L), INT(L), INT(0)]
    if kernel == "avgpool1d":
        args.append(INT(1))
    args.append(INT(0))  # no ceil_mode
    return [Call(kernel, tuple(args))]


def adaptive_geometry(node):
    """(rows per sample, H, W, OH, OW) of an adaptive pooling (1-D: H = OH = 1)."""
    C, *spatial = node.in_shape
    _, *out = node.out_shape
    if len(spatial) == 1:
        spatial, out = [1, *spatial], [1, *out]
    return C, (*spatial, *out)


def _adaptive_calls(node, graph, site):
    C, geo = adaptive_geometry(node)
    return [Call(node.op, (OUT, IN(0), INT(f"B * {C}"), *map(INT, geo)))]


def upsample_geometry(node, graph):
    """(rows per sample, (H, W, OH, OW, mode), (scale along H, along W)) of an upsampling
    (1-D: H = OH = 1); mode as upsample_i0's (ops/pool_geometry.h)."""
    C, geo = adaptive_geometry(node)
    a = node.attrs
    one_d = len(node.in_shape) == 2  # torch's 1-d nearest forward: no shortcuts, scale in T
    mode = (3 if one_d else 0) if a["mode"] == "nearest" else 2 if a["align_corners"] else 1
    scales = upsample_scales(node, graph.dtype)
    return C, (*geo, mode), ((1.0, *scales) if len(scales) == 1 else scales)


def _upsample_calls(node, graph, site):
    C, geo, scales = upsample_geometry(node, graph)
    return [Call("upsample", (OUT, IN(0), INT(f"B * {C}"), *map(INT, geo), *map(REAL, scales)))]


# -- elementwise with a mask ----------------------------------------------------------------
def _dropout_calls(node, graph, site):
    n = _n(node.in_shape)
    p = REAL(f"(training ? T({float(node.attrs['p'])!r}) : T(0))")
    seed = U64(f"::rootclad::dropout_hash(seed, {site.index})")
    return [Call("dropout", (OUT, IN(0), INT(f"B * {n}"), p, seed, LONG(f"(long)b0 * {n}")))]


def _normal_calls(node, graph, site):
    n = _n(node.in_shape)
    seed = U64(f"::rootclad::dropout_hash(seed, {site.index})")
    return [Call("normal", (OUT, IN(0), INT(f"B * {n}"), seed, LONG(f"(long)b0 * {n}")))]


def _stochastic_depth_calls(node, graph, site):
    """One mask entry per sample (its index in the whole batch: b0 + r), as dropout's."""
    n = _n(node.in_shape)
    p = REAL(f"(training ? T({float(node.attrs['p'])!r}) : T(0))")
    seed = U64(f"::rootclad::dropout_hash(seed, {site.index})")
    args = (OUT, IN(0), INT("B"), INT(n), p, seed, LONG("(long)b0"),
            INT(node.attrs["whole_batch"]))  # fmt: skip
    return [Call("sample_dropout", args)]


# -- binary ---------------------------------------------------------------------------------
BINARY_KINDS = {"add": 0, "sub": 1, "mul": 2, "div": 3}


def binary_kind(node) -> int:
    """The kernels' kind (ops/binary.h): BINARY_KINDS, or a mask's (4 to 7)."""
    if node.op == "masked_fill":
        zero = node.attrs.get("zero", False)
        return (6 if zero else 5) if node.attrs["keep"] else (7 if zero else 4)
    return BINARY_KINDS[node.op]


def broadcast_padded(node):
    """broadcast_geometry of the node, padded to MAX_BROADCAST_DIMS axes (size 1, stride 0);
    of expand, its input's strides twice."""
    a, b = node.in_shapes if len(node.in_shapes) == 2 else node.in_shapes * 2
    dims, sa, sb = broadcast_geometry(node.out_shape, a, b)
    pad = MAX_BROADCAST_DIMS - len(dims)
    return [1] * pad + dims, [0] * pad + sa, [0] * pad + sb


def _binary_calls(node, graph, site):
    a, b = node.in_shapes
    dims, sa, sb = broadcast_padded(node)
    args = (OUT, IN(0), IN(1), INT(binary_kind(node)), INT("B"))
    args += tuple(INT(d) for d in dims) + tuple(INT(s) for s in sa) + (INT(_n(a)),)
    args += tuple(INT(s) for s in sb) + (INT(_n(b)),)
    return [Call("binary", args)]


# -- shape ----------------------------------------------------------------------------------
def _permute_calls(node, graph, site):
    dims, st = permute_geometry(node)
    args = (OUT, IN(0), INT("B"), INT(_n(node.in_shape)), *map(INT, dims), *map(INT, st))
    return [Call("permute", args)]


def _cat_calls(node, graph, site):
    """One copy per input into its slice of each output row."""
    outer, n_out, parts = cat_parts(node)
    return [
        Call("cat_part", (OUT, IN(i), INT(f"B * {outer}"), INT(n_in), INT(n_out), INT(off)))
        for i, (n_in, off) in enumerate(parts)
    ]


def _slice_calls(node, graph, site):
    rows, geo = slice_geometry(node)
    return [Call("slice", (OUT, IN(0), INT(f"B * {rows}"), *map(INT, geo)))]


def _pad_calls(node, graph, site):
    rows, geo = pad_geometry(node)
    args = (OUT, IN(0), INT(f"B * {rows}"), *map(INT, geo), REAL(node.attrs["value"]))
    return [Call("pad", args)]


def _expand_calls(node, graph, site):
    dims, st, _ = broadcast_padded(node)
    args = (OUT, IN(0), INT("B"), INT(_n(node.in_shape)), *map(INT, dims), *map(INT, st))
    return [Call("expand", args)]


def _topk_calls(node, graph, site):
    shape, a = node.in_shape, node.attrs
    R, Q = _n(shape[: a["axis"]]), _n(shape[a["axis"] + 1 :])
    geo = (INT(f"B * {R}"), INT(shape[a["axis"]]), INT(a["k"]), INT(Q), INT(int(a["largest"])))
    return [Call("topk", (OUT, IN(0), *geo))]


def _gather_calls(node, graph, site):
    P, N, M, Q = gather_geometry(node)
    return [Call("gather", (OUT, IN(0), IN(1), INT(f"B * {P}"), INT(N), INT(M), INT(Q)))]


def _parameter_calls(node, graph, site):
    start = node.attrs.get("start", 0)  # a block of the tensor
    src = W("weight", start) if "weight" in node.params else BUF("value", start)
    return [Call("parameter", (OUT, src, INT("B"), INT(_n(node.out_shape))))]


def _embedding_calls(node, graph, site):
    V, D = graph.param(node.params["weight"]).shape
    geo = (LONG(f"(long)B * {_n(node.in_shape)}"), INT(V), INT(D), INT(node.attrs["padding_idx"]))
    return [Call("embedding", (OUT, IN(0), W("weight"), *geo))]


# -- normalisation --------------------------------------------------------------------------
def _softmax_calls(node, graph, site):
    shape, axis = node.in_shape, node.attrs["axis"]
    outer, inner = _n(shape[:axis]), _n(shape[axis + 1 :])
    return [Call(node.op, (OUT, IN(0), INT(f"B * {outer}"), INT(shape[axis]), INT(inner)))]


def layer_norm_rows(node):
    return _n(node.in_shape) // _n(node.attrs["normalized_shape"])


def _layer_norm_calls(node, graph, site):
    M = _n(node.attrs["normalized_shape"])
    args = (OUT, SCRATCH("stats"), IN(0), W("weight"), W("bias"))
    args += (INT(f"B * {layer_norm_rows(node)}"), INT(M), REAL(float(node.attrs["eps"])))
    return [Call("layer_norm", args)]


def _batch_norm_calls(node, graph, site):
    C, S = node.in_shape[0], _n(node.in_shape[1:])
    a = node.attrs
    args = (OUT, SCRATCH("stats"), IN(0), W("weight"), W("bias"))
    args += (BUF("running_mean"), BUF("running_var"), BUF("num_batches_tracked"))
    args += (INT("B"), INT(C), INT(S), REAL(a["eps"]), REAL(a["momentum"]), INT("training"))
    return [Call("batch_norm", args)]


CPU_OPS: dict[str, CpuOp] = {
    "linear": CpuOp(_linear_calls, whole_chunk=True, fused_update=_linear_update),
    "matmul": CpuOp(_matmul_calls),
    "cdist": CpuOp(_cdist_calls),
    "conv1d": CpuOp(_conv1d_calls, _conv1d_scratch, scratch_saves=("cols",)),
    "conv2d": CpuOp(_conv2d_calls, _conv2d_scratch, scratch_saves=("cols",)),
    "conv_transpose1d": CpuOp(_conv_transpose_calls, _conv_transpose_scratch),
    "conv_transpose2d": CpuOp(_conv_transpose_calls, _conv_transpose_scratch),
    "maxpool1d": CpuOp(_pool1d_calls),
    "avgpool1d": CpuOp(_pool1d_calls),
    "maxpool2d": CpuOp(_pool2d_calls),
    "avgpool2d": CpuOp(_pool2d_calls),
    "conv3d": CpuOp(_conv3d_calls),
    "maxpool3d": CpuOp(_pool3d_calls),
    "avgpool3d": CpuOp(_pool3d_calls),
    "adaptive_avgpool": CpuOp(_adaptive_calls),
    "adaptive_maxpool": CpuOp(_adaptive_calls),
    "global_avgpool": CpuOp(_global_pool_calls),
    "amax": CpuOp(_amax_calls),
    "upsample": CpuOp(_upsample_calls),
    "dropout": CpuOp(_dropout_calls),
    "stochastic_depth": CpuOp(_stochastic_depth_calls),
    "normal": CpuOp(_normal_calls),
    "add": CpuOp(_binary_calls),
    "sub": CpuOp(_binary_calls),
    "mul": CpuOp(_binary_calls),
    "div": CpuOp(_binary_calls),
    "masked_fill": CpuOp(_binary_calls),
    "permute": CpuOp(_permute_calls),
    "cat": CpuOp(_cat_calls),
    "slice": CpuOp(_slice_calls),
    "pad": CpuOp(_pad_calls),
    "expand": CpuOp(_expand_calls),
    "topk": CpuOp(_topk_calls),
    "gather": CpuOp(_gather_calls),
    "parameter": CpuOp(_parameter_calls),
    "embedding": CpuOp(_embedding_calls),
    "softmax": CpuOp(_softmax_calls),
    "log_softmax": CpuOp(_softmax_calls),
    "safe_softmax": CpuOp(_softmax_calls),
    "layer_norm": CpuOp(
        _layer_norm_calls,
        lambda node, g: {"stats": 2 * layer_norm_rows(node)},  # mean, 1/std per row
        scratch_saves=("stats",),
    ),
    "batch_norm": CpuOp(
        _batch_norm_calls,
        # per channel: mean, 1/std; and one value for the batch's count (norm kernels)
        lambda node, g: {"stats": 2 * node.in_shape[0] + 1},
        scratch_saves=("stats",),
        whole_chunk=True,
        sync_values=lambda node: 2 * node.in_shape[0] + 1,
    ),
}
_UNARY = CpuOp(_unary_calls)
_PARAMETRIC = CpuOp(_parametric_calls)


def cpu_op(node: Node) -> CpuOp:
    """How ``node`` runs on the CPU; an IRError naming it for an op without CPU kernels."""
    op = CPU_OPS.get(node.op)
    if op is not None:
        return op
    if OPS[node.op].functor:
        return _PARAMETRIC if OPS[node.op].params else _UNARY
    raise IRError(f"{node.describe()}: op {node.op!r} has no CPU kernels")
