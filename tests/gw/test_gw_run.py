"""``rootclad gw run``: configuration checks, the evaluation's statistics against independent
computations, resuming, and a small run end to end (summary, report, ROOT file)."""

from __future__ import annotations

import json
import re
import shutil
import sys

import numpy as np
import pytest
import torch
from scipy import stats

from rootclad.gw.run import evaluate as ev
from rootclad.gw.run.config import ConfigError, resolve

SMALL = dict(train_events=1200, val_events=300, test_events=800, epochs=2, bootstrap=20,
             bank_min_match=0.9, saliency_examples=2)  # fmt: skip


# -- configuration -------------------------------------------------------------------------
def test_config_file_round_trips_and_bad_values_name_their_key(tmp_path):
    cfg = resolve(epochs=3)
    path = tmp_path / "run.toml"
    path.write_text(cfg.to_toml())
    assert resolve(path) == cfg
    for text, match in [
        ("epoch = 3", "unknown key 'epoch'"),
        ("epochs = 'three'", "epochs must be an integer"),
        ("snr = [5]", r"snr must be two numbers"),
        ("snr = [8, 4]", r"snr must be \[low, high\]"),
        ("train_events = 0", "train_events must be at least 1"),
        ("test_events = 100", "test_events must be at least 200"),
        ("duration = 0.1", "at least 280"),
        ("model = 'vit'", "model must be one of cnn, mlp, resnet, resnet-deep"),
        ("lr = nan", "lr must be a positive number"),
        ("epochs = ", "not TOML"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=match):
            resolve(path)
    with pytest.raises(ConfigError, match="no such configuration file"):
        resolve(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="unknown preset"):
        resolve(preset="huge")


def test_an_approximant_without_lalsuite_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "lalsimulation", None)  # import now fails
    with pytest.raises(ConfigError, match="approximant 'IMRPhenomD' needs lalsuite"):
        resolve(approximant="IMRPhenomD")


def test_unwritable_output_or_full_disk_is_reported_before_simulating(tmp_path, monkeypatch):
    from rootclad.gw.run import pipeline

    (tmp_path / "file").write_text("")
    cfg = resolve(**SMALL)
    with pytest.raises(ConfigError, match="cannot write to the output directory"):
        pipeline.run(cfg, tmp_path / "file" / "out", log=lambda *_: None)
    monkeypatch.setattr(pipeline.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10**6, 10**6))  # fmt: skip
    with pytest.raises(ConfigError, match="GB free, the run needs about"):
        pipeline.run(cfg, tmp_path / "out", log=lambda *_: None)
    assert not (tmp_path / "out" / "data").exists()


# -- evaluation ------------------------------------------------------------------------------
def _pairwise_auc(score, label):
    s1, s0 = score[label == 1], score[label == 0]
    return ((s1[:, None] > s0[None]).sum() + 0.5 * (s1[:, None] == s0[None]).sum()) / (
        len(s1) * len(s0)
    )


def test_auc_and_roc_equal_direct_counts():
    rng = np.random.default_rng(1)
    label = (rng.random(500) < 0.4).astype(int)
    score = np.round(rng.standard_normal(500) + label, 1)  # ties
    assert ev.auc(score, label) == pytest.approx(_pairwise_auc(score, label), abs=1e-12)
    fpr, tpr = ev.roc(score, label)
    for t in (-1.0, 0.0, 0.7, 2.0):  # each threshold's rates are a point of the curve
        f = (score[label == 0] >= t).mean()
        p = (score[label == 1] >= t).mean()
        assert np.any(np.isclose(fpr, f) & np.isclose(tpr, p))
    assert np.trapezoid(tpr, fpr) == pytest.approx(ev.auc(score, label), abs=1e-12)


def test_every_signal_is_in_an_efficiency_bin_and_inside_its_interval():
    """float32 SNRs (as the ROOT file holds them): the loudest signal fell out of every bin
    (max + 1e-9 rounded back to max), and at all detections the interval's top was 1 - 2e-16."""
    rng = np.random.default_rng(3)
    n = 301
    label = np.r_[np.zeros(200, int), np.ones(n, int)]
    snr = np.r_[np.zeros(200), rng.uniform(4, 20, n)].astype(np.float32)
    stat = np.r_[rng.standard_normal(200), 10 + rng.standard_normal(n)]  # all detected
    out = ev.evaluate({"a": stat, "b": -stat}, label, snr, bootstrap=2)
    for name, method in out["methods"].items():
        for curve in (f["efficiency"] for f in method["fap"].values()):
            assert sum(curve["n"]) == n, name
            p = np.array(curve["k"]) / np.array(curve["n"])
            assert np.all((np.array(curve["low"]) <= p) & (p <= np.array(curve["high"])))
    assert ev.wilson(7, 7)[1] == 1.0 and ev.wilson(0, 7)[0] == 0.0


def test_snr50_fit_recovers_a_known_efficiency_curve_and_its_error_covers_it():
    """Statistic N(0, 1) + 0.3 SNR: at false-alarm probability f, half the signals pass at
    SNR = isf(f) / 0.3 exactly."""
    rng = np.random.default_rng(7)
    n = 20000
    label = (rng.random(n) < 0.5).astype(int)
    snr = np.where(label == 1, rng.uniform(2, 14, n), 0.0)
    out = ev.evaluate({"a": rng.standard_normal(n) + 0.3 * snr,
                       "b": rng.standard_normal(n) + 0.36 * snr}, label, snr, bootstrap=60)  # fmt: skip
    for fap in ev.FAPS:
        k = ev.fap_key(fap)
        for name, slope in (("a", 0.3), ("b", 0.36)):
            r = out["methods"][name]["fap"][k]
            truth = stats.norm.isf(fap) / slope
            assert abs(r["snr50"] - truth) < 4 * r["snr50_std"] + 0.05, (name, k, r, truth)
        ratio = out["ratio"][k]
        assert abs(ratio["value"] - 1.2) < 4 * ratio["std"] + 0.01
    assert ev.fap_key(1e-2) == "1e-2" and ev.fap_key(1e-3) == "1e-3"


@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (10, 10), (1, 3), (47, 120)])
def test_wilson_interval_solves_its_defining_equation(k, n):
    """The Wilson bounds are the proportions p whose score test |k/n - p| = sqrt(p(1-p)/n)
    (one standard deviation) is at its edge: found here by root finding, not the formula."""
    from scipy import optimize

    from rootclad.gw.run.evaluate import wilson

    def edge(p):
        return abs(k / n - p) - np.sqrt(p * (1 - p) / n)

    eps = 1e-12  # p = k/n is a root too: the brackets leave it out
    low = 0.0 if k == 0 else optimize.brentq(edge, eps, k / n - eps)
    high = 1.0 if k == n else optimize.brentq(edge, k / n + eps, 1 - eps)
    got = wilson(k, n)
    assert got == pytest.approx((low, high), abs=1e-9), (got, low, high)
    if 0 < k < n:  # the normal approximation is another interval: the check can tell
        half = np.sqrt(k / n * (1 - k / n) / n)
        assert got != pytest.approx((k / n - half, k / n + half), abs=1e-3)


def test_snr50_fit_is_nan_without_a_crossing():
    snr = np.linspace(5, 10, 100)
    assert np.isnan(ev.fit_snr50(snr, np.ones(100)))
    assert np.isnan(ev.fit_snr50(snr, (snr > 4.0).astype(float)))


@pytest.mark.parametrize(
    "a, b, top", [(10.0, 4.0, 20.0), (5.3, 2.46, 12.0), (7.1, 0.6, 12.0), (6.0, 1.3, 12.0)]
)
def test_snr50_fit_is_the_maximum_likelihood_found_by_scipy(a, b, top):
    """The probit fit against scipy's L-BFGS on the same binned likelihood started at the
    truth, and against the truth within the statistical error; a broad curve included (a
    simplex search from the median and width 1, the fit before, stopped at width 1.284 on the
    first case's data, 8,400 units of log-likelihood below the maximum)."""
    from scipy import optimize, special, stats

    rng = np.random.default_rng(11)
    snr = rng.uniform(2.0, top, 20000)
    det = (rng.uniform(size=len(snr)) < stats.norm.cdf((snr - a) / b)).astype(float)
    got = ev.fit_probit(snr, det)
    idx = ((snr - snr.min()) / 0.02).astype(np.int64)
    n, k = np.bincount(idx), np.bincount(idx, weights=det)
    x = snr.min() + (np.arange(len(n)) + 0.5) * 0.02

    def nll(p):
        z = (x - p[0]) / p[1]
        return -np.sum(k * special.log_ndtr(z) + (n - k) * special.log_ndtr(-z))

    options = {"ftol": 1e-15, "gtol": 1e-10}
    bounds = [(2, top), (0.05, 10)]
    ref = optimize.minimize(nll, [a, b], method="L-BFGS-B", bounds=bounds, options=options).x
    assert got == pytest.approx(tuple(ref), abs=2e-3)
    assert abs(got[0] - a) < 0.1 * b and abs(got[1] - b) < 0.1 * b
    assert nll(got) <= nll(ref) + 1e-6


# -- training: resume ends where an uninterrupted run ends -----------------------------------
@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    from rootclad.gw.run.pipeline import simulate_all

    d = tmp_path_factory.mktemp("gwrun")  # train.root too, for FILE's training
    files = simulate_all(resolve(**SMALL, **FILE), d / "data", False, lambda *_: None)
    return resolve(**SMALL), files


FILE = dict(training_data="file", curriculum_epochs=0)  # train.root's events every epoch


# training for the noise tail: fresh events, a curriculum, carried hard negatives (their seeds
# restored from the checkpoint; a pool of 24 so that carried ones are among the 16 mined: with
# 200 a resume that dropped them went unseen), the partial AUC's selection and a cosine rate
TAIL = dict(
    training_data="fresh",
    curriculum_epochs=1,
    hard_negatives=16,
    hard_pool=24,
    hard_mining="carry",
    select="pauc",
    val_noise=1000,
    lr_schedule="cosine",
)


@pytest.mark.parametrize(
    "keys", [pytest.param(FILE, id="file"), pytest.param(TAIL, id="tail", marks=pytest.mark.slow)]
)
def test_interrupted_training_resumes_to_the_same_weights(small_files, tmp_path, keys):
    from rootclad.gw.run.train import train

    cfg, files = small_files
    # the tail stops in epoch 3: its checkpoint then carries epoch 2's hard negatives
    stop = 3 if keys is TAIL else 2
    cfg = resolve(**{**SMALL, "epochs": stop + 1, "engine": "pullback", **keys})
    quiet = lambda *_: None  # noqa: E731
    full = train(cfg, files["train"], files["val"], tmp_path / "a", progress=False, log=quiet)

    def stop_at(msg):
        if msg.startswith(f"epoch {stop}:"):
            raise KeyboardInterrupt

    interrupted = (cfg, files["train"], files["val"], tmp_path / "b")
    with pytest.raises(KeyboardInterrupt):
        train(*interrupted, progress=False, log=stop_at)
    # the log line comes before the epoch's checkpoint: the last good one is the epoch before
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["epoch"] == stop - 1
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["checkpoint.pt"]
    resumed = train(cfg, files["train"], files["val"], tmp_path / "b", resume=True,
                    progress=False, log=quiet)  # fmt: skip
    assert resumed.resumed_from == stop - 1
    for key in ("train_loss", "val_loss"):  # every epoch's, the last one's mined from the carry
        assert [h[key] for h in resumed.history] == [h[key] for h in full.history], key
    for (k, a), b in zip(full.cm.state_dict().items(), resumed.cm.state_dict().values(),
                         strict=True):  # fmt: skip
        assert torch.equal(a, b), k
    if keys is TAIL:  # the carried seeds are the checkpoint's: without them epoch 4 mines otherwise
        kept = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["hard_kept"]
        assert len(kept) == 16
    other = resolve(**{**SMALL, "epochs": stop + 1, "engine": "pullback", "lr": 2e-3, **keys})
    with pytest.raises(ValueError, match="another configuration"):
        train(other, files["train"], files["val"], tmp_path / "b", resume=True, progress=False,
              log=quiet)  # fmt: skip


# -- end to end --------------------------------------------------------------------------------
@pytest.mark.slow
def test_small_run_writes_summary_report_and_root_file(small_files, tmp_path):
    from rootclad.gw.run.pipeline import run

    cfg, files = small_files
    out = tmp_path / "run"
    # the default trains on fresh events: no train.root is read or written
    shutil.copytree(files["val"].parent, out / "data", ignore=shutil.ignore_patterns("train*"))
    lines = []
    summary = run(cfg, out, progress=False, log=lines.append)
    assert sum("reused" in line for line in lines) == 2  # same configuration: not rewritten
    assert not (out / "data" / "train.root").exists()
    s = json.loads((out / "summary.json").read_text())
    assert s["engine"] in ("clad", "pullback") and s["engine"] == summary["engine"]
    for m in ("network", "matched_filter"):
        assert 0.5 < s["auc"][m] <= 1
    for k in ("1e-1", "1e-2", "1e-3"):
        for m in ("network", "matched_filter"):
            assert set(s["snr50"][k][m]) == {"value", "std", "probit_width"}
            e = s["efficiency"][k][m]
            assert sum(e["n"]) == summary["test_events"]["signal"]
            assert all(lo <= k_ / n <= hi for lo, k_, n, hi in
                       zip(e["low"], e["k"], e["n"], e["high"], strict=True))  # fmt: skip
        assert set(s["ratio"][k]) == {"value", "std"}
    # the matched filter is the optimal statistic here: it must beat chance clearly
    assert s["auc"]["matched_filter"] > 0.8
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 5 and 'src="plots/' not in page
    # the markdown rendered: no literal backticks or asterisks, code and bold as HTML
    text = re.sub(r'src="data:[^"]*"', "", page)
    assert "`" not in text and "**" not in text
    assert "<strong>" in text and "<code>rootclad gw run --config config.toml</code>" in text
    assert "SNR at 50% efficiency" in (out / "report.md").read_text()
    assert resolve(out / "config.toml") == cfg
    for stem in ("gwnet.so", "gwnet.root", "gwnet.h"):
        assert (out / "model" / stem).exists()
    if "skipped" not in s["root"]:
        import uproot

        assert s["root"]["max_abs_diff_to_python"] < 1e-4
        with uproot.open(out / "scores.root") as f:
            names = {k.split(";")[0] for k in f.keys()}
            assert {"score_noise", "score_signal", "roc_network", "roc_matched_filter",
                    "efficiency_network_1e-2", "efficiency_matched_filter_1e-3",
                    "tefficiency_network_1e-2"} <= names  # fmt: skip
            assert f["score_noise"].values().sum() == s["test_events"]["noise"]
    # the network through ONNX (torch's exporter, rootclad.onnx.load) gives the same numbers
    assert (out / "model" / "gwnet.onnx").exists()
    assert s["onnx"]["events"] == cfg.test_events
    assert s["onnx"]["max_abs_diff_scores"] < 1e-4 and s["onnx"]["max_rel_diff_saliency"] < 1e-4
    assert "ONNX: the trained network" in (out / "report.md").read_text()
    assert not list(out.rglob("*.partial*"))
    # the same seed gives the same numbers
    again = run(cfg, tmp_path / "again", progress=False, log=lambda *_: None)
    assert again["auc"] == s["auc"] and again["snr50"] == s["snr50"]


def test_a_lalsuite_approximant_simulates_through_the_run_config(tmp_path):
    pytest.importorskip("lalsimulation", reason="needs lalsuite")
    from rootclad.gw.dataset import read_config
    from rootclad.gw.run.pipeline import simulate_all

    cfg = resolve(train_events=20, val_events=10, test_events=200, batch_size=16,
                  approximant="IMRPhenomD")  # fmt: skip
    files = simulate_all(cfg, tmp_path, False, lambda *_: None)
    assert read_config(files["test"]).approximant == "IMRPhenomD"


def test_the_best_epochs_weights_are_kept_not_the_last(small_files, tmp_path, monkeypatch):
    """state_dict() views the live parameters: keeping it as "the best weights" kept whatever
    the last epoch left. The validation losses are set so that epoch 2 is the best."""
    from rootclad.gw.run import train as train_module

    cfg, files = small_files
    cfg = resolve(**{**SMALL, "epochs": 3, "engine": "pullback"})
    losses = iter([0.5, 0.4, 0.6])
    monkeypatch.setattr(train_module, "validation_loss", lambda *a: next(losses))
    result = train_module.train(cfg, files["train"], files["val"], tmp_path, progress=False,
                                log=lambda *_: None)  # fmt: skip
    assert result.best_epoch == 2
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    for name, value in result.cm.state_dict().items():
        assert torch.equal(value, state["best_model"][name]), name
    assert any(not torch.equal(state["model"][k], state["best_model"][k]) for k in state["model"])
    # the export of those weights is the run's current best: a background study takes it
    from rootclad.gw.run.weights import current_best

    (tmp_path / "model").mkdir()
    result.cm.export(tmp_path / "model" / "gwnet")
    _, source = current_best(tmp_path, cfg)
    assert source["file"] == str(tmp_path / "model" / "gwnet.root")
    assert (source["checkpoint_epoch"], source["best_epoch"]) == (3, 2)


def test_the_mlp_trains_and_scores_too(small_files, tmp_path):
    from rootclad.gw.run.pipeline import network_scores, onnx_round_trip, strain_of
    from rootclad.gw.run.train import saliency, train

    cfg, files = small_files
    cfg = resolve(**{**SMALL, "epochs": 1, "model": "mlp", "engine": "pullback"})
    result = train(cfg, files["train"], files["val"], tmp_path, progress=False,
                   log=lambda *_: None)  # fmt: skip
    scores = network_scores(result.cm, cfg, files["test"])
    assert scores.shape == (cfg.test_events,) and np.isfinite(scores).all()
    assert np.isfinite(result.history[0]["val_loss"])
    # its ONNX round trip, as the run does it
    strain = strain_of(files["test"], [0, 1])
    examples = {"strain": strain[:, 0], "saliency": saliency(result.cm, cfg, strain)}
    via = onnx_round_trip(result.cm, cfg, tmp_path / "gwnet", files["test"], scores, examples)
    assert via["max_abs_diff_scores"] < 1e-4 and via["max_rel_diff_saliency"] < 1e-4, via


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_a_cuda_run_without_a_gpu_stops_before_simulating(tmp_path):
    from rootclad.gw.run.pipeline import run

    with pytest.raises(ConfigError, match=r'device = "cuda": .*(nvcc|no CUDA device)'):
        run(resolve(**SMALL, device="cuda"), tmp_path, progress=False, log=lambda *_: None)
    assert not (tmp_path / "data").exists()


def test_training_scoring_and_saliency_on_a_device_model(small_files, tmp_path, monkeypatch):
    """The run's training, scores and saliency with a DeviceModel (what --device cuda
    compiles), here on its host kernels: as the CPU CompiledModel's, trained alike."""
    from rootclad.gw.run import train as train_module
    from rootclad.gw.run.pipeline import network_scores, strain_of
    from rootclad.torch import DeviceModel

    cfg, files = small_files
    cfg = resolve(**{**SMALL, "epochs": 1, "model": "mlp", "engine": "pullback"})
    quiet = lambda *_: None  # noqa: E731
    ref = train_module.train(cfg, files["train"], files["val"], tmp_path / "cpu",
                             progress=False, log=quiet)  # fmt: skip
    compile_cpu = train_module.compile_model
    monkeypatch.setattr(train_module, "compile_model",
                        lambda c: _on_device_kernels(compile_cpu(c)))  # fmt: skip
    got = train_module.train(cfg, files["train"], files["val"], tmp_path / "dev",
                             progress=False, log=quiet)  # fmt: skip
    assert isinstance(got.cm, DeviceModel)
    a, b = ref.history[0], got.history[0]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3)
    assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-3)
    s_ref, s_got = (
        network_scores(ref.cm, cfg, files["test"]),
        network_scores(got.cm, cfg, files["test"]),
    )
    assert np.corrcoef(s_ref, s_got)[0, 1] > 0.999
    strain = strain_of(files["test"], [0, 1])
    # saliency of the same weights: the device model's autograd path against the CPU model's
    got.cm.load_state_dict(ref.cm.state_dict())
    np.testing.assert_allclose(
        train_module.saliency(got.cm, cfg, strain),
        train_module.saliency(ref.cm, cfg, strain),
        rtol=1e-3,
        atol=1e-6,
    )


def _on_device_kernels(cm):
    """The device model of a CompiledModel, run on the host (device="cpu")."""
    from rootclad.compiler import device_program

    dm = device_program(cm.graph, cm.loss, "cpu")
    dm.load_state_dict(cm.state_dict())
    return dm
