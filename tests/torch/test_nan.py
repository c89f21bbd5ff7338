"""NaN in the input propagates as in torch: through every op, into the loss and gradients.

A ReLU that turned NaN into 0 made the loss finite while the parameters became NaN; a user
must see the NaN where torch shows it. References are torch's own NaN patterns.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_same_nan, mixed_batch, mixed_model, torch_loss
from fixtures.op_cases import CASES, Fn
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import rootclad

F64 = torch.float64


def _with_nans(shape, B=3, seed=2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((B, *shape), generator=gen, dtype=F64)
    flat = x.view(B, -1)
    mid = flat.shape[1] // 2  # one sample: its first and three inner positions (a strided
    flat[1, [0, mid, mid + 1, mid + 2]] = float("nan")  # layer skips some positions)
    return x


@pytest.mark.parametrize("build, shape", [pytest.param(c[1], c[2], id=c[0]) for c in CASES])
def test_nan_input_gives_torch_nan_pattern_in_every_op(build, shape):
    torch.manual_seed(0)
    net = build()
    x = _with_nans(shape)
    cm = rootclad.compile(copy.deepcopy(net), example_input=x, engine="pullback")
    out = cm(x)
    # torch's fused CPU attention kernel lets a NaN reach fewer outputs than softmax(q k^T) v
    # does (its running maximum skips NaN); its math kernel is the definition
    with sdpa_kernel(SDPBackend.MATH):
        ref = net(x)
    assert_same_nan(out, ref, "forward")
    assert bool(ref.isnan().any()), "the case must let a NaN through (it tests nothing otherwise)"
    finite = ~ref.isnan()
    torch.testing.assert_close(out[finite], ref[finite], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "loss, where",
    [("bce_with_logits", "input"), ("cross_entropy", "input"), ("mse", "input"),
     ("bce_with_logits", "target"), ("mse", "target")],  # class indices have no NaN
)  # fmt: skip
def test_nan_reaches_the_loss_and_gradients_as_in_torch(loss, where):
    torch.manual_seed(0)
    net = mixed_model().eval()
    x, y = mixed_batch(B=4)
    if loss == "bce_with_logits":
        y = torch.rand(4, 3, dtype=F64)
    elif loss == "mse":
        y = torch.randn(4, 3, dtype=F64)
    if where == "input":
        x[2, 1, 5] = float("nan")
    else:
        y[1, 2] = float("nan")
    cm = rootclad.compile(copy.deepcopy(net), example_input=x, loss=loss, engine="pullback")
    value, grads = cm.loss_and_grad(x, y)
    ref_value = torch_loss(loss, net(x), y)
    ref_grads = torch.autograd.grad(ref_value, list(net.parameters()))
    assert bool(torch.isnan(ref_value)) and bool(torch.isnan(value))
    # Element by element the patterns may differ: torch multiplies a NaN gradient by the
    # zeros of a padded input (0 * NaN = NaN) where rootclad's kernels skip the padding. A
    # parameter whose gradient torch makes NaN must get NaN here too, and no other.
    for (name, g), ref_g in zip(grads.items(), ref_grads, strict=True):
        assert bool(g.isnan().any()) == bool(ref_g.isnan().any()), f"d{name}"


def test_nan_input_stays_nan_in_train_step_loss():
    """The report of the defect: the loss of a step on a NaN input must be NaN (with the
    check that refuses such a batch turned off)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(1, 4, 3), nn.ReLU(), nn.MaxPool1d(2), nn.Flatten(),
                        nn.Linear(4 * 7, 1)).double()  # fmt: skip
    x = torch.randn(4, 1, 16, dtype=F64)
    x[0, 0, 3] = float("nan")
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    opt = rootclad.optim.SGD(cm, lr=0.1)
    loss = cm.train_step(x, torch.ones(4, 1, dtype=F64), opt, check_finite=False)
    assert loss != loss  # NaN


def test_maxpool2d_sends_a_nan_windows_gradient_where_torch_does():
    """A window with several NaNs: torch's `v > max || isnan(v)` keeps the last NaN, and the
    gradient goes there; a window without NaN sends it to its first maximum."""
    x = torch.tensor([[[[float("nan"), 1.0, 3.0, 3.0], [float("nan"), 0.0, 2.0, 3.0]]]], dtype=F64)
    net = nn.Sequential(nn.MaxPool2d(2)).double()
    cm = rootclad.compile(copy.deepcopy(net), example_input=x, engine="pullback")
    xs, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, ref = cm(xs), net(xr)
    (got,) = torch.autograd.grad(out, xs, torch.ones_like(out))
    (want,) = torch.autograd.grad(ref, xr, torch.ones_like(ref))
    assert torch.equal(got, want), (got, want)
    assert want[0, 0, 1, 0] == 1 and want[0, 0, 0, 2] == 1  # the last NaN; the first 3


@pytest.mark.parametrize("reduce", [torch.amax, torch.amin])
def test_amax_shares_a_rows_gradient_among_its_nans_and_ties_as_torch_does(reduce):
    """A row with NaNs gives NaN, and every element of it a NaN gradient (torch's (g / count)
    * mask: no element equals NaN); a row whose extremum appears three times gives a third to
    each; a row of distinct values all to one."""
    nan = float("nan")
    x = torch.tensor([[[nan, 1.0, nan, 2.0], [3.0, -1.0, 3.0, 3.0], [0.5, 4.0, -4.0, 0.0]]],
                     dtype=F64)  # fmt: skip
    x[0, 1] *= 1 if reduce is torch.amax else -1
    net = Fn(lambda t: reduce(t, -1))
    cm = rootclad.compile(copy.deepcopy(net), example_input=x, engine="pullback")
    xs, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, ref = cm(xs), net(xr)
    assert_same_nan(out, ref, "forward")
    d_out = torch.tensor([[6.0, 3.0, 2.0]], dtype=F64)
    (got,) = torch.autograd.grad(out, xs, d_out)
    (want,) = torch.autograd.grad(ref, xr, d_out)
    assert_same_nan(got, want, "gradient")
    assert torch.equal(got[0, 1:], want[0, 1:]), (got, want)
    assert bool(want[0, 0].isnan().all()) and want[0, 1].tolist() == [1, 0, 1, 1]
