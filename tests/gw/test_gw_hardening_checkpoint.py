"""``gw run --resume`` reads checkpoint.pt, a file a user may have been sent: it is loaded with
``weights_only=True``, so a pickle that would run code is refused, never executed."""

from __future__ import annotations

import os

import pytest
import torch

from rootclad.gw.run.config import resolve

TINY = dict(train_events=200, val_events=100, test_events=200, epochs=1, engine="pullback",
            model="mlp", bootstrap=5, bank_min_match=0.9, saliency_examples=1)  # fmt: skip


class _Payload:
    """Unpickling this creates the marker file: what a crafted checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mknod, (self.marker,))


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    from rootclad.gw.run.pipeline import simulate_all

    cfg = resolve(**TINY)
    d = tmp_path_factory.mktemp("gwckpt")
    return cfg, simulate_all(cfg, d / "data", False, lambda *_: None)


def test_a_checkpoint_that_would_run_code_is_refused(tiny_files, tmp_path):
    from rootclad.gw.run.train import train

    cfg, files = tiny_files
    out = tmp_path / "run"
    out.mkdir()
    marker = tmp_path / "pwned"
    torch.save({"config": cfg.to_toml(), "epoch": _Payload(marker)}, out / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"checkpoint\.pt: refused.*GLOBAL posix.mknod"):
        train(cfg, files["train"], files["val"], out, resume=True, progress=False,
              log=lambda *_: None)  # fmt: skip
    assert not marker.exists()


def test_a_written_checkpoint_loads_with_weights_only(tiny_files, tmp_path):
    """What train() writes is plain data: torch.load(weights_only=True) reads it whole."""
    from rootclad.gw.run.train import train

    cfg, files = tiny_files
    train(cfg, files["train"], files["val"], tmp_path, progress=False, log=lambda *_: None)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state["config"] == cfg.to_toml()


def _saved(tmp_path, state) -> bytes:
    torch.save(state, tmp_path / "x.pt")
    return (tmp_path / "x.pt").read_bytes()


CHECKPOINTS = {
    "torn": lambda cfg, d: _saved(
        d, {"config": cfg.to_toml(), "epoch": 1, "model": {"w": torch.zeros(4000)}}
    )[:3000],
    "empty": lambda cfg, d: b"",
    "not a checkpoint": lambda cfg, d: b"PK\x03\x04" + os.urandom(200),
    "a list": lambda cfg, d: _saved(d, [1, 2]),
    "no epoch": lambda cfg, d: _saved(d, {"config": cfg.to_toml()}),
    "a negative epoch": lambda cfg, d: _saved(d, {"config": cfg.to_toml(), "epoch": -5}),
    "a deep config": lambda cfg, d: _saved(
        d, {"config": "x = " + "[" * 5000 + "]" * 5000, "epoch": 1}
    ),
}


@pytest.mark.parametrize("what", CHECKPOINTS)
def test_resume_from_a_checkpoint_that_cannot_be_read_is_one_line_naming_it(tmp_path, capsys, what):
    """Refused before any work (nothing simulated, config.toml not written over), as one
    line of ``rootclad gw run: error:`` naming the file: a torn checkpoint printed torch's
    traceback."""
    from rootclad.cli import main

    cfg = resolve(**TINY)
    out = tmp_path / "run"
    out.mkdir()
    ckpt = out / "checkpoint.pt"
    ckpt.write_bytes(CHECKPOINTS[what](cfg, tmp_path))
    config = tmp_path / "run.toml"
    config.write_text(cfg.to_toml())
    status = main(["gw", "run", "-q", "--config", str(config), "--resume", "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"rootclad gw run: error: {ckpt}: "), err
    assert err.count("\n") == 1 and "remove it or run without --resume" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt"]
