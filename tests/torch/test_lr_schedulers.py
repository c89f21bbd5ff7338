"""torch.optim.lr_scheduler on rootclad's optimizers: each scheduler changes the learning rate
exactly as it changes a torch.optim optimizer's on the same schedule, and what it sets is what
the next train_step uses.

Reference: torch's own optimizer, stepped by the same scheduler with the same metrics.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import rootclad

F64 = torch.float64
sched = torch.optim.lr_scheduler


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)).double()


def _batch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 6, generator=g, dtype=F64)
    return x, (x[:, 0] > 0).to(F64)


SCHEDULERS = {
    "steplr": lambda o: sched.StepLR(o, step_size=3, gamma=0.3),
    "cosine": lambda o: sched.CosineAnnealingLR(o, T_max=5, eta_min=1e-4),
    "plateau": lambda o: sched.ReduceLROnPlateau(o, factor=0.5, patience=1),
    "exponential": lambda o: sched.ExponentialLR(o, gamma=0.9),
    "onecycle": lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=20),
}
METRICS = [1.0, 0.9, 0.95, 0.97, 0.8, 0.85, 0.86, 0.87, 0.7, 0.71, 0.72, 0.73, 0.74, 0.6, 0.61]


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
@pytest.mark.parametrize("kind", SCHEDULERS)
def test_schedulers_change_the_lr_as_on_a_torch_optimizer(kind, optimizer):
    net = _mlp()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
    ours = getattr(rootclad.optim, optimizer)(cm, lr=0.05)
    p = torch.zeros(3, requires_grad=True)
    theirs = getattr(torch.optim, optimizer)([p], lr=0.05)
    s_ours, s_theirs = SCHEDULERS[kind](ours), SCHEDULERS[kind](theirs)
    x, y = _batch()
    lrs, ref = [], []
    for metric in METRICS:
        cm.train_step(x, y, ours)  # (before the scheduler, as torch asks: no warning either)
        p.grad = torch.ones(3)
        theirs.step()
        for s in (s_ours, s_theirs):
            s.step(metric) if kind == "plateau" else s.step()
        lrs.append(ours.lr)
        ref.append(theirs.param_groups[0]["lr"])
        if "betas" in theirs.param_groups[0]:  # OneCycleLR cycles Adam's beta1 too
            assert ours.param_groups[0]["betas"] == theirs.param_groups[0]["betas"]
    assert lrs == ref  # exactly: the same arithmetic on the same numbers
    assert len(set(lrs)) > 2, lrs  # the schedule changed it
    # (that the C++ update then uses these rates: test_fit.py's weights against a torch loop)
    # what it added to the group (initial_lr, OneCycleLR's max_lr, ...) is kept for a checkpoint
    kept = ours.state_dict()["group"]
    assert kept == {k: theirs.param_groups[0][k] for k in kept}
    assert ("initial_lr" in kept) == ("initial_lr" in theirs.param_groups[0])


def test_the_param_group_is_checked_and_the_optimizer_stays_rootclads():
    cm = rootclad.compile(_mlp(), example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
    opt = rootclad.optim.SGD(cm, lr=0.1, momentum=0.9)
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.Optimizer)
    assert group["lr"] == 0.1 and group["momentum"] == 0.9 and not group["nesterov"]
    assert [id(p) for p in group["params"]] == [id(p) for p in cm.parameters()]
    with pytest.raises(ValueError, match="learning rate"):
        group["lr"] = -1.0
    with pytest.raises(ValueError, match="learning rate"):
        group["lr"] = math.nan
    assert opt.lr == 0.1  # the refused value changed nothing
    group["momentum"] = 0.5
    assert opt.hyperparameters()["momentum"] == 0.5
    with pytest.raises(RuntimeError, match="inside cm.train_step"):
        opt.step()
    with pytest.raises(ValueError, match="one param group"):
        opt.add_param_group({"params": []})
    adam = rootclad.optim.Adam(cm, lr=1e-3)
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        adam.param_groups[0]["betas"] = (0.9, 1.0)
    assert adam.param_groups[0]["betas"] == (0.9, 0.999)
