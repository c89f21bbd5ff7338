"""Training that targets the noise tail (gw/run/fresh.py): the partial AUC against
scikit-learn's, fresh epochs regenerated from their seeds with the curriculum's SNRs, hard
negatives the loudest of their pool, the configuration's checks, and the seeds of training,
the test file and a background study disjoint (with the study's guard shown to refuse).

No network is trained here: the score functions are numpy's, the data a few hundred short
segments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rootclad.gw.run import fresh
from rootclad.gw.run.config import ConfigError, resolve

SMALL = dict(
    train_events=256,
    val_events=64,
    test_events=256,
    epochs=3,
    batch_size=32,
    duration=0.25,
    training_data="fresh",
    curriculum_epochs=2,
    hard_negatives=16,
    hard_pool=200,
    select="pauc",
    val_noise=1000,
)


def _sim(cfg):
    from rootclad.gw.dataset import SimulationConfig

    s = cfg.simulation("train")
    return SimulationConfig(
        seed=s["seed"],
        duration=cfg.duration,
        sample_rate=cfg.sample_rate,
        snr=cfg.snr,
        mass_range=cfg.mass_range,
        t_merger=(0.12, 0.2),
    )


def test_partial_auc_is_scikit_learns_area_to_the_same_false_alarm_probability():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    noise, signal = rng.normal(size=20000), rng.normal(2.5, 1.0, size=5000)
    y = np.r_[np.zeros(len(noise)), np.ones(len(signal))]
    s = np.r_[noise, signal]
    # over all false-alarm probabilities it is the AUC (Mann-Whitney, no ties)
    assert fresh.partial_auc(signal, noise, 1.0) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    # to 1e-3: scikit-learn's McClish-standardised value undone gives the area / 1e-3; its
    # trapezoids differ from the steps by at most half a step's rise per step (K = 20 steps)
    f = 1e-3
    r = roc_auc_score(y, s, max_fpr=f)
    area = ((2 * r - 1) * (f - 0.5 * f**2) + 0.5 * f**2) / f
    ours = fresh.partial_auc(signal, noise, f)
    assert ours == pytest.approx(area, abs=0.5 / 20)
    assert 0.05 < ours < 0.9  # a range where the comparison means something
    # a wrong answer is told apart: the signals shifted down by 0.3 sigma
    assert abs(fresh.partial_auc(signal - 0.3, noise, f) - area) > 0.5 / 20


def test_an_epoch_is_regenerated_from_its_seeds_with_the_curriculums_snrs():
    from rootclad.gw.dataset import generate_events

    cfg = resolve(**SMALL)
    sim = _sim(cfg)
    assert fresh.curriculum_snr(cfg, 0) == (8.0, 12.0)
    assert fresh.curriculum_snr(cfg, 1) == (5.0, 12.0)
    assert fresh.curriculum_snr(cfg, 2) == (2.0, 12.0) == cfg.snr
    it = fresh.FreshBatches(cfg, sim)
    for epoch in (0, 2):
        it.set_epoch(epoch)
        x = np.concatenate([b[0] for b in it])
        y = np.concatenate([b[1] for b in it])
        assert len(it) == 8 and x.shape == (256, 1, 512) and y.shape == (256, 1)
        seeds = fresh.kind_seeds(cfg.seed, "train", epoch, 256, fresh.file_seeds(cfg))
        lo, hi = fresh.curriculum_snr(cfg, epoch)
        ev = generate_events(seeds, dataclasses.replace(sim, snr=(lo, hi)))
        # the same events, shuffled: each row is one generated event with its label
        rows = {r.tobytes(): lab for r, lab in zip(ev["strain"], ev["label"], strict=True)}
        assert all(rows[r[0].tobytes()] == lab for r, lab in zip(x, y[:, 0], strict=True))
        snr = ev["snr"][ev["label"] == 1]
        assert snr.min() >= lo and snr.max() <= hi
    first = fresh.kind_seeds(cfg.seed, "train", 0, 256)
    assert not np.isin(first, fresh.kind_seeds(cfg.seed, "train", 1, 256)).any()


def test_hard_negatives_are_the_loudest_of_their_pool():
    from rootclad.gw.dataset import generate_events

    cfg = resolve(**SMALL)
    sim = _sim(cfg)

    def score(x):
        return np.abs(x).max(axis=(1, 2)).astype(np.float64)

    mined = fresh.hard_miner(cfg, sim, score)(1)
    pool = fresh.kind_seeds(cfg.seed, "hard", 1, cfg.hard_pool, fresh.file_seeds(cfg))
    x = generate_events(pool, dataclasses.replace(sim, signal_fraction=0.0))["strain"][:, None]
    expected = x[np.argsort(-score(x), kind="stable")[:16]]
    np.testing.assert_array_equal(mined, expected)
    # they replace noise events of the epoch, never signals
    it = fresh.FreshBatches(cfg, sim, lambda epoch: mined)
    it.set_epoch(1)
    xs = np.concatenate([b[0] for b in it])
    ys = np.concatenate([b[1] for b in it])[:, 0]
    hard = {m.tobytes() for m in mined}
    placed = [lab for r, lab in zip(xs, ys, strict=True) if r.tobytes() in hard]
    assert len(placed) == 16 and not any(placed)


def test_carried_hard_negatives_are_the_loudest_of_every_pool_so_far():
    import torch

    from rootclad.gw.dataset import event_seeds, generate_events

    cfg = resolve(**{**SMALL, "hard_mining": "carry"})
    sim = _sim(cfg)
    noise = dataclasses.replace(sim, signal_fraction=0.0)

    def score(x):
        return np.abs(x).max(axis=(1, 2)).astype(np.float64)

    mine = fresh.hard_miner(cfg, sim, score)
    mine(1)
    second = mine(2)
    ex = fresh.file_seeds(cfg)
    pools = np.r_[[fresh.kind_seeds(cfg.seed, "hard", e, 200, ex) for e in (1, 2)]].ravel()
    s = score(generate_events(pools, noise)["strain"][:, None])
    # the 16 loudest of both pools (scores are distinct: ties cannot decide it)
    assert set(mine.kept) == set(pools[np.argsort(-s)[:16]])
    assert np.isin(mine.kept, pools[:200]).any()  # some carried over from epoch 1
    regenerated = generate_events(mine.kept, noise)["strain"][:, None]
    np.testing.assert_array_equal(np.sort(score(regenerated)), np.sort(score(second)))
    # a checkpoint's carried seeds resume only when they are the pools' (after 3 epochs)
    state = {"epoch": 3, "hard_kept": torch.from_numpy(mine.kept)}
    np.testing.assert_array_equal(fresh.carried_seeds(cfg, state, "ck.pt"), mine.kept)
    test = event_seeds(cfg.simulation("test")["seed"], 0, 1)
    # a test file's seed; floats; epoch 2's seeds in a checkpoint of 2 epochs (its pool: 1's)
    for bad, epoch in ((np.r_[mine.kept[:3], test], 3), (mine.kept[:3] * 1.0, 3), (mine.kept, 2)):
        state = {"epoch": epoch, "hard_kept": torch.from_numpy(bad)}
        with pytest.raises(ValueError, match="ck.pt: its hard_kept is not at most 16 seeds"):
            fresh.carried_seeds(cfg, state, "ck.pt")
    with pytest.raises(ConfigError, match='hard_mining = "carry" needs hard_negatives'):
        resolve(**{**SMALL, "hard_mining": "carry", "hard_negatives": 0})


def test_the_training_seeds_the_test_files_and_a_studys_are_disjoint():
    from rootclad.gw.dataset import event_seeds
    from rootclad.gw.run.background import task_seeds

    cfg = resolve(**SMALL)
    train = fresh.training_seeds(cfg)
    # every kind drawn: 3 epochs of 256 and of 200 (pool), the validation noise, the files
    assert len(train) == 3 * 256 + 3 * 200 + 1000 + 256 + 64
    test = event_seeds(cfg.simulation("test")["seed"], 0, cfg.test_events)
    study = np.concatenate([task_seeds(0, i, 4096) for i in range(8)])
    assert not np.isin(train, test).any()
    assert not np.isin(study, np.r_[train, test]).any()
    fresh.check_disjoint(cfg.to_toml(), 8, lambda i: task_seeds(0, i, 4096))  # passes
    # the guard refuses a study that holds one of them, naming the task
    with pytest.raises(ConfigError, match="background task 5 holds a segment seed"):
        fresh.check_disjoint(
            cfg.to_toml(), 8, lambda i: np.r_[task_seeds(0, i, 10), test[:1] if i == 5 else []]
        )


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(training_data="file"), 'need training_data = "fresh"'),
        (dict(hard_negatives=200), "hard_negatives must be at most hard_pool"),
        (dict(val_noise=10), "val_noise must be at least 1000"),
        (dict(select="best"), "select must be one of loss, pauc"),
        (dict(hard_mining="all"), "hard_mining must be one of pool, carry"),
        (dict(model="transformer"), "model must be one of cnn, mlp, resnet, resnet-deep"),
    ],
)
def test_bad_training_settings_are_refused_naming_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        resolve(**{**SMALL, **change})


def test_a_checkpoint_from_before_the_new_keys_resumes_under_their_defaults():
    from rootclad.gw.run.train import _same_training

    # what such a checkpoint trained: train.root (no curriculum then)
    now = resolve(train_events=256, test_events=256, training_data="file", curriculum_epochs=0)
    now = now.to_toml()
    old = "".join(
        line for line in now.splitlines(keepends=True) if line.split(" =")[0] not in fresh_keys()
    )
    assert _same_training(old, now)
    assert not _same_training(old, resolve(**SMALL).to_toml())


def fresh_keys():
    return (
        "training_data",
        "curriculum_epochs",
        "hard_negatives",
        "hard_pool",
        "hard_mining",
        "select",
        "val_noise",
        "lr_schedule",
    )


def test_the_deep_gw_resnet_compiles_to_torchs_forward_and_gradients():
    """resnet-deep (GroupNorm, residual stages, the mean and maximum over time) compiled:
    its output and every gradient against torch autograd in float64."""
    import torch

    from rootclad.gw.models import gw_resnet_deep
    from tests.fixtures.core import check_against_torch

    torch.manual_seed(0)
    net = gw_resnet_deep(512)
    check_against_torch(net, torch.randn(3, 1, 512), torch.float64)


def test_the_pauc_validation_reads_the_files_signals_and_fresh_noise(tmp_path):
    from rootclad.gw.dataset import generate_events, simulate
    from rootclad.gw.run.inputs import read_test

    cfg = resolve(**SMALL)
    sim = _sim(cfg)
    kw = cfg.simulation("val")
    val = tmp_path / "val.root"
    simulate(
        val,
        kw.pop("n_events"),
        workers=1,
        progress=False,
        t_merger=(0.12, 0.2),
        **{k: v for k, v in kw.items() if k != "compression"},
    )
    monitored = fresh.pauc_validation(cfg, sim, val, lambda x: np.abs(x).max(axis=(1, 2)))
    meta = read_test(val)
    seeds = meta["seed"][meta["label"] == 1]
    signal = generate_events(seeds, dataclasses.replace(sim, snr=cfg.snr))["strain"]
    noise_seeds = fresh.kind_seeds(cfg.seed, "val_noise", 0, 1000, fresh.file_seeds(cfg))
    noise = generate_events(noise_seeds, dataclasses.replace(sim, signal_fraction=0.0))["strain"]
    want = 1 - fresh.partial_auc(np.abs(signal).max(axis=1), np.abs(noise).max(axis=1))
    assert monitored() == pytest.approx(want, abs=1e-12)
