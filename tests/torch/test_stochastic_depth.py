"""torchvision's StochasticDepth (the stochastic_depth op): in training, each sample's whole
value kept with probability 1 - p and scaled by 1 / (1 - p) ('row'), or every sample's at once
('batch'); the identity in eval mode (the eval forward is an op case of fixtures/op_cases.py,
checked against torch on every backend).

torch draws its masks from another RNG, so training is checked by its properties, with the
mask checker of test_dropout (which fails on what is not dropout)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close
from fixtures.zoo import vision
from test_dropout import _mask, _x

import rootclad

F64 = torch.float64


def _model(p, mode, B=4):
    vision()  # torchvision, importable beside this torch
    from torchvision.ops import StochasticDepth

    net = torch.nn.Sequential(StochasticDepth(p, mode)).double()
    return rootclad.compile(net, example_input=_x(B), loss="mse", engine="pullback")


@pytest.mark.parametrize("p", [0.2, 0.7])
def test_row_mode_keeps_or_drops_each_sample_whole_with_keep_fraction_1_minus_p(p):
    B = 400
    x = _x(B)
    mask = _mask(_model(p, "row", B)(x), x, p)
    per_sample = mask[:, :1]
    assert torch.equal(mask, per_sample.expand_as(mask)), "a sample partly dropped"
    keep = (per_sample != 0).to(F64).mean().item()
    sd = math.sqrt(p * (1 - p) / B)
    assert abs(keep - (1 - p)) < 5 * sd, f"keep fraction {keep:.3f}, expected {1 - p} +- {sd:.3f}"


def test_batch_mode_keeps_or_drops_the_whole_batch_and_backward_uses_the_forward_mask():
    p = 0.5
    cm = _model(p, "batch")
    kept = []
    for _ in range(40):
        x = _x().requires_grad_(True)
        out = cm(x)
        mask = _mask(out.detach(), x.detach(), p)
        assert torch.equal(mask, mask.flatten()[0].expand_as(mask)), "not one draw per batch"
        kept.append(bool(mask.flatten()[0] != 0))
        g = torch.randn(out.shape, dtype=F64)
        (dx,) = torch.autograd.grad(out, x, g)
        torch.testing.assert_close(dx, g * mask, rtol=1e-14, atol=0)  # zeros if dropped
    assert 5 < sum(kept) < 35, f"{sum(kept)} of 40 batches kept at p = 0.5"


def test_eval_mode_is_the_identity_and_p_1_drops_everything():
    x = _x()
    assert torch.equal(_model(0.5, "row").eval()(x), x)
    assert torch.equal(_model(1.0, "row")(x), torch.zeros_like(x))


def _residual_net(mode):
    """x + StochasticDepth(block(x)), as torchvision's EfficientNet and ConvNeXt blocks."""
    vision()
    from torchvision.ops import StochasticDepth

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.sd = torch.nn.Linear(5, 5), StochasticDepth(0.5, mode)
            self.out = torch.nn.Linear(5, 3)

        def forward(self, x):
            return self.out(x + self.sd(torch.tanh(self.fc(x))))

    torch.manual_seed(0)
    return Block().double()


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", [True, False], ids=["clad-pullbacks", "clad-nopullbacks"])
@pytest.mark.parametrize("mode", ["row", "batch"])
def test_clad_and_pullback_engines_draw_the_same_masks_in_training(clad, pullbacks, mode):
    """Equal seeds, equal masks: both engines' training-mode gradients agree, and the masks
    were on (the gradients differ from eval mode's)."""
    net = _residual_net(mode)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 5, dtype=F64, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    models = [rootclad.compile(copy.deepcopy(net), x, loss="cross_entropy", engine=e, seed=3,
                               **({"pullbacks": pullbacks} if e == "clad" else {}))
              for e in ("clad", "pullback")]  # fmt: skip
    for _ in range(3):
        (lc, gc), (lp, gp) = (m.loss_and_grad(x, y) for m in models)
        assert_close_rel(lc, lp, 1e-12, "loss")
        assert_grads_close(gc, gp, 1e-12, "clad vs pullback", against_all=True)  # batch: 0s
    _, g_eval = models[1].eval().loss_and_grad(x, y)
    assert (g_eval["fc.weight"] - gp["fc.weight"]).abs().max() > 1e-6


def test_device_loops_draw_the_cpu_models_masks():
    """The device program (its kernels as loops on the CPU) and the compiled CPU model, both
    seeded 7, drop the same samples."""
    from rootclad.compiler import compile_device

    net = _residual_net("row")
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 5, dtype=F64, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    cm = rootclad.compile(net, x, loss="cross_entropy", engine="pullback", seed=7)
    dm = compile_device(net, x, device="cpu", loss="cross_entropy", seed=7)
    out = dm.predict(x)
    assert_close_rel(out, cm.predict(x), 1e-12, "forward")
    assert (out - net.eval()(x)).abs().max() > 1e-6  # the masks were on
    (lc, gc), (ld, gd) = cm.loss_and_grad(x, y), dm.loss_and_grad(x, y)
    assert_close_rel(ld, lc, 1e-12, "loss")
    assert_grads_close(gd, gc, 1e-11, "device loops vs CPU model")


def test_a_draw_of_a_constant_is_drawn_on_every_call_not_folded_once():
    """StochasticDepth(mode='batch') of a constant made in forward (no input reaches it): a
    draw, computed on every call as torch does, not a value folded at compile time."""
    vision()
    from torchvision.ops import StochasticDepth

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sd = StochasticDepth(0.5, "batch")

        def forward(self, x):
            return x * self.sd(torch.ones(x.shape[1:], dtype=x.dtype))

    x = _x()
    cm = rootclad.compile(Scaled(), example_input=x, loss="mse", engine="pullback")
    kept = [bool((cm(x) != 0).all()) for _ in range(40)]
    assert 5 < sum(kept) < 35, f"{sum(kept)} of 40 calls kept at p = 0.5: folded once?"
