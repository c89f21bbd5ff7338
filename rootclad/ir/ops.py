"""The op registry: everything rootclad knows about each op, in one entry.

An entry (:class:`OpSpec`) says how many inputs the op reads, which parameters it owns, how
its output shape follows from its inputs (and checks them, naming the node), which C++ kernel
calls compute it, and which ``torch.nn`` modules and torch functions lower to it. The IR
(:mod:`rootclad.ir.graph`), the torch front-end (:mod:`rootclad.ir.from_torch`), the emitter
(:mod:`rootclad.codegen.emit`) and the op-coverage test all read this table, so adding an op
means: its kernels (``<kernel>_forward`` / ``<kernel>_backward`` in
``include/rootclad/kernels.h``), its Clad-convention adapter (``<kernel>_forward_pullback`` in
``include/rootclad/pullbacks.h``), an entry here (``saves``: what its pullback reads of the
forward, which the arena planner keeps), and a torch reference case in
``tests/core/test_core_ops.py`` (the coverage test fails until there is one). On the GPU: its
device kernels in ``include/rootclad/device_kernels.h`` and the entry's ``device`` hook
(tests/cuda/test_device_ops.py runs every case of test_core_ops.py on them).

Kernel calls are written once, as the forward call's argument list (:class:`Call`); the
emitter derives the pullback call from it by Clad's convention: the same arguments, then one
adjoint per argument (the gradient region of each tensor, a dummy for each scalar).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rootclad.ir.graph import Graph, IRError, Node, expect

# Conv1d runs directly (no im2col scratch) for stride 1 or at most this many taps C*K;
# must match CONV1D_DIRECT_MAX_TAPS in include/rootclad/kernels.h.
CONV1D_DIRECT_MAX_TAPS = 32
# must match MAX_TAPS and MIN_ROW of conv2d_s1 in include/rootclad/conv2d.h
CONV2D_DIRECT_MAX_TAPS = 288
CONV2D_DIRECT_MIN_ROW = 16
BN_CHUNKS = 64  # must match BN_CHUNKS in include/rootclad/device_kernels.h
# device programs: a one-group convolution with at least this many taps C*KH*KW gets a
# workspace, so that it runs as products (cuBLAS) at large batches (device_kernels.h:
# conv_gemm_applies); fewer taps stay direct (im2col would copy each input that many times)
CONV_GEMM_MIN_DEPTH = 32
MAX_BROADCAST_DIMS = 3  # per-sample dimensions of a broadcasting binary op, after merging


# -- kernel calls ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Arg:
    """One argument of a kernel call.

    kind: ``out`` (the node's output), ``in`` (input ``ref``), ``param`` (parameter role
    ``ref``, null when the layer has none), ``buffer`` (buffer role ``ref``: state that is not
    trained, null when the layer has none), ``scratch`` (the node's scratch region ``ref``),
    or a scalar: ``int``, ``real``, ``u64``, ``long`` (``ref`` a C++ expression; ``B`` is the
    chunk's batch). ``nullable``: an input whose gradient may be skipped (null) when it is a
    model input and no input gradient is asked for; only for kernels that accept that.
    """

    kind: str
    ref: object = None
    nullable: bool = False


OUT = Arg("out")


def IN(i: int = 0, nullable: bool = False) -> Arg:
    return Arg("in", i, nullable)


def W(role: str) -> Arg:
    return Arg("param", role)


def BUF(role: str) -> Arg:
    return Arg("buffer", role)


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


# -- the spec -------------------------------------------------------------------------------
@dataclass
class OpSpec:
    name: str
    summary: str  # one line, for error messages and docs
    infer: Callable[[Node, list, Graph], tuple]  # per-sample output shape; checks the inputs
    calls: Callable[[Node, Graph, Site], list[Call]] | None  # None: the output aliases input 0
    arity: int | None = 1  # None: one or more
    params: tuple[str, ...] = ()  # parameter roles, in the torch module's order
    buffers: tuple[str, ...] = ()  # buffer roles (torch buffers: not trained)
    scratch: Callable[[Node, Graph], dict[str, int]] | None = None  # per-sample sizes
    # what the op's pullback reads of the forward: "in" (its inputs), "out", scratch keys;
    # None: all of them. The arena planner reuses the rest once the forward is past it, so a
    # missing entry gives wrong gradients (ROOTCLAD_CHECK_PLAN=1 turns them into NaN).
    saves: tuple[str, ...] | None = None
    flops: Callable[[Node, Graph], int] | None = None  # multiply-adds x 2, one sample's forward
    modules: tuple[str, ...] = ()  # torch.nn class names that lower to this op
    from_module: Callable | None = None  # (module, where) -> attrs; raises IRError
    functions: tuple[str, ...] = ()  # torch functions / Tensor methods ("Tensor.relu")
    from_call: Callable | None = None  # (extra positional args, kwargs, where) -> attrs
    # the op on CUDA and on dev::Host (codegen/device.py, include/rootclad/device_kernels.h):
    # (node, graph, DeviceSite) -> (forward statements, backward statements[, DeviceScratch:
    # how many values of scratch it uses]); None: no device kernels yet
    device: Callable | None = None
    # from_module / from_call give an axis as torch numbers it, batch axis included, in attrs
    # "dim"; the front-end turns it into "axis", the per-sample axis (0 = the first after B)


@dataclass(frozen=True)
class DeviceSite:
    """C++ expressions for one node in a device program (codegen/device.py): its output and
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
    # an activation fused into this op (DEVICE_FUSED_ACTIVATIONS' functor; out and d_out are
    # then the activation's): the forward applies it, the backward reads d_out through dy()
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


OPS: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} registered twice")
    OPS[spec.name] = spec
    return spec


def supported_ops() -> str:
    return ", ".join(OPS)


def supported_modules() -> str:
    return ", ".join(m for spec in OPS.values() for m in spec.modules)


def _n(shape) -> int:
    return math.prod(shape)


def same_shape(node: Node, shapes, graph: Graph) -> tuple:
    return shapes[0]


def _ints(value, n: int, what: str, where: str):
    """A module's int-or-tuple attribute: an int for n = 1, an n-tuple of ints otherwise."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * n
    if len(values) != n:
        raise IRError(f"{where}: {what}={value!r} is not a {n}-d value")
    values = tuple(int(v) for v in values)
    return values[0] if n == 1 else values


def _arg(args, kwargs, i: int, name: str, default):
    return args[i] if len(args) > i else kwargs.get(name, default)


# -- Linear ---------------------------------------------------------------------------------
def _linear_infer(node, shapes, graph):
    (shape,) = shapes
    w = graph.param(node.params["weight"])
    expect(
        len(shape) >= 1 and shape[-1] == w.shape[1],
        node,
        f"expected input (..., {w.shape[1]}), got per-sample shape {shape}",
    )
    return (*shape[:-1], w.shape[0])


def _linear_calls(node, graph, site):
    C, OC = node.in_shape[-1], node.out_shape[-1]
    R = f"B * {_n(node.in_shape) // C}"
    return [Call("linear", (OUT, IN(0, True), W("weight"), W("bias"), INT(R), INT(C), INT(OC)))]


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


register(
    OpSpec(
        "linear",
        "Linear on the last axis (any leading per-sample axes)",
        _linear_infer,
        _linear_calls,
        params=("weight", "bias"),
        saves=("in",),
        flops=lambda node, g: 2 * _n(node.in_shape) * node.out_shape[-1],
        modules=("Linear", "LazyLinear"),
        from_module=lambda mod, where: {},
        device=_linear_device,
    )
)


# -- Conv1d ---------------------------------------------------------------------------------
def _conv_from_module(mod, where, n: int):
    """Conv1d (n = 1) and Conv2d (n = 2): zero padding, numbers (or 'valid') only."""
    if mod.padding_mode != "zeros":
        raise IRError(f"{where}: padding_mode={mod.padding_mode!r} (only 'zeros')")
    if isinstance(mod.padding, str):
        if mod.padding != "valid":
            raise IRError(f"{where}: padding={mod.padding!r}; give an integer padding")
        pad = _ints(0, n, "padding", where)
    else:
        pad = _ints(mod.padding, n, "padding", where)
    return {
        "stride": _ints(mod.stride, n, "stride", where),
        "padding": pad,
        "dilation": _ints(mod.dilation, n, "dilation", where),
        "groups": int(mod.groups),
    }


def _conv_flops(node, graph) -> int:
    return 2 * _n(node.out_shape) * _n(graph.param(node.params["weight"]).shape[1:])


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


def _conv1d_geometry(node, graph):
    C, L = node.in_shape
    OC, LO = node.out_shape
    K = graph.param(node.params["weight"]).shape[2]
    return C, L, OC, LO, K


def _conv1d_scratch(node, graph):
    """im2col's columns and product; the direct paths (stride 1 or few taps) need none.
    Grouped convolutions run as a Conv2d of height 1 (conv2d.h): columns only."""
    C, _, OC, LO, K = _conv1d_geometry(node, graph)
    if node.attrs.get("groups", 1) != 1:
        return {"cols": C * K * LO}
    direct = node.attrs["stride"] == 1 or C * K <= CONV1D_DIRECT_MAX_TAPS
    return {"tmp": 0 if direct else OC * LO, "cols": 0 if direct else C * K * LO}


def _conv1d_calls(node, graph, site):
    C, L, OC, _, K = _conv1d_geometry(node, graph)
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


def _conv1d_device(node, graph, d):
    C, L, OC, _, K = _conv1d_geometry(node, graph)
    a = node.attrs
    G = a.get("groups", 1)
    geo = (C, L, OC, K, a["stride"], a["padding"], a["dilation"], G)
    return _conv_device(d, f"conv1d_shape({', '.join(map(str, geo))})", C, K, G)


register(
    OpSpec(
        "conv1d",
        "Conv1d (zero padding, any stride/padding/dilation/groups)",
        _conv1d_infer,
        _conv1d_calls,
        params=("weight", "bias"),
        scratch=_conv1d_scratch,
        saves=("in", "cols"),
        flops=_conv_flops,
        device=_conv1d_device,
        modules=("Conv1d",),
        from_module=lambda mod, where: _conv_from_module(mod, where, 1),
    )
)


# -- pooling --------------------------------------------------------------------------------
def _pool_from_module(mod, where, n: int):
    """MaxPool / AvgPool in n = 1 or 2 dimensions (no ceil_mode, dilation or indices)."""
    if mod.ceil_mode:
        raise IRError(f"{where}: ceil_mode=True is not supported")
    k = _ints(mod.kernel_size, n, "kernel_size", where)
    stride = mod.stride if mod.stride is not None else mod.kernel_size
    attrs = {
        "kernel_size": k,
        "stride": _ints(stride, n, "stride", where),
        "padding": _ints(mod.padding, n, "padding", where),
    }
    if type(mod).__name__.startswith("MaxPool"):
        if _ints(mod.dilation, n, "dilation", where) != _ints(1, n, "", where):
            raise IRError(f"{where}: dilation != 1 is not supported")
        if mod.return_indices:
            raise IRError(f"{where}: return_indices is not supported")
        return attrs
    if getattr(mod, "divisor_override", None):
        raise IRError(f"{where}: divisor_override is not supported")
    attrs["count_include_pad"] = int(mod.count_include_pad)
    return attrs


def _pool_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    expect(len(shape) == 2, node, f"expected input (C, L), got per-sample shape {shape}")
    k, s, p = a["kernel_size"], a["stride"], a["padding"]
    expect(p <= k // 2, node, f"padding {p} must be at most half the kernel size {k}")
    lo = (shape[1] + 2 * p - k) // s + 1
    expect(lo >= 1, node, f"input length {shape[1]} is shorter than the kernel {k}")
    return (shape[0], lo)


def _pool_calls(node, graph, site):
    C, L = node.in_shape
    a = node.attrs
    args = [OUT, IN(0), INT(f"B * {C}"), INT(L)]
    args += [INT(a["kernel_size"]), INT(a["stride"]), INT(a["padding"])]
    if node.op == "avgpool1d":
        args.append(INT(a["count_include_pad"]))
    return [Call(node.op, tuple(args))]


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
                                 f"{a['stride']}, 0, {a['padding']})")  # fmt: skip


def _pool2d_device(node, graph, d):
    _, H, Wd = node.in_shape
    geo = (H, Wd, *(v for k in ("kernel_size", "stride", "padding") for v in node.attrs[k]))
    return _pool_device(node, d, f"pool2d_shape({', '.join(map(str, geo))})")


for _name, _module in (("maxpool1d", "MaxPool1d"), ("avgpool1d", "AvgPool1d")):
    register(
        OpSpec(
            _name,
            f"{_module} (no ceil_mode)",
            _pool_infer,
            _pool_calls,
            saves=("in", "out") if _name.startswith("max") else (),
            modules=(_module,),
            from_module=lambda mod, where: _pool_from_module(mod, where, 1),
            device=_pool1d_device,
        )
    )


def _global_pool_from_module(mod, where):
    size = mod.output_size
    if any(v != 1 for v in (size if isinstance(size, (tuple, list)) else (size,))):
        raise IRError(f"{where}: output_size={size!r}; only global pooling (output_size=1)")
    if getattr(mod, "return_indices", False):
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


def _global_pool_calls(node, graph, site):
    """The 1-d pool with one window spanning each channel's H*W (or L) values."""
    C, L = node.in_shape[0], _n(node.in_shape[1:])
    kernel = node.op.replace("global_", "") + "1d"
    args = [OUT, IN(0), INT(f"B * {C}"), INT(L), INT(L), INT(L), INT(0)]
    if kernel == "avgpool1d":
        args.append(INT(1))
    return [Call(kernel, tuple(args))]


def _global_pool_device(node, graph, d):
    C, L = node.in_shape[0], _n(node.in_shape[1:])
    rows = f"(long)B * {C}, {L}"
    fwd = [f"{node.op}_forward(on, {d.out}, {d.ins[0]}, {rows});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        reads = f", {d.ins[0]}" if node.op == "global_maxpool" else ""  # where the maximum is
        bwd.append(f"{node.op}_backward(on, {d.d_ins[0]}, {d.d_out}{reads}, {rows});")
    return fwd, bwd


for _name, _modules in (
    ("global_avgpool", ("AdaptiveAvgPool1d", "AdaptiveAvgPool2d")),
    ("global_maxpool", ("AdaptiveMaxPool1d", "AdaptiveMaxPool2d")),
):
    register(
        OpSpec(
            _name,
            f"{' / '.join(_modules)} to size 1: pooling over all positions",
            _global_pool_infer,
            _global_pool_calls,
            saves=("in", "out") if _name == "global_maxpool" else (),
            modules=_modules,
            from_module=_global_pool_from_module,
            device=_global_pool_device,
        )
    )


# -- 2-D convolution and pooling ------------------------------------------------------------
def _conv2d_out(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _conv2d_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    w = graph.param(node.params["weight"])
    expect(len(shape) == 3, node, f"expected input (C, H, W), got per-sample shape {shape}")
    expect(
        shape[0] == w.shape[1] * a["groups"],
        node,
        f"expected {w.shape[1] * a['groups']} input channels, got {shape[0]} (shape {shape})",
    )
    out = [
        _conv2d_out(shape[1 + i], w.shape[2 + i], a["stride"][i], a["padding"][i], a["dilation"][i])
        for i in range(2)
    ]
    expect(min(out) >= 1, node, f"input {shape[1:]} is smaller than the kernel {w.shape[2:]}")
    return (w.shape[0], *out)


def _conv2d_calls(node, graph, site):
    C, H, Wd = node.in_shape
    OC = node.out_shape[0]
    a = node.attrs
    KH, KW = graph.param(node.params["weight"]).shape[2:]
    geometry = (H, Wd, OC, KH, KW, *a["stride"], *a["padding"], *a["dilation"], a["groups"])
    args = (OUT, SCRATCH("cols"), IN(0, True), W("weight"), W("bias"), INT("B"), INT(C))
    return [Call("conv2d", args + tuple(map(INT, geometry)))]


def _conv2d_device(node, graph, d):
    C, H, Wd = node.in_shape
    KH, KW = graph.param(node.params["weight"]).shape[2:]
    a = node.attrs
    OC = node.out_shape[0]
    geo = (C, H, Wd, OC, KH, KW, *a["stride"], *a["padding"], *a["dilation"], a["groups"])
    shape = f"conv2d_shape({', '.join(map(str, geo))})"
    return _conv_device(d, shape, C, KH * KW, a["groups"])


def _conv2d_scratch(node, graph):
    """im2col's columns, which the direct path (conv2d.h: conv2d_s1::applies) does without."""
    C, _, Wd = node.in_shape
    KH, KW = graph.param(node.params["weight"]).shape[2:]
    a = node.attrs
    OH = node.out_shape[1]
    direct = (
        tuple(a["stride"]) == (1, 1)
        and a["groups"] == 1
        and C * KH * KW <= CONV2D_DIRECT_MAX_TAPS
        and OH * (Wd + 2 * a["padding"][1]) >= CONV2D_DIRECT_MIN_ROW
    )
    return {"cols": 0 if direct else C * KH * KW * _n(node.out_shape[1:])}


register(
    OpSpec(
        "conv2d",
        "Conv2d (zero padding, any stride/padding/dilation/groups)",
        _conv2d_infer,
        _conv2d_calls,
        params=("weight", "bias"),
        scratch=_conv2d_scratch,
        saves=("in", "cols"),
        flops=_conv_flops,
        device=_conv2d_device,
        modules=("Conv2d",),
        from_module=lambda mod, where: _conv_from_module(mod, where, 2),
    )
)


def _pool2d_infer(node, shapes, graph):
    (shape,) = shapes
    a = node.attrs
    expect(len(shape) == 3, node, f"expected input (C, H, W), got per-sample shape {shape}")
    out = []
    for i in range(2):
        k, s, p = a["kernel_size"][i], a["stride"][i], a["padding"][i]
        expect(p <= k // 2, node, f"padding {p} must be at most half the kernel size {k}")
        out.append((shape[1 + i] + 2 * p - k) // s + 1)
    expect(min(out) >= 1, node, f"input {shape[1:]} is smaller than the kernel")
    return (shape[0], *out)


def _pool2d_calls(node, graph, site):
    C, H, Wd = node.in_shape
    a = node.attrs
    args = [OUT, IN(0), INT(f"B * {C}"), INT(H), INT(Wd)]
    args += [INT(v) for key in ("kernel_size", "stride", "padding") for v in a[key]]
    if node.op == "avgpool2d":
        args.append(INT(a["count_include_pad"]))
    return [Call(node.op, tuple(args))]


for _name, _module in (("maxpool2d", "MaxPool2d"), ("avgpool2d", "AvgPool2d")):
    register(
        OpSpec(
            _name,
            f"{_module} (no ceil_mode)",
            _pool2d_infer,
            _pool2d_calls,
            saves=("in", "out") if _name.startswith("max") else (),
            device=_pool2d_device,
            modules=(_module,),
            from_module=lambda mod, where: _pool_from_module(mod, where, 2),
        )
    )


# -- elementwise ----------------------------------------------------------------------------
def _unary(
    name,
    summary,
    modules=(),
    functions=(),
    attrs=(),
    from_module=None,
    from_call=None,
    saves=("in",),
    device=None,
):
    """An elementwise op: <name>_forward(out, inp, N, attrs...) over the whole tensor; its
    pullback reads ``saves`` (the input, or the output)."""

    def calls(node, graph, site):
        extra = tuple(REAL(float(node.attrs[a])) for a in attrs)
        return [Call(name, (OUT, IN(0), INT(f"B * {_n(node.in_shape)}"), *extra))]

    register(
        OpSpec(
            name,
            summary,
            same_shape,
            calls,
            saves=saves,
            modules=modules,
            from_module=from_module or (lambda mod, where: {}),
            functions=functions,
            from_call=from_call or (lambda args, kwargs, where: {}),
            device=device or (_unary_device if name in _UNARY_DEVICE else None),
        )
    )


# the device functor of each elementwise op (device_kernels.h), from the node's attrs
_UNARY_DEVICE = {
    "relu": lambda a: "Relu{}",
    "tanh": lambda a: "Tanh{}",
    "sigmoid": lambda a: "Sigmoid{}",
    "silu": lambda a: "Silu{}",
    "leaky_relu": lambda a: f"LeakyRelu{{{float(a['negative_slope'])!r}}}",
    "elu": lambda a: f"Elu{{{float(a['alpha'])!r}}}",
    "softplus": lambda a: f"Softplus{{{float(a['beta'])!r}, {float(a['threshold'])!r}}}",
    "gelu": lambda a: f"Gelu{{{int(a['approximate'] == 'tanh')}}}",
    "affine": lambda a: f"Affine{{{float(a['scale'])!r}, {float(a['shift'])!r}}}",
}


def _unary_device(node, graph, d):
    n = f"(long)B * {_n(node.in_shape)}"
    op = _UNARY_DEVICE[node.op](node.attrs)
    fwd = [f"unary_forward(on, {d.out}, {d.ins[0]}, {n}, {op});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"unary_backward(on, {d.d_ins[0]}, {d.d_out}, {d.ins[0]}, {d.out}, {n}, {op});")
    return fwd, bwd


# Device programs fuse an activation whose derivative reads only its output into the op that
# produces its input, when it is that value's only reader: the producer applies it as it writes
# (its hook passes DeviceSite.act through fwd_act() and dy()), and no pre-activation is stored.
DEVICE_FUSED_ACTIVATIONS = {op: _UNARY_DEVICE[op]({}) for op in ("relu", "tanh", "sigmoid")}
DEVICE_FUSING_PRODUCERS = {"linear", "conv1d", "conv2d", "maxpool1d", "maxpool2d", "avgpool1d",
                           "avgpool2d", "add", "sub", "mul", "div"}  # fmt: skip


_F = "torch.nn.functional."
_unary("relu", "ReLU", ("ReLU",), ("torch.relu", _F + "relu", "Tensor.relu"), saves=("out",))
_unary("tanh", "Tanh", ("Tanh",), ("torch.tanh", _F + "tanh", "Tensor.tanh"), saves=("out",))
_unary(
    "sigmoid",
    "Sigmoid",
    ("Sigmoid",),
    ("torch.sigmoid", _F + "sigmoid", "Tensor.sigmoid"),
    saves=("out",),
)
_unary("silu", "SiLU (x * sigmoid(x))", ("SiLU",), (_F + "silu",))
_unary(
    "leaky_relu",
    "LeakyReLU",
    ("LeakyReLU",),
    (_F + "leaky_relu",),
    attrs=("negative_slope",),
    from_module=lambda mod, where: {"negative_slope": float(mod.negative_slope)},
    from_call=lambda args, kw, where: {
        "negative_slope": float(_arg(args, kw, 0, "negative_slope", 0.01))
    },  # fmt: skip
)
_unary(
    "elu",
    "ELU",
    ("ELU",),
    (_F + "elu",),
    attrs=("alpha",),
    from_module=lambda mod, where: {"alpha": float(mod.alpha)},
    from_call=lambda args, kw, where: {"alpha": float(_arg(args, kw, 0, "alpha", 1.0))},
)
_unary(
    "softplus",
    "Softplus (beta, threshold)",
    ("Softplus",),
    (_F + "softplus",),
    attrs=("beta", "threshold"),
    from_module=lambda mod, where: {"beta": float(mod.beta), "threshold": float(mod.threshold)},
    from_call=lambda args, kw, where: {
        "beta": float(_arg(args, kw, 0, "beta", 1.0)),
        "threshold": float(_arg(args, kw, 1, "threshold", 20.0)),
    },
)


def _gelu_attrs(approximate, where):
    if approximate not in ("none", "tanh"):
        raise IRError(f"{where}: approximate={approximate!r} (only 'none' or 'tanh')")
    return {"approximate": approximate}


register(
    OpSpec(
        "gelu",
        "GELU (exact or tanh approximation)",
        same_shape,
        lambda node, g, site: [
            Call(
                "gelu",
                (
                    OUT,
                    IN(0),
                    INT(f"B * {_n(node.in_shape)}"),
                    INT(int(node.attrs["approximate"] == "tanh")),
                ),
            )  # fmt: skip
        ],
        saves=("in",),
        device=_unary_device,
        modules=("GELU",),
        from_module=lambda mod, where: _gelu_attrs(mod.approximate, where),
        functions=(_F + "gelu",),
        from_call=lambda args, kw, where: _gelu_attrs(kw.get("approximate", "none"), where),
    )
)


def _dropout_calls(node, graph, site):
    n = _n(node.in_shape)
    p = REAL(f"(training ? T({float(node.attrs['p'])!r}) : T(0))")
    seed = U64(f"::rootclad::dropout_hash(seed, {site.index})")
    return [Call("dropout", (OUT, IN(0), INT(f"B * {n}"), p, seed, LONG(f"(long)b0 * {n}")))]


def _dropout_device(node, graph, d):
    """The CPU's mask (dropout_mask.h): the same node seed, each element's index in the batch."""
    n = f"(long)B * {_n(node.in_shape)}"
    mask = f"training ? T({float(node.attrs['p'])!r}) : T(0), ::rootclad::dropout_hash(seed, {d.index})"
    fwd = [f"dropout_forward(on, {d.out}, {d.ins[0]}, {n}, {mask});"]
    bwd = []
    if d.d_ins[0] != "nullptr":
        bwd.append(f"dropout_backward(on, {d.d_ins[0]}, {d.d_out}, {n}, {mask});")
    return fwd, bwd


register(
    OpSpec(
        "dropout",
        "Dropout (a counter-based mask, the same on any thread)",
        same_shape,
        _dropout_calls,
        saves=(),  # the mask is recomputed from the seed
        device=_dropout_device,
        modules=("Dropout",),
        from_module=lambda mod, where: {"p": float(mod.p)},
    )
)


def _affine_calls(node, graph, site):
    a = node.attrs
    n = f"B * {_n(node.in_shape)}"
    return [Call("affine", (OUT, IN(0), INT(n), REAL(float(a["scale"])), REAL(float(a["shift"]))))]


register(
    OpSpec(
        "affine",
        "x * scale + shift with constant numbers (x + 1, 2 * x, x / 4, 1 - x, -x)",
        same_shape,
        _affine_calls,
        saves=(),
        device=_unary_device,
    )
)


# -- binary with broadcasting ---------------------------------------------------------------
BINARY_KINDS = {"add": 0, "sub": 1, "mul": 2, "div": 3}


def broadcast_shapes(node: Node, a: tuple, b: tuple) -> tuple:
    """torch's broadcasting of two per-sample shapes (the batch axis is shared)."""
    n = max(len(a), len(b))
    a1, b1 = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for i, (x, y) in enumerate(zip(a1, b1, strict=True)):
        expect(
            x == y or x == 1 or y == 1,
            node,
            f"shapes {tuple(a)} and {tuple(b)} do not broadcast (axis {i - n} is {x} and {y}; "
            "per-sample shapes, the batch axis excluded)",
        )
        out.append(max(x, y))
    return tuple(out)


def broadcast_geometry(out: tuple, a: tuple, b: tuple):
    """Merge axes so that the loop nest is short: (dims, a strides, b strides), each of
    length MAX_BROADCAST_DIMS or fewer before padding; a broadcast axis has stride 0."""
    n = len(out)
    shapes = [(1,) * (n - len(s)) + tuple(s) for s in (a, b)]
    # per axis: (size, a broadcast?, b broadcast?); size-1 output axes drop out
    axes = [(d, shapes[0][i] == 1, shapes[1][i] == 1) for i, d in enumerate(out) if d != 1]
    merged: list[list] = []
    for d, ab, bb in axes:
        if merged and (merged[-1][1], merged[-1][2]) == (ab, bb):
            merged[-1][0] *= d
        else:
            merged.append([d, ab, bb])
    dims = [m[0] for m in merged] or [1]
    strides = []
    for which in (1, 2):
        st, acc = [0] * len(dims), 1
        for i in range(len(merged) - 1, -1, -1):
            broadcast = merged[i][which]
            st[i] = 0 if broadcast else acc
            acc *= 1 if broadcast else merged[i][0]
        strides.append(st)
    return dims, strides[0], strides[1]


def _binary_infer(node, shapes, graph):
    out = broadcast_shapes(node, *shapes)
    dims, _, _ = broadcast_geometry(out, *shapes)
    expect(
        len(dims) <= MAX_BROADCAST_DIMS,
        node,
        f"broadcasting {tuple(shapes[0])} with {tuple(shapes[1])} needs {len(dims)} loop axes; "
        f"at most {MAX_BROADCAST_DIMS} are supported",
    )
    return out


def _binary_calls(node, graph, site):
    a, b = node.in_shapes
    dims, sa, sb = _broadcast_padded(node)
    args = (OUT, IN(0), IN(1), INT(BINARY_KINDS[node.op]), INT("B"))
    args += tuple(INT(d) for d in dims) + tuple(INT(s) for s in sa) + (INT(_n(a)),)
    args += tuple(INT(s) for s in sb) + (INT(_n(b)),)
    return [Call("binary", args)]


def _broadcast_padded(node):
    """broadcast_geometry of the node, padded to MAX_BROADCAST_DIMS axes (size 1, stride 0)."""
    a, b = node.in_shapes
    dims, sa, sb = broadcast_geometry(node.out_shape, a, b)
    pad = MAX_BROADCAST_DIMS - len(dims)
    return [1] * pad + dims, [0] * pad + sa, [0] * pad + sb


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
    dims, sa, sb = _broadcast_padded(node)
    g = (f"Broadcast{{{{{', '.join(map(str, dims))}}}, {{{', '.join(map(str, sa))}}}, "
         f"{{{', '.join(map(str, sb))}}}, {_n(a)}, {_n(b)}}}")  # fmt: skip
    kind = BINARY_KINDS[node.op]
    fwd = [f"binary_forward(on, {d.out}, {d.ins[0]}, {d.ins[1]}, (long)B, {g}, {kind}"
           f"{d.fwd_act()});"]  # fmt: skip
    bwd = [f"binary_backward(on, {dx}, {d.dy()}, {d.ins[0]}, {d.ins[1]}, (long)B, {g}, {kind}, "
           f"{which});" for which, dx in enumerate(d.d_ins) if dx != "nullptr"]  # fmt: skip
    return fwd, bwd


for _name, _sym in (("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/")):
    register(
        OpSpec(
            _name,
            f"a {_sym} b of two tensors, with broadcasting (residual additions)",
            _binary_infer,
            _binary_calls,
            arity=2,
            saves=("in",) if _name in ("mul", "div") else (),
            device=_binary_device,
        )
    )


# -- shape ops ------------------------------------------------------------------------------
def _reshape_infer(node, shapes, graph):
    (shape,) = shapes
    target = list(node.attrs["shape"])
    expect(target.count(-1) <= 1, node, f"shape {tuple(target)} has more than one -1")
    known = math.prod(d for d in target if d != -1)
    if -1 in target:
        expect(
            known > 0 and _n(shape) % known == 0,
            node,
            f"cannot reshape per-sample shape {shape} to {tuple(target)}",
        )
        target[target.index(-1)] = _n(shape) // known
    expect(
        math.prod(target) == _n(shape),
        node,
        f"cannot reshape per-sample shape {shape} ({_n(shape)} values) to {tuple(target)}",
    )
    return tuple(target)


register(
    OpSpec(
        "reshape",
        "reshape / view / flatten of the per-sample shape (no copy)",
        _reshape_infer,
        None,
    )
)
register(
    OpSpec(
        "flatten",
        "Flatten(start_dim=1): (B, ...) -> (B, n)",
        lambda node, shapes, g: (_n(shapes[0]),),
        None,
        modules=("Flatten",),
        from_module=lambda mod, where: _flatten_attrs(mod.start_dim, mod.end_dim, where),
    )
)
register(
    OpSpec(
        "identity",
        "Identity (no copy)",
        same_shape,
        None,
        modules=("Identity",),
        from_module=lambda mod, where: {},
    )
)


def _flatten_attrs(start, end, where):
    if (start, end) != (1, -1):
        raise IRError(f"{where}: only Flatten(start_dim=1, end_dim=-1) is supported")
    return {}


def _permute_infer(node, shapes, graph):
    (shape,) = shapes
    perm = node.attrs["perm"]
    expect(
        sorted(perm) == list(range(len(shape))),
        node,
        f"permutation {tuple(perm)} of the per-sample axes does not fit shape {shape}",
    )
    expect(len(shape) <= 4, node, f"at most 4 per-sample axes can be permuted, got {shape}")
    return tuple(shape[p] for p in perm)


def _permute_geometry(node):
    """The output's dims and, per output axis, the input's stride; padded to 4 axes."""
    shape, perm = node.in_shape, node.attrs["perm"]
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    dims = [shape[p] for p in perm]
    st = [strides[p] for p in perm]
    pad = 4 - len(dims)
    return [1] * pad + dims, [0] * pad + st


def _permute_calls(node, graph, site):
    dims, st = _permute_geometry(node)
    args = (OUT, IN(0), INT("B"), INT(_n(node.in_shape)), *map(INT, dims), *map(INT, st))
    return [Call("permute", args)]


def _permute_device(node, graph, d):
    dims, st = _permute_geometry(node)
    g = (f"Permute{{{{{', '.join(map(str, dims))}}}, {{{', '.join(map(str, st))}}}, "
         f"{_n(node.in_shape)}}}")  # fmt: skip
    fwd = [f"permute_forward(on, {d.out}, {d.ins[0]}, (long)B, {g});"]
    bwd = [f"permute_backward(on, {d.d_ins[0]}, {d.d_out}, (long)B, {g});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


register(
    OpSpec(
        "permute",
        "permute / transpose of per-sample axes (a copy)",
        _permute_infer,
        _permute_calls,
        saves=(),
        device=_permute_device,
    )
)


def _cat_infer(node, shapes, graph):
    dim = node.attrs["axis"]
    first = shapes[0]
    expect(0 <= dim < len(first), node, f"axis {dim} is not a per-sample axis of {first}")
    for s in shapes[1:]:
        expect(
            len(s) == len(first)
            and all(x == y for i, (x, y) in enumerate(zip(s, first, strict=True)) if i != dim),
            node,
            f"cannot concatenate per-sample shapes {[tuple(x) for x in shapes]} along axis "
            f"{dim} (the batch axis excluded): the other axes must agree",
        )
    return tuple(sum(s[dim] for s in shapes) if i == dim else d for i, d in enumerate(first))


def _cat_parts(node):
    """Rows per sample, the output's row length, and (row length, offset) of each input."""
    dim = node.attrs["axis"]
    parts, off = [], 0
    for s in node.in_shapes:
        parts.append((_n(s[dim:]), off))
        off += _n(s[dim:])
    return _n(node.out_shape[:dim]), _n(node.out_shape[dim:]), parts


def _cat_calls(node, graph, site):
    """One copy per input into its slice of each output row."""
    outer, n_out, parts = _cat_parts(node)
    return [
        Call("cat_part", (OUT, IN(i), INT(f"B * {outer}"), INT(n_in), INT(n_out), INT(off)))
        for i, (n_in, off) in enumerate(parts)
    ]


def _cat_device(node, graph, d):
    outer, n_out, parts = _cat_parts(node)
    fwd, bwd = [], []
    for x, dx, (n_in, off) in zip(d.ins, d.d_ins, parts, strict=True):
        shape = f"(long)B * {outer}, {n_in}, {n_out}, {off}"
        fwd.append(f"cat_part_forward(on, {d.out}, {x}, {shape});")
        if dx != "nullptr":
            bwd.append(f"cat_part_backward(on, {dx}, {d.d_out}, {shape});")
    return fwd, bwd


register(
    OpSpec(
        "cat",
        "torch.cat of tensors along a per-sample axis",
        _cat_infer,
        _cat_calls,
        arity=None,
        saves=(),
        device=_cat_device,
    )
)


# -- normalisation and softmax --------------------------------------------------------------
def _softmax_infer(node, shapes, graph):
    (shape,) = shapes
    axis = node.attrs["axis"]
    expect(0 <= axis < len(shape), node, f"axis {axis} is not a per-sample axis of {shape}")
    return shape


def _softmax_calls(node, graph, site):
    shape, axis = node.in_shape, node.attrs["axis"]
    outer, inner = _n(shape[:axis]), _n(shape[axis + 1 :])
    return [Call(node.op, (OUT, IN(0), INT(f"B * {outer}"), INT(shape[axis]), INT(inner)))]


def _softmax_device(node, graph, d):
    shape, axis = node.in_shape, node.attrs["axis"]
    lines = f"(long)B * {_n(shape[:axis])}, {shape[axis]}, {_n(shape[axis + 1 :])}"
    log_form = int(node.op == "log_softmax")
    fwd = [f"softmax_forward(on, {d.out}, {d.ins[0]}, {lines}, {log_form});"]
    bwd = [f"softmax_backward(on, {d.d_ins[0]}, {d.d_out}, {d.out}, {lines}, {log_form});"]
    return fwd, bwd if d.d_ins[0] != "nullptr" else []


def _softmax_module(mod, where):
    if mod.dim is None:
        raise IRError(f"{where}: give dim explicitly (implicit dim is deprecated in torch)")
    return {"dim": mod.dim}


for _name, _module in (("softmax", "Softmax"), ("log_softmax", "LogSoftmax")):
    register(
        OpSpec(
            _name,
            f"{_module} along a per-sample axis",
            _softmax_infer,
            _softmax_calls,
            saves=("out",),
            device=_softmax_device,
            modules=(_module,),
            from_module=_softmax_module,
            functions=(f"torch.{_name}", _F + _name, f"Tensor.{_name}"),
            from_call=lambda args, kw, where: {"dim": _arg(args, kw, 0, "dim", None)},
        )
    )


def _layer_norm_module(mod, where):
    return {"normalized_shape": tuple(mod.normalized_shape), "eps": float(mod.eps)}


def _layer_norm_infer(node, shapes, graph):
    (shape,) = shapes
    ns = tuple(node.attrs["normalized_shape"])
    expect(
        len(ns) <= len(shape) and tuple(shape[len(shape) - len(ns) :]) == ns,
        node,
        f"normalized_shape {ns} is not the trailing shape of the per-sample input {shape}",
    )
    for role in ("weight", "bias"):
        if role in node.params:
            p = graph.param(node.params[role])
            expect(p.shape == ns, node, f"{role} has shape {p.shape}, expected {ns}")
    return shape


def _layer_norm_rows(node):
    return _n(node.in_shape) // _n(node.attrs["normalized_shape"])


def _layer_norm_calls(node, graph, site):
    M = _n(node.attrs["normalized_shape"])
    args = (OUT, SCRATCH("stats"), IN(0), W("weight"), W("bias"))
    args += (INT(f"B * {_layer_norm_rows(node)}"), INT(M), REAL(float(node.attrs["eps"])))
    return [Call("layer_norm", args)]


def _layer_norm_device(node, graph, d):
    rows = f"(long)B * {_layer_norm_rows(node)}, {_n(node.attrs['normalized_shape'])}"
    stats = d.sample_scratch  # each row's mean and 1/std
    fwd = [f"layer_norm_forward(on, {d.out}, {stats}, {d.ins[0]}, {d.p('weight')}, "
           f"{d.p('bias')}, {rows}, T({float(node.attrs['eps'])!r}));"]  # fmt: skip
    bwd = [f"layer_norm_backward_params(on, {d.dp('weight')}, {d.dp('bias')}, {d.d_out}, "
           f"{d.ins[0]}, {stats}, {rows});"]  # fmt: skip
    if d.d_ins[0] != "nullptr":
        bwd.append(f"layer_norm_backward_input(on, {d.d_ins[0]}, {d.d_out}, {d.ins[0]}, {stats}, "
                   f"{d.p('weight')}, {rows});")  # fmt: skip
    return fwd, bwd, DeviceScratch(per_sample=2 * _layer_norm_rows(node))


register(
    OpSpec(
        "layer_norm",
        "LayerNorm over the trailing axes (with or without affine weights)",
        _layer_norm_infer,
        _layer_norm_calls,
        params=("weight", "bias"),
        scratch=lambda node, g: {"stats": 2 * _layer_norm_rows(node)},  # mean, 1/std per row
        saves=("in", "stats"),
        device=_layer_norm_device,
        modules=("LayerNorm",),
        from_module=_layer_norm_module,
    )
)


def _batch_norm_module(mod, where):
    if mod.momentum is None:
        raise IRError(f"{where}: momentum=None (a cumulative average) is not supported")
    return {"eps": float(mod.eps), "momentum": float(mod.momentum)}


def _batch_norm_infer(node, shapes, graph):
    (shape,) = shapes
    expect(
        len(shape) in (1, 2, 3),
        node,
        f"expected input (C,), (C, L) or (C, H, W), got per-sample shape {shape}",
    )
    for role in ("weight", "bias"):
        if role in node.params:
            p = graph.param(node.params[role])
            expect(p.shape == (shape[0],), node, f"{role} has shape {p.shape}, expected "
                   f"({shape[0]},) for {shape[0]} channels")  # fmt: skip
    return shape


def _batch_norm_calls(node, graph, site):
    C, S = node.in_shape[0], _n(node.in_shape[1:])
    a = node.attrs
    args = (OUT, SCRATCH("stats"), IN(0), W("weight"), W("bias"))
    args += (BUF("running_mean"), BUF("running_var"), BUF("num_batches_tracked"))
    args += (INT("B"), INT(C), INT(S), REAL(a["eps"]), REAL(a["momentum"]), INT("training"))
    return [Call("batch_norm", args)]


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


register(
    OpSpec(
        "batch_norm",
        "BatchNorm1d/2d: batch statistics in training mode (updating the running ones as "
        "torch), running statistics in eval mode",
        _batch_norm_infer,
        _batch_norm_calls,
        params=("weight", "bias"),
        buffers=("running_mean", "running_var", "num_batches_tracked"),
        # per channel: mean, 1/std; and one value for the batch's count (graph_ops.h)
        scratch=lambda node, g: {"stats": 2 * node.in_shape[0] + 1},
        saves=("in", "stats"),
        device=_batch_norm_device,
        modules=("BatchNorm1d", "BatchNorm2d"),
        from_module=_batch_norm_module,
    )
)
