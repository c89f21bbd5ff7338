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
from core_helpers import (
    RTOL,
    assert_close_rel,
    assert_grads_close,
    check_against_torch,
    perturbed,
)
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.frontends.torch_fx import graph_from_module
from rootclad.ir import OPS

F64, F32 = torch.float64, torch.float32


def _seq(*layers):
    return nn.Sequential(*layers).double()


# (id, builder of the net, per-sample input shape, also run in float32)
# fmt: off
CASES = [
    ("linear", lambda: _seq(nn.Linear(5, 3)), (5,), False),
    ("linear-nobias", lambda: _seq(nn.Linear(5, 3, bias=False)), (5,), False),
    ("linear-3d", lambda: _seq(nn.Linear(5, 3)), (4, 5), True),
    # C*K <= 32 taps: a direct convolution in kernels.h
    ("conv-1to4-k3", lambda: _seq(nn.Conv1d(1, 4, 3)), (1, 17), False),
    ("conv-3to2-k5-s2-p2-nobias", lambda: _seq(nn.Conv1d(3, 2, 5, stride=2, padding=2, bias=False)), (3, 16), True),
    ("conv-2to5-k3-s3-p1-d2", lambda: _seq(nn.Conv1d(2, 5, 3, stride=3, padding=1, dilation=2)), (2, 20), False),
    ("conv-2to3-k4-d3-p3-nobias", lambda: _seq(nn.Conv1d(2, 3, 4, padding=3, dilation=3, bias=False)), (2, 11), False),
    # stride 1, rows of at least one vector: the register-blocked kernels of conv1d_s1.h
    # (10 channels: one block of 8 and 2 single rows; K=5: a block of 4 taps and one more)
    ("conv-s1-3to10-k5", lambda: _seq(nn.Conv1d(3, 10, 5)), (3, 70), True),
    ("conv-s1-4to5-k6-p3-d2-nobias", lambda: _seq(nn.Conv1d(4, 5, 6, padding=3, dilation=2, bias=False)), (4, 41), True),
    ("conv-s1-2to3-k3-one-vector", lambda: _seq(nn.Conv1d(2, 3, 3)), (2, 20), True),
    ("conv-s1-1to2-k40-short-rows", lambda: _seq(nn.Conv1d(1, 2, 40, padding=1)), (1, 45), False),
    # C*K > 32 taps and stride > 1: im2col and a GEMM
    ("conv-8to4-k5", lambda: _seq(nn.Conv1d(8, 4, 5)), (8, 12), True),
    ("conv-6to3-k7-s2-p3-d2-nobias", lambda: _seq(nn.Conv1d(6, 3, 7, stride=2, padding=3, dilation=2, bias=False)), (6, 19), False),
    ("conv-16to1-k3-s3", lambda: _seq(nn.Conv1d(16, 1, 3, stride=3)), (16, 10), False),
    ("maxpool-k3-s2-p1", lambda: _seq(nn.MaxPool1d(3, stride=2, padding=1)), (2, 11), False),
    ("maxpool-k4-s1-p2", lambda: _seq(nn.MaxPool1d(4, stride=1, padding=2)), (2, 9), False),
    ("maxpool-k5-s3-odd-tail", lambda: _seq(nn.MaxPool1d(5, stride=3)), (1, 14), False),
    # non-overlapping windows: K = 4 (unrolled) and K = 5 (any K), with a tail left over
    ("maxpool-k4-s4-tail", lambda: _seq(nn.MaxPool1d(4)), (2, 23), True),
    ("maxpool-k5-s5", lambda: _seq(nn.MaxPool1d(5)), (2, 20), False),
    ("avgpool-k3-s2-p1-cip", lambda: _seq(nn.AvgPool1d(3, stride=2, padding=1)), (2, 11), False),
    ("avgpool-k3-s2-p1-nocip", lambda: _seq(nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False)), (2, 11), False),
    ("avgpool-k4-s3-p2-nocip", lambda: _seq(nn.AvgPool1d(4, stride=3, padding=2, count_include_pad=False)), (2, 13), False),
    ("relu", lambda: _seq(nn.ReLU()), (3, 7), False),
    ("leaky_relu", lambda: _seq(nn.LeakyReLU(0.1)), (3, 7), False),
    ("tanh", lambda: _seq(nn.Tanh()), (3, 7), False),
    ("sigmoid", lambda: _seq(nn.Sigmoid()), (3, 7), False),
    ("gelu", lambda: _seq(nn.GELU()), (3, 7), False),
    ("gelu-tanh", lambda: _seq(nn.GELU(approximate="tanh")), (3, 7), True),
    ("flatten-linear", lambda: _seq(nn.Flatten(), nn.Linear(12, 2)), (3, 4), False),
    ("identity", lambda: _seq(nn.Identity()), (6,), False),
    ("dropout-eval-linear", lambda: _seq(nn.Dropout(0.5), nn.Linear(6, 2)).eval(), (6,), False),
    # added with the graph IR
    ("elu", lambda: _seq(nn.ELU(0.7)), (3, 7), False),
    ("silu", lambda: _seq(nn.SiLU()), (3, 7), True),
    ("softplus-beta2-threshold1", lambda: _seq(nn.Softplus(beta=2.0, threshold=1.0)), (3, 7), True),
    ("global-avgpool", lambda: _seq(nn.AdaptiveAvgPool1d(1)), (3, 7), False),
    ("global-maxpool", lambda: _seq(nn.AdaptiveMaxPool1d(1)), (3, 7), False),
    ("softmax-last", lambda: _seq(nn.Softmax(dim=-1)), (3, 7), True),
    ("softmax-channels", lambda: _seq(nn.Softmax(dim=1)), (3, 7), False),
    ("log_softmax", lambda: _seq(nn.LogSoftmax(dim=1)), (5,), True),
    ("log_softmax-fn-middle", lambda: _Fn(lambda x: F.log_softmax(x, dim=2)), (2, 5, 3), False),
    ("layer_norm", lambda: perturbed(_seq(nn.LayerNorm(7))), (3, 7), True),
    ("layer_norm-2d-no-affine", lambda: _seq(nn.LayerNorm((3, 7), elementwise_affine=False)), (3, 7), False),
    ("layer_norm-no-bias", lambda: perturbed(_seq(nn.LayerNorm(7, bias=False))), (3, 7), False),
    ("affine", lambda: _Fn(lambda x: 1 - 2 * x / 4 + 0.5 - (-x) * 3), (3, 7), False),
    ("add-fanout", lambda: _Fn(lambda x, a, b: x + a(x) + b(x), nn.Linear(5, 5), nn.Linear(5, 5)), (5,), False),
    ("add-x-plus-x", lambda: _Fn(lambda x, a: a(x + x), nn.Linear(5, 2)), (5,), False),
    ("mul-broadcast-channels", lambda: _Fn(lambda x, fc: x * fc(x.flatten(1)).view(-1, 3, 1), nn.Linear(12, 3)), (3, 4), True),
    ("sub-broadcast-first", lambda: _Fn(lambda x, fc: fc(x.flatten(1)).view(-1, 3, 1) - x, nn.Linear(12, 3)), (3, 4), False),
    ("div-broadcast-positions", lambda: _Fn(lambda x, fc: x / (1.5 + torch.sigmoid(fc(x.flatten(1)).view(x.size(0), 1, 4))), nn.Linear(12, 4)), (3, 4), True),
    ("cat-features", lambda: _Fn(lambda x, fc: torch.cat([x, fc(x)], dim=1), nn.Linear(5, 3)), (5,), False),
    ("cat-positions", lambda: _Fn(lambda x: torch.cat([x, torch.tanh(x), x], dim=-1)), (2, 7), False),
    ("reshape-linear", lambda: _Fn(lambda x, fc: fc(x.reshape(x.shape[0], 7, 3)), nn.Linear(3, 2)), (21,), False),
    ("permute-linear", lambda: _Fn(lambda x, fc: fc(x.permute(0, 2, 1)), nn.Linear(3, 2)), (3, 7), True),
    ("transpose-3d", lambda: _Fn(lambda x: torch.tanh(x).transpose(1, 3).contiguous()), (2, 3, 4), False),
    ("conv1d-groups2", lambda: _seq(nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2)), (4, 11), True),
    ("conv1d-depthwise-d2", lambda: _seq(nn.Conv1d(3, 3, 3, padding=2, dilation=2, groups=3, bias=False)), (3, 9), False),
    ("conv2d", lambda: _seq(nn.Conv2d(2, 3, 3)), (2, 7, 6), True),
    ("conv2d-s2-p1-rect", lambda: _seq(nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 0), bias=False)), (3, 8, 7), False),
    ("conv2d-d2-groups2", lambda: _seq(nn.Conv2d(4, 2, 3, padding=2, dilation=2, groups=2)), (4, 6, 5), False),
    ("conv2d-depthwise", lambda: _seq(nn.Conv2d(3, 3, 3, padding=1, groups=3)), (3, 5, 5), True),
    # stride 1, one group: conv2d.h's direct kernels (padding, dilation, a rectangular kernel,
    # an image narrower than a vector); above 288 taps, im2col and GEMM again
    ("conv2d-direct-p-d-rect", lambda: _seq(nn.Conv2d(3, 5, (3, 2), padding=(2, 1), dilation=(2, 1))), (3, 9, 8), True),
    ("conv2d-direct-digits", lambda: _seq(nn.Conv2d(1, 9, 3, padding=1), nn.ReLU(), nn.Conv2d(9, 10, 3, padding=1)), (1, 12, 11), True),
    ("conv2d-direct-narrow", lambda: _seq(nn.Conv2d(2, 3, (2, 1))), (2, 9, 1), False),
    ("conv2d-many-taps", lambda: _seq(nn.Conv2d(40, 3, 3, padding=1)), (40, 4, 5), False),
    ("maxpool2d", lambda: _seq(nn.MaxPool2d(2)), (2, 6, 7), True),
    ("maxpool2d-k3-s2-p1", lambda: _seq(nn.MaxPool2d(3, stride=2, padding=1)), (2, 7, 6), False),
    ("avgpool2d-k3-s2-p1", lambda: _seq(nn.AvgPool2d(3, stride=2, padding=1)), (2, 7, 6), False),
    ("avgpool2d-nocip-rect", lambda: _seq(nn.AvgPool2d((2, 3), stride=(1, 2), padding=(1, 1), count_include_pad=False)), (2, 5, 6), False),
    ("global-avgpool2d", lambda: _seq(nn.AdaptiveAvgPool2d(1)), (3, 4, 5), False),
    ("global-maxpool2d", lambda: _seq(nn.AdaptiveMaxPool2d((1, 1))), (3, 4, 5), False),
    # BatchNorm: training mode uses the batch's statistics, eval mode the running ones
    ("batchnorm1d-features", lambda: perturbed(_seq(nn.BatchNorm1d(5))), (5,), True),
    ("batchnorm1d-sequence", lambda: perturbed(_seq(nn.BatchNorm1d(3, momentum=0.3))), (3, 7), False),
    ("batchnorm2d", lambda: perturbed(_seq(nn.BatchNorm2d(2))), (2, 4, 5), True),
    ("batchnorm1d-no-affine", lambda: _seq(nn.BatchNorm1d(3, affine=False)), (3, 7), False),
    ("batchnorm1d-untracked", lambda: perturbed(_seq(nn.BatchNorm1d(3, track_running_stats=False))), (3, 7), False),
    ("batchnorm1d-eval", lambda: perturbed(_seq(nn.BatchNorm1d(3))).eval(), (3, 7), False),
    ("batchnorm2d-eval", lambda: perturbed(_seq(nn.BatchNorm2d(2))).eval(), (2, 4, 5), True),
]
# fmt: on


class _Fn(nn.Module):
    """A graph written as a function of the input and some layers, traced by torch.fx."""

    def __init__(self, fn, *layers):
        super().__init__()
        self.fn = fn
        self.layers = nn.ModuleList(layers)
        self.double()

    def forward(self, x):
        return self.fn(x, *self.layers)


PARAMS = [pytest.param(build, shape, F64, id=f"{name}-f64") for name, build, shape, _ in CASES]
PARAMS += [
    pytest.param(build, shape, F32, id=f"{name}-f32") for name, build, shape, f32 in CASES if f32
]


def _input(shape, B=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((B, *shape), generator=gen, dtype=F64)


@pytest.mark.parametrize("build, shape, dtype", PARAMS)
def test_op_forward_and_vjp_match_torch(build, shape, dtype):
    torch.manual_seed(0)
    net = build()
    cm = check_against_torch(net, _input(shape), dtype)
    assert cm.engine == "pullback"
    assert [n for n, _ in cm.named_parameters()] == [n for n, _ in net.named_parameters()]


def test_every_registered_op_has_a_case_here():
    """Each op of the registry (rootclad/ir/ops.py) appears in a case above, so that adding an
    op without a torch reference case fails here."""
    covered = set()
    for _, build, shape, _ in CASES:
        graph = graph_from_module(build(), _input(shape), "float64")
        covered |= {node.op for node in graph.nodes}
    missing = sorted(set(OPS) - covered)
    assert not missing, f"ops without a case in CASES: {missing}"


def test_op_compiled_model_serves_other_batch_sizes():
    """The batch is a run-time argument: one library, batches 1, 7 and 2 in that order."""
    torch.manual_seed(0)
    net = _seq(nn.Conv1d(8, 4, 5))  # a case above: the library is already built
    for B in (1, 7, 2):
        check_against_torch(net, _input((8, 12), B=B, seed=B))


# Products with one row, one column or a depth of one go to GEMV / GER instead of GEMM
# (blas.h): batch 1, one output feature, one input feature, with and without bias (beta 0
# and 1). (id, builder, per-sample input shape, batch)
# fmt: off
GEMV_CASES = [
    ("linear-5to3-b1", lambda: _seq(nn.Linear(5, 3)), (5,), 1),
    ("linear-5to3-nobias-b1", lambda: _seq(nn.Linear(5, 3, bias=False)), (5,), 1),
    ("linear-5to1-b3", lambda: _seq(nn.Linear(5, 1)), (5,), 3),
    ("linear-5to1-nobias-b1", lambda: _seq(nn.Linear(5, 1, bias=False)), (5,), 1),
    ("linear-1to4-b3", lambda: _seq(nn.Linear(1, 4)), (1,), 3),
    ("linear-1to4-nobias-b3", lambda: _seq(nn.Linear(1, 4, bias=False)), (1,), 3),
    ("linear-3d-4x5to3-b1", lambda: _seq(nn.Linear(5, 3)), (4, 5), 1),
    ("mlp-6to4to1-b1", lambda: _seq(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 1)), (6,), 1),
]
# fmt: on


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("build, shape, B", [pytest.param(*c[1:], id=c[0]) for c in GEMV_CASES])
def test_linear_as_gemv_and_ger_matches_torch(build, shape, B, dtype):
    torch.manual_seed(0)
    check_against_torch(build(), _input(shape, B=B), dtype)


# Upstream gradients with one nonzero in 4 positions (or fewer): conv1d_sparse.h's backward
# pass, for layers of C*K >= 64 taps. (id, builder, per-sample input shape, one nonzero in)
# fmt: off
SPARSE_CASES = [
    # 128 taps: whole vectors in float32 and float64; every tap inside the input
    ("conv-s1-16to5-k8", lambda: _seq(nn.Conv1d(16, 5, 8)), (16, 40), 4),
    # 64 taps, padding: the first and last nonzeros take the loop per tap
    ("conv-s1-8to3-k8-p3", lambda: _seq(nn.Conv1d(8, 3, 8, padding=3)), (8, 30), 4),
    # 70 taps: whole vectors and a tail of elements; no bias
    ("conv-s1-7to4-k10-nobias", lambda: _seq(nn.Conv1d(7, 4, 10, bias=False)), (7, 33), 5),
    # 65 taps, stride 2 and padding; dilation 2 (a loop per tap for every nonzero)
    ("conv-5to4-k13-s2-p2", lambda: _seq(nn.Conv1d(5, 4, 13, stride=2, padding=2)), (5, 41), 4),
    ("conv-9to3-k8-d2-p4", lambda: _seq(nn.Conv1d(9, 3, 8, padding=4, dilation=2)), (9, 37), 8),
]
# fmt: on


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize(
    "build, shape, every", [pytest.param(*c[1:], id=c[0]) for c in SPARSE_CASES]
)
def test_conv_backward_on_sparse_upstream_gradients_matches_torch(build, shape, every, dtype):
    torch.manual_seed(0)
    check_against_torch(build(), _input(shape, B=4), dtype, every=every)


@pytest.mark.parametrize("K", [4, 5])
def test_maxpool_ties_send_the_gradient_to_the_first_maximum(K):
    """Windows with repeated maxima (small integers, and -0.0 next to 0.0): the gradient goes
    to the element torch picks, the first maximum, in both window-search paths."""
    gen = torch.Generator().manual_seed(K)
    x = torch.randint(-1, 2, (4, 2, 8 * K + 3), generator=gen).to(F64)
    x[0, 0, :2] = torch.tensor([-0.0, 0.0], dtype=F64)
    x[0, 0, 2:K] = -1.0
    check_against_torch(_seq(nn.MaxPool1d(K)), x)


# -- losses ------------------------------------------------------------------------------
def _loss_case(loss, dtype, B=5, C=6, K=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = _seq(nn.Linear(C, K)).to(dtype)
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


@pytest.mark.parametrize("build, shape", [pytest.param(b, s, id=n) for n, b, s, _ in CASES])
def test_input_grad_alone_matches_the_full_vjp(build, shape):
    """cm.input_grad asks for the inputs' gradient alone, and the pullback engine's kernels
    then skip every parameter's (a null d_weight): the result must equal autograd's through
    the full VJP."""
    torch.manual_seed(0)
    net = build()
    x = _input(shape, B=4)
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    d_out = torch.randn(4, *cm.output_shape, dtype=F64)
    xr = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(cm(xr), xr, d_out)
    assert_close_rel(cm.input_grad(x, d_out=d_out), want, 1e-12, "input_grad")


def test_direct_convolution_thresholds_match_the_kernels():
    """cpu_ops.py gives the direct convolution paths no im2col scratch by the same test the kernels
    make; if the constants drifted apart a kernel would write columns into memory the plan
    gave to other values."""
    import re

    from rootclad.codegen import cpu_ops as ops

    inc = Path(rootclad.get_include()) / "rootclad"
    conv2d = (inc / "ops" / "conv2d.h").read_text()
    kernels = (inc / "ops" / "conv1d.h").read_text()

    def const(text, name):
        return int(re.search(rf"constexpr int {name} = (\d+);", text).group(1))

    assert const(conv2d, "MAX_TAPS") == ops.CONV2D_DIRECT_MAX_TAPS
    assert const(conv2d, "MIN_ROW") == ops.CONV2D_DIRECT_MIN_ROW
    assert const(kernels, "CONV1D_DIRECT_MAX_TAPS") == ops.CONV1D_DIRECT_MAX_TAPS
