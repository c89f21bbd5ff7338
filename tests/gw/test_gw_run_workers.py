"""``rootclad gw run --workers N`` (rootclad/gw/run/cluster.py) on a dask LocalCluster of worker
processes: the simulated files hold the events a single process writes, one rank on the
workers trains as the single-process run does, the workers' scores equal this process's, two
ranks that lose a worker resume from the checkpoint to the weights of an uninterrupted run,
and the whole run on two workers gives its report (the network's scores checked against ROOT's
define_score in this process)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

from rootclad.gw.run.config import ConfigError, resolve

distributed = pytest.importorskip("distributed")

SMALL = dict(train_events=1200, val_events=300, test_events=800, epochs=2, bootstrap=20,
             bank_min_match=0.9, saliency_examples=2, engine="pullback")  # fmt: skip
# the data-parallel route trains on train.root (fresh events train in the driver)
SMALL.update(training_data="file", curriculum_epochs=0)
QUIET = lambda *_: None  # noqa: E731


def _cluster(n: int):
    env = {"ROOTCLAD_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                    dashboard_address=":0", env=env)  # fmt: skip


@pytest.fixture(scope="module")
def client():
    with _cluster(2) as lc, distributed.Client(lc) as c:
        yield c


@pytest.fixture(scope="module")
def files(tmp_path_factory, client):
    """The small run's data files, simulated on the workers."""
    from rootclad.gw.run.pipeline import simulate_all

    d = tmp_path_factory.mktemp("gwworkers")
    return simulate_all(resolve(**SMALL), d / "data", False, QUIET, client)


def test_files_simulated_on_workers_hold_the_single_process_events(files, tmp_path):
    import uproot

    from rootclad.gw.dataset import simulate
    from rootclad.gw.run.config import resolve

    kwargs = resolve(**SMALL).simulation("val")
    n = kwargs.pop("n_events")
    simulate(tmp_path / "val.root", n, workers=1, progress=False, **kwargs)
    with uproot.open(files["val"]) as a, uproot.open(tmp_path / "val.root") as b:
        assert str(a["config"]) == str(b["config"])
        x, y = a["events"].arrays(library="np"), b["events"].arrays(library="np")
        assert set(x) == set(y)
        for k in x:
            assert np.array_equal(np.stack(x[k]), np.stack(y[k])), k


def test_one_rank_on_a_worker_trains_as_this_process_does(files, client, tmp_path):
    from rootclad.gw.run import cluster
    from rootclad.gw.run.train import train

    cfg = resolve(**{**SMALL, "workers": 1})
    here = train(cfg, files["train"], files["val"], tmp_path / "a", progress=False, log=QUIET)
    lines = []
    there = cluster.train(client, cfg, files["train"], files["val"], tmp_path / "b", resume=False,
                          log=lines.append)  # fmt: skip
    assert there.ranks == 1 and there.best_epoch == here.best_epoch
    # rank 0's epoch lines reach this process
    assert [x.split(",")[0] for x in lines if x.startswith("epoch")] == [
        f"epoch {h['epoch']}: train loss {h['train_loss']:.4f}" for h in here.history]  # fmt: skip
    for a, b in zip(here.history, there.history, strict=True):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
    for k, v in here.cm.state_dict().items():
        torch.testing.assert_close(there.cm.state_dict()[k], v, rtol=1e-4, atol=1e-6)
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["epoch"] == 2


def test_scores_on_the_workers_equal_this_process(files, client, tmp_path):
    from rootclad.gw.run import cluster
    from rootclad.gw.run.background import make_spec
    from rootclad.gw.run.inputs import template_bank
    from rootclad.gw.run.pipeline import matched_filter, network_scores
    from rootclad.gw.run.train import compile_model

    cfg = resolve(**SMALL)
    cm = compile_model(cfg)
    bank = template_bank(cfg, files["test"], tmp_path, QUIET)
    weights = {k: v.double().reshape(-1).numpy() for k, v in cm.state_dict().items()}
    cluster.SCORE_STEP, step = 300, cluster.SCORE_STEP  # three ranges, the last short
    try:
        net, mf = cluster.score_test(client, make_spec(cfg, weights, files["test"], bank),
                                     files["test"], False)  # fmt: skip
    finally:
        cluster.SCORE_STEP = step
    ref = network_scores(cm, cfg, files["test"])
    assert net.shape == ref.shape == (cfg.test_events,)
    np.testing.assert_allclose(net, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_allclose(mf, matched_filter(bank, files["test"], False), rtol=1e-6)


def test_two_ranks_that_lose_a_worker_resume_to_the_uninterrupted_weights(files, tmp_path):
    from rootclad.gw.run import cluster

    # four epochs: training is still running when this process sees the line of the second
    cfg = resolve(**{**SMALL, "epochs": 4, "workers": 2})
    with _cluster(2) as lc, distributed.Client(lc) as c:
        full = cluster.train(c, cfg, files["train"], files["val"], tmp_path / "a", resume=False,
                             log=QUIET)  # fmt: skip
        pids = c.run(os.getpid)
        victim = pids[sorted(pids)[1]]  # rank 1's worker

        def kill_at_epoch_two(line):
            if line.startswith("epoch 2:"):
                os.kill(victim, signal.SIGKILL)

        with pytest.raises(RuntimeError, match=r"the worker of training rank 1 \(tcp://.*\) died "
                           r"\(rank 0 then failed: .*\); rerun with --resume"):  # fmt: skip
            cluster.train(c, cfg, files["train"], files["val"], tmp_path / "b", resume=False,
                          log=kill_at_epoch_two)  # fmt: skip
    ckpt = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] in (1, 2)
    # resumed on a fresh cluster: the checkpoint holds no rank count
    with _cluster(2) as lc, distributed.Client(lc) as c:
        resumed = cluster.train(c, cfg, files["train"], files["val"], tmp_path / "b",
                                resume=True, log=QUIET)  # fmt: skip
    assert resumed.resumed_from == ckpt["epoch"] and full.ranks == resumed.ranks == 2
    assert [h["val_loss"] for h in resumed.history] == [h["val_loss"] for h in full.history]
    for k, v in full.cm.state_dict().items():
        assert torch.equal(resumed.cm.state_dict()[k], v), k


def test_bad_worker_settings_are_refused_before_work(client, tmp_path, monkeypatch):
    from rootclad.gw.run import cluster

    with pytest.raises(ConfigError, match="batch_size .* split evenly over workers = 3"):
        resolve(**{**SMALL, "workers": 3})
    with pytest.raises(ConfigError, match="workers must not be negative"):
        resolve(**{**SMALL, "workers": -1})
    with pytest.raises(ConfigError, match='device = "cuda" runs in one process'):
        resolve(**{**SMALL, "workers": 2, "device": "cuda"})
    cfg = resolve(**{**SMALL, "scheduler": "tcp://127.0.0.1:9"})
    with pytest.raises(ConfigError, match="tcp://127.0.0.1:9 did not answer within 0.5 s"):
        with cluster.cluster(cfg, timeout=0.5):
            pass
    cfg = resolve(**{**SMALL, "scheduler": client.scheduler.address, "workers": 4})
    with pytest.raises(ConfigError, match="workers = 4, but the scheduler at .* has 2"):
        with cluster.cluster(cfg):
            pass
    import rootclad.version
    from rootclad.gw.run.connect import check_workers

    with monkeypatch.context() as m:
        m.setattr(rootclad.version, "__version__", "0.0.0")
        with pytest.raises(
            ConfigError,
            match=r"workers of the test cluster that cannot run this "
            r"rootclad \(0.0.0\): tcp://.*: rootclad ",
        ):
            check_workers(client, "the test cluster")
    # all the scheduler's workers train: the global batch must split over them, before work
    cfg = resolve(**{**SMALL, "scheduler": client.scheduler.address, "batch_size": 63})
    with pytest.raises(ConfigError, match=r"batch_size \(63\) .* over the 2 ranks"):
        with cluster.cluster(cfg):
            pass
    # the output directory: every worker sees and writes it
    assert cluster.check_shared(client, tmp_path) is None
    for lack in ("see", "write"):  # what a worker without it would report
        monkeypatch.setattr(cluster, "_sees", lambda path, lack=lack: lack)
        with pytest.raises(ConfigError, match=rf"the workers tcp://.* cannot {lack} into the "
                           "output directory"):  # fmt: skip
            cluster.check_shared(client, tmp_path)
    assert list(tmp_path.iterdir()) == []  # the probes are removed


@pytest.mark.slow
def test_the_whole_run_on_two_workers(files, tmp_path):
    import shutil

    from rootclad.gw.run.pipeline import run

    cfg = resolve(**{**SMALL, "workers": 2})
    shutil.copytree(files["train"].parent, tmp_path / "data")  # reused: the same configuration
    lines = []
    s = run(cfg, tmp_path, progress=False, log=lines.append)
    assert any("reused" in x for x in lines) and any("on 2 Dask workers" in x for x in lines)
    assert s["training"]["ranks"] == 2 and s["config"]["workers"] == 2
    assert "score on the workers (network, matched filter)" in s["seconds"]
    # the workers' network scores against ROOT's define_score here
    if "skipped" not in s["root"]:
        assert s["root"]["events"] == cfg.test_events
        assert s["root"]["max_abs_diff_to_python"] < 1e-4
    assert (tmp_path / "report.html").exists() and (tmp_path / "checkpoint.pt").exists()


def test_a_worker_reports_what_it_lacks_of_the_output_directory(tmp_path):
    from rootclad.gw.run.cluster import _sees

    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    assert _sees(str(probe)) == ""
    assert _sees(str(tmp_path / "elsewhere" / "probe")) == "see"
    if os.geteuid() != 0:  # root writes anywhere
        tmp_path.chmod(0o500)
        try:
            assert _sees(str(probe)) == "write"
        finally:
            tmp_path.chmod(0o700)
