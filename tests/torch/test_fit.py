"""rootclad.fit against a plain torch training loop, and its early stopping, schedulers,
checkpoints and progress bar.

References: the same model trained by torch autograd with torch.optim and torch's own
schedulers on the same batches (float64: losses and weights to rounding); a one-weight model
whose weights after each epoch of full-batch SGD are known in closed form, so that the best
validation epoch is known before the fit runs; the compiled loss (loss_and_grad) for the
validation loss of each kind of loss.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rootclad
from rootclad.torch.fit import check_checkpoint, evaluate

F64 = torch.float64
sched = torch.optim.lr_scheduler


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)).double()


@pytest.fixture(scope="module")
def mlp():
    """_mlp compiled once for the tests that start it from _mlp's weights (load_state_dict)."""
    return rootclad.compile(_mlp(), example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")


def _batches(n, B, seed, weights=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=F64)
    y = ((x[:, 0] * x[:, 1] + x[:, 2]) > 0).to(torch.int32)  # labels as readers give them
    w = torch.rand(n, generator=g, dtype=F64) + 0.5
    return [(x[i : i + B], y[i : i + B], *([w[i : i + B]] if weights else []))
            for i in range(0, n, B)]  # fmt: skip


def _torch_loss(out, y, w, norm):
    terms = F.binary_cross_entropy_with_logits(out[:, 0], y.double(), reduction="none")
    if w is None:
        return terms.mean(), terms.sum(), len(y)
    total = (terms * w).sum()
    return (
        (total / (w.sum() if norm == "sum_w" else len(y))),
        total,
        (w.sum() if norm == "sum_w" else len(y)),
    )


def _torch_fit(net, opt, scheduler, train, val, epochs, norm):
    """The loop a torch user writes: the same batches, the epoch's loss weighted as one batch's."""
    history = []
    for _ in range(epochs):
        lr = opt.param_groups[0]["lr"]
        total = seen = 0.0
        for x, y, *w in train:
            opt.zero_grad()
            loss, _, n = _torch_loss(net(x), y, w[0] if w else None, norm)
            loss.backward()
            opt.step()
            total, seen = total + loss.item() * float(n), seen + float(n)
        with torch.no_grad():
            parts = [_torch_loss(net(x), y, w[0] if w else None, norm)[1:] for x, y, *w in val]
        v = sum(float(t) for t, _ in parts) / sum(float(n) for _, n in parts)
        history.append((total / seen, v, lr))
        if scheduler is not None:
            scheduler.step()
    return history


CASES = {  # optimizer, its settings, scheduler (or None), event weights, weight_norm
    "sgd-momentum-steplr": (
        "SGD",
        {"lr": 0.1, "momentum": 0.9},
        lambda o: sched.StepLR(o, 2, gamma=0.5),
        False,
        "mean",
    ),
    "adam-cosine-weights": (
        "Adam",
        {"lr": 1e-2},
        lambda o: sched.CosineAnnealingLR(o, T_max=4),
        True,
        "mean",
    ),
    "adamw-sum_w": ("AdamW", {"lr": 1e-2, "weight_decay": 0.1}, None, True, "sum_w"),
}


@pytest.mark.parametrize("case", CASES)
def test_fit_equals_a_torch_loop(case):
    name, kwargs, make_scheduler, weights, norm = CASES[case]
    net = _mlp()
    ref = copy.deepcopy(net)
    cm = rootclad.compile(net, example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
    train, val = _batches(120, 16, 1, weights), _batches(50, 16, 2, weights)
    opt = getattr(rootclad.optim, name)(cm, **kwargs)
    result = rootclad.fit(cm, opt, train, epochs=5, validation=val, restore_best=False,
                          scheduler=make_scheduler and make_scheduler(opt), weight_norm=norm,
                          progress=False)  # fmt: skip
    topt = getattr(torch.optim, name)(ref.parameters(), **kwargs)
    expected = _torch_fit(ref, topt, make_scheduler and make_scheduler(topt), train, val, 5, norm)
    got = [(h["train_loss"], h["val_loss"]) for h in result.history]
    np.testing.assert_allclose(got, [e[:2] for e in expected], rtol=1e-10, atol=0)
    assert [h["lr"] for h in result.history] == [e[2] for e in expected]  # each epoch's rate
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-10, atol=1e-13, msg=k)
    assert got[-1][0] < 0.9 * got[0][0]  # it trained


def _one_weight(eta, epochs_known=30):
    """Linear(1, 1) without bias, weight 0, mse on y = 2x, full-batch SGD at eta: the weight
    after t epochs is 2 - 2 r**t with r = 1 - 2 eta mean(x**2)."""
    x = torch.linspace(0.5, 1.5, 8, dtype=F64)[:, None]
    r = 1 - 2 * eta * float((x**2).mean())
    return x, [2 - 2 * r**t for t in range(epochs_known + 1)]


def test_early_stopping_stops_at_the_known_epoch_and_restores_its_weights():
    eta, c, patience = 0.1, 1.45, 3
    x, w = _one_weight(eta)
    m2 = float((x**2).mean())
    val_losses = [m2 * (w[t] - c) ** 2 for t in range(1, len(w))]  # epochs 1, 2, ...
    best = int(np.argmin(val_losses)) + 1
    assert 3 < best < 20 and val_losses[best - 1] < 0.5 * min(
        val_losses[best - 2], val_losses[best]
    )
    net = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        net.weight.zero_()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 1, dtype=F64), loss="mse",
                          engine="pullback")  # fmt: skip
    last = []
    result = rootclad.fit(cm, rootclad.optim.SGD(cm, lr=eta), [(x, 2 * x)], epochs=40,
                          validation=[(x, c * x)], patience=patience, progress=False,
                          on_epoch_end=lambda s: last.append(float(s.model.state_dict()["weight"])))  # fmt: skip
    assert result.best_epoch == best and result.stopped_early
    assert len(result.history) == best + patience  # the epochs after the best: patience
    np.testing.assert_allclose([h["val_loss"] for h in result.history],
                               val_losses[: best + patience], rtol=1e-10)  # fmt: skip
    np.testing.assert_allclose(last, w[1 : best + patience + 1], rtol=1e-12)
    assert float(cm.state_dict()["weight"]) == pytest.approx(w[best], rel=1e-12)  # restored
    assert abs(last[-1] - w[best]) > 0.1  # (and the last epoch's was another)
    # restore_best=False keeps the last epoch's
    cm.load_state_dict({"weight": torch.zeros(1, 1)})
    rootclad.fit(cm, rootclad.optim.SGD(cm, lr=eta), [(x, 2 * x)], epochs=40, patience=patience,
                 validation=[(x, c * x)], restore_best=False, progress=False)  # fmt: skip
    assert float(cm.state_dict()["weight"]) == pytest.approx(w[best + patience], rel=1e-12)


def test_min_delta_and_patience_follow_keras():
    """An improvement is a loss below the best by more than min_delta; patience counts the
    epochs after the last improvement (the monitored number here is given, not computed)."""
    cm = rootclad.compile(_mlp(), example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
    scripted = iter([1.0, 0.95, 0.92, 0.5, 0.49, 0.48, 0.47, 0.1])
    result = rootclad.fit(cm, rootclad.optim.SGD(cm, lr=0.01), _batches(16, 16, 1), epochs=8,
                          validation=lambda: next(scripted), patience=2, min_delta=0.05,
                          progress=False)  # fmt: skip
    # 0.95 and 0.92 are within 0.05 of 1.0: no improvement; 0.5 is; 0.49, 0.48: not; stop
    assert result.best_epoch == 4 and result.best_loss == 0.5
    assert len(result.history) == 6 and result.stopped_early
    with pytest.raises(ValueError, match="patience=0"):
        rootclad.fit(cm, rootclad.optim.SGD(cm), [], epochs=1, patience=0)


class _Shuffled:
    """Batches in an order set by the epoch, as rootclad.data's iterators (set_epoch)."""

    def __init__(self, batches):
        self.batches, self.epoch = batches, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        order = torch.randperm(
            len(self.batches), generator=torch.Generator().manual_seed(self.epoch)
        )
        self.epoch += 1
        return iter([self.batches[i] for i in order])


def test_a_resumed_fit_ends_where_an_uninterrupted_one_ends(tmp_path):
    train, val = _batches(96, 16, 1), _batches(32, 16, 2)

    def setup():
        cm = rootclad.compile(_mlp(), example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
        opt = rootclad.optim.Adam(cm, lr=1e-2)
        return cm, opt, sched.StepLR(opt, 1, gamma=0.7)

    cm, opt, s = setup()
    full = rootclad.fit(cm, opt, _Shuffled(train), epochs=5, validation=val, scheduler=s,
                        patience=4, progress=False)  # fmt: skip

    def save_and_stop(state):
        torch.save(state.checkpoint(), tmp_path / "ckpt.pt")
        state.stop = state.epoch == 2

    cm2, opt2, s2 = setup()
    first = rootclad.fit(cm2, opt2, _Shuffled(train), epochs=5, validation=val, scheduler=s2,
                         patience=4, progress=False, on_epoch_end=save_and_stop)  # fmt: skip
    assert len(first.history) == 2 and first.stopped_early
    cm3, opt3, s3 = setup()
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)  # plain data: no pickle of code
    resumed = rootclad.fit(cm3, opt3, _Shuffled(train), epochs=5, validation=val, scheduler=s3,
                           patience=4, progress=False, resume=ckpt)  # fmt: skip
    assert resumed.resumed_from == 2 and opt3.lr == opt.lr
    keys = ("train_loss", "val_loss", "lr")
    assert [[h[k] for k in keys] for h in resumed.history] == [[h[k] for k in keys]
                                                               for h in full.history]  # fmt: skip
    for (k, a), b in zip(cm.state_dict().items(), cm3.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="holds a scheduler"):
        rootclad.fit(cm3, opt3, train, epochs=5, resume=ckpt)


def test_a_fit_resumed_between_its_best_epoch_and_its_stop_keeps_both(tmp_path):
    """A model with Dropout (its masks follow the model's call count) and a validation loss
    whose best epoch (2) comes before the resume point (3), with patience 3: the resumed fit
    stops at the same epoch, restores the same (epoch 2) weights and draws the same masks."""
    train = _batches(96, 16, 1)
    vals = [0.5, 0.3, 0.4, 0.45, 0.6, 0.7, 0.8]  # best at epoch 2; no improvement after

    def setup():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 1)).double()
        cm = rootclad.compile(net, example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
        return cm, rootclad.optim.Adam(cm, lr=1e-2)

    def validation(start):
        it = iter(vals[start:])
        return lambda: next(it)

    cm, opt = setup()
    best = {}

    def keep(state):
        if state.epoch == 2:
            best.update({k: v.clone() for k, v in state.model.state_dict().items()})

    full = rootclad.fit(cm, opt, _Shuffled(train), epochs=7, validation=validation(0),
                        patience=3, progress=False, on_epoch_end=keep)  # fmt: skip
    assert (full.best_epoch, len(full.history), full.stopped_early) == (2, 5, True)
    for k, v in cm.state_dict().items():
        assert torch.equal(v, best[k]), k  # the best epoch's weights, restored

    def save_at_3(state):
        torch.save(state.checkpoint(), tmp_path / "ckpt.pt")
        state.stop = state.epoch == 3

    cm2, opt2 = setup()
    rootclad.fit(cm2, opt2, _Shuffled(train), epochs=7, validation=validation(0), patience=3,
                 progress=False, on_epoch_end=save_at_3)  # fmt: skip
    cm3, opt3 = setup()
    resumed = rootclad.fit(cm3, opt3, _Shuffled(train), epochs=7, validation=validation(3),
                           patience=3, progress=False,
                           resume=torch.load(tmp_path / "ckpt.pt", weights_only=True))  # fmt: skip
    assert (resumed.best_epoch, len(resumed.history), resumed.stopped_early) == (2, 5, True)
    assert [h["train_loss"] for h in resumed.history] == [h["train_loss"] for h in full.history]
    for (k, a), b in zip(cm.state_dict().items(), cm3.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_a_rootclad_optimizer_refuses_to_be_copied_and_checks_nesterov_on_load():
    import copy

    cm = rootclad.compile(_mlp(), example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
    opt = rootclad.optim.SGD(cm, lr=0.1)
    with pytest.raises(TypeError, match="state_dict"):
        copy.deepcopy(opt)
    state = opt.state_dict()
    state["config"] = list(state["config"])
    state["config"][5] = 1.0  # nesterov without momentum
    with pytest.raises(ValueError, match="Nesterov"):
        opt.load_state_dict(state)


@pytest.mark.parametrize("loss", ["bce_with_logits", "mse", "huber", "cross_entropy", "nll"])
@pytest.mark.parametrize("norm", ["mean", "sum_w"])
def test_the_validation_loss_is_the_compiled_loss_over_all_batches(loss, norm):
    torch.manual_seed(1)
    classes = loss in ("cross_entropy", "nll")
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3 if classes else 2),
                        *([nn.LogSoftmax(dim=1)] if loss == "nll" else [])).double()  # fmt: skip
    cm = rootclad.compile(net, example_input=torch.zeros(1, 6, dtype=F64), loss=loss,
                          engine="pullback")  # fmt: skip
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 6, generator=g, dtype=F64) * 2
    y = (torch.randint(0, 3, (40,), generator=g) if classes
         else torch.rand(40, 2, generator=g, dtype=F64).round())  # fmt: skip
    w = torch.rand(40, generator=g, dtype=F64) + 0.1
    whole, _ = cm.loss_and_grad(x, y, weight=w, weight_norm=norm)  # one batch of all 40
    split = [(x[i : i + 16], y[i : i + 16], w[i : i + 16]) for i in range(0, 40, 16)]
    assert evaluate(cm, split, weight_norm=norm) == pytest.approx(float(whole), rel=1e-12)


def test_the_progress_bar_shows_when_asked_and_not_in_a_pipe(capsys):
    cm = rootclad.compile(_mlp(), example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
    train = _batches(32, 16, 1)
    rootclad.fit(cm, rootclad.optim.SGD(cm), train, epochs=2, progress=True)
    assert "epoch 2/2" in capsys.readouterr().err
    lines = []
    rootclad.fit(cm, rootclad.optim.SGD(cm), train, epochs=2, log=lines.append)  # not a TTY
    assert capsys.readouterr().err == ""
    assert len(lines) == 2 and lines[1].startswith("epoch 2: train loss ")
    assert "validation" not in lines[0]


class _Stream(torch.utils.data.IterableDataset):
    """Batches with no len(): a DataLoader over it has __len__, and len() raises TypeError."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_a_dataloader_over_an_iterable_dataset_trains_as_its_batches(mlp, capsys):
    """fit asked the progress bar for len(train), which raised before the first epoch."""
    train = _batches(48, 16, 1)
    loader = torch.utils.data.DataLoader(_Stream(train), batch_size=None)
    with pytest.raises(TypeError):
        len(loader)
    start = _mlp().state_dict()
    mlp.load_state_dict(start)
    got = rootclad.fit(mlp, rootclad.optim.SGD(mlp, lr=0.1), loader, epochs=2, progress=True)
    assert "epoch 2/2" in capsys.readouterr().err
    mlp.load_state_dict(start)
    ref = rootclad.fit(mlp, rootclad.optim.SGD(mlp, lr=0.1), train, epochs=2, progress=False)
    assert [h["train_loss"] for h in got.history] == [h["train_loss"] for h in ref.history]
    assert got.history[1]["train_loss"] < got.history[0]["train_loss"]


def test_a_checkpoint_of_an_optimizer_whose_group_has_a_name_resumes(mlp):
    """A key of the user's own in the param group (torch keeps it) was saved and then refused:
    no checkpoint of that optimizer could resume."""
    train = _batches(32, 16, 1)
    mlp.load_state_dict(_mlp().state_dict())
    opt = rootclad.optim.Adam(mlp, lr=1e-2)
    opt.param_groups[0]["name"] = "mlp"
    saved = []

    def keep(state):
        saved.append(state.checkpoint())

    rootclad.fit(mlp, opt, train, epochs=1, progress=False, on_epoch_end=keep)
    again = rootclad.optim.Adam(mlp, lr=1e-2)
    result = rootclad.fit(mlp, again, train, epochs=2, progress=False, resume=saved[0])
    assert result.resumed_from == 1 and again.param_groups[0]["name"] == "mlp"


# -- a checkpoint is data from a file: every value checked before anything is loaded -----------
def _ckpt_setup():
    cm = rootclad.compile(_mlp(), example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    return cm, opt, sched.StepLR(opt, 1, gamma=0.7)


def _nan_at(key, name):
    def corrupt(ck):
        ck[key][name].view(-1)[0] = float("nan")

    return corrupt


def _set(*path, value):
    def corrupt(ck):
        d = ck
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value

    return corrupt


def _drop(key):
    return lambda ck: ck.pop(key)


BAD_CHECKPOINTS = {  # what is wrong, and the words the error must hold
    "best weights NaN": (  # named as the checkpoint's key, without a hint fit cannot follow
        _nan_at("best_model", "0.weight"),
        r"^the checkpoint's 'best_model'\['0.weight'\] holds nan at \[0, 0\]: not a finite "
        "number; nothing was loaded$",
    ),
    "weights NaN": (_nan_at("model", "2.bias"), r"'model'.*'2.bias'.*not a finite"),
    "weights of another shape": (
        _set("model", "0.bias", value=torch.zeros(3, dtype=F64)),
        r"'model'.*'0.bias'.*shape \(3,\).*\(8,\)",
    ),
    "weights missing": (lambda ck: ck["model"].pop("2.weight"), r"'model'.*missing.*2.weight"),
    "weights not a tensor": (_set("model", "2.bias", value=[0.5]), r"'model'.*'2.bias'.*tensor"),
    "negative epoch": (_set("epoch", value=-5), r"'epoch'.*-5"),
    "epoch a bool": (_set("epoch", value=True), r"'epoch'"),
    "epoch beyond the history": (_set("epoch", value=3), r"'epoch'.*3.*'history'.*2"),
    "history's epoch numbers": (_set("history", 1, "epoch", value=7), r"'history'\[1\].*'epoch'"),
    "history's lr NaN": (_set("history", 0, "lr", value=float("nan")), r"'history'\[0\].*'lr'"),
    "history not a list": (_set("history", value="x"), r"'history'"),
    "bad_epochs out of step": (_set("bad_epochs", value=5), r"'bad_epochs'.*5"),
    "best_epoch beyond epoch": (_set("best_epoch", value=9), r"'best_epoch'.*9"),
    "best_val NaN": (_set("best_val", value=float("nan")), r"'best_val'"),
    "best_val not the history's": (_set("best_val", value=1e-3), r"'best_val'.*history"),
    "calls negative": (_set("calls", value=-3), r"'calls'.*-3"),
    "key missing": (_drop("bad_epochs"), r"'bad_epochs'.*missing"),
    "scheduler's base_lrs NaN": (
        _set("scheduler", "base_lrs", value=[float("nan")]),
        r"'scheduler'.*'base_lrs'",
    ),
    "scheduler's extra attribute": (
        _set("scheduler", "optimizer", value=5),
        r"'scheduler'.*'optimizer'",
    ),
    "scheduler's last_epoch": (
        _set("scheduler", "last_epoch", value=-5),
        r"'scheduler'.*'last_epoch'.*-5",
    ),
    "optimizer's initial_lr NaN": (
        _set("optimizer", "group", "initial_lr", value=float("nan")),
        r"'optimizer'.*'initial_lr'",
    ),
    "optimizer's state missing": (
        lambda ck: ck["optimizer"].pop("state"),
        r"'optimizer' has no 'state'",
    ),
    # the optimizer's own check (rootclad.optim), named as the checkpoint's key
    "optimizer's moments NaN": (
        _nan_at("optimizer", "state"),
        r"'optimizer'\['state'\] holds a non-finite value \(nan\) in the exp_avg of '0.weight'",
    ),
    "optimizer's kind another": (_set("optimizer", "kind", value=-1), r"'optimizer'.*kind.*\(-1\)"),
    "optimizer's config all 7": (
        _set("optimizer", "config", value=[7.0] * 9),
        r"'optimizer'\['config'\]\[0\] \(kind\) is 7.0",
    ),
}


def test_a_checkpoint_is_checked_before_anything_is_loaded():
    """Each bad value is refused with an error naming its key, and the model, the optimizer and
    the scheduler are left as they were; the good checkpoint resumes."""
    import io

    train, val = _batches(48, 16, 1), _batches(32, 16, 2)
    cm, opt, s = _ckpt_setup()
    saved = []
    rootclad.fit(
        cm,
        opt,
        train,
        epochs=2,
        validation=val,
        scheduler=s,
        progress=False,
        on_epoch_end=lambda st: saved.append(st.checkpoint()),
    )
    buf = io.BytesIO()
    torch.save(saved[-1], buf)  # as a file holds it

    def read():
        buf.seek(0)
        return torch.load(buf, weights_only=True)

    good = read()
    assert good["epoch"] == 2 and good["best_epoch"] >= 1 and good["best_model"] is not None
    cm2, opt2, s2 = _ckpt_setup()
    rootclad.fit(cm2, opt2, train[:1], epochs=1, scheduler=s2, progress=False)  # some state
    before = (
        {k: v.clone() for k, v in cm2.state_dict().items()},
        opt2.state_dict(),
        copy.deepcopy(s2.state_dict()),
        cm2._calls_made(),
    )
    for what, (corrupt, words) in BAD_CHECKPOINTS.items():
        ck = read()
        corrupt(ck)
        # what the ranks agree on before any rank loads anything
        with pytest.raises((ValueError, TypeError), match=words):
            check_checkpoint(ck, cm2, opt2, s2)
        with pytest.raises((ValueError, TypeError), match=words):
            rootclad.fit(
                cm2, opt2, train, epochs=4, validation=val, scheduler=s2, progress=False, resume=ck
            )
        for k, v in before[0].items():
            assert torch.equal(cm2.state_dict()[k], v), (what, k)
        after = opt2.state_dict()
        assert torch.equal(after.pop("state"), before[1]["state"]), what
        assert after == {k: v for k, v in before[1].items() if k != "state"}, what
        assert s2.state_dict() == before[2] and cm2._calls_made() == before[3], what
    resumed = rootclad.fit(
        cm2, opt2, train, epochs=3, validation=val, scheduler=s2, progress=False, resume=read()
    )
    assert resumed.resumed_from == 2 and len(resumed.history) == 3
