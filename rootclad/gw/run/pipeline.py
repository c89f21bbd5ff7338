"""``rootclad gw run``: simulate, train, evaluate against the matched filter, explain, score in
ROOT, report. Each stage is timed; everything lands in one output directory:

    config.toml        the resolved configuration (rerun with --config)
    data/              train.root, val.root, test.root (reused when their configuration matches)
    checkpoint.pt      weights, optimizer state and epoch, written atomically after each epoch
    model/gwnet.*      the exported model (cm.export: .so, .root, .h; .onnx: torch's exporter)
    cache/bank-*.npz   the matched filter's template bank
    scores.root        ROOT: score histograms of both methods per class, ROC TGraphs,
                       efficiencies as TEfficiency and TGraphAsymmErrors
    plots/*.png        loss, ROC, efficiency vs SNR, score distributions, saliency
    report.md, report.html (self-contained), summary.json
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from rootclad.gw.run.config import ConfigError, RunConfig
from rootclad.gw.run.inputs import _entries, read_test, strain_chunks, strain_of, template_bank
from rootclad.paths import replacing, write_error


class Stages:
    """Seconds per stage, in order."""

    def __init__(self, log):
        self.times: dict[str, float] = {}
        self.log = log

    def run(self, name, fn, *args, **kwargs):
        try:
            self.log(f"== {name}")
            t = time.perf_counter()
            out = fn(*args, **kwargs)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"interrupted during {name} (rerun with --resume to continue "
                                    "from the last finished epoch)") from None  # fmt: skip
        self.times[name] = time.perf_counter() - t
        return out


def _check_output(out: Path, cfg: RunConfig) -> None:
    """Before any work: the directory can be written, the disk holds the data files, and a
    CUDA run has nvcc and a GPU."""
    if cfg.device == "cuda":
        from rootclad.compiler import check_device

        try:
            check_device("cuda")
        except (RuntimeError, ValueError) as err:
            raise ConfigError(f'device = "cuda": {err}') from None
    if any(c in str(out.resolve()) for c in "#?"):
        raise ConfigError(f"{out}: ROOT reads what follows '#' or '?' in a file name as an "
                          "anchor or options, so it would open other files than the run's; "
                          "choose a directory without them")  # fmt: skip
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"cannot write to the output directory {out}: {err.strerror}") from None
    n = round(cfg.duration * cfg.sample_rate)
    # data files a resumed or repeated run reuses need no space; one it replaces needs it all,
    # the old file staying until the new one is complete
    todo = [
        split for split in splits(cfg) if not _reusable(out / "data" / f"{split}.root", cfg, split)
    ]
    events = sum(cfg.simulation(split)["n_events"] for split in todo)
    need = events * (n * 4 + 64) * 1.05 + 50e6
    free = shutil.disk_usage(out).free
    if free < need:
        raise ConfigError(f"{out}: {free / 1e9:.2f} GB free, the run needs about "
                          f"{need / 1e9:.2f} GB (fewer events: --events)")  # fmt: skip


SPLITS = ("train", "val", "test")


def splits(cfg: RunConfig) -> tuple[str, ...]:
    """The data files a run simulates: training on fresh events reads no training file."""
    return SPLITS[1:] if cfg.training_data == "fresh" else SPLITS


def _reusable(path: Path, cfg: RunConfig, split: str) -> bool:
    """Whether ``path`` holds the split's events as ``cfg`` would simulate them, written with
    the compression it asks for (which decides what corruption a read detects)."""
    from rootclad.gw.dataset import compression_name, file_compression, read_config
    from rootclad.gw.run.train import simulation_config

    kwargs = cfg.simulation(split)
    try:
        same = path.exists() and read_config(path) == simulation_config(cfg, split)
        same = same and _entries(path) == kwargs["n_events"]
        return same and file_compression(path) == compression_name(kwargs["compression"])
    except Exception:  # unreadable: simulate again
        return False


def simulate_all(cfg: RunConfig, data: Path, progress, log, client=None) -> dict[str, Path]:
    from rootclad.gw.dataset import simulate

    data.mkdir(parents=True, exist_ok=True)
    files = {"train": None}
    for split in splits(cfg):
        path = data / f"{split}.root"
        kwargs = cfg.simulation(split)
        n = kwargs.pop("n_events")
        if _reusable(path, cfg, split):
            log(f"{path}: reused ({n} events, same configuration)")
        else:
            result = simulate(path, n, progress=progress, client=client, **kwargs)
            log(f"{path}: {n} events in {result.seconds:.1f} s")
        files[split] = path
    return files


def network_scores(cm, cfg: RunConfig, path: Path) -> np.ndarray:
    """The network's logit for every test event, chunk by chunk."""
    from rootclad.gw.run.train import scores

    return np.concatenate([scores(cm, cfg, x) for x in strain_chunks(path)])


def matched_filter(bank, path: Path, progress) -> np.ndarray:
    """The maximised matched-filter SNR of every test event, chunk by chunk."""
    from tqdm.auto import tqdm

    from rootclad.gw.matched_filter import matched_filter_snr

    out = []
    with tqdm(total=_entries(path), unit="ev", disable=not progress, desc="matched filter") as bar:
        for x in strain_chunks(path, 512):
            out.append(matched_filter_snr(x, bank).snr)
            bar.update(len(x))
    return np.concatenate(out)


def explain(cm, cfg, test: dict, test_file: Path) -> dict:
    """Saliency of example signal events (loud, median and quiet among the detected ones)
    with the injected whitened signal for the overlay."""
    from rootclad.gw.dataset import injected_signals, read_config
    from rootclad.gw.run.train import saliency

    sig = np.flatnonzero(test["label"] == 1)
    order = sig[np.argsort(test["snr"][sig])]
    k = min(cfg.saliency_examples, len(order))
    picks = order[np.linspace(len(order) // 2, len(order) - 1, k).astype(int)] if k else order[:0]
    strain = strain_of(test_file, picks)
    return {
        "index": picks.tolist(),
        "snr": test["snr"][picks].tolist(),
        "strain": strain[:, 0],
        "signal": injected_signals(test["seed"][picks], read_config(test_file)),
        "saliency": saliency(cm, cfg, strain),
    }


# While ROOT runs, SIGINT only sets this flag (a C handler): Python's handler would raise
# KeyboardInterrupt inside cppyy, which crashed there once (SetDetailedException), and it
# cannot run at all until a long C++ call returns. The event loop stops at the flag.
_SIGINT_FLAG = """
#include <atomic>
#include <csignal>
namespace rootclad_gw {
inline std::atomic<bool> interrupted{false};
inline struct sigaction python_handler;
inline void on_sigint(int) { interrupted = true; }
inline void catch_sigint() {
  interrupted = false;
  struct sigaction flag = {};
  flag.sa_handler = on_sigint;
  sigaction(SIGINT, &flag, &python_handler);
}
inline void release_sigint() { sigaction(SIGINT, &python_handler, nullptr); }
}  // namespace rootclad_gw
"""


@contextlib.contextmanager
def _sigint_as_flag(ROOT):
    """Ctrl-C in the block sets ``rootclad_gw::interrupted``; KeyboardInterrupt is raised when
    the block ends (or at once, when it raises)."""
    from rootclad.data.cling import declare

    declare(_SIGINT_FLAG)
    ROOT.rootclad_gw.catch_sigint()
    try:
        yield
    finally:
        ROOT.rootclad_gw.release_sigint()
    if ROOT.rootclad_gw.interrupted.load():
        raise KeyboardInterrupt


def root_scoring(cfg, stem: Path, test_file: Path, network: np.ndarray, mf: np.ndarray, ev: dict,
                 out: Path):  # fmt: skip
    """The test file scored in ROOT through RDataFrame (define_score), checked against the
    Python scores, and a ROOT file with the score histograms of both methods per class and the
    curves (see _write_scores_file)."""
    try:
        from rootclad.data.cling import import_root

        ROOT = import_root()
    except ImportError:
        return {"skipped": "ROOT is not installed"}
    import rootclad.root

    path = out / "scores.root"
    with _sigint_as_flag(ROOT), replacing(path) as tmp:
        # after Ctrl-C the loop runs on without reading or scoring an event
        df = ROOT.RDataFrame("events", str(test_file)).Filter("!rootclad_gw::interrupted")
        df = rootclad.root.define_score(df, stem, column="score")  # the stored input column
        cols = df.AsNumpy(["score", "label"])
        if ROOT.rootclad_gw.interrupted.load():
            raise KeyboardInterrupt
        _write_scores_file(ROOT, tmp, path, cols, mf, ev)
    diff = float(np.max(np.abs(cols["score"] - network)))
    return {"file": str(path), "max_abs_diff_to_python": diff, "events": int(len(cols["score"]))}


# per method: its name in titles (no raw identifiers), its statistic, its histograms' names
_METHODS = {"network": ("network", "network logit", "score_{}"),
            "matched_filter": ("matched filter", "matched-filter SNR", "score_matched_filter_{}")}  # fmt: skip


def _write_scores_file(ROOT, tmp: Path, path: Path, cols: dict, mf, ev: dict) -> None:
    """Score histograms per method and class (the network's scores as ROOT computed them,
    the matched filter's SNR), the ROC curves as TGraphs, and the efficiency curves as
    TEfficiency and TGraphAsymmErrors."""
    f = ROOT.TFile(str(tmp), "RECREATE")
    if f.IsZombie():
        raise write_error(path)
    names = []
    try:
        for method, stat in (("network", cols["score"]), ("matched_filter", mf)):
            stat = np.asarray(stat, dtype=np.float64)
            lo, hi = _histogram_range(stat)
            for label, cls in ((0, "noise"), (1, "signal")):
                _, what, name = _METHODS[method]
                name = name.format(cls)
                h = ROOT.TH1D(name, f"{what}, {cls} events;{what};events", 60, lo, hi)
                h.SetDirectory(ROOT.nullptr)  # Python's: not deleted again when the file closes
                x = np.ascontiguousarray(stat[np.asarray(cols["label"]) == label])
                h.FillN(len(x), x, ROOT.nullptr)
                names.append(name)
                f.WriteObject(h, name)
        for method, m in ev["methods"].items():
            words = _METHODS[method][0]
            fpr, tpr = np.asarray(m["roc"]["fpr"]), np.asarray(m["roc"]["tpr"])
            g = ROOT.TGraph(len(fpr), fpr, tpr)
            g.SetTitle(f"ROC, {words} (AUC {m['auc']:.4f});false-alarm probability;efficiency")
            names.append(f"roc_{method}")
            f.WriteObject(g, names[-1])
            for key, v in m["fap"].items():
                title = f"{words}, false-alarm probability {key};injected SNR;efficiency"
                for obj in _efficiency(ROOT, v["efficiency"], ev["snr_edges"], title,
                                       f"{method}_{key}"):  # fmt: skip
                    names.append(obj.GetName())
                    f.WriteObject(obj, names[-1])
    finally:
        f.Close()
    _check_root_file(tmp, path, names, failed=f.TestBit(ROOT.TFile.kWriteError))


def _histogram_range(x: np.ndarray) -> tuple[float, float]:
    """Limits that hold every finite value of ``x`` inside the bins: a histogram's upper edge
    is exclusive, so limits on the data's own extremes put the largest value in the overflow."""
    x = x[np.isfinite(x)]
    lo, hi = (float(x.min()), float(x.max())) if len(x) else (0.0, 1.0)
    pad = max(0.02 * (hi - lo), 1e-6 * max(1.0, abs(lo), abs(hi)))
    return lo - pad, hi + pad


# evaluate.wilson's interval is one standard deviation (z = 1): ROOT's level for the same
_ONE_SIGMA = math.erf(1 / math.sqrt(2))


def _efficiency(ROOT, e: dict, edges, title: str, suffix: str):
    """One efficiency curve of evaluate.py twice: ``tefficiency_SUFFIX``, a TEfficiency (the
    counts per SNR bin; ROOT's Wilson interval at one standard deviation), and
    ``efficiency_SUFFIX``, a TGraphAsymmErrors of the points with evaluate.wilson's bounds
    (bins without signal events left out)."""
    teff = ROOT.TEfficiency(f"tefficiency_{suffix}", title, len(edges) - 1,
                            np.asarray(edges, np.float64))  # fmt: skip
    teff.SetDirectory(ROOT.nullptr)  # Python's: not deleted again when the file closes
    axis = teff.GetTotalHistogram().GetXaxis()
    for x, n, k in zip(e["snr"], e["n"], e["k"], strict=True):
        b = axis.FindFixBin(x)
        teff.SetTotalEvents(b, n)
        teff.SetPassedEvents(b, k)
    teff.SetStatisticOption(ROOT.TEfficiency.kFWilson)
    teff.SetConfidenceLevel(_ONE_SIGMA)
    x, y = np.asarray(e["snr"], np.float64), np.asarray(e["efficiency"], np.float64)
    low = y - np.asarray(e["low"], np.float64)
    high = np.asarray(e["high"], np.float64) - y
    zero = np.zeros(len(x))
    g = ROOT.TGraphAsymmErrors(len(x), x, y, zero, zero, low, high)
    g.SetNameTitle(f"efficiency_{suffix}", title)
    return [teff, g]


def _check_root_file(tmp: Path, path: Path, names: list[str], failed: bool) -> None:
    """ROOT reports a failed write only by a bit and an error line: the file written as ``tmp``
    (to become ``path``) must have no write error and hold every object, readable."""
    import uproot

    if failed:
        raise write_error(path)
    try:
        with uproot.open(tmp) as f:
            missing = sorted(set(names) - {k.split(";")[0] for k in f.keys()})
    except Exception as err:
        raise write_error(path, f" (unreadable: {err})") from err
    if missing:
        raise write_error(path, f" (missing {', '.join(missing)})")


def onnx_round_trip(cm, cfg, stem: Path, test_file: Path, network: np.ndarray,
                    examples: dict) -> dict:  # fmt: skip
    """The trained network written to ONNX by torch's exporter, read back by
    rootclad.onnx.load, and its scores on the whole test file and saliency on the example
    events compared with the trained model's."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        return {"skipped": "the onnx package is not installed"}
    import warnings

    import torch

    import rootclad
    from rootclad.gw.models import make
    from rootclad.gw.run.train import saliency

    n = round(cfg.duration * cfg.sample_rate)
    net = make(cfg.model, n)
    net.load_state_dict(cm.state_dict())
    net.eval()
    path = stem.with_suffix(".onnx")
    shape = (2, n) if cfg.model == "mlp" else (2, 1, n)
    # the TorchScript-based exporter warns that it is legacy
    with warnings.catch_warnings(), replacing(path) as tmp:
        warnings.simplefilter("ignore")
        torch.onnx.export(net, torch.zeros(shape), str(tmp), dynamo=False, input_names=["strain"],
                          output_names=["logit"], opset_version=17,
                          dynamic_axes={"strain": {0: "batch"}, "logit": {0: "batch"}})  # fmt: skip
    imported = rootclad.onnx.load(path, loss="bce_with_logits", engine=cm.engine)
    again = network_scores(imported, cfg, test_file)
    sal = saliency(imported, cfg, examples["strain"][:, None, :])
    ref = np.asarray(examples["saliency"])
    scale = max(float(np.max(np.abs(ref))), 1e-30) if ref.size else 1.0
    return {
        "file": str(path),
        "engine": imported.engine,
        "events": int(len(again)),
        "max_abs_diff_scores": float(np.max(np.abs(again - network))),
        "max_rel_diff_saliency": float(np.max(np.abs(sal - ref))) / scale if ref.size else 0.0,
    }


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("rootclad", "torch", "numpy", "scipy", "uproot", "ROOT", "lalsuite", "matplotlib"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    if "ROOT" in out:  # the wheel's own number (0.1a12) says less than ROOT's (6.40/00)
        try:
            from rootclad.data.cling import import_root

            out["ROOT"] = f"{import_root().gROOT.GetVersion()} (package {out['ROOT']})"
        except Exception:  # noqa: BLE001  (PyROOT fails in many ways; the number stays)
            pass
    return out


def _engine_in_use(engine: str) -> str:
    """The engine the run will train with, said before it starts (auto: Clad where found)."""
    if engine != "auto":
        return engine
    from rootclad.toolchain import find_clad

    clad, why = find_clad()
    return "clad (auto: Clad found)" if clad else f"pullback (auto: {why})"


def run(cfg: RunConfig, out: Path, *, resume: bool = False, progress: bool | None = None,
        log=print) -> dict:  # fmt: skip
    """The whole run; returns the summary (also written to ``out/summary.json``). With
    ``cfg.workers`` > 1 or ``cfg.scheduler``, simulation, training and scoring run on Dask
    workers (cluster.py)."""
    from rootclad.gw.run import cluster
    from rootclad.gw.run.train import resume_state

    out = Path(out)
    _check_output(out, cfg)
    # a checkpoint that cannot be resumed is refused before any work, config.toml unchanged
    resuming = resume_state(cfg, out / "checkpoint.pt", resume, lambda *_: None) is not None
    if progress is None:
        progress = sys.stderr.isatty()
    with cluster.cluster(cfg) as client:
        if client is not None:
            cluster.check_shared(client, out)
        return _run(cfg, out, client, resume, resuming, progress, log)


EXPORT = ("model/gwnet.root", "model/gwnet.so", "model/gwnet.h", "model/gwnet.onnx")


def _retire_export(out: Path, log) -> None:
    """A training that starts afresh makes the directory's export another training's: it is
    removed before config.toml changes, so that nothing (gw background, a macro) takes it for
    this configuration's weights. Resuming the checkpoint keeps it."""
    gone = [name for name in EXPORT if (out / name).exists()]
    for name in gone:
        (out / name).unlink()
    if gone:
        log(f"removed the previous training's export ({', '.join(gone)})")


def _run(cfg: RunConfig, out: Path, client, resume: bool, resuming: bool, progress, log) -> dict:
    from rootclad.gw.run import cluster, report, train

    where = "" if client is None else f" on {len(client.nthreads())} Dask workers"
    log(f"writing to {out.resolve()}; engine: {_engine_in_use(cfg.engine)}{where}")
    if not resuming:
        _retire_export(out, log)
    report.write_text(out / "config.toml", cfg.to_toml())
    stages = Stages(log)
    files = stages.run("simulate", simulate_all, cfg, out / "data", progress, log, client)
    tail = cfg.training_data == "fresh" or cfg.select == "pauc" or cfg.lr_schedule != "constant"
    if client is None or tail:
        # training for the tail simulates its events here: this process trains
        tr = stages.run("train", train.train, cfg, files["train"], files["val"], out,
                        resume=resume, progress=progress, log=log)  # fmt: skip
    else:
        tr = stages.run("train", cluster.train, client, cfg, files["train"], files["val"], out,
                        resume=resume, log=log)  # fmt: skip
    what = "1 - partial AUC" if cfg.select == "pauc" else "loss"
    log(f"engine: {tr.engine} on {tr.cm.device}; best validation {what} at epoch {tr.best_epoch}")
    test = read_test(files["test"])
    if client is None:
        network = stages.run("score (network)", network_scores, tr.cm, cfg, files["test"])
    bank = stages.run("template bank", template_bank, cfg, files["test"], out / "cache", log)
    if client is None:
        mf = stages.run("matched filter", matched_filter, bank, files["test"], progress)
    else:
        from rootclad.gw.run.background import make_spec

        weights = {k: v.detach().double().cpu().reshape(-1).numpy()
                   for k, v in tr.cm.state_dict().items()}  # fmt: skip
        spec = make_spec(cfg, weights, files["test"], bank)
        network, mf = stages.run("score on the workers (network, matched filter)",
                                 cluster.score_test, client, spec, files["test"], progress)  # fmt: skip
    ev = stages.run("evaluate", _evaluate, cfg, network, mf, test)
    examples = stages.run("saliency", explain, tr.cm, cfg, test, files["test"])
    (out / "model").mkdir(exist_ok=True)
    stem = out / "model" / "gwnet"
    # the ROOT artifact and the ONNX export start from the CPU library
    cpu = tr.cm if cfg.device == "cpu" else stages.run("model to the CPU", tr.cm.to, "cpu")
    from rootclad.data.schema import Schema

    # the export knows its input: define_score and the macros read the column from it
    schema = Schema({"strain": round(cfg.duration * cfg.sample_rate)}, target="label",
                    classes=["noise", "signal"])  # fmt: skip
    stages.run("export", cpu.export, stem, None, schema)
    in_root = stages.run("score in ROOT", root_scoring, cfg, stem, files["test"], network, mf, ev,
                         out)  # fmt: skip
    via_onnx = stages.run("ONNX round trip", onnx_round_trip, cpu, cfg, stem, files["test"],
                          network, examples)  # fmt: skip
    summary = report.summary(cfg, tr, ev, len(bank), in_root, stages.times, versions())
    summary["onnx"] = via_onnx
    stages.run("report", report.write, out, cfg, tr, ev, test, network, mf, examples, summary)
    log(f"report: {out / 'report.html'}")
    if cfg.background_segments:  # --preset search
        from rootclad.gw.run.background import StudyConfig, run_study

        sc = StudyConfig(segments=cfg.background_segments, seed=cfg.seed, bootstrap=cfg.bootstrap)
        from rootclad.gw.dataset import _default_workers

        # without Dask workers the study runs on one local process per core (one on a GPU:
        # each process would hold a CUDA context)
        local = 1 if client is not None or cfg.device == "cuda" else _default_workers()
        bg = stages.run(
            "background",
            run_study,
            out,
            out / "background",
            sc,
            client=client,
            workers=local,
            progress=progress,
            log=log,
        )
        summary["background"] = {"file": str(out / "background" / "background.json"),
                                 "verdict": bg["verdict"], "seconds": stages.times["background"]}  # fmt: skip
        report.write_text(out / "summary.json", json.dumps(summary, indent=1, default=float) + "\n")
    return summary


def _evaluate(cfg, network, mf, test):
    from rootclad.gw.run.evaluate import evaluate

    return evaluate({"network": network, "matched_filter": mf}, test["label"], test["snr"],
                    bootstrap=cfg.bootstrap, seed=cfg.seed)  # fmt: skip
