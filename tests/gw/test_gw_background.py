"""``rootclad gw background``: thresholds against numpy.quantile of the same statistics computed
in one process, resuming after an interruption, independence from the number of workers (local
processes and a Dask LocalCluster), the efficiency machinery, bad input, which weights a
study scores (the run's current best, recorded by content hash) and task files checked against
the study.

The run directory is tiny and made directly (a 0.25 s segment, an untrained CNN exported as
the run exports it, a small test file and bank): the study's statistics do not need a trained
network, only the same one everywhere."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rootclad.gw.run import background as bgm
from rootclad.gw.run import evaluate as ev
from rootclad.gw.run.background import StudyConfig, run_study
from rootclad.gw.run.config import ConfigError, resolve
from rootclad.gw.run.weights import weights_sha256

QUIET = lambda *_: None  # noqa: E731
# 3 tasks of 100 segments; 30 values kept per task, so thresholds below rank ~30 are exact and
# those above come from the histograms
STUDY = StudyConfig(segments=300, per_task=100, seed=7, faps=(0.5, 0.1, 0.01), keep=30,
                    bootstrap=20)  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from rootclad.gw.dataset import simulate
    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.train import compile_model

    cfg = resolve(duration=0.25, train_events=64, val_events=64, test_events=400,
                  bank_min_match=0.8, engine="pullback", bootstrap=10)  # fmt: skip
    d = tmp_path_factory.mktemp("bgrun")
    (d / "config.toml").write_text(cfg.to_toml())
    (d / "data").mkdir()
    kwargs = cfg.simulation("test")
    simulate(d / "data" / "test.root", kwargs.pop("n_events"), workers=1, progress=False,
             **kwargs)  # fmt: skip
    (d / "model").mkdir()
    cm = compile_model(cfg)
    cm.export(d / "model" / "gwnet")
    _checkpoint(d, cfg, cm.state_dict())
    return d


def _checkpoint(d, cfg, best, epoch=1):
    """checkpoint.pt as gw run writes it, with ``best`` as the best epoch's weights."""
    import torch

    torch.save(
        {
            "config": cfg.to_toml(),
            "epoch": epoch,
            "best_epoch": epoch,
            "model": best,
            "best_model": best,
        },
        d / "checkpoint.pt",
    )


@pytest.fixture(scope="module")
def reference(run_dir, tmp_path_factory):
    """The study run once, in this process."""
    out = tmp_path_factory.mktemp("bg") / "ref"
    return out, run_study(run_dir, out, STUDY, log=QUIET)


def _tasks(out, n):
    return [np.load(bgm.task_path(out, i), allow_pickle=False) for i in range(n)]


def _same_tasks(a, b, n):
    for x, y in zip(_tasks(a, n), _tasks(b, n), strict=True):
        for k in x.files:
            if k != "seconds":
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_task_seeds_are_the_spawned_children_of_the_study_seed():
    kids = np.random.SeedSequence(7).spawn(3)
    for i, kid in enumerate(kids):
        want = (kid.generate_state(50, dtype=np.uint64) >> np.uint64(1)).astype(np.int64)
        np.testing.assert_array_equal(bgm.task_seeds(7, i, 50), want)
    assert len(set(np.concatenate([bgm.task_seeds(7, i, 50) for i in range(3)]))) == 150


def test_thresholds_equal_numpy_quantile_of_the_whole_background(run_dir, reference):
    """All 300 segments regenerated from their seeds and scored at once, in this process: the
    study's exact thresholds are numpy.quantile's, its histogram ones within two bins."""
    from rootclad.gw.dataset import generate_events, read_config
    from rootclad.gw.matched_filter import matched_filter_snr
    from rootclad.gw.run.train import scores

    out, s = reference
    spec = bgm.load_run(run_dir, QUIET)
    cfg, cm, bank, _ = bgm.scorer(spec, None)
    sim = dataclasses.replace(read_config(run_dir / "data" / "test.root"), signal_fraction=0.0)
    seeds = np.concatenate([bgm.task_seeds(STUDY.seed, i, STUDY.per_task) for i in range(3)])
    x = generate_events(seeds, sim)["strain"][:, None, :]
    assert len(x) == s["segments"] == 300
    direct = {
        "network": scores(cm, cfg, x, bgm.NET_BATCH),
        "matched_filter": matched_filter_snr(x, bank).snr,
    }
    saw = set()
    for m, stat in direct.items():
        width = np.diff(bgm.hist_edges(m)[:2])[0]
        for fap in STUDY.faps:
            row = s["thresholds"][m][ev.fap_key(fap)]
            want = ev.threshold(stat, fap)
            saw.add(row["exact"])
            if row["exact"]:
                assert row["threshold"] == pytest.approx(want, rel=1e-12, abs=1e-12), (m, fap)
            else:
                assert abs(row["threshold"] - want) < 2 * width, (m, fap)
        # the loudest events are the loudest segments, with their seeds
        loud = s["loudest"][m][0]
        i = int(np.argmax(stat))
        assert loud["seed"] == seeds[i] and loud[m] == pytest.approx(stat[i], rel=1e-12)
    assert saw == {True, False}  # both ways of reading a threshold were checked
    # the efficiencies are the test signals' fraction above those thresholds
    sig = np.load(out / "signals.npz", allow_pickle=False)
    t = s["thresholds"]["network"]["1e-2"]["threshold"]
    e = s["efficiency"]["1e-2"]["network"]
    assert sum(e["k"]) == int(np.sum(sig["network"] > t)) and sum(e["n"]) == len(sig["snr"])
    assert s["roc"]["fap"][-1] == pytest.approx(1 / 300)
    for name in ("background.md", "background.html", "background.json"):
        assert (out / name).stat().st_size > 0
    assert len(list((out / "plots").glob("*.png"))) == 3


def test_an_interrupted_study_resumes_with_only_the_missing_tasks(run_dir, reference, tmp_path):
    ref_out, ref = reference
    out = tmp_path / "bg"
    ran = []

    def stop_after_two(i):
        ran.append(i)
        if len(ran) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(run_dir, out, STUDY, log=QUIET, on_task=stop_after_two)
    assert sorted(p.name for p in (out / "tasks").iterdir()) == ["task-000000.npz",
                                                                "task-000001.npz"]  # fmt: skip
    # a torn file (a crash in another writer) is computed again, not read
    (out / "tasks" / "task-000001.npz").write_bytes(b"PK\x03\x04 torn")
    again, lines = [], []
    s = run_study(run_dir, out, STUDY, log=lines.append, on_task=again.append)
    assert again == [1, 2] and "1 finished before, 2 to run" in lines[-2]
    assert s["thresholds"] == ref["thresholds"] and s["snr50"] == ref["snr50"]
    _same_tasks(out, ref_out, 3)
    assert not [p for p in (out / "tasks").iterdir() if "partial" in p.name]
    # nothing left to do: the summary again, no task run
    none = []
    assert run_study(run_dir, out, STUDY, log=QUIET, on_task=none.append)["ratio"] == ref["ratio"]
    assert none == []


def test_two_local_workers_give_the_same_statistics_as_one(run_dir, reference, tmp_path):
    ref_out, ref = reference
    # the matched filter computed on the workers, not taken from the reference's cache
    s = run_study(run_dir, tmp_path / "bg", STUDY, workers=2, log=QUIET, mf_cache=False)
    _same_tasks(tmp_path / "bg", ref_out, 3)
    assert s["thresholds"] == ref["thresholds"] and s["snr50"] == ref["snr50"]
    assert s["this_call"]["workers"] == 2


def test_a_dask_local_cluster_gives_the_same_statistics(run_dir, reference, tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    ref_out, ref = reference
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:  # fmt: skip
        s = run_study(
            run_dir,
            tmp_path / "bg",
            STUDY,
            scheduler=cluster.scheduler_address,
            log=QUIET,
            mf_cache=False,
        )
    _same_tasks(tmp_path / "bg", ref_out, 3)
    assert s["thresholds"] == ref["thresholds"]


def test_the_matched_filter_cache_gives_what_the_filter_computes(
    run_dir, reference, tmp_path, monkeypatch
):
    """A study taking the matched filter from the cache writes the tasks of one that computes
    it; a cached file that is not a task's values (a template outside the bank) is computed
    again; the cache is keyed by the bank (another bank's study does not read it)."""
    from rootclad.gw.run import mf_cache

    ref_out, _ = reference
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path / "cache"))
    fill = run_study(run_dir, tmp_path / "fill", STUDY, log=QUIET)  # computes and keeps
    assert fill["matched_filter_tasks_from_cache"] == 0
    files = sorted((tmp_path / "cache" / "gw-matched-filter").glob("*/task-*.npz"))
    assert len(files) == 3

    def no_filter(*args, **kwargs):
        raise AssertionError("the matched filter ran although its values were cached")

    (tmp_path / "cached").mkdir()  # the test signals' statistics: the fill's
    shutil.copy(tmp_path / "fill" / "signals.npz", tmp_path / "cached")
    with monkeypatch.context() as m:
        m.setattr("rootclad.gw.matched_filter.matched_filter_snr", no_filter)
        cached = run_study(run_dir, tmp_path / "cached", STUDY, log=QUIET)
    _same_tasks(tmp_path / "cached", ref_out, 3)
    # its rate of the matched filter is not a cache read's: none measured
    assert cached["matched_filter_tasks_from_cache"] == 3
    assert cached["segments_per_second_per_worker"]["matched_filter"] is None
    with np.load(files[1]) as z:
        forged = {k: z[k] for k in z.files}
    forged["template"][0] = 10**6
    np.savez(files[1], **forged)
    assert mf_cache.load(files[1].parent.name, 1, STUDY.per_task, 10, 0.25) is None
    run_study(run_dir, tmp_path / "again", STUDY, log=QUIET)
    _same_tasks(tmp_path / "again", ref_out, 3)
    with np.load(files[1]) as z:  # replaced by the values computed again
        assert z["template"].max() < 10**6
    spec = bgm.load_run(run_dir, QUIET)
    other = {**spec, "bank": {**spec["bank"], "templates": spec["bank"]["templates"][:1]}}
    study = {"seed": STUDY.seed, "per_task": STUDY.per_task}
    assert mf_cache.key(other, study) != mf_cache.key(spec, study)


def test_thresholds_given_to_at_thresholds_reproduce_evaluate():
    """The efficiency machinery on thresholds from elsewhere: with the test noise's own
    thresholds it gives evaluate's efficiencies and SNR50 exactly."""
    rng = np.random.default_rng(3)
    label = np.r_[np.zeros(400, int), np.ones(300, int)]
    snr = np.r_[np.zeros(400), rng.uniform(2, 12, 300)]
    stat = {"network": rng.normal(size=700) + label * snr * 0.4,
            "matched_filter": rng.normal(size=700) + label * snr * 0.5}  # fmt: skip
    full = ev.evaluate(stat, label, snr, bootstrap=0)
    sig = label == 1
    t = {m: {k: full["methods"][m]["fap"][k]["threshold"] for k in ("1e-1", "1e-2")}
         for m in stat}  # fmt: skip
    out = ev.at_thresholds({m: s[sig] for m, s in stat.items()}, snr[sig], t, {}, bootstrap=0)
    for m in stat:
        for k in t[m]:
            a, b = out["methods"][m]["fap"][k], full["methods"][m]["fap"][k]
            assert a["snr50"] == b["snr50"] and a["efficiency"] == b["efficiency"]


def test_bad_input_is_refused_quickly_and_clearly(run_dir, reference, tmp_path, monkeypatch):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(run_dir, bare, ignore=shutil.ignore_patterns("model", "checkpoint.pt"))
    with pytest.raises(ConfigError, match="no trained model"):
        run_study(bare, tmp_path / "o1", STUDY, log=QUIET)
    with pytest.raises(ConfigError, match="not a `rootclad gw run` directory"):
        run_study(tmp_path, tmp_path / "o2", STUDY, log=QUIET)
    # another study's results are not mixed in
    with pytest.raises(ConfigError, match="another study"):
        run_study(run_dir, reference[0], StudyConfig(**{**STUDY.__dict__, "seed": 8}), log=QUIET)
    # a scheduler that does not answer: a closed port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="did not answer within 1 s"):
        run_study(run_dir, tmp_path / "o3", STUDY, scheduler=f"tcp://127.0.0.1:{port}",
                  connect_timeout=1, log=QUIET)  # fmt: skip
    assert time.perf_counter() - t < 15
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import now fails
    with pytest.raises(ConfigError, match="--scheduler needs dask's distributed scheduler"):
        run_study(run_dir, tmp_path / "o4", STUDY, scheduler="tcp://127.0.0.1:1", log=QUIET)
    with pytest.raises(ConfigError, match="segments must be at least 1"):
        run_study(run_dir, tmp_path / "o5", StudyConfig(segments=0), log=QUIET)
    too_many = r"segments must be an integer of at most 63 bits, got 10+\.\.\. \(401 characters\)"
    with pytest.raises(ConfigError, match=too_many):
        run_study(run_dir, tmp_path / "o5", StudyConfig(segments=10**400), log=QUIET)
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 6))
    summary = json.loads((reference[0] / "background.json").read_text())
    assert summary["segments"] == 300


def test_the_search_preset_trains_for_the_tail_then_runs_a_study():
    """``gw run --preset search`` is the ablation's kept recipe (benchmarks/gw/bench_search.py)
    and a background study of 2e6 segments after the report; the study does not change the
    training (a checkpoint of the recipe without it resumes under the preset)."""
    import sys

    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.train import _same_training

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gw"))
    from bench_search import kept_recipe

    search = resolve(preset="search")
    last = resolve(**kept_recipe())
    assert search.background_segments == 2_000_000 and last.background_segments == 0
    assert search == last.__class__(**{**last.__dict__, "background_segments": 2 * 10**6})
    assert _same_training(search.to_toml(), last.to_toml())
    assert not _same_training(search.to_toml(), resolve().to_toml())
    with pytest.raises(ConfigError, match="background_segments must not be negative"):
        resolve(background_segments=-1)


@pytest.mark.slow  # 80 s at load 7 on 2 cores: two fresh interpreters, then the rest here
def test_a_killed_worker_stops_the_study_and_a_rerun_completes_it(run_dir, reference, tmp_path):
    """SIGKILL to a local worker process: the study stops with the pool's error, the tasks
    finished before are kept, and a rerun (here with one process) computes only the rest."""
    import multiprocessing as mp
    import os
    import signal

    ref_out, ref = reference
    out = tmp_path / "bg"
    first = []

    def kill_a_worker(i):
        first.append(i)
        if len(first) == 1:
            os.kill(mp.active_children()[0].pid, signal.SIGKILL)

    with pytest.raises(RuntimeError, match=r"background task \d+ failed: BrokenProcessPool"):
        run_study(run_dir, out, StudyConfig(**{**STUDY.__dict__, "segments": 600}), workers=2,
                  log=QUIET, on_task=kill_a_worker)  # fmt: skip
    kept = sorted(p.name for p in (out / "tasks").iterdir())
    assert 1 <= len(kept) < 6 and not [k for k in kept if "partial" in k]
    again = []
    s = run_study(run_dir, out, StudyConfig(**{**STUDY.__dict__, "segments": 600}), log=QUIET,
                  on_task=again.append)  # fmt: skip
    assert len(again) == 6 - len(kept) and s["segments"] == 600
    _same_tasks(out, ref_out, 3)  # the first three tasks are the reference study's


def test_a_studys_key_is_what_the_scores_depend_on(run_dir):
    """A study's fingerprint hashes the network's kind, input length and weights, the noise and
    the bank: not where the run ran (the same model run on workers has the same key) nor how
    it was trained (the same weights under another training key); another model's weights or
    another bank give another key."""
    from rootclad.gw.run.background import load_run, make_spec
    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.inputs import template_bank

    spec = load_run(run_dir, QUIET)
    cfg = resolve(run_dir / "config.toml")
    test = run_dir / "data" / "test.root"
    bank = template_bank(cfg, test, run_dir / "cache", QUIET)
    moved = dataclasses.replace(cfg, workers=2, scheduler="tcp://10.0.0.1:8786")
    there = make_spec(moved, spec["weights"], test, bank)
    assert there["model_key"] == spec["model_key"]
    assert "workers" not in spec["config"] and "scheduler" not in spec["config"]
    trained = dataclasses.replace(cfg, lr=0.5, epochs=99, lr_schedule="cosine")
    assert make_spec(trained, spec["weights"], test, bank)["model_key"] == spec["model_key"]
    w = {k: v + (k == sorted(v for v in spec["weights"])[0]) for k, v in spec["weights"].items()}
    assert make_spec(cfg, w, test, bank)["model_key"] != spec["model_key"]
    fewer = dataclasses.replace(bank, masses=bank.masses[:1], templates=bank.templates[:1])
    assert make_spec(cfg, spec["weights"], test, fewer)["model_key"] != spec["model_key"]


# -- which weights a study scores ------------------------------------------------------------
def _other_weights(cm):
    import torch

    return {
        k: v + 1e-3 * torch.arange(v.numel()).reshape(v.shape) for k, v in cm.state_dict().items()
    }


def test_a_study_records_the_weights_it_scored(run_dir, reference):
    out, s = reference
    spec = bgm.load_run(run_dir, QUIET)
    sha = weights_sha256(spec["weights"])
    assert s["weights"] == {
        "sha256": sha,
        "file": str(run_dir / "model" / "gwnet.root"),
        "checkpoint_epoch": 1,
        "best_epoch": 1,
    }
    assert json.loads((out / "study.json").read_text())["weights"] == sha
    assert sha[:16] in (out / "background.md").read_text()


def test_a_study_refuses_weights_that_are_not_the_runs_current_best(run_dir, reference, tmp_path):
    """A run directory reused for another configuration: killed during its training (the
    checkpoint is the new training's, the export the old one's) or before its first epoch (the
    checkpoint is still the old configuration's). And a study directory whose tasks scored
    other weights than the run's now."""
    import shutil

    from rootclad.gw.run.train import compile_model

    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    old = resolve(d / "config.toml")
    new = dataclasses.replace(old, lr=2 * old.lr)
    cm = compile_model(old)
    (d / "config.toml").write_text(new.to_toml())
    _checkpoint(d, new, _other_weights(cm), epoch=3)
    stale = r"gwnet\.root holds weights \(sha256 \w+\) that are not the run's current best "
    with pytest.raises(ConfigError, match=stale + r"\(.*checkpoint\.pt, epoch 3"):
        run_study(d, tmp_path / "o1", STUDY, log=QUIET)
    _checkpoint(d, old, cm.state_dict())
    with pytest.raises(ConfigError, match=r"checkpoint\.pt is of another training than .*toml"):
        run_study(d, tmp_path / "o2", STUDY, log=QUIET)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    # the run finished with other weights: the reference study's tasks are not theirs
    (d / "config.toml").write_text(old.to_toml())
    cm.load_state_dict(_other_weights(cm))
    cm.export(d / "model" / "gwnet")
    _checkpoint(d, old, cm.state_dict())
    with pytest.raises(
        ConfigError,
        match=r"another study \(its tasks scored weights sha256 \w+, "
        r"the run's are now \w+",
    ):
        run_study(d, reference[0], STUDY, log=QUIET)


def test_a_run_that_starts_another_training_removes_its_old_export(run_dir, tmp_path, monkeypatch):
    """gw run over a finished run's directory, stopped before its first checkpoint: the old
    export is gone (the study then finds only the old configuration's checkpoint, refused);
    resuming the checkpoint's own training keeps the export."""
    import shutil

    from rootclad.gw.run import pipeline

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "simulate_all", stop)
    cfg = resolve(run_dir / "config.toml")
    exported = ["gwnet.h", "gwnet.root", "gwnet.so"]
    for resume, new, kept in (
        (False, cfg, []),
        (True, cfg, exported),
        (False, dataclasses.replace(cfg, lr=2 * cfg.lr), []),
    ):
        d = tmp_path / f"run-{resume}-{new.lr}"
        shutil.copytree(run_dir, d)
        (d / "model" / "gwnet.onnx").write_bytes(b"")
        with pytest.raises(KeyboardInterrupt):
            pipeline.run(new, d, resume=resume, progress=False, log=QUIET)
        left = sorted(p.name for p in (d / "model").iterdir())
        assert left == (sorted([*kept, "gwnet.onnx"]) if kept else []), (resume, new.lr)
    with pytest.raises(ConfigError, match=r"checkpoint\.pt is of another training"):
        run_study(d, tmp_path / "o", STUDY, log=QUIET)


# -- task files hold what the study asked for ------------------------------------------------
def _forged(field, how):
    def forge(r):
        r = dict(r)
        r[field] = how(r[field]) if field in r else how(None)
        return r

    return forge


FORGERIES = {
    "segments": _forged("segments", lambda v: np.int64(10**6)),
    "task": _forged("task", lambda v: np.int64(5)),
    "seconds": _forged("seconds", lambda v: np.array([np.nan, 1.0, 1.0])),
    "network_top": _forged("network_top", lambda v: v[:5]),
    "matched_filter_top": _forged("matched_filter_top", lambda v: v * 10),
    "network_hist": _forged("network_hist", lambda v: v * 2),
    "matched_filter_loud_seed": _forged("matched_filter_loud_seed", lambda v: v + 1),
    "network_loud": _forged("network_loud", lambda v: v.astype(np.float32)),
    "extra": _forged("extra", lambda v: np.zeros(3)),
}


@pytest.mark.parametrize("field", FORGERIES)
def test_a_forged_task_file_is_refused_naming_the_file_and_field(
    run_dir, reference, tmp_path, field
):
    """A task file with the study's (public) key and other counts or shapes: ``segments =
    10**6`` moved the thresholds tenfold, still "exact"."""
    import shutil

    out = tmp_path / "bg"
    shutil.copytree(reference[0], out)
    path = bgm.task_path(out, 1)
    with np.load(path, allow_pickle=False) as z:
        r = FORGERIES[field]({k: z[k] for k in z.files})
    np.savez(path, **r)
    kept = path.read_bytes()
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: {field}\b"):
        run_study(run_dir, out, STUDY, log=QUIET)
    assert path.read_bytes() == kept  # left to look at, not computed over


def test_a_forged_result_from_a_worker_is_refused_before_it_is_written(
    run_dir, tmp_path, monkeypatch
):
    real = bgm.run_task
    monkeypatch.setattr(
        bgm, "run_task", lambda *a, **k: {**real(*a, **k), "segments": np.int64(10**6)}
    )
    one = StudyConfig(**{**STUDY.__dict__, "segments": 100})
    forged = r"the result of task 0: segments is 1000000, the study's tasks hold 100"
    with pytest.raises(ValueError, match=forged):
        run_study(run_dir, tmp_path / "bg", one, log=QUIET)
    assert list((tmp_path / "bg" / "tasks").iterdir()) == []


def test_forged_test_signal_statistics_are_refused(run_dir, reference, tmp_path):
    import shutil

    out = tmp_path / "bg"
    shutil.copytree(reference[0], out)
    with np.load(out / "signals.npz", allow_pickle=False) as z:
        r = {k: z[k] for k in z.files}
    np.savez(out / "signals.npz", **{**r, "network": r["network"][:-1]})
    with pytest.raises(ValueError, match=r"signals\.npz: network"):
        run_study(run_dir, out, STUDY, log=QUIET)
