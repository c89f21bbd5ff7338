"""Who owns which state: frozen parameters, parameter views, and each optimizer's own state.

References are torch.optim runs of the same model with the same parameters frozen, and
torch.optim's own argument checks.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from fixtures.core import assert_close_rel, torch_loss
from fixtures.training import OPTIMIZERS, SMALL_BATCH_MODELS, batches, training_data
from torch import nn

import rootclad

F64 = torch.float64
RTOL = 1e-8


def _set_frozen(named, frozen: set[str]) -> None:
    for name, p in named:
        p.requires_grad_(name not in frozen)


# (step at which the set applies, names frozen from then on)
SCHEDULE = [(0, {"0.weight"}), (20, {"0.weight", "0.bias"}), (40, set()), (55, {"0.bias"})]


@pytest.mark.parametrize("sizes", [(1, 8), (16, 32)], ids=["fused", "unfused"])
@pytest.mark.parametrize("name, ours, theirs, kwargs", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_frozen_parameters_stay_frozen_and_the_rest_tracks_torch(name, ours, theirs, kwargs, sizes):
    """Parameters frozen at compile time and frozen / thawed mid-run: torch.optim skips a
    parameter without a gradient (its state and step count too); so must train_step."""
    _track_frozen("pullback", name, ours, theirs, kwargs, sizes)


@pytest.mark.clad
@pytest.mark.parametrize("name, ours, theirs, kwargs", [OPTIMIZERS[3], OPTIMIZERS[1]],
                         ids=["adam", "sgd-nesterov-wd"])  # fmt: skip
def test_frozen_parameters_stay_frozen_with_the_clad_engine(clad, name, ours, theirs, kwargs):
    _track_frozen("clad", name, ours, theirs, kwargs, (1, 8))


def _track_frozen(engine, name, ours, theirs, kwargs, sizes):
    build, shape = SMALL_BATCH_MODELS["conv-head"]
    torch.manual_seed(0)
    net0 = build().double()
    net0[0].weight.requires_grad_(False)
    cm = rootclad.compile(net0, example_input=torch.zeros(1, *shape, dtype=F64), engine=engine)
    assert cm.engine == engine
    assert not cm.state_dict()["0.weight"].requires_grad
    assert not dict(cm.named_parameters())["0.weight"].requires_grad
    net = copy.deepcopy(net0)
    opt, opt_ref = ours(cm, **kwargs), theirs(net.parameters(), **kwargs)
    x, y = training_data(shape=shape, seed=8)
    changes = dict(SCHEDULE)
    was = {k: v.clone() for k, v in cm.state_dict().items()}
    for step, idx in enumerate(batches(len(x), 70, seed=9, sizes=sizes)):
        if step in changes:
            _set_frozen(cm.named_parameters(), changes[step])
            _set_frozen(net.named_parameters(), changes[step])
        frozen = {k for k, p in cm.named_parameters() if not p.requires_grad}
        cm.train_step(x[idx], y[idx], opt)
        opt_ref.zero_grad()
        torch_loss("bce_with_logits", net(x[idx]), y[idx]).backward()
        opt_ref.step()
        now = cm.state_dict()
        for k in frozen:
            assert torch.equal(now[k], was[k]), f"step {step}: frozen {k} changed"
        was = {k: v.clone() for k, v in now.items()}
    for (k, p), q in zip(cm.named_parameters(), net.parameters(), strict=True):
        assert_close_rel(p, q, RTOL, f"{name} {k}")
        assert not torch.equal(p.detach(), net0.state_dict()[k]), f"{k} never trained"


def test_loss_and_grad_and_autograd_leave_frozen_parameters_out():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1)).double()
    net[2].bias.requires_grad_(False)
    x = torch.randn(5, 4, dtype=F64)
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    _, grads = cm.loss_and_grad(x, torch.ones(5, 1, dtype=F64))
    assert list(grads) == ["0.weight", "0.bias", "2.weight"]
    cm(x).sum().backward()
    views = dict(cm.named_parameters())
    assert views["2.bias"].grad is None and views["2.weight"].grad is not None


def test_assigning_data_to_a_parameter_view_is_refused():
    """p.data = t would leave the compiled code reading the old arena values."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 1)).double()
    x = torch.randn(3, 4, dtype=F64)
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    p = dict(cm.named_parameters())["0.weight"]
    before = cm.predict(x)
    with pytest.raises(RuntimeError, match="copy_"):
        p.data = torch.zeros(1, 4, dtype=F64)
    assert torch.equal(cm.predict(x), before)
    assert p.data.data_ptr() == p.data_ptr()  # reading .data still works (torch code does)
    with torch.no_grad():  # the way the message gives
        p.copy_(torch.zeros(1, 4, dtype=F64))
    assert torch.equal(cm.predict(x), net[0].bias.detach().expand(3, 1))


@pytest.fixture(scope="module")
def cm():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 8), nn.GELU(), nn.Linear(8, 1))
    return rootclad.compile(net.double(), example_input=torch.zeros(1, 6, dtype=F64),
                            engine="pullback")  # fmt: skip


BAD_SETTINGS = [
    (rootclad.optim.SGD, None, {"lr": math.nan}),  # torch's SGD takes it, then trains to NaN
    (rootclad.optim.SGD, None, {"lr": math.inf}),
    (rootclad.optim.SGD, torch.optim.SGD, {"lr": -0.1}),
    (rootclad.optim.SGD, torch.optim.SGD, {"lr": 0.1, "momentum": -0.5}),
    (rootclad.optim.SGD, torch.optim.SGD, {"lr": 0.1, "weight_decay": -1.0}),
    (rootclad.optim.Adam, torch.optim.Adam, {"lr": math.nan}),
    (rootclad.optim.Adam, torch.optim.Adam, {"betas": (1.5, 0.999)}),
    (rootclad.optim.Adam, torch.optim.Adam, {"betas": (0.9, 1.0)}),
    (rootclad.optim.Adam, torch.optim.Adam, {"betas": (-0.1, 0.999)}),
    (rootclad.optim.Adam, torch.optim.Adam, {"eps": -1e-8}),
    (rootclad.optim.Adam, torch.optim.Adam, {"weight_decay": -0.1}),
    (rootclad.optim.AdamW, torch.optim.AdamW, {"betas": (0.9, math.nan)}),
    (rootclad.optim.AdamW, torch.optim.AdamW, {"weight_decay": -0.1}),
]


@pytest.mark.parametrize("ours, theirs, kwargs", BAD_SETTINGS, ids=lambda v: str(v))
def test_optimizer_settings_torch_refuses_are_refused(cm, ours, theirs, kwargs):
    if theirs is not None:
        with pytest.raises(ValueError):  # the reference: torch refuses these too
            theirs([torch.zeros(1, requires_grad=True)], **kwargs)
    with pytest.raises(ValueError) as err:
        ours(cm, **kwargs)
    assert any(k in str(err.value) for k in ("learning rate", "beta", "epsilon", "momentum",
                                             "weight_decay")), str(err.value)  # fmt: skip


def test_optimizer_refuses_a_non_finite_learning_rate_set_later(cm):
    opt = rootclad.optim.Adam(cm, lr=1e-3)
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="learning rate"):
            opt.lr = bad
    assert opt.lr == 1e-3


def test_two_optimizers_on_one_model_keep_their_own_state(cm):
    """An Adam and an SGD with momentum taking turns on one model equal torch.optim's two doing
    the same; before, creating the second zeroed the first's state (one shared arena)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 8), nn.GELU(), nn.Linear(8, 1))
    net = net.double()
    cm.load_state_dict(net.state_dict())
    a, b = rootclad.optim.Adam(cm, lr=1e-2), rootclad.optim.SGD(cm, lr=0.05, momentum=0.9)
    ref_a = torch.optim.Adam(net.parameters(), lr=1e-2)
    ref_b = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    x, y = training_data(seed=2)
    for i, idx in enumerate(batches(len(x), 40, seed=3)):
        ours, ref = (a, ref_a) if i % 3 else (b, ref_b)
        cm.train_step(x[idx], y[idx], ours)
        ref.zero_grad()
        torch_loss("bce_with_logits", net(x[idx]), y[idx]).backward()
        ref.step()
    for (k, p), q in zip(cm.named_parameters(), net.parameters(), strict=True):
        assert_close_rel(p, q, RTOL, k)


# -- an optimizer state is data from a file: every value checked, nothing changed when refused --
def _trained_opt(cm, make=rootclad.optim.Adam, **kwargs):
    opt = make(cm, **{"lr": 1e-2, **kwargs})
    x, y = training_data(seed=4)
    cm.train_step(x[:8], y[:8], opt)
    opt.param_groups[0]["initial_lr"] = 1e-2  # what a scheduler keeps there
    opt.param_groups[0]["min_lr"] = 1e-4
    return opt


def _opt_snapshot(opt):
    state = opt.state_dict()
    return state.pop("state").clone(), state


def _assert_opt_unchanged(opt, before, what):
    state = opt.state_dict()
    assert torch.equal(state.pop("state"), before[0]), what
    assert state == before[1], what


def _put(key, value):
    def change(state):
        state[key] = value

    return change


def _put_in(key, index, value):
    def change(state):
        state[key] = type(state[key])(state[key])
        state[key][index] = value

    return change


# config fields: kind, lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps
BAD_OPTIMIZER_STATES = {  # what is wrong: (change, error, the words the error must hold)
    **{
        f"{k} missing": (lambda s, k=k: s.pop(k), ValueError, f"no '{k}'")
        for k in ("kind", "config", "step_count", "steps", "state")
    },
    "a key of torch.optim's": (_put("param_groups", []), ValueError, "'param_groups'"),
    "state a list": (lambda s: s.update(state=s["state"].tolist()), TypeError, "'state'.*tensor"),
    "state of integers": (lambda s: s.update(state=s["state"].long()), TypeError, "'state'"),
    "kind a bool": (_put("kind", True), TypeError, "'kind'"),
    "config a string": (_put("config", "0.01"), TypeError, "'config'"),
    "lr a string": (_put_in("config", 1, "0.01"), TypeError, r"'config'\[1\]"),
    "kind in config another": (_put_in("config", 0, 0.0), ValueError, r"'config'\[0\]"),
    "unused momentum NaN": (_put_in("config", 2, math.nan), ValueError, r"'config'\[2\]"),
    "unused momentum set": (_put_in("config", 2, 0.5), ValueError, r"'config'\[2\].*momentum"),
    "step_count a float": (_put("step_count", 1.0), ValueError, "step_count.*whole.*1.0"),
    "step_count too large": (_put("step_count", 2**70), ValueError, "step_count"),
    "steps a string": (_put("steps", "1111"), TypeError, "'steps'"),
    "group a string": (_put("group", "x"), TypeError, "'group'"),
    "group shadows lr": (_put("group", {"lr": 5.0}), ValueError, "'lr'.*hyperparameter"),
    "group holds params": (_put("group", {"params": [0, 1]}), ValueError, "'params'"),
    "initial_lr NaN": (_put("group", {"initial_lr": math.nan}), ValueError, "'initial_lr'.*nan"),
    "initial_lr negative": (_put("group", {"initial_lr": -0.1}), ValueError, "'initial_lr'"),
    "initial_lr a string": (_put("group", {"initial_lr": "0.1"}), TypeError, "'initial_lr'"),
    "initial_lr a bool": (_put("group", {"initial_lr": True}), TypeError, "'initial_lr'"),
    "a key no scheduler writes": (_put("group", {"note": 1.0}), ValueError, "'note'"),
}


@pytest.mark.parametrize("what", BAD_OPTIMIZER_STATES)
def test_an_optimizer_state_is_refused_naming_the_key_and_nothing_changes(cm, what):
    """opt.load_state_dict raised KeyError for a missing key, took a list, strings and floats
    for numbers, another kind's config and any group key (a NaN initial_lr, an "lr" the
    optimizer's own setting shadows)."""
    change, error, words = BAD_OPTIMIZER_STATES[what]
    opt = _trained_opt(cm)
    state = opt.state_dict()
    change(state)
    before = _opt_snapshot(opt)
    with pytest.raises(error, match=words):
        opt.load_state_dict(state)
    _assert_opt_unchanged(opt, before, what)


@pytest.mark.parametrize(
    "change, error, words",
    [
        (_put("group", {"betas": (0.9, 0.99)}), ValueError, "'betas'"),  # Adam's, not SGD's
        (_put_in("config", 5, 0.5), ValueError, r"'config'\[5\].*nesterov"),
        (_put_in("config", 6, 0.9), ValueError, r"'config'\[6\]"),  # beta1, unused by SGD
        ([], TypeError, "dict"),
    ],
)
def test_an_sgd_state_with_adams_settings_or_a_half_nesterov_is_refused(cm, change, error, words):
    opt = _trained_opt(cm, rootclad.optim.SGD, momentum=0.9, nesterov=True)
    state = opt.state_dict()
    if callable(change):
        change(state)
    else:
        state = change
    before = _opt_snapshot(opt)
    with pytest.raises(error, match=words):
        opt.load_state_dict(state)
    _assert_opt_unchanged(opt, before, words)


def test_a_loaded_group_replaces_the_optimizers_as_torch_does(cm):
    opt = _trained_opt(cm)
    state = opt.state_dict()
    state["group"] = {"initial_lr": 0.02, "max_lr": 0.1}
    opt.load_state_dict(state)  # min_lr goes: the group is the saved one
    assert opt.state_dict()["group"] == {"initial_lr": 0.02, "max_lr": 0.1}
    assert opt.param_groups[0]["initial_lr"] == 0.02 and "min_lr" not in opt.param_groups[0]
