"""Fit with Minuit2, using a network's gradient that rootclad computes.

A small network stands in for a simulation: it maps three physics parameters theta to eight
observables. Given "observed" values (the network at a true theta), Minuit2 minimises
chi2(theta) = sum((net(theta) - observed)^2) twice, once with the gradient rootclad's compiled
backward provides (ROOT.Math.GradFunctor) and once with Minuit's own finite differences
(ROOT.Math.Functor), and torch's L-BFGS minimises the same chi2 on the original torch module.
All three should land on the same theta; the gradient run needs fewer chi2 evaluations.

    python tutorials/minuit_network_fit.py
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import rootclad

torch.manual_seed(7)
net = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 8))
net = net.double().eval()
theta_true = torch.tensor([[0.4, -0.7, 0.2]], dtype=torch.float64)
with torch.no_grad():
    observed = net(theta_true)
theta0 = [0.0, 0.0, 0.0]

cm = rootclad.compile(net, example_input=theta_true, loss="mse")
print(f"compiled the network ({cm.engine} engine)")

calls = {"chi2": 0, "gradient": 0}


def chi2(x) -> float:
    calls["chi2"] += 1
    theta = torch.tensor([[x[0], x[1], x[2]]], dtype=torch.float64)
    with torch.no_grad():
        return float(((cm(theta) - observed) ** 2).sum())


_last: dict = {}


def gradient(x, i: int) -> float:
    """d chi2 / d theta_i. Minuit asks coordinate by coordinate; one backward pass (the
    compiled VJP with upstream 2 (net(theta) - observed)) serves all three."""
    key = (x[0], x[1], x[2])
    if _last.get("key") != key:
        calls["gradient"] += 1
        theta = torch.tensor([key], dtype=torch.float64, requires_grad=True)
        out = cm(theta)
        (g,) = torch.autograd.grad(out, theta, grad_outputs=2 * (out - observed).detach())
        _last.update(key=key, value=g[0].tolist())
    return _last["value"][i]


def minuit(function) -> tuple[list[float], int]:
    import ROOT

    m = ROOT.Math.Factory.CreateMinimizer("Minuit2", "Migrad")
    m.SetFunction(function)
    m.SetStrategy(1)
    m.SetTolerance(1e-6)
    for i, v in enumerate(theta0):
        m.SetVariable(i, f"theta{i}", v, 0.1)
    m.Minimize()
    return [m.X()[i] for i in range(3)], m.NCalls()


import ROOT  # noqa: E402  (after torch and rootclad: ROOT's banner stays out of their way)

with_grad, n_grad = minuit(ROOT.Math.GradFunctor(chi2, gradient, 3))
gradients = calls["gradient"]
calls.update(chi2=0, gradient=0)
without, n_plain = minuit(ROOT.Math.Functor(chi2, 3))

theta = torch.tensor([theta0], dtype=torch.float64, requires_grad=True)
opt = torch.optim.LBFGS([theta], lr=1, max_iter=500, tolerance_grad=1e-12,
                        tolerance_change=1e-15, line_search_fn="strong_wolfe")  # fmt: skip


def closure():
    opt.zero_grad()
    loss = ((net(theta) - observed) ** 2).sum()
    loss.backward()
    return loss


opt.step(closure)
torch_theta = theta.detach()[0].numpy()

print(f"true theta                    {np.round(theta_true[0].numpy(), 6)}")
print(f"Minuit2 with rootclad's gradient {np.round(with_grad, 6)}: {n_grad} chi2 calls, "
      f"{gradients} gradients")  # fmt: skip
print(f"Minuit2 without gradient       {np.round(without, 6)}: {n_plain} chi2 calls")
print(f"torch L-BFGS                   {np.round(torch_theta, 6)}")
print(f"max |Minuit2 (gradient) - torch| = {np.max(np.abs(np.array(with_grad) - torch_theta)):.3e}")
print(
    f"max |Minuit2 (no gradient) - torch| = {np.max(np.abs(np.array(without) - torch_theta)):.3e}"
)
print(f"calls with gradient {n_grad}, without {n_plain}")
