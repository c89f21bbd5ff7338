"""Per-op harness: forward and VJP of every kernel against torch, through ``rootclad.compile``.

Each case is a one-layer model (or layer + Flatten/Linear) compiled with the pullback engine;
``cm(x)`` runs the C++ forward, ``torch.autograd.grad`` with a random upstream gradient runs
the compiled VJP. The reference is torch in float64 on the same (dtype-rounded) numbers:
float64 must agree to 1e-10 relative, float32 to 1e-4. Every case runs in float64; the
float32 cases are those whose float32 code differs beyond the element type (BLAS calls,
index arithmetic, transcendental functions); the mixed model in test_core_models runs every
op in float32 too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures.core import (
    RTOL,
    assert_close_rel,
    assert_grads_close,
    check_against_torch,
)
from fixtures.op_cases import (
    CASES,
    MASK_CASES,
    Fn,
    Tied,
    Tokens,
    dtype_params,
    index_input,
    mask_input,
    sample_input,
    seq,
)
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.frontends.aten import graph_from_export
from rootclad.ir import OPS

F64, F32 = torch.float64, torch.float32


PARAMS = dtype_params()
# case -> the IR ops of its compiled model (float64), for the registry's coverage below
COVERED: dict[str, set] = {}


@pytest.mark.parametrize("build, shape, dtype, rtol", PARAMS)
def test_op_forward_and_vjp_match_torch(request, build, shape, dtype, rtol):
    torch.manual_seed(0)
    net = build()
    cm = check_against_torch(net, sample_input(shape), dtype, rtol=rtol)
    assert cm.engine == "pullback"
    assert [n for n, _ in cm.named_parameters()] == [n for n, _ in net.named_parameters()]
    if dtype == F64:
        COVERED[request.node.callspec.id] = {node.op for node in cm.graph.nodes}
        _input_grad_alone(cm, shape)


def _input_grad_alone(cm, shape) -> None:
    """cm.input_grad asks for the inputs' gradient alone, and the pullback engine's kernels
    then skip every parameter's (a null d_weight): the result must equal autograd's through
    the full VJP."""
    x = sample_input(shape, B=4)
    d_out = torch.randn(4, *cm.output_shape, dtype=F64)
    xr = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(cm(xr), xr, d_out)
    assert_close_rel(cm.input_grad(x, d_out=d_out), want, 1e-12, "input_grad")


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", [True, False], ids=["pullbacks", "clad-loops"])
@pytest.mark.parametrize("build, shape, dtype, rtol", PARAMS)
def test_op_on_the_clad_engine_matches_torch(clad, build, shape, dtype, rtol, pullbacks):
    """Every case again with Clad writing the backward: over the custom pullbacks, and
    differentiating the kernels' loops itself (skipped, saying why, without Clad)."""
    torch.manual_seed(0)
    net = build()
    if not pullbacks and isinstance(net, Tied):
        pytest.skip("amax over tied values needs pullbacks=True (Clad differentiating the loop "
                    "gives a tie's gradient to one element, torch shares it)")  # fmt: skip
    if not pullbacks and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        pytest.skip("BatchNorm needs pullbacks=True (Clad's own sweep would restore its running "
                    "statistics)")  # fmt: skip
    cm = check_against_torch(net, sample_input(shape), dtype, rtol=rtol, engine="clad",
                             pullbacks=pullbacks)  # fmt: skip
    assert cm.engine == "clad" and cm.pullbacks == pullbacks


def test_every_registered_op_has_a_case_here():
    """Each op of the registry (rootclad/ir/ops/) appears in a case above, so that adding an
    op without a torch reference case fails here (the cases' ops as the float64 runs above
    compiled them)."""
    covered = set().union(*COVERED.values())
    for name, build, shape, _ in CASES:  # those not run above (a -k selection)
        if f"{name}-f64" not in COVERED:
            covered |= {
                node.op for node in graph_from_export(build(), sample_input(shape), "float64").nodes
            }
    for _, build, shapes, kind in MASK_CASES:  # models of two inputs: tests/torch/test_masks.py
        graph = graph_from_export(build(), mask_input(shapes, kind), "float64")
        covered |= {node.op for node in graph.nodes}
    covered |= {n.op for n in graph_from_export(Tokens().double(), index_input(), "float64").nodes}
    missing = sorted(set(OPS) - covered)
    assert not missing, f"ops without a case in CASES: {missing}"


def test_every_convolution_path_over_chunks_of_the_batch():
    """Each Conv2d path of conv2d_impl.h (pointwise and im2col per sample from 1024 outputs on,
    side by side below; depthwise strided and over the flat plane) on a batch of 40, which the
    runtime splits into chunks (a chunk's kernels start past sample 0), against torch."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 1),  # pointwise, 64x64: per sample
        nn.Conv2d(8, 8, 3, stride=2, padding=1),  # im2col, 32x32: per sample
        nn.Tanh(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8),  # depthwise, strided rows
        nn.Conv2d(8, 8, 3, stride=2, padding=1),  # im2col, 8x8: side by side
        nn.Conv2d(8, 4, 1),  # pointwise, 8x8: side by side
        nn.Tanh(),
        nn.Conv2d(4, 4, 3, padding=1, groups=4),  # depthwise, the flat plane
        nn.Flatten(),
        nn.Linear(256, 2),
    )
    check_against_torch(net, sample_input((3, 64, 64), B=40))


def test_op_compiled_model_serves_other_batch_sizes():
    """The batch is a run-time argument: one library, batches 1, 7 and 2 in that order."""
    torch.manual_seed(0)
    net = seq(nn.Conv1d(8, 4, 5))  # a case above: the library is already built
    for B in (1, 7, 2):
        check_against_torch(net, sample_input((8, 12), B=B, seed=B))


# Products with one row, one column or a depth of one go to GEMV / GER instead of GEMM
# (blas.h): batch 1, one output feature, one input feature, with and without bias (beta 0
# and 1). (id, builder, per-sample input shape, batch)
# fmt: off
GEMV_CASES = [
    ("linear-5to3-b1", lambda: seq(nn.Linear(5, 3)), (5,), 1),
    ("linear-5to3-nobias-b1", lambda: seq(nn.Linear(5, 3, bias=False)), (5,), 1),
    ("linear-5to1-b3", lambda: seq(nn.Linear(5, 1)), (5,), 3),
    ("linear-5to1-nobias-b1", lambda: seq(nn.Linear(5, 1, bias=False)), (5,), 1),
    ("linear-1to4-b3", lambda: seq(nn.Linear(1, 4)), (1,), 3),
    ("linear-1to4-nobias-b3", lambda: seq(nn.Linear(1, 4, bias=False)), (1,), 3),
    ("linear-3d-4x5to3-b1", lambda: seq(nn.Linear(5, 3)), (4, 5), 1),
    ("mlp-6to4to1-b1", lambda: seq(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 1)), (6,), 1),
]
# fmt: on


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("build, shape, B", [pytest.param(*c[1:], id=c[0]) for c in GEMV_CASES])
def test_linear_as_gemv_and_ger_matches_torch(build, shape, B, dtype):
    torch.manual_seed(0)
    check_against_torch(build(), sample_input(shape, B=B), dtype)


# Upstream gradients with one nonzero in 4 positions (or fewer): conv1d_sparse.h's backward
# pass, for layers of C*K >= 64 taps. (id, builder, per-sample input shape, one nonzero in)
# fmt: off
SPARSE_CASES = [
    # 128 taps: whole vectors in float32 and float64; every tap inside the input
    ("conv-s1-16to5-k8", lambda: seq(nn.Conv1d(16, 5, 8)), (16, 40), 4),
    # 64 taps, padding: the first and last nonzeros take the loop per tap
    ("conv-s1-8to3-k8-p3", lambda: seq(nn.Conv1d(8, 3, 8, padding=3)), (8, 30), 4),
    # 70 taps: whole vectors and a tail of elements; no bias
    ("conv-s1-7to4-k10-nobias", lambda: seq(nn.Conv1d(7, 4, 10, bias=False)), (7, 33), 5),
    # 65 taps, stride 2 and padding; dilation 2 (a loop per tap for every nonzero)
    ("conv-5to4-k13-s2-p2", lambda: seq(nn.Conv1d(5, 4, 13, stride=2, padding=2)), (5, 41), 4),
    ("conv-9to3-k8-d2-p4", lambda: seq(nn.Conv1d(9, 3, 8, padding=4, dilation=2)), (9, 37), 8),
]
# fmt: on


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize(
    "build, shape, every", [pytest.param(*c[1:], id=c[0]) for c in SPARSE_CASES]
)
def test_conv_backward_on_sparse_upstream_gradients_matches_torch(build, shape, every, dtype):
    torch.manual_seed(0)
    check_against_torch(build(), sample_input(shape, B=4), dtype, every=every)


@pytest.mark.parametrize("K", [4, 5])
def test_maxpool_ties_send_the_gradient_to_the_first_maximum(K):
    """Windows with repeated maxima (small integers, and -0.0 next to 0.0): the gradient goes
    to the element torch picks, the first maximum, in both window-search paths."""
    gen = torch.Generator().manual_seed(K)
    x = torch.randint(-1, 2, (4, 2, 8 * K + 3), generator=gen).to(F64)
    x[0, 0, :2] = torch.tensor([-0.0, 0.0], dtype=F64)
    x[0, 0, 2:K] = -1.0
    check_against_torch(seq(nn.MaxPool1d(K)), x)


# inputs exactly on the bounds: torch's hardtanh/relu6 give no gradient there, its clamp does
_ON_BOUNDS = [
    pytest.param(lambda: seq(nn.ReLU6()), (0.0, 6.0), id="ReLU6"),
    pytest.param(lambda: seq(nn.Hardtanh(-0.5, 0.75)), (-0.5, 0.75), id="Hardtanh"),
    pytest.param(lambda: Fn(lambda x: F.relu6(x)), (0.0, 6.0), id="F.relu6"),
    pytest.param(lambda: Fn(lambda x: x.clamp(-0.5, 0.75)), (-0.5, 0.75), id="clamp"),
    pytest.param(lambda: Fn(lambda x: torch.clamp(x, min=0.0)), (0.0, 0.0), id="clamp-min"),
]


def _on_bounds(lo, hi):
    x = sample_input((3, 8), B=2)
    x[:, :, :4] = torch.tensor([lo, hi, lo, hi], dtype=F64)
    return x


@pytest.mark.parametrize("build, bounds", _ON_BOUNDS)
def test_clamps_on_their_bounds_pass_the_gradient_as_torch_does(build, bounds):
    check_against_torch(build(), _on_bounds(*bounds))


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", [True, False], ids=["pullbacks", "clad-loops"])
@pytest.mark.parametrize("build, bounds", _ON_BOUNDS)
def test_clamps_on_their_bounds_on_the_clad_engine(clad, build, bounds, pullbacks):
    """Clad differentiating the functor's f (pullbacks=False) takes the branch f takes on the
    bound: f must agree with grad there."""
    check_against_torch(build(), _on_bounds(*bounds), engine="clad", pullbacks=pullbacks)


# -- losses ------------------------------------------------------------------------------
def _loss_case(loss, dtype, B=5, C=6, K=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = seq(nn.Linear(C, K)).to(dtype)
    x = torch.randn(B, C, generator=gen, dtype=F64).to(dtype)
    if loss in ("cross_entropy", "nll"):
        y = torch.randint(0, K, (B,), generator=gen)
    elif loss == "bce_with_logits":
        y = torch.rand(B, K, generator=gen, dtype=F64).round()
        y[0] = torch.rand(K, generator=gen, dtype=F64)  # soft labels too
    else:  # huber: differences on both sides of its delta of 1
        y = 2 * torch.randn(B, K, generator=gen, dtype=F64)
    return net, x, y


def _loss_reference(loss, net, x, y):
    """torch's loss and parameter gradients in float64, written out from the formulas."""
    ref = net.to(F64)
    z = ref(x.to(F64))
    if loss == "bce_with_logits":
        value = torch.nn.functional.binary_cross_entropy_with_logits(z, y.to(F64))
    elif loss == "cross_entropy":
        value = torch.nn.functional.cross_entropy(z, y)
    elif loss == "nll":
        value = torch.nn.functional.nll_loss(z, y)  # any numbers; test_core_graph: LogSoftmax
    elif loss == "huber":
        value = torch.nn.functional.huber_loss(z, y.to(F64))
    else:
        value = torch.nn.functional.mse_loss(z, y.to(F64))
    grads = torch.autograd.grad(value, list(ref.parameters()))
    return value.detach(), dict(zip([n for n, _ in ref.named_parameters()], grads, strict=True))


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("loss", ["bce_with_logits", "cross_entropy", "mse", "nll", "huber"])
def test_loss_value_and_gradient_match_torch(loss, dtype):
    net, x, y = _loss_case(loss, dtype)
    cm = rootclad.compile(net, example_input=x, loss=loss, engine="pullback")
    value, grads = cm.loss_and_grad(x, y)
    # B=5 <= C=6 random rows: d_weight = d_logits^T x pins down every logit's gradient
    ref_value, ref_grads = _loss_reference(loss, net, x, y)
    assert value.dtype == dtype
    assert_close_rel(value, ref_value, RTOL[dtype], f"{loss} value")
    assert_grads_close(grads, ref_grads, RTOL[dtype], loss)


@pytest.mark.parametrize("loss", ["bce_with_logits", "cross_entropy", "mse", "nll", "huber"])
def test_loss_targets_in_other_layouts(loss):
    """int32 class indices, and bce/mse targets in another memory layout (the output's
    shape, transposed in memory), are accepted."""
    net, x, y = _loss_case(loss, F64, B=4, seed=3)
    cm = rootclad.compile(net, example_input=x, loss=loss, engine="pullback")
    ref_value, ref_grads = _loss_reference(loss, net, x, y)
    if loss in ("cross_entropy", "nll"):
        y_other = y.to(torch.int32)
    else:
        y_other = y.t().contiguous().t()
        assert not y_other.is_contiguous()
    value, grads = cm.loss_and_grad(x, y_other)
    assert_close_rel(value, ref_value, 1e-10, loss)
    assert_grads_close(grads, ref_grads, 1e-10, loss)


@pytest.mark.parametrize("loss", ["bce_with_logits", "cross_entropy"])
def test_loss_is_stable_for_huge_logits(loss):
    """Logits of +-800 overflow a naive exp; torch's stable forms stay finite and so must ours."""
    net, x, y = _loss_case(loss, F64, B=4, K=3, seed=5)
    with torch.no_grad():
        net[0].bias.copy_(torch.tensor([800.0, -800.0, 400.0], dtype=F64))
    cm = rootclad.compile(net, example_input=x, loss=loss, engine="pullback")
    value, grads = cm.loss_and_grad(x, y)
    ref_value, ref_grads = _loss_reference(loss, net, x, y)
    assert_close_rel(value, ref_value, 1e-10, loss)
    assert_grads_close(grads, ref_grads, 1e-10, loss)


def test_direct_convolution_thresholds_match_the_kernels():
    """cpu_ops.py gives the direct convolution paths no im2col scratch by the same test the kernels
    make; if the constants drifted apart a kernel would write columns into memory the plan
    gave to other values."""
    import re

    from rootclad.codegen import cpu_ops as ops

    inc = Path(rootclad.get_include()) / "rootclad"
    conv2d = (inc / "ops" / "conv2d_direct.h").read_text()  # the paths without columns
    kernels = (inc / "ops" / "conv1d_impl.h").read_text()

    def const(text, name):
        return int(re.search(rf"constexpr int {name} = (\d+);", text).group(1))

    assert const(conv2d, "MAX_TAPS") == ops.CONV2D_DIRECT_MAX_TAPS
    assert const(conv2d, "MIN_ROW") == ops.CONV2D_DIRECT_MIN_ROW
    assert const(kernels, "CONV1D_DIRECT_MAX_TAPS") == ops.CONV1D_DIRECT_MAX_TAPS

    def applies(space):  # the test conv2d_<space>::applies makes, whitespace folded
        body = conv2d[conv2d.index(f"namespace conv2d_{space} {{") :]
        found = re.search(r"bool applies\(const Conv2dShape& s\) \{\s*return ([^;]+);", body)
        return " ".join(found.group(1).split())

    # the kernels' tests, as cpu_ops.depthwise and cpu_ops.pointwise make them
    assert applies("dw") == "s.G > 1 && s.C == s.G"
    assert applies("pw") == (
        "s.KH == 1 && s.KW == 1 && s.SH == 1 && s.SW == 1 && s.PH == 0 && s.PW == 0 && s.G == 1"
    )
    assert ops.depthwise(8, 8) and not ops.depthwise(8, 4) and not ops.depthwise(1, 1)
    one = {"stride": (1, 1), "padding": (0, 0), "groups": 1}
    assert ops.pointwise((1, 1), one)
    for k, other in [
        ((1, 3), {}),
        ((1, 1), {"stride": (2, 1)}),
        ((1, 1), {"padding": (0, 1)}),
        ((1, 1), {"groups": 2}),
    ]:
        assert not ops.pointwise(k, {**one, **other})
