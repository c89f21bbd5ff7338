"""``gw run`` on a full disk: every stage's file is checked before it replaces the old one, the
stage fails with ENOSPC naming the file, and no temporary file is left behind. The disk is a
small tmpfs (this needs root, as mounting does; skipped otherwise)."""

from __future__ import annotations

import errno
import shutil

import numpy as np
import pytest
import torch

from rootclad.data.schema import Schema
from rootclad.gw.run.config import ConfigError, resolve

TINY = dict(train_events=200, val_events=100, test_events=200, epochs=1, engine="pullback",
            model="mlp", bootstrap=5, bank_min_match=0.9, saliency_examples=1)  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny data files and an (untrained) compiled MLP exported beside them."""
    from rootclad.gw.run.pipeline import network_scores, simulate_all
    from rootclad.gw.run.train import compile_model

    cfg = resolve(**TINY)
    d = tmp_path_factory.mktemp("gwdisk")
    files = simulate_all(cfg, d / "data", False, lambda *_: None)
    cm = compile_model(cfg)
    n = round(cfg.duration * cfg.sample_rate)
    cm.export(d / "gwnet", schema=Schema({"strain": n}, target="label"))  # as the run exports
    return cfg, files, cm, d / "gwnet", network_scores(cm, cfg, files["test"])


def _no_partials(d):
    assert not [p.name for p in d.iterdir() if "partial" in p.name]


def test_scores_root_on_a_full_disk_fails_the_stage_naming_the_file(tiny, full_disk):
    pytest.importorskip("ROOT")
    from rootclad.gw.run.pipeline import root_scoring

    cfg, files, _, stem, network = tiny
    with pytest.raises(OSError, match=r"No space left on device.*scores\.root") as e:
        root_scoring(cfg, stem, files["test"], network, np.zeros_like(network),
                     {"methods": {}}, full_disk)  # fmt: skip
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(full_disk / "scores.root")
    assert not (full_disk / "scores.root").exists()
    _no_partials(full_disk)


def test_simulating_onto_a_full_disk_names_the_file(full_disk):
    from rootclad.gw.dataset import simulate

    path = full_disk / "train.root"
    with pytest.raises(OSError, match="No space left on device") as e:
        simulate(path, 300, workers=1, progress=False)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]


def test_a_checkpoint_on_a_full_disk_says_no_space_left(full_disk):
    """torch.save's own error is ``RuntimeError: basic_ios::clear``."""
    from rootclad.gw.run.train import _save_checkpoint

    path = full_disk / "checkpoint.pt"
    with pytest.raises(
        OSError, match=r"No space left on device \(RuntimeError: .*checkpoint\.pt"
    ) as e:
        _save_checkpoint(path, {"model": {"w": torch.zeros(100_000)}})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    _no_partials(full_disk)


def test_the_onnx_export_on_a_full_disk_leaves_no_partial_file(tiny, full_disk):
    pytest.importorskip("onnx")
    from rootclad.gw.run.pipeline import onnx_round_trip

    cfg, files, cm, _, network = tiny
    with pytest.raises(OSError, match="No space left on device") as e:
        onnx_round_trip(cm, cfg, full_disk / "gwnet", files["test"], network,
                        {"strain": np.zeros((0, 1))})  # fmt: skip
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(full_disk / "gwnet.onnx")
    _no_partials(full_disk)


def test_the_root_export_on_a_full_disk_names_its_own_file(tiny, full_disk):
    """The copy of the compiled library failed naming the cache's .so, not the export's."""
    cfg, files, cm, _, network = tiny
    with pytest.raises(OSError, match="No space left on device") as e:
        cm.export(full_disk / "gwnet")
    assert e.value.errno == errno.ENOSPC
    assert e.value.filename.startswith(str(full_disk / "gwnet."))
    _no_partials(full_disk)


def test_report_files_on_a_full_disk_leave_no_partial_file(full_disk):
    from rootclad.gw.run.report import write_text

    with pytest.raises(OSError, match="No space left on device") as e:
        write_text(full_disk / "report.md", "x" * 100_000)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(full_disk / "report.md")
    _no_partials(full_disk)


def test_the_free_space_check_counts_only_data_still_to_simulate(tiny, tmp_path, monkeypatch):
    """A resumed run whose data files are all there needs no space for them."""
    from rootclad.gw.run import pipeline

    cfg, files, *_ = tiny
    out = tmp_path / "run"
    shutil.copytree(files["val"].parent, out / "data")  # no train.root: fresh events
    # room for everything but the data files (the check's 50 MB margin)
    monkeypatch.setattr(pipeline.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 52 * 10**6, 52 * 10**6))  # fmt: skip
    pipeline._check_output(out, cfg)
    (out / "data" / "test.root").unlink()
    big = resolve(**{**TINY, "test_events": 20_000})  # 160 MB of test data to write
    with pytest.raises(ConfigError, match="GB free, the run needs about"):
        pipeline._check_output(out, big)
