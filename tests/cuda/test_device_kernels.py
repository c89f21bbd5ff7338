"""The CUDA kernels' bodies (rootclad/device_kernels.h, by family in device/), run on the CPU and checked against torch.

Each kernel is one body per element, launched on the GPU by dev::Cuda and looped over on the
CPU by dev::Host (rootclad/device.h). Here the host loop runs them, so their indexing and
arithmetic are tested on machines without a GPU; test_nvcc.py compiles the same source for
the GPU. Forward values against torch's, backward ones against torch autograd's, in float64
to 1e-12 and float32 to 1e-5; the backward kernels add into their adjoints (checked by
starting from non-zero ones)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import rootclad
from rootclad.toolchain import find_cxx

HERE = Path(__file__).resolve().parent
F64, F32 = torch.float64, torch.float32
SUFFIX = {F64: "f64", F32: "f32"}
TOL = {F64: {"rtol": 1e-12, "atol": 1e-12}, F32: {"rtol": 1e-4, "atol": 1e-4}}


def _host_kernels(tmp_path_factory, *flags):
    """The kernels built from the headers, their C entry points exported alone: exported
    unversioned, rootclad's C++ names would satisfy another library's references to its
    runtime's versioned ones once this library is in the global scope (ROOT's RDataFrame puts
    every library loaded there when it compiles an expression, test_data_bad_input.py's), and
    a device program built with other chunk sizes ran these kernels: a heap overflow, which
    glibc's checks caught."""
    cxx, _ = find_cxx()
    where = tmp_path_factory.mktemp("host_kernels")
    so, script = where / "host_kernels.so", where / "exports.map"
    script.write_text("{ global: *_f32; *_f64; conv_gemm_workspace; local: *; };\n")
    build = [cxx, "-O1", "-std=c++17", "-shared", "-fPIC", f"-I{rootclad.get_include()}", *flags]
    build += [str(HERE / "host_kernels.cpp"), "-o", str(so), f"-Wl,--version-script={script}"]
    subprocess.run(build, check=True)
    lib = ctypes.CDLL(str(so))
    lib.conv_gemm_workspace.restype = ctypes.c_long
    return lib


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return _host_kernels(tmp_path_factory)


SMALL_CHUNKS = 1000  # output positions per chunk of products, instead of 2^17


@pytest.fixture(scope="module")
def lib_small_chunks(tmp_path_factory):
    """The kernels with convolutions as products in chunks of at most SMALL_CHUNKS output
    positions (whole samples): several chunks, the last one short, at test sizes."""
    return _host_kernels(tmp_path_factory, f"-DROOTCLAD_CONV_GEMM_MAX_COLUMNS={SMALL_CHUNKS}")


def _call(lib, name, dtype, *args):
    """lib.<name>_<dtype>(...) with tensors passed as pointers, ints as C int or long."""
    conv = []
    for a in args:
        if isinstance(a, torch.Tensor):
            assert a.is_contiguous() and a.dtype == dtype
            conv.append(ctypes.c_void_p(a.data_ptr()))
        elif a is None:
            conv.append(ctypes.c_void_p(0))
        elif isinstance(a, float):
            conv.append(ctypes.c_double(a))
        else:
            conv.append(a)
    getattr(lib, f"{name}_{SUFFIX[dtype]}")(*conv)


def _long(n):
    return ctypes.c_long(n)


def _rand(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype)


def _grads(fn, inputs, d_out):
    """torch autograd's gradients of <fn(*inputs), d_out> w.r.t. the inputs."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    (fn(*leaves) * d_out).sum().backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(
    "R, C, OC, bias", [(5, 7, 3, True), (1, 2048, 256, True), (4, 64, 1, False)]
)
def test_linear(lib, dtype, R, C, OC, bias):
    x, w = _rand(R, C, dtype=dtype, seed=1), _rand(OC, C, dtype=dtype, seed=2)
    b = _rand(OC, dtype=dtype, seed=3) if bias else None
    out = torch.empty(R, OC, dtype=dtype)
    _call(lib, "linear_forward", dtype, out, x, w, b, R, C, OC)
    torch.testing.assert_close(out, F.linear(x, w, b), **TOL[dtype])
    dy = _rand(R, OC, dtype=dtype, seed=4)
    dx, dw = torch.ones(R, C, dtype=dtype), torch.ones(OC, C, dtype=dtype)
    db = torch.ones(OC, dtype=dtype) if bias else None
    _call(lib, "linear_backward", dtype, dx, dw, db, dy, x, w, R, C, OC)
    ref = _grads(lambda x, w, *b: F.linear(x, w, *b), [x, w] + ([b] if bias else []), dy)
    for got, want in zip([dx, dw] + ([db] if bias else []), ref, strict=True):
        torch.testing.assert_close(got, want + 1, **TOL[dtype])


@pytest.mark.parametrize("dtype", [F64, F32])
def test_relu(lib, dtype):
    x = _rand(3, 50, dtype=dtype)
    x[0, :5] = 0  # torch's gradient at 0 is 0
    out = torch.empty_like(x)
    _call(lib, "relu_forward", dtype, out, x, _long(x.numel()))
    torch.testing.assert_close(out, torch.relu(x), rtol=0, atol=0)
    dy, dx = _rand(3, 50, dtype=dtype, seed=5), torch.ones_like(x)
    _call(lib, "relu_backward", dtype, dx, dy, out, _long(x.numel()))
    torch.testing.assert_close(dx, _grads(torch.relu, [x], dy)[0] + 1, rtol=0, atol=0)


CONV1D = [  # B, C, L, OC, K, stride, padding, dilation
    (2, 3, 19, 4, 3, 1, 0, 1),
    (2, 2, 23, 3, 4, 2, 3, 2),
    (1, 1, 2048, 8, 16, 2, 0, 1),  # the GW CNN's first layer
    (3, 8, 31, 16, 7, 1, 3, 1),  # a residual block's
    (2, 4, 17, 2, 1, 3, 0, 1),
]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("B, C, L, OC, K, S, P, D", CONV1D)
def test_conv1d(lib, dtype, B, C, L, OC, K, S, P, D):
    x, w, b = (_rand(B, C, L, dtype=dtype, seed=1), _rand(OC, C, K, dtype=dtype, seed=2),
               _rand(OC, dtype=dtype, seed=3))  # fmt: skip
    ref = F.conv1d(x, w, b, stride=S, padding=P, dilation=D)
    out = torch.empty_like(ref)
    _call(lib, "conv1d_forward", dtype, out, x, w, b, B, C, L, OC, K, S, P, D)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    dy = _rand(*ref.shape, dtype=dtype, seed=4)
    dx, dw, db = torch.ones_like(x), torch.ones_like(w), torch.ones_like(b)
    _call(lib, "conv1d_backward", dtype, dx, dw, db, dy, x, w, B, C, L, OC, K, S, P, D)
    want = _grads(lambda x, w, b: F.conv1d(x, w, b, stride=S, padding=P, dilation=D), [x, w, b], dy)
    for got, ref_grad in zip([dx, dw, db], want, strict=True):
        torch.testing.assert_close(got, ref_grad + 1, **TOL[dtype])


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(
    "L, K, S, P", [(2048, 4, 4, 0), (13, 3, 2, 1), (11, 5, 3, 2), (9, 2, 1, 0)]
)
def test_maxpool1d(lib, dtype, L, K, S, P):
    x = _rand(3, 2, L, dtype=dtype)
    x[0, 0, :6] = 1.0  # ties: the first maximum takes the gradient, as in torch
    ref = F.max_pool1d(x, K, S, P)
    out = torch.empty_like(ref)
    R = 3 * 2
    _call(lib, "maxpool1d_forward", dtype, out, x, _long(R), L, K, S, P)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    dy, dx = _rand(*ref.shape, dtype=dtype, seed=6), torch.ones_like(x)
    _call(lib, "maxpool1d_backward", dtype, dx, dy, x, _long(R), L, K, S, P)
    want = _grads(lambda x: F.max_pool1d(x, K, S, P), [x], dy)[0]
    torch.testing.assert_close(dx, want + 1, **TOL[dtype])


def _ints(*values):
    return (ctypes.c_int * len(values))(*values)


CONV2D = [  # B, C, H, W, OC, (KH, KW), stride, padding, dilation, groups
    (2, 1, 12, 12, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # the digit CNN's shapes
    (2, 4, 9, 11, 6, (3, 2), (2, 1), (1, 0), (1, 2), 2),
    (1, 6, 8, 8, 6, (3, 3), (1, 2), (2, 1), (2, 1), 6),  # depthwise
    (3, 2, 5, 7, 3, (1, 1), (1, 1), (0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("B, C, H, W, OC, K, S, P, D, G", CONV2D)
def test_conv2d(lib, dtype, B, C, H, W, OC, K, S, P, D, G):
    x, w, b = (_rand(B, C, H, W, dtype=dtype, seed=1), _rand(OC, C // G, *K, dtype=dtype, seed=2),
               _rand(OC, dtype=dtype, seed=3))  # fmt: skip

    def conv(x, w, b):
        return F.conv2d(x, w, b, stride=S, padding=P, dilation=D, groups=G)

    ref = conv(x, w, b)
    dy = _rand(*ref.shape, dtype=dtype, seed=4)
    out, dx, dw, db = (torch.empty_like(ref), torch.ones_like(x), torch.ones_like(w),
                       torch.ones_like(b))  # fmt: skip
    _call(lib, "conv2d", dtype, out, dx, dw, db, dy, x, w, b, B,
          _ints(C, H, W, OC, *K, *S, *P, *D, G), None)  # fmt: skip
    torch.testing.assert_close(out, ref, **TOL[dtype])
    for got, want in zip([dx, dw, db], _grads(conv, [x, w, b], dy), strict=True):
        torch.testing.assert_close(got, want + 1, **TOL[dtype])


CONV_GEMM_MIN_COLUMNS = 4096  # device_kernels.h: from so many output positions over the batch
CONV_GEMM_MAX_COLUMNS = 1 << 17  # device_kernels.h: at most so many per chunk of products
CONV_AS_PRODUCTS = [  # B, C, H, W, OC, (KH, KW), stride, padding, dilation (one group)
    (15, 3, 20, 30, 5, (3, 2), (2, 1), (1, 0), (1, 2)),
    (42, 4, 1, 300, 6, (1, 5), (1, 3), (0, 2), (1, 2)),  # 1-D: strided, padded, dilated
    (32, 8, 1, 128, 16, (1, 1), (1, 1), (0, 0), (1, 1)),  # 1x1 (the ResNet's widening)
    (9, 16, 1, 508, 32, (1, 8), (1, 1), (0, 0), (1, 1)),  # the GW CNN's second layer
]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("wanted", ["all", "no-dx", "dx-only", "all, tanh fused"])
@pytest.mark.parametrize("chunks", ["one", "several"])
@pytest.mark.parametrize("B, C, H, W, OC, K, S, P, D", CONV_AS_PRODUCTS)
def test_conv2d_as_products(request, dtype, wanted, chunks, B, C, H, W, OC, K, S, P, D):
    """With a workspace and enough output positions over the batch, a one-group convolution
    runs as im2col and gemm (the column-major calls cuBLAS gets on the GPU, here as loops), in
    one chunk of samples or (SMALL_CHUNKS) several, the last one short: the forward and each
    adjoint that is asked for against torch (also with a Tanh fused into the convolution, whose
    backward reads the output adjoint through it). The workspace is as large as a chunk's columns
    and channel-major output: used, and not a value past it; one sample fewer than the
    threshold needs none (the direct kernels) and leaves it alone."""
    lib = request.getfixturevalue("lib" if chunks == "one" else "lib_small_chunks")
    x, w, b = (_rand(B, C, H, W, dtype=dtype, seed=1), _rand(OC, C, *K, dtype=dtype, seed=2),
               _rand(OC, dtype=dtype, seed=3))  # fmt: skip

    fused = wanted == "all, tanh fused"

    def conv(x, w, b):
        y = F.conv2d(x, w, b, stride=S, padding=P, dilation=D)
        return torch.tanh(y) if fused else y

    ref = conv(x, w, b)
    positions = ref.shape[2] * ref.shape[3]
    header = (Path(rootclad.get_include()) / "rootclad" / "device" / "conv.h").read_text()
    assert f"constexpr long CONV_GEMM_MIN_COLUMNS = {CONV_GEMM_MIN_COLUMNS};" in header
    assert (
        f"#define ROOTCLAD_CONV_GEMM_MAX_COLUMNS (1L << {CONV_GEMM_MAX_COLUMNS.bit_length() - 1})"
        in header
    )
    assert B * positions >= CONV_GEMM_MIN_COLUMNS > (B - 1) * positions
    per_chunk = max(1, (CONV_GEMM_MAX_COLUMNS if chunks == "one" else SMALL_CHUNKS) // positions)
    assert (per_chunk >= B) == (chunks == "one")
    dy = _rand(*ref.shape, dtype=dtype, seed=4)
    out, dx, dw, db = (torch.empty_like(ref), torch.ones_like(x), torch.ones_like(w),
                       torch.ones_like(b))  # fmt: skip
    grads = {"no-dx": (None, dw, db), "dx-only": (dx, None, None)}.get(wanted, (dx, dw, db))
    geometry = _ints(C, H, W, OC, *K, *S, *P, *D, 1)
    size = (C * K[0] * K[1] + OC) * positions * min(B, per_chunk)
    assert lib.conv_gemm_workspace(B, geometry) == size
    work = torch.full((size + 1,), float("nan"), dtype=dtype)
    work[-1] = 7.0  # one value past the end
    kernel = "conv2d_tanh" if fused else "conv2d"
    _call(lib, kernel, dtype, out, *grads, dy, x, w, b, B, geometry, work)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    for got, want in zip(grads, _grads(conv, [x, w, b], dy), strict=True):
        if got is not None:
            torch.testing.assert_close(got, want + 1, **TOL[dtype])
    assert not work.isnan().all() and work[-1] == 7.0
    fewer = B - 1  # the direct kernels, the workspace untouched
    assert lib.conv_gemm_workspace(fewer, geometry) == 0
    work.fill_(float("nan"))
    out = torch.empty(fewer, *ref.shape[1:], dtype=dtype)
    _call(lib, kernel, dtype, out, None, None, None, dy[:fewer], x[:fewer], w, b, fewer,
          geometry, work)  # fmt: skip
    torch.testing.assert_close(out, ref[:fewer], **TOL[dtype])
    assert work.isnan().all()


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("kind", ["max", "avg", "avg-exclude-pad"])
@pytest.mark.parametrize("H, W, K, S, P", [(12, 12, (2, 2), (2, 2), (0, 0)),
                                           (9, 7, (3, 2), (2, 1), (1, 1)),
                                           (5, 8, (3, 3), (1, 3), (1, 0))])  # fmt: skip
def test_pool2d(lib, dtype, kind, H, W, K, S, P):
    x = _rand(2, 3, H, W, dtype=dtype)
    x[0, 0, :2, :3] = 1.0  # ties: the first maximum takes the gradient, as in torch
    if kind == "max":

        def pool(x):
            return F.max_pool2d(x, K, S, P)
    else:

        def pool(x):
            return F.avg_pool2d(x, K, S, P, count_include_pad=kind == "avg")

    ref = pool(x)
    dy = _rand(*ref.shape, dtype=dtype, seed=6)
    out, dx = torch.empty_like(ref), torch.ones_like(x)
    _call(lib, "pool2d", dtype, out, dx, dy, x, _long(6), _ints(H, W, *K, *S, *P),
          int(kind != "max"), int(kind == "avg"))  # fmt: skip
    torch.testing.assert_close(out, ref, **TOL[dtype])
    torch.testing.assert_close(dx, _grads(pool, [x], dy)[0] + 1, **TOL[dtype])


@pytest.mark.parametrize("dtype", [F64, F32])
def test_bce_with_logits(lib, dtype):
    z = _rand(37, dtype=dtype) * 30  # large logits: the stable form
    y = (torch.arange(37) % 2).to(dtype)
    loss, dz = torch.zeros(1, dtype=dtype), torch.empty_like(z)
    _call(lib, "bce_with_logits", dtype, loss, dz, z, y, _long(37))
    torch.testing.assert_close(loss[0], F.binary_cross_entropy_with_logits(z, y), **TOL[dtype])
    want = _grads(lambda z: F.binary_cross_entropy_with_logits(z, y), [z], torch.ones(()))[0]
    torch.testing.assert_close(dz, want, **TOL[dtype])


def _config(kind, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
            betas=(0.9, 0.999), eps=1e-8):  # fmt: skip
    """rootclad::OptimConfig as the double array the kernels read (rootclad/optim_rule.h)."""
    values = (kind, lr, momentum, dampening, weight_decay, float(nesterov), *betas, eps)
    return (ctypes.c_double * len(values))(*values)


OPTIMIZERS = {
    "adam": (lambda p: torch.optim.Adam(p, lr=1e-2), _config(1, 1e-2)),
    "adam_l2": (
        lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.01),
        _config(1, 1e-2, weight_decay=0.01),
    ),  # fmt: skip
    "adamw": (
        lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1),
        _config(2, 1e-2, weight_decay=0.1, betas=(0.8, 0.99)),
    ),  # fmt: skip
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), _config(0, 0.1)),
    "sgd_nesterov": (
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        _config(0, 0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ),
    "sgd_dampening": (
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, dampening=0.3),
        _config(0, 0.1, momentum=0.5, dampening=0.3),
    ),  # fmt: skip
}


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_optimizer_step_matches_torch_optim(lib, dtype, kind):
    make, cfg = OPTIMIZERS[kind]
    p = _rand(100, dtype=dtype)
    ref = p.clone().requires_grad_(True)
    opt = make([ref])
    state = torch.zeros(200, dtype=dtype)
    for t in range(1, 6):
        g = _rand(100, dtype=dtype, seed=10 + t)
        ref.grad = g.clone()
        opt.step()
        _call(lib, "optim_step", dtype, p, g, state, _long(100), cfg, _long(t))
    torch.testing.assert_close(p, ref.detach(), **TOL[dtype])


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_optimizer_step_in_memory_equals_the_step_by_value(lib, kind):
    """optim_step_in_memory, which reads its configuration and step count from memory (as a
    replayed CUDA graph does) and advances the count: 5 steps equal the by-value steps bit for
    bit, and the count ends at 6."""
    _, cfg = OPTIMIZERS[kind]
    p, q = _rand(100, dtype=F64), _rand(100, dtype=F64)
    state_p, state_q = torch.zeros(200, dtype=F64), torch.zeros(200, dtype=F64)
    step = torch.ones(1, dtype=torch.int64)
    for t in range(1, 6):
        g = _rand(100, dtype=F64, seed=10 + t)
        _call(lib, "optim_step", F64, p, g, state_p, _long(100), cfg, _long(t))
        _call(lib, "optim_step_in_memory", F64, q, g, state_q, _long(100), cfg,
              ctypes.c_void_p(step.data_ptr()))  # fmt: skip
    assert torch.equal(q, p) and torch.equal(state_q, state_p)
    assert int(step) == 6


def test_the_gw_mlp_trains_through_the_device_kernels(lib):
    """The GW MLP's forward, loss, backward and Adam composed from the kernels, 20 steps,
    against torch's model, loss and optimizer (float64)."""
    from rootclad.gw.models import gw_mlp

    torch.manual_seed(0)
    net = gw_mlp(64).double()
    ours = [p.detach().clone().contiguous() for p in net.parameters()]
    state = [torch.zeros(2 * p.numel(), dtype=F64) for p in ours]
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    B = 6
    for step in range(1, 21):
        x = _rand(B, 64, dtype=F64, seed=step)
        y = (torch.arange(B) % 2).to(F64)
        opt.zero_grad()
        ref_loss = F.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
        ref_loss.backward()
        opt.step()
        loss = _mlp_step(lib, ours, state, x, y, step)
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-12, atol=1e-12)
    for got, want in zip(ours, net.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)


def _mlp_step(lib, params, state, x, y, step):
    """One Adam step of Linear-ReLU-Linear-ReLU-Linear with BCE, through the kernels."""
    B = x.shape[0]
    acts, pre = [x], []
    for i in range(0, len(params), 2):
        w, b = params[i], params[i + 1]
        OC, C = w.shape
        out = torch.empty(B, OC, dtype=F64)
        _call(lib, "linear_forward", F64, out, acts[-1], w, b, B, C, OC)
        pre.append(out)
        if i + 2 < len(params):
            r = torch.empty_like(out)
            _call(lib, "relu_forward", F64, r, out, _long(out.numel()))
            acts.append(r)
    loss, d = torch.zeros(1, dtype=F64), torch.empty(B, dtype=F64)
    _call(lib, "bce_with_logits", F64, loss, d, pre[-1].reshape(-1).contiguous(), y, _long(B))
    d = d.reshape(B, 1)
    grads = [torch.zeros_like(p) for p in params]
    for layer in reversed(range(len(pre))):
        w = params[2 * layer]
        OC, C = w.shape
        if layer + 1 < len(pre):  # through the ReLU after this layer
            dr = torch.zeros_like(pre[layer])
            _call(lib, "relu_backward", F64, dr, d, acts[layer + 1], _long(d.numel()))
            d = dr
        dx = torch.zeros(B, C, dtype=F64)
        _call(lib, "linear_backward", F64, dx, grads[2 * layer], grads[2 * layer + 1], d,
              acts[layer], w, B, C, OC)  # fmt: skip
        d = dx
    for p, g, s in zip(params, grads, state, strict=True):
        _call(lib, "optim_step", F64, p, g, s, _long(p.numel()), _config(1, 1e-3), _long(step))
    return loss[0]


def test_a_wrong_kernel_fails_these_checks(lib):
    """The comparison above fails on a wrong answer: conv1d run with its dilation dropped
    (padding 1, dilation 1) against torch's padding 2, dilation 2, of the same length."""
    x, w = _rand(1, 2, 15, dtype=F64), _rand(3, 2, 3, dtype=F64)
    out = torch.empty(1, 3, 15, dtype=F64)
    _call(lib, "conv1d_forward", F64, out, x, w, None, 1, 2, 15, 3, 3, 1, 1, 1)
    with pytest.raises(AssertionError, match="not close"):
        torch.testing.assert_close(out, F.conv1d(x, w, padding=2, dilation=2), **TOL[F64])


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("ta, tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_passes_blas_arguments_that_give_the_row_major_product(lib, ta, tb, dtype):
    """dev::gemm's row-major product, through the column-major call cuBLAS receives (run by
    colmajor_gemm's loops on the host), against torch: both transpositions, leading
    dimensions wider than the matrices, alpha and beta; beta = 0 ignores C (NaN there)."""
    M, N, K, pad = 5, 7, 3, 2
    a = _rand(*((K, M) if ta else (M, K)), dtype=dtype, seed=1)
    b = _rand(*((N, K) if tb else (K, N)), dtype=dtype, seed=2)
    c0 = _rand(M, N, dtype=dtype, seed=3)
    A = torch.zeros(a.shape[0], a.shape[1] + pad, dtype=dtype)
    B = torch.zeros(b.shape[0], b.shape[1] + pad, dtype=dtype)
    C = torch.full((M, N + pad), 5.0, dtype=dtype)
    A[:, : a.shape[1]], B[:, : b.shape[1]], C[:, :N] = a, b, c0
    opa, opb = (a.T if ta else a).double(), (b.T if tb else b).double()
    _call(lib, "gemm", dtype, ta, tb, M, N, K, 0.7, A, A.shape[1], B, B.shape[1], 0.3, C,
          C.shape[1])  # fmt: skip
    want = 0.7 * opa @ opb + 0.3 * c0.double()
    torch.testing.assert_close(C[:, :N].double(), want, **TOL[dtype])
    assert (C[:, N:] == 5.0).all()  # outside the matrix: untouched
    C[:, :N] = float("nan")
    _call(lib, "gemm", dtype, ta, tb, M, N, K, 1.0, A, A.shape[1], B, B.shape[1], 0.0, C,
          C.shape[1])  # fmt: skip
    torch.testing.assert_close(C[:, :N].double(), opa @ opb, **TOL[dtype])
