"""Dropout: a seeded counter-based mask, the same in forward and backward, identity in eval.

torch's dropout draws from another RNG, so these tests check the properties instead of
values: out = x * mask with mask in {0, 1/(1-p)}, a keep fraction of 1-p within binomial
noise, reproducible masks for equal seeds, and a backward that uses the forward's mask.
"""

from __future__ import annotations

import math

import pytest
import torch
from fixtures.core import assert_close_rel
from torch import nn

import rootclad

F64 = torch.float64
N = 4000  # elements per sample


def _x(B=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, generator=gen, dtype=F64)
    return x + torch.sign(x)  # |x| >= 1: out / x is well defined


def _dropout_model(p, seed=0):
    net = nn.Sequential(nn.Dropout(p)).double()
    return rootclad.compile(net, example_input=_x(), loss="mse", engine="pullback", seed=seed)


def _mask(out, x, p):
    """out / x, checked to be 0 or 1/(1-p) everywhere; returns it."""
    ratio = out / x
    scale = 1.0 / (1.0 - p)
    kept = (ratio - scale).abs() <= 1e-12 * scale
    dropped = ratio == 0
    assert bool((kept | dropped).all()), (
        f"values outside {{0, {scale}}}: {ratio[~(kept | dropped)]}"
    )
    return torch.where(kept, torch.full_like(ratio, scale), torch.zeros_like(ratio))


@pytest.mark.parametrize("p", [0.25, 0.8])
def test_dropout_output_is_x_times_a_scaled_mask_with_keep_fraction_1_minus_p(p):
    x = _x()
    cm = _dropout_model(p)
    mask = _mask(cm(x), x, p)
    n = mask.numel()
    keep = (mask != 0).sum().item() / n
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(keep - (1 - p)) < 5 * sd, f"keep fraction {keep:.4f}, expected {1 - p} +- {sd:.4f}"
    # every sample gets its own mask, not one mask broadcast over the batch
    assert not torch.equal(mask[0], mask[1])
    # predict() in training mode drops too, with a fresh mask
    mask2 = _mask(cm.predict(x), x, p)
    assert not torch.equal(mask, mask2)


def test_dropout_masks_are_reproducible_by_seed_and_fresh_per_call():
    p = 0.25
    x = _x()
    a, b, c = _dropout_model(p, seed=7), _dropout_model(p, seed=7), _dropout_model(p, seed=8)
    assert not (b.built_now or c.built_now)  # one library; the seed is data, not code
    m_a1, m_b1, m_c1 = (_mask(m(x), x, p) for m in (a, b, c))
    assert torch.equal(m_a1, m_b1)
    assert not torch.equal(m_a1, m_c1)
    m_a2 = _mask(a(x), x, p)
    assert not torch.equal(m_a1, m_a2)  # the next call draws a new mask
    assert torch.equal(_mask(b(x), x, p), m_a2)  # ... the same one for the same seed


def test_dropout_backward_uses_the_forward_mask():
    p = 0.25
    x = _x().requires_grad_(True)
    cm = _dropout_model(p)
    out = cm(x)
    mask = _mask(out.detach(), x.detach(), p)
    g = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    (dx,) = torch.autograd.grad(out, x, g)
    assert_close_rel(dx, g * mask, 1e-14, "d_input")


def test_dropout_fused_loss_and_grad_uses_one_mask_for_forward_and_backward():
    """Dropout -> Linear(N, 1) on one sample: d_weight = d_z * x * mask shows the backward's
    mask; the loss value shows whether the forward used the same one."""
    p = 0.25
    torch.manual_seed(0)
    net = nn.Sequential(nn.Dropout(p), nn.Linear(N, 1, bias=False)).double()
    x = _x(B=1, seed=2)
    y = torch.tensor([[1.0]], dtype=F64)
    cm = rootclad.compile(net, example_input=x, loss="bce_with_logits", engine="pullback")
    for _ in range(3):
        loss, grads = cm.loss_and_grad(x, y)
        r = grads["1.weight"] / x  # = d_z * mask
        mask = (r != 0).to(F64) / (1 - p)
        assert 0 < (mask != 0).sum() < N
        w = net[1].weight.detach()
        z = (x * mask) @ w.T
        ref = torch.nn.functional.binary_cross_entropy_with_logits(z, y)
        assert_close_rel(loss, ref, 1e-12, "loss with the backward's mask")
        d_z = torch.sigmoid(z) - y
        assert_close_rel(grads["1.weight"], d_z * x * mask, 1e-12, "d_weight")


def test_dropout_is_the_identity_in_eval_mode():
    p = 0.25
    x = _x().requires_grad_(True)
    cm = _dropout_model(p).eval()
    out = cm(x)
    assert torch.equal(out, x.detach())
    assert torch.equal(cm.predict(x.detach()), x.detach())
    g = torch.randn(out.shape, dtype=F64)
    (dx,) = torch.autograd.grad(out, x, g)
    assert torch.equal(dx, g)
    cm.train()
    assert not torch.equal(cm(x.detach()), x.detach())


def test_mask_checker_fails_on_outputs_that_are_not_dropout():
    x = _x(B=1)
    p = 0.25
    mask = (torch.arange(N) % 2).to(F64) / (1 - p)
    assert torch.equal(_mask(x * mask, x, p), mask.expand_as(x))  # a true dropout passes
    for wrong in (x * 2.0, x * (1 / (1 - p)) * (1 + 1e-9), x * 0.5):
        with pytest.raises(AssertionError):
            _mask(wrong, x, p)


def test_compile_keeps_the_modules_training_mode():
    """An eval-mode module compiles to an eval-mode model: no dropout in its predictions."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Dropout(0.25), nn.Linear(N, 1, bias=False)).double().eval()
    x = _x()
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    assert not cm.training
    assert_close_rel(cm.predict(x), net(x).detach(), 1e-10)
    assert_close_rel(cm(x).detach(), net(x).detach(), 1e-10)
    assert rootclad.compile(net.train(), example_input=x, engine="pullback").training
