"""Per-sample loss weights (HEP event weights) in loss_and_grad and train_step, both engines.

The reference is torch: ``(F.<loss>(out, y, reduction="none") * w[:, None]).mean()``, its
autograd gradient, and torch.optim steps on that loss.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close
from torch import nn
from torch.nn import functional as F

import rootclad

F64 = torch.float64


def weighted_torch_loss(loss: str, out, y, w):
    if loss in ("cross_entropy", "nll"):
        fn = F.cross_entropy if loss == "cross_entropy" else F.nll_loss
        return (fn(out, y.long(), reduction="none") * w).mean()
    fn = {"bce_with_logits": F.binary_cross_entropy_with_logits, "mse": F.mse_loss,
          "huber": F.huber_loss}[loss]  # fmt: skip
    per = fn(out, y.reshape(out.shape).to(out.dtype), reduction="none")
    return (per * w.reshape(-1, *[1] * (per.dim() - 1))).mean()


def _case(loss, B, seed=0):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv1d(2, 4, 3), nn.Tanh(), nn.MaxPool1d(2), nn.Flatten(),
                        nn.Linear(4 * 7, 3)).double()  # fmt: skip
    x = torch.randn(B, 2, 16, generator=gen, dtype=F64)
    if loss in ("cross_entropy", "nll"):
        y = torch.randint(0, 3, (B,), generator=gen)
    elif loss == "bce_with_logits":
        y = torch.rand(B, 3, generator=gen, dtype=F64).round()
    else:  # huber: differences on both sides of its delta of 1
        y = 2 * torch.randn(B, 3, generator=gen, dtype=F64)
    w = torch.rand(B, generator=gen, dtype=F64) * 3 - 0.5  # negative weights too (NLO samples)
    return net, x, y, w


ENGINES = [pytest.param("pullback", id="pullback"),
           pytest.param("clad", id="clad", marks=pytest.mark.clad)]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("B", [5, 200], ids=["one-chunk", "split-over-threads"])
@pytest.mark.parametrize("loss", ["bce_with_logits", "mse", "cross_entropy", "nll", "huber"])
def test_weighted_loss_and_gradients_equal_torch(loss, B, engine, request):
    if engine == "clad":
        request.getfixturevalue("clad")
    net, x, y, w = _case(loss, B)
    cm = rootclad.compile(copy.deepcopy(net), example_input=x, loss=loss, engine=engine)
    value, grads = cm.loss_and_grad(x, y, weight=w)
    ref = weighted_torch_loss(loss, net(x), y, w)
    ref_grads = torch.autograd.grad(ref, list(net.parameters()))
    names = [n for n, _ in net.named_parameters()]
    assert_close_rel(value, ref.detach(), 1e-10, f"{loss} weighted value")
    assert_grads_close(grads, dict(zip(names, ref_grads, strict=True)), 1e-10, loss)
    # weights of one: the unweighted loss (another code path inside the library)
    v1, g1 = cm.loss_and_grad(x, y, weight=torch.ones(B, dtype=F64))
    v0, g0 = cm.loss_and_grad(x, y)
    assert_close_rel(v1, v0, 1e-12, "weights of one")
    assert_grads_close(g1, g0, 1e-12, "weights of one")


@pytest.mark.parametrize("B", [4, 200], ids=["small", "split-over-threads"])
def test_weighted_train_step_tracks_torch_optim(B):
    net, x, y, w = _case("bce_with_logits", B, seed=1)
    cm = rootclad.compile(copy.deepcopy(net), example_input=x, engine="pullback")
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    ref_opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for step in range(30):
        gen = torch.Generator().manual_seed(100 + step)
        ws = w[torch.randperm(B, generator=gen)]
        ours = cm.train_step(x, y, opt, weight=ws)
        ref_opt.zero_grad()
        ref = weighted_torch_loss("bce_with_logits", net(x), y, ws)
        ref.backward()
        ref_opt.step()
        assert abs(ours - ref.item()) <= 1e-10 * abs(ref.item())
    for (k, p), q in zip(cm.named_parameters(), net.parameters(), strict=True):
        assert_close_rel(p, q, 1e-8, k)


@pytest.mark.parametrize("loss", ["bce_with_logits", "cross_entropy", "mse"])
def test_sum_w_normalised_loss_and_gradients_equal_torch(loss):
    """weight_norm="sum_w": (per-sample loss * w).sum() / w.sum() in torch, value and every
    gradient; then train_step with it tracks torch.optim."""
    net, x, y, w = _case(loss, 7, seed=3)
    cm = rootclad.compile(copy.deepcopy(net), example_input=x, loss=loss, engine="pullback")
    value, grads = cm.loss_and_grad(x, y, weight=w, weight_norm="sum_w")
    out = net(x)
    if loss == "cross_entropy":
        per = F.cross_entropy(out, y.long(), reduction="none")
    else:
        fn = F.binary_cross_entropy_with_logits if loss == "bce_with_logits" else F.mse_loss
        per = fn(out, y.to(out.dtype), reduction="none").mean(1)
    ref = (per * w).sum() / w.sum()
    names = [n for n, _ in net.named_parameters()]
    ref_grads = torch.autograd.grad(ref, list(net.parameters()), retain_graph=True)
    ref_grads = dict(zip(names, ref_grads, strict=True))
    assert_close_rel(value, ref.detach(), 1e-10, f"{loss} sum_w value")
    assert_grads_close(grads, ref_grads, 1e-10, f"{loss} sum_w")
    mean_value, _ = cm.loss_and_grad(x, y, weight=w)
    assert abs(float(mean_value) - float(value)) > 1e-3 * abs(float(value))  # not the mean
    opt, ref_opt = rootclad.optim.SGD(cm, lr=0.1), torch.optim.SGD(net.parameters(), lr=0.1)
    got = cm.train_step(x, y, opt, weight=w, weight_norm="sum_w")
    ref.backward()
    ref_opt.step()
    assert abs(got - ref.item()) <= 1e-10 * abs(ref.item())
    for (k, p), q in zip(cm.named_parameters(), net.parameters(), strict=True):
        assert_close_rel(p, q, 1e-10, f"{k} after a sum_w step")
    with pytest.raises(ValueError, match="sum to 0"):
        cm.loss_and_grad(x, y, weight=torch.tensor([1.0, -1.0, 0, 0, 0, 0, 0], dtype=F64),
                         weight_norm="sum_w")  # fmt: skip
    with pytest.raises(ValueError, match="weight_norm='sum'"):
        cm.loss_and_grad(x, y, weight=w, weight_norm="sum")


def test_bad_weights_are_refused():
    net, x, y, w = _case("mse", 6)
    cm = rootclad.compile(net, example_input=x, loss="mse", engine="pullback")
    for bad in (w[:5], w.reshape(6, 1), torch.ones(6, dtype=torch.complex128)):
        with pytest.raises(
            ValueError, match=r"weight must hold one number per sample, shape \(6,\)"
        ):
            cm.loss_and_grad(x, y, weight=bad)
    w[2] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        cm.train_step(x, y, rootclad.optim.SGD(cm), weight=w)
