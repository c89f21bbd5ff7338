"""A NaN or infinity in a training batch must not poison the parameters or the optimizer.

``train_step`` refused nothing: one NaN input made every parameter and Adam's moments NaN for
good, and loading the parameters back did not help (the moments stayed NaN). Now a non-finite
input, target or weight is refused, naming the sample, with everything left byte for byte;
an optimizer whose state holds NaN is refused until it is reset or loaded; an optimizer state
with NaN or infinite hyperparameters is refused when loaded. References: torch.optim.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import rootclad

F64 = torch.float64


def _setup(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    cm = rootclad.compile(copy.deepcopy(net), torch.zeros(4, 6, dtype=F64), "mse",
                          engine="pullback")  # fmt: skip
    return net, cm


def _batch(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, generator=gen, dtype=F64), torch.randn(4, 1, generator=gen, dtype=F64)


def _snapshot(cm, opt):
    return [p.detach().clone() for p in cm.parameters()], opt.state_dict()


def _assert_unchanged(cm, opt, before):
    params, state = before
    for p, q in zip(cm.parameters(), params, strict=True):
        assert torch.equal(p.detach(), q)
    now = opt.state_dict()
    assert torch.equal(now["state"], state["state"])
    assert now["step_count"] == state["step_count"] and now["config"] == state["config"]


@pytest.mark.parametrize(
    "where, value, message",
    [("input", float("nan"), r"non-finite input \(nan\) in sample 2, value 3"),
     ("input", float("inf"), r"non-finite input \(inf\) in sample 2, value 3"),
     ("target", float("-inf"), r"non-finite target \(-inf\) in sample 1, value 0"),
     ("weight", float("nan"), r"weight: non-finite value \(nan\) in sample 3")],
)  # fmt: skip
def test_a_non_finite_batch_is_refused_and_training_goes_on_as_in_torch(where, value, message):
    net, cm = _setup()
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    ref = torch.optim.Adam(net.parameters(), lr=1e-2)
    x, y = _batch(1)
    cm.train_step(x, y, opt)
    ref.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    ref.step()
    before = _snapshot(cm, opt)
    bad_x, bad_y = _batch(2)
    w = torch.ones(4, dtype=F64)
    {"input": bad_x[2], "target": bad_y[1], "weight": w[3:]}[where][
        {"input": 3, "target": 0, "weight": 0}[where]
    ] = value
    with pytest.raises(ValueError, match=message):
        cm.train_step(bad_x, bad_y, opt, weight=w)
    _assert_unchanged(cm, opt, before)
    for seed in (3, 4):  # the next steps are torch's, as if the bad batch had never come
        x, y = _batch(seed)
        cm.train_step(x, y, opt)
        ref.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        ref.step()
    for p, q in zip(cm.parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-10, atol=1e-12)


def test_the_input_of_a_two_input_model_is_named():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 1)

        def forward(self, a, b):
            return self.fc(torch.cat([a, b], dim=1))

    torch.manual_seed(0)
    a, b = torch.randn(3, 2, dtype=F64), torch.randn(3, 3, dtype=F64)
    cm = rootclad.compile(Two().double(), (a, b), "mse", engine="pullback")
    opt = rootclad.optim.SGD(cm, lr=0.1)
    b[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite input 1 \(nan\) in sample 1, value 2"):
        cm.train_step((a, b), torch.zeros(3, 1, dtype=F64), opt)
    assert opt.step_count == 0


def test_a_poisoned_optimizer_is_refused_until_reset_even_with_its_parameters_restored():
    net, cm = _setup()
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    x, y = _batch(1)
    saved = {k: v.clone() for k, v in cm.state_dict().items()}
    bad = x.clone()
    bad[0, 0] = float("nan")
    loss = cm.train_step(bad, y, opt, check_finite=False)  # opted out: the step runs
    assert loss != loss
    assert not bool(torch.isfinite(opt.state_dict()["state"]).all())
    cm.load_state_dict(saved)  # the parameters back; Adam's moments are still NaN
    with pytest.raises(ValueError, match=r"Adam: the state holds a non-finite value \(nan\) "
                                         r"in the exp_avg of '0.weight' \(value 0\)"):  # fmt: skip
        cm.train_step(x, y, opt)
    for p, q in zip(cm.parameters(), net.parameters(), strict=True):
        assert torch.equal(p.detach(), q.detach())  # refused: nothing moved
    opt.reset()
    ref = torch.optim.Adam(net.parameters(), lr=1e-2)
    for seed in (1, 2):
        x, y = _batch(seed)
        cm.train_step(x, y, opt)
        ref.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        ref.step()
    for p, q in zip(cm.parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "kind, field, value, message",
    [("adam", "lr", float("nan"), "learning rate in the loaded state: nan"),
     ("adam", "beta1", float("inf"), "beta parameter at index 0 in the loaded state: inf"),
     ("adam", "beta2", 1.0, "beta parameter at index 1 in the loaded state: 1.0"),
     ("adam", "eps", float("nan"), "epsilon value in the loaded state: nan"),
     ("adam", "weight_decay", float("-inf"), "weight_decay in the loaded state: -inf"),
     ("sgd", "momentum", float("nan"), "momentum in the loaded state: nan"),
     ("sgd", "dampening", float("inf"), "dampening in the loaded state: inf"),
     ("sgd", "lr", float("inf"), "learning rate in the loaded state: inf")],
)  # fmt: skip
def test_an_optimizer_state_with_bad_hyperparameters_is_refused(kind, field, value, message):
    _, cm = _setup()
    make = {"adam": rootclad.optim.Adam, "sgd": rootclad.optim.SGD}[kind]
    opt = make(cm, lr=1e-2)
    cm.train_step(*_batch(1), opt)
    state = opt.state_dict()
    fields = ["kind", "lr", "momentum", "dampening", "weight_decay", "nesterov", "beta1",
              "beta2", "eps"]  # fmt: skip
    state["config"][fields.index(field)] = value
    before = _snapshot(cm, opt)
    with pytest.raises(ValueError, match=f"invalid {message}"):
        opt.load_state_dict(state)
    _assert_unchanged(cm, opt, before)


def test_an_optimizer_state_with_nan_moments_is_refused_when_loaded():
    _, cm = _setup()
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    cm.train_step(*_batch(1), opt)
    state = opt.state_dict()
    n = len(state["state"]) // 2
    state["state"][n + 30 + 5 + 1] = float("inf")  # after 0.weight (5, 6) and 0.bias (5)
    before = _snapshot(cm, opt)
    with pytest.raises(ValueError, match=r"inf\) in the exp_avg_sq of '2.weight' \(value 1\)"):
        opt.load_state_dict(state)
    _assert_unchanged(cm, opt, before)


@pytest.mark.parametrize(
    "change, message",
    [(dict(step_count=-1), "step_count must be a whole number >= 0, got -1"),
     (dict(step_count=2.5), "step_count must be a whole number >= 0, got 2.5"),
     (dict(steps=[1, 1, 1]), "counts steps for 3 parameter tensors; this model has 4"),
     (dict(steps=[1, 1, 2, 1]), r"a parameter tensor's step count \(2\) exceeds the optimizer's \(1\)"),
     (dict(steps=[1, -1, 1, 1]), "per-tensor step count must be a whole number >= 0, got -1")],
)  # fmt: skip
def test_an_optimizer_state_with_impossible_step_counts_is_refused(change, message):
    """A step count of -1 made the next Adam step divide by 1 - beta**0 = 0: every parameter
    NaN, with finite batches and a finite state."""
    _, cm = _setup()
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    cm.train_step(*_batch(1), opt)
    state = {**opt.state_dict(), **change}
    before = _snapshot(cm, opt)
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(state)
    _assert_unchanged(cm, opt, before)


def test_per_tensor_step_counts_load_and_train_on():
    _, cm = _setup()
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    cm.train_step(*_batch(1), opt)
    state = {**opt.state_dict(), "steps": [1, 1, 0, 1]}
    opt.load_state_dict(state)
    assert opt.state_dict()["steps"] == [1, 1, 0, 1]
    cm.train_step(*_batch(2), opt)
    assert opt.state_dict()["steps"] == [2, 2, 1, 2]
    assert all(torch.isfinite(p).all() for p in cm.parameters())
