"""The model zoo: third-party classifiers (torchvision, timm) compile and compute what torch
computes. Random weights (perturbed: fresh BatchNorm/LayerNorm and zero-initialised heads
would hide mistakes), float64, inputs (B, 3, 32, 32).

Each model: the output, the input's gradient and every parameter's gradient against torch
autograd (each parameter's against the largest of all gradients, 1e-9), and 20 Adam steps in train mode
(BatchNorm on the batch's statistics) against torch.optim. The architectures still refused
are in docs/models.md, with what each needs."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_close_rel, check_against_torch, perturbed, torch_loss
from fixtures.zoo import RTOL, SLOW, TRAIN_RTOL, ZOO, vision
from torch import nn

import rootclad

F64 = torch.float64
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ZOO]


def _build(name, perturb=True):
    tv, timm = vision()
    torch.manual_seed(0)
    net = ZOO[name](tv, timm).double()
    for m in net.modules():  # torch's dropout masks are not rootclad's: compare without
        if isinstance(m, nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return perturbed(net) if perturb else net


@pytest.mark.parametrize("engine", ["pullback", pytest.param("clad", marks=pytest.mark.clad)])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_forward_and_gradients_match_torch(name, engine, request):
    if engine == "clad":
        request.getfixturevalue("clad")  # skips, saying why, without Clad
    net = _build(name).eval()
    x = torch.randn(2, 3, 32, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
    cm = check_against_torch(net, x, F64, engine=engine, rtol=RTOL.get(name, 1e-9),
                             loss="cross_entropy", against_all=True)  # fmt: skip
    assert cm.engine == engine


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_training_tracks_torch_optim(name):
    """torch's own initialisation and a small learning rate: these deep BatchNorm networks
    are chaotic under Adam at 1e-3 (regnet_y_400mf in torch against itself, its weights
    changed by 1e-15, parts by 0.2 in the loss after 20 steps; at 1e-5 by 4e-12:
    benchmarks/models/check_adam_chaos.py).
    Parameters are compared against how far the parameters moved: some get a gradient that
    is zero in exact arithmetic (a BatchNorm bias feeding another BatchNorm), and Adam turns
    its rounding noise into moves of 1e-11 that are not errors."""
    net = _build(name, perturb=False).train()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(24, 3, 32, 32, dtype=F64, generator=gen)
    y = torch.randint(0, 3, (24,), generator=gen)
    cm = rootclad.compile(net, x[:2], loss="cross_entropy", engine="pullback")
    ref = copy.deepcopy(net)
    opt = rootclad.optim.Adam(cm, lr=1e-5)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-5)
    losses, ref_losses = [], []
    for step in range(20):
        idx = torch.arange(step % 3 * 8, step % 3 * 8 + 8)
        losses.append(cm.train_step(x[idx], y[idx], opt))
        opt_ref.zero_grad()
        value = torch_loss("cross_entropy", ref(x[idx]), y[idx])
        value.backward()
        opt_ref.step()
        ref_losses.append(value.item())
    rtol = RTOL.get(name, 1e-9) * 1e3
    assert_close_rel(torch.tensor(losses), torch.tensor(ref_losses), rtol, f"{name} losses")
    rtol = TRAIN_RTOL.get(name, rtol)
    start = {k: v.detach() for k, v in net.named_parameters()}
    moved = max(float((q.detach() - start[k]).abs().max()) for k, q in ref.named_parameters())
    assert moved > 1e-4, f"{name}: the parameters did not move"
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        err = float((p.detach() - q.detach()).abs().max()) / moved
        assert err <= rtol, f"{name} {k}: off by {err:.3e} of the largest move > {rtol:.1e}"
