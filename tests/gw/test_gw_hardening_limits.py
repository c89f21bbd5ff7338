"""Sizes and seeds are checked before ``gw run`` writes anything: ``batch_size = 10**9`` failed
after simulating, a seed of 2**64 + 1 after writing config.toml and data/."""

from __future__ import annotations

import pytest

from rootclad.cli import main
from rootclad.gw.run.config import MAX_SEED, ConfigError, resolve


def test_seeds_must_fit_what_the_data_seeds_are_made_into():
    for seed in (2**64 + 1, 2**63, MAX_SEED + 1):
        with pytest.raises(ConfigError, match=f"seed must be at most {MAX_SEED}.*got {seed}"):
            resolve(seed=seed)
    cfg = resolve(seed=MAX_SEED)
    assert max(cfg.simulation(s)["seed"] for s in ("train", "val", "test")) < 2**63
    assert (MAX_SEED + 1) * 1000 + 2 >= 2**63  # the bound is tight


def test_a_batch_larger_than_the_training_set_is_refused():
    with pytest.raises(ConfigError, match=r"batch_size must be at most train_events \(1200\)"):
        resolve(train_events=1200, batch_size=10**9)
    assert resolve(train_events=1200, batch_size=1200).batch_size == 1200


def test_the_preset_batch_fits_a_small_training_set():
    """`gw run --events 20` was refused: the preset's batch of 64 exceeded 20 events. A batch
    the user gives is still checked."""
    default = resolve().batch_size
    assert resolve(train_events=20).batch_size == 20
    assert resolve(train_events=10 * default).batch_size == default
    with pytest.raises(ConfigError, match="batch_size must be at most train_events"):
        resolve(train_events=20, batch_size=default)


@pytest.mark.parametrize(
    "args, toml, match",
    [
        (["--seed", str(2**64 + 1)], "", "seed must be at most"),
        ([], "batch_size = 1000000000\n", "batch_size must be at most train_events"),
    ],
)
def test_gw_run_refuses_them_before_writing_anything(tmp_path, capsys, args, toml, match):
    config = tmp_path / "run.toml"
    config.write_text("train_events = 300\nval_events = 100\ntest_events = 400\n" + toml)
    out = tmp_path / "out"
    status = main(["gw", "run", "-q", "--config", str(config), "--out", str(out), *args])
    assert status == 2 and match in capsys.readouterr().err
    assert not out.exists()


def test_simulate_refuses_a_seed_beyond_64_bits_before_writing(tmp_path):
    from rootclad.gw.dataset import simulate

    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*63\)"):
        simulate(tmp_path / "x.root", 10, seed=2**64 + 1, workers=1, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_gw_run_refuses_an_output_directory_root_would_misread(tmp_path, capsys):
    out = tmp_path / "run#3"
    status = main(["gw", "run", "-q", "--events", "300", "--out", str(out)])
    assert status == 2 and "ROOT reads what follows '#' or '?'" in capsys.readouterr().err
    assert not out.exists()
