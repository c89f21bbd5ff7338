"""Gradients checked without trusting torch's layers: gradcheck and central finite differences.

``torch.autograd.gradcheck`` compares the compiled VJP (``cm(x)``) with numerical Jacobians
of the compiled forward, w.r.t. the input and every parameter. The finite-difference tests
perturb parameters of a whole model in place and difference its compiled loss, so they
depend on neither torch autograd nor torch's layer implementations.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.core import assert_close_rel
from torch import nn
from torch.autograd.gradcheck import GradcheckError

import rootclad

F64 = torch.float64


def _smooth_cnn():
    return nn.Sequential(
        nn.Conv1d(2, 3, 3, padding=1),
        nn.Tanh(),
        nn.AvgPool1d(2),
        nn.Conv1d(3, 2, 3, stride=2, dilation=1),
        nn.GELU(),
        nn.Flatten(),
        nn.Linear(2, 2),
        nn.Sigmoid(),
        nn.Linear(2, 3),
    ).double()


def _kinked_cnn():
    return nn.Sequential(
        nn.Conv1d(2, 3, 3, padding=2, dilation=2),
        nn.ReLU(),
        nn.MaxPool1d(3, stride=2, padding=1),
        nn.LeakyReLU(0.2),
        nn.AvgPool1d(3, stride=1, padding=1, count_include_pad=False),
        nn.Flatten(),
        nn.Linear(12, 3),
        nn.GELU(approximate="tanh"),
    ).double()


@pytest.mark.parametrize("build", [_smooth_cnn, _kinked_cnn], ids=["smooth", "kinked"])
def test_gradcheck_on_the_autograd_function(build):
    torch.manual_seed(0)
    net = build()
    x = torch.randn(2, 2, 8, dtype=F64, requires_grad=True)
    # the libraries of the finite-difference tests below (the loss plays no part here)
    loss = "cross_entropy" if build is _smooth_cnn else "bce_with_logits"
    cm = rootclad.compile(net, example_input=x.detach(), loss=loss, engine="pullback")
    params = list(cm.parameters())
    assert all(p.requires_grad for p in params)
    # gradcheck perturbs x and the parameter views in place; the views are the arena
    assert torch.autograd.gradcheck(
        lambda x, *ps: cm(x), (x, *params), eps=1e-6, atol=1e-8, rtol=1e-6
    )


def test_gradcheck_fails_on_a_wrong_backward():
    """The check above can fail: a Function with a wrong VJP is caught."""
    torch.manual_seed(0)
    net = _smooth_cnn()
    x = torch.randn(2, 2, 8, dtype=F64, requires_grad=True)
    cm = rootclad.compile(net, x.detach(), loss="cross_entropy", engine="pullback")

    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * 1.0001  # 1e-4 off: far above the rtol

    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(lambda x: cm(Wrong.apply(x)), (x,), eps=1e-6, atol=1e-8, rtol=1e-6)


def _central_differences(cm, x, y, picks, eps=1e-6):
    """(L(p + eps) - L(p - eps)) / 2 eps for each (name, flat index) in ``picks``."""
    views = dict(cm.named_parameters())
    out = []
    with torch.no_grad():
        for name, i in picks:
            flat = views[name].view(-1)
            keep = flat[i].item()
            flat[i] = keep + eps
            up = cm.loss_and_grad(x, y)[0].item()
            flat[i] = keep - eps
            down = cm.loss_and_grad(x, y)[0].item()
            flat[i] = keep
            out.append((up - down) / (2 * eps))
    return torch.tensor(out, dtype=F64)


def _random_picks(cm, n, seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = [(name, p.numel()) for name, p in cm.named_parameters()]
    picks = [(name, int(torch.randint(k, (1,), generator=gen))) for name, k in sizes]
    total = sum(k for _, k in sizes)
    for j in torch.randperm(total, generator=gen)[: max(0, n - len(picks))].tolist():
        for name, k in sizes:
            if j < k:
                picks.append((name, j))
                break
            j -= k
    return picks  # at least one entry of every parameter


@pytest.mark.parametrize(
    "build, loss",
    [
        (_smooth_cnn, "cross_entropy"),
        (_smooth_cnn, "mse"),
        (_kinked_cnn, "bce_with_logits"),
    ],
)
def test_loss_gradient_matches_central_differences(build, loss):
    torch.manual_seed(1)
    net = build()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, 8, generator=gen, dtype=F64)
    if loss == "cross_entropy":
        y = torch.randint(0, 3, (3,), generator=gen)
    elif loss == "mse":
        y = torch.randn(3, 3, generator=gen, dtype=F64)
    else:
        y = torch.rand(3, 3, generator=gen, dtype=F64)
    cm = rootclad.compile(net, example_input=x, loss=loss, engine="pullback")
    _, grads = cm.loss_and_grad(x, y)
    picks = _random_picks(cm, 24, seed=3)
    analytic = torch.stack([grads[name].reshape(-1)[i] for name, i in picks])
    numeric = _central_differences(cm, x, y, picks)
    assert_close_rel(analytic, numeric, 1e-6, f"{loss} gradient vs finite differences")
    # the perturbations were undone: the gradient is unchanged
    _, again = cm.loss_and_grad(x, y)
    for name in grads:
        assert torch.equal(again[name], grads[name])
