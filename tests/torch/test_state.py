"""Who owns which state: frozen parameters, parameter views, and each optimizer's own state.

References are torch.optim runs of the same model with the same parameters frozen, and
torch.optim's own argument checks.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from fixtures.core import assert_close_rel, torch_loss
from fixtures.training import OPTIMIZERS, SMALL_BATCH_MODELS, batches, training_data
from torch import nn

import rootclad
from rootclad.compiler import graph_from_export, parameter_aliases
from rootclad.torch.base import ModelBase

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
    "lr beyond a float": (_put_in("config", 1, 10**400), ValueError, "learning rate.*inf"),
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
    "initial_lr beyond a float": (_put("group", {"initial_lr": 10**400}), ValueError, "initial_lr"),
    "initial_lr a string": (_put("group", {"initial_lr": "0.1"}), TypeError, "'initial_lr'"),
    "initial_lr a bool": (_put("group", {"initial_lr": True}), TypeError, "'initial_lr'"),
    "group shadows betas": (_put("group", {"betas": (0.9, 0.99)}), ValueError, "'betas'"),
    # keys of the user's own are kept as torch keeps them, if they are plain data
    "a key of one's own NaN": (_put("group", {"note": math.nan}), ValueError, "'note'.*nan"),
    "a key of one's own a tensor": (_put("group", {"note": torch.ones(1)}), TypeError, "'note'"),
    "a key of one's own nested": (_put("group", {"note": [[1.0]]}), TypeError, "'note'"),
    "a key of one's own long": (_put("group", {"note": [0] * 100}), ValueError, "'note'.*100"),
    "a key of one's own infinite": (_put("group", {"note": (1, math.inf)}), ValueError, "'note'"),
    "a key not a string": (_put("group", {3: 0.5}), TypeError, "'group'.*3"),
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
        (_put("group", {"momentum": 0.5}), ValueError, "'momentum'"),  # its config's
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


def test_a_group_keeps_keys_of_ones_own_through_a_round_trip_as_torch_does(cm):
    """state_dict() saved a key such as "name" and load_state_dict refused it: a state of an
    optimizer whose group was named did not load back (nor a fit checkpoint of it)."""
    ref = torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    ref.param_groups[0]["name"] = "encoder"
    ref.load_state_dict(ref.state_dict())  # the reference: torch keeps it
    assert ref.param_groups[0]["name"] == "encoder"
    opt = _trained_opt(cm)
    own = {"name": "encoder", "frozen": False, "tags": ("a", 1, 2.5, None), "note": None}
    for k, v in own.items():
        opt.param_groups[0][k] = v
    state = opt.state_dict()
    assert state["group"] == {"initial_lr": 1e-2, "min_lr": 1e-4, **own}
    opt.load_state_dict(state)
    other = rootclad.optim.Adam(cm)
    other.load_state_dict(state)
    assert other.state_dict()["group"] == state["group"]
    assert other.param_groups[0]["name"] == "encoder"
    before = _opt_snapshot(other)
    with pytest.raises(TypeError, match="'note'"):  # what would not load back is refused here
        other.param_groups[0]["note"] = torch.ones(1)
    with pytest.raises(ValueError, match="'initial_lr'"):
        other.param_groups[0]["initial_lr"] = math.nan
    _assert_opt_unchanged(other, before, "setting the group")


def test_a_state_is_named_as_its_caller_names_it(cm):
    """fit names a checkpoint's keys; it took base.py's message apart to do it. A caller's own
    name has no hint of check_finite=False, which its users cannot pass."""
    sd = {k: v.clone() for k, v in cm.state_dict().items()}
    sd["4.bias"] = torch.tensor([math.nan], dtype=F64)
    with pytest.raises(ValueError) as err:
        cm.check_state_dict(sd, where="the file's 'weights'")
    assert str(err.value) == (
        "the file's 'weights'['4.bias'] holds nan at [0]: not a finite number; nothing was loaded"
    )
    del sd["4.bias"]
    with pytest.raises(KeyError, match=r"the file's 'weights': missing keys \['4.bias'\]"):
        cm.check_state_dict(sd, where="the file's 'weights'")
    with pytest.raises(TypeError, match="^the file's 'weights' must be a dict"):
        cm.check_state_dict([], where="the file's 'weights'")
    opt = _trained_opt(cm)
    state = opt.state_dict()
    state["state"][1] = math.inf
    with pytest.raises(ValueError, match=r"^the file's 'opt'\['state'\] holds a non-finite value "):
        opt.check_state_dict(state, where="the file's 'opt'")
    state = opt.state_dict()
    state["config"] = [1.0, 0.01, 0.0, 0.0, 0.0, 0.0, 0.9, 0.999, -1.0]  # eps < 0
    with pytest.raises(ValueError, match=r"^invalid epsilon value in the file's 'opt': -1.0"):
        opt.check_state_dict(state, where="the file's 'opt'")


# -- a model's state dict: every entry checked before any is copied in ------------------------
def _with(**entries):
    def change(sd):
        sd.update(entries)

    return change


BAD_STATE_DICTS = {  # the bad entry is the last one loaded: the ones before must stay as they were
    "a shape": (_with(**{"4.bias": torch.zeros(2, dtype=F64)}), ValueError, r"'4.bias'.*\(2,\)"),
    "a list": (_with(**{"4.bias": [0.5]}), TypeError, "'4.bias'.*tensor.*list"),
    "a numpy array": (_with(**{"4.weight": np.zeros((1, 8))}), TypeError, "'4.weight'.*ndarray"),
    "NaN": (
        _with(**{"4.bias": torch.tensor([math.nan], dtype=F64)}),
        ValueError,
        r"'4.bias' holds nan at \[0\]: not a finite.*check_finite=False",
    ),
    "infinity": (
        _with(**{"4.weight": torch.full((1, 8), -math.inf)}),
        ValueError,
        r"'4.weight'.*-inf at \[0, 0\]",
    ),
    "complex": (_with(**{"4.bias": torch.zeros(1, dtype=torch.complex128)}), TypeError, "complex"),
    "bool": (_with(**{"4.bias": torch.zeros(1, dtype=torch.bool)}), TypeError, "'4.bias'.*bool"),
}


@pytest.mark.parametrize("what", BAD_STATE_DICTS)
def test_a_refused_state_dict_leaves_every_tensor_as_it_was(cm, what):
    """A shape error part-way left the tensors before it loaded; lists, arrays, NaN and
    infinities were taken."""
    change, error, words = BAD_STATE_DICTS[what]
    sd = {k: torch.randn_like(v) for k, v in cm.state_dict().items()}
    change(sd)
    before = {k: v.clone() for k, v in cm.state_dict().items()}
    with pytest.raises(error, match=words):
        cm.load_state_dict(sd)
    for k, v in cm.state_dict().items():
        assert torch.equal(v, before[k]), (what, k)


def test_non_finite_weights_load_when_asked_and_strict_false_is_torchs(cm):
    before = {k: v.clone() for k, v in cm.state_dict().items()}
    with pytest.raises(TypeError, match="dict"):
        cm.load_state_dict(list(before.items()))
    nan = {**before, "2.bias": torch.full((8,), math.nan, dtype=F64)}
    cm.load_state_dict(nan, check_finite=False)  # a diverged run, loaded to look at it
    assert torch.isnan(cm.state_dict()["2.bias"]).all()
    result = cm.load_state_dict({"0.bias": torch.ones(12, dtype=torch.int64)}, strict=False)
    assert result.missing_keys == ["0.weight", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert result.unexpected_keys == [] and torch.equal(
        cm.state_dict()["0.bias"], torch.ones(12, dtype=F64)
    )
    with pytest.raises(ValueError, match="'4.bias'"):  # strict=False checks what it loads
        cm.load_state_dict(
            {"0.bias": before["0.bias"], "4.bias": torch.tensor([math.inf])}, strict=False
        )
    assert torch.equal(cm.state_dict()["0.bias"], torch.ones(12, dtype=F64))
    cm.load_state_dict(before)


class _Stateful(nn.Module):
    """BatchNorm under two names, one never called, and a constant buffer that masks with -inf."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.again = self.bn
        self.spare = nn.BatchNorm1d(4)
        self.register_buffer("mask", torch.tensor([[0.0, -math.inf, 0.0, 0.0]]))

    def forward(self, x):
        return self.again(self.fc(x)) + self.mask


@pytest.fixture(scope="module")
def stateful():
    """The state every compiled model loads through (ModelBase: CompiledModel and DeviceModel
    inherit its load_state_dict), float32, over the graph of _Stateful; no library is built."""
    net = _Stateful()
    graph = graph_from_export(net, torch.zeros(5, 3), "float32")
    model = ModelBase(
        graph, "mse", aliases=parameter_aliases(net), ignored=[n for n, _ in net.named_buffers()]
    )
    model.device = torch.device("cpu")
    n, nb = model.n_param_values, sum(b.numel for b in graph.buffers)
    model._view_parameters(torch.zeros(n), torch.zeros(n), torch.zeros(nb))
    with torch.no_grad():
        net.bn.running_var.fill_(2.0)
        net.bn.num_batches_tracked.fill_(3)
    model.load_state_dict(net.state_dict())  # aliases, the unused layer, -inf in the mask
    return net, model


def _value(name, value):
    return lambda sd: sd.update({name: value})


BAD_BUFFERS = {
    "negative running variance": (
        _value("bn.running_var", torch.tensor([1.0, -0.5, 1.0, 1.0])),
        ValueError,
        r"'bn.running_var'.*negative.*-0.5",
    ),
    "NaN running mean": (
        _value("bn.running_mean", torch.tensor([0.0, 0.0, math.nan, 0.0])),
        ValueError,
        r"'bn.running_mean'.*nan at \[2\]",
    ),
    "negative batch count": (
        _value("bn.num_batches_tracked", torch.tensor(-1)),
        ValueError,
        "'bn.num_batches_tracked'.*whole",
    ),
    "fractional batch count": (
        _value("bn.num_batches_tracked", torch.tensor(2.5)),
        ValueError,
        "'bn.num_batches_tracked'.*2.5",
    ),
    "NaN in the mask": (_value("mask", torch.full((1, 4), math.nan)), ValueError, "'mask'.*nan"),
    "float64 beyond float32": (
        _value("fc.weight", torch.full((4, 3), 1e300, dtype=F64)),
        ValueError,
        "'fc.weight'.*1e\\+300.*float32",
    ),
    "names that disagree": (
        _value("again.weight", torch.full((4,), 7.0)),
        ValueError,
        "'again.weight'.*'bn.weight'",
    ),
    "another name a list": (_value("again.bias", [0.0] * 4), TypeError, "'again.bias'"),
    "an unused layer's a list": (_value("spare.running_mean", [0.0] * 4), TypeError, "'spare"),
}


@pytest.mark.parametrize("what", BAD_BUFFERS)
def test_buffers_and_other_names_are_checked_before_anything_loads(stateful, what):
    net, model = stateful
    change, error, words = BAD_BUFFERS[what]
    sd = {k: v.clone() for k, v in net.state_dict().items() if not k.startswith("again.")}
    sd["fc.bias"] = torch.full((4,), 9.0)  # loaded before the bad entry, unless refused
    change(sd)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=words):
        model.load_state_dict(sd)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), (what, k)
    if what in ("NaN running mean", "NaN in the mask", "float64 beyond float32"):
        model.load_state_dict(sd, check_finite=False)  # the way the message gives
        model.load_state_dict(before)
    elif error is ValueError and "names" not in what:  # never a state torch would make
        with pytest.raises(error, match=words):
            model.load_state_dict(sd, check_finite=False)


def test_the_models_share_one_load_state_dict():
    from rootclad.torch import CompiledModel, DeviceModel

    assert CompiledModel.load_state_dict is ModelBase.load_state_dict
    assert DeviceModel.load_state_dict is ModelBase.load_state_dict
