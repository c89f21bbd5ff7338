"""``rootclad gw background``: the false-alarm probability of a trained run's network and of its
matched filter, measured on far more noise than a test set holds (down to 1e-5 and below).

The study is split into tasks of ``per_task`` noise-only segments. Task ``i`` draws its
segments' seeds from ``SeedSequence(seed, spawn_key=(i,))`` (the i-th child that
``SeedSequence(seed).spawn`` gives), generates and whitens them as the run's test file was
made (its stored configuration, no signals), scores them with the run's network (its current
best weights, :mod:`.weights`) and with its template bank, and keeps only what the thresholds
need: the loudest ``keep`` values of each statistic, a fine histogram of each, and the loudest
events (their seeds regenerate them). A task therefore depends on the study seed and its index
alone, never on the worker that ran it or on how many there were.

Each finished task is written atomically to ``OUT/tasks/task-NNNNNN.npz``; a rerun (after a
crash, a kill, Ctrl-C, or with more segments) computes only the tasks that are missing.
``OUT/study.json`` holds the fingerprint of what the tasks depend on (the model's weights, the
bank, the noise, the task size) and the weights' sha256: tasks of another study are never mixed
in, and every task file and worker's result is checked against the study (:func:`check_task`).

Thresholds are the same linear-interpolation quantile of the whole background as
``numpy.quantile`` (evaluate.threshold), computed from the tasks' loudest values where they
are known to hold every value that large (and from the histograms, approximately, above that:
said in the output). Efficiencies, SNR50 and their bootstrap errors on the run's test signals
come from :func:`rootclad.gw.run.evaluate.at_thresholds`; the report from
:mod:`.background_report`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from rootclad.gw.run.background_report import METHODS
from rootclad.gw.run.background_workers import run_dask, run_local
from rootclad.gw.run.config import ConfigError, shown
from rootclad.gw.run.fresh import check_disjoint
from rootclad.gw.run.weights import current_best
from rootclad.paths import replacing

FORMAT = 2  # 2: the matched filter in single precision (SNRs to 2e-7 of themselves)
# histogram edges per statistic: the network's logit and the matched filter's SNR; values
# outside land in the first or last bin (the thresholds that matter are read exactly)
EDGES = {"network": (-60.0, 60.0, 24000), "matched_filter": (0.0, 30.0, 15000)}
LOUD = 10  # loudest events kept per task and per statistic
SLICE = 512  # segments generated and scored at a time
# the network scores this many segments per call: fewer than a compiled model splits over its
# thread pool (model_runtime.h's MIN_CHUNK), so each call runs as one chunk and a logit does
# not depend on the process's thread count (split batches differed in the last float32 bit
# between 1 and 2 threads); as fast as batches of 512 on this machine
NET_BATCH = 3


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    segments: int = 100_000  # rounded up to whole tasks
    per_task: int = 4096
    seed: int = 0
    faps: tuple[float, ...] = (1e-3, 1e-4, 1e-5)
    keep: int = 2000  # loudest values of each statistic kept per task
    bootstrap: int = 200
    min_match: float | None = None  # of the template bank (None: the run's, bank_min_match)

    @property
    def tasks(self) -> int:
        return -(-self.segments // self.per_task)

    def check(self) -> StudyConfig:
        for key in ("segments", "per_task", "keep", "seed", "bootstrap"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v >= 2**63:
                raise ConfigError(f"{key} must be an integer of at most 63 bits, got {shown(v)}")
        for key in ("segments", "per_task", "keep"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1, got {getattr(self, key)}")
        if self.seed < 0 or self.bootstrap < 0:
            raise ConfigError("seed and bootstrap must not be negative")
        mm = self.min_match
        if mm is not None and (
            isinstance(mm, bool) or not isinstance(mm, (int, float)) or not 0.5 < mm < 1
        ):
            raise ConfigError(f"min_match must be in (0.5, 1), got {shown(mm)}")
        if not self.faps or not all(0 < f < 1 for f in self.faps):
            raise ConfigError(f"false-alarm probabilities must lie in (0, 1), got {self.faps}")
        return self


def task_seeds(seed: int, task: int, n: int) -> np.ndarray:
    """The event seeds (int64, [0, 2**63)) of task ``task``'s ``n`` segments."""
    ss = np.random.SeedSequence(seed, spawn_key=(task,))
    return (ss.generate_state(n, dtype=np.uint64) >> np.uint64(1)).astype(np.int64)


# -- the run directory -----------------------------------------------------------------------
def load_run(run: Path, log=print, min_match: float | None = None) -> dict:
    """What every task needs from a ``rootclad gw run`` directory, as plain values (sent to
    the workers, which need no access to the directory): the run's configuration, the weights,
    the noise configuration and the template bank; and which weights those are
    (``weights_from``: their sha256 and file). ``min_match``: the bank's (default the run's
    ``bank_min_match``)."""
    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.inputs import template_bank

    run = Path(run)
    if not (run / "config.toml").exists():
        raise ConfigError(f"{run}: not a `rootclad gw run` directory (no config.toml)")
    test = run / "data" / "test.root"
    if not test.exists():
        raise ConfigError(f"{run}: no data/test.root (its noise configuration and test signals "
                          "are needed); rerun `rootclad gw run` there")  # fmt: skip
    cfg = resolve(run / "config.toml")
    weights, source = current_best(run, cfg)
    if min_match is not None:
        cfg = dataclasses.replace(cfg, bank_min_match=float(min_match))
    spec = make_spec(cfg, weights, test, template_bank(cfg, test, run / "cache", log))
    spec["weights_from"] = source
    return spec


def make_spec(cfg, weights: dict[str, np.ndarray], test: Path, bank) -> dict:
    """:func:`load_run`'s values from a run's configuration, weights, test file (its noise
    configuration) and template bank."""
    from rootclad.gw.dataset import read_config

    sim = dataclasses.replace(read_config(test), signal_fraction=0.0)
    # where the run ran is no part of the model (the workers rebuild it from the rest)
    text = "".join(line for line in cfg.to_toml().splitlines(keepends=True)
                   if line.split(" =")[0] not in ("workers", "scheduler"))  # fmt: skip
    spec = {"config": text, "weights": weights, "simulation": sim.to_json(),
            "bank": {"masses": bank.masses, "templates": bank.templates, "n": bank.n,
                     "sample_rate": bank.sample_rate, "band": tuple(bank.band),
                     "psd": bank.psd, "t_ref": bank.t_ref, "approximant": bank.approximant}}  # fmt: skip
    # the key: what the scores depend on (the network's kind and input length, its weights,
    # the noise, the bank), not how it was trained: a key of the training does not move it
    scoring = f"{cfg.model}:{cfg.duration!r}:{cfg.sample_rate!r}:"
    h = hashlib.sha256(scoring.encode() + spec["simulation"].encode())
    for k in sorted(weights):
        h.update(k.encode() + np.ascontiguousarray(weights[k], np.float64).tobytes())
    h.update(np.ascontiguousarray(bank.templates).tobytes())
    spec["model_key"] = h.hexdigest()
    return spec


# -- one task (on a worker) ------------------------------------------------------------------
_SCORER: dict = {}


def scorer(spec: dict, threads: int | None):
    """The compiled network, the bank and the noise generator, built once per process."""
    if _SCORER.get("key") == spec["model_key"]:
        return _SCORER["value"]
    import tomllib
    import torch

    from rootclad.gw.dataset import SimulationConfig, _Generator
    from rootclad.gw.matched_filter import TemplateBank
    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.train import compile_model

    if threads is not None:  # before the first model library starts its pool
        os.environ.setdefault("ROOTCLAD_NUM_THREADS", str(threads))
        torch.set_num_threads(threads)
    cfg = resolve(**tomllib.loads(spec["config"]))
    cm = compile_model(cfg)
    state = cm.state_dict()
    missing = sorted(set(state) ^ set(spec["weights"]))
    if missing:
        raise ValueError(f"the run's weights do not fit its configured {cfg.model}: "
                         f"{', '.join(missing)}")  # fmt: skip
    for k, v in state.items():
        if np.size(spec["weights"][k]) != v.numel():
            raise ValueError(
                f"the run's weights do not fit its configured {cfg.model}: {k} "
                f"holds {np.size(spec['weights'][k])} values, the model's {v.numel()}"
            )
    cm.load_state_dict({k: torch.from_numpy(np.asarray(spec["weights"][k]).reshape(v.shape))
                        .to(v.dtype) for k, v in state.items()})  # fmt: skip
    cm.eval()
    b = spec["bank"]
    bank = TemplateBank(b["masses"], b["templates"], b["n"], b["sample_rate"], b["band"],
                        b["psd"], b["t_ref"], b["approximant"])  # fmt: skip
    gen = _Generator(SimulationConfig.from_json(spec["simulation"]))
    _SCORER.update(key=spec["model_key"], value=(cfg, cm, bank, gen))
    return _SCORER["value"]


def _histogram(method: str, x: np.ndarray) -> np.ndarray:
    lo, hi, bins = EDGES[method]
    idx = np.clip(((x - lo) * (bins / (hi - lo))).astype(np.int64), 0, bins - 1)
    return np.bincount(idx, minlength=bins).astype(np.int64)


def hist_edges(method: str) -> np.ndarray:
    lo, hi, bins = EDGES[method]
    return np.linspace(lo, hi, bins + 1)


def run_task(spec: dict, study: dict, task: int, threads: int | None = None) -> dict:
    """Task ``task`` of the study: its segments generated, whitened and scored; what is kept."""
    from rootclad.gw.matched_filter import matched_filter_snr
    from rootclad.gw.run import mf_cache
    from rootclad.gw.run.train import scores

    cfg, cm, bank, gen = scorer(spec, threads)
    n = study["per_task"]
    seeds = task_seeds(study["seed"], task, n)
    stat = {m: np.empty(n) for m in METHODS}
    template, when = np.empty(n, np.int64), np.empty(n)
    seconds = np.zeros(3)  # generation and whitening, network, matched filter
    mf_key = mf_cache.key(spec, study) if study.get("mf_cache") else None
    cached = mf_key and mf_cache.load(mf_key, task, n, len(bank), bank.n / bank.sample_rate)
    for lo in range(0, n, SLICE):
        t0 = time.perf_counter()
        x = gen.events(seeds[lo : lo + SLICE])["strain"][:, None, :]
        t1 = time.perf_counter()
        stat["network"][lo : lo + len(x)] = scores(cm, cfg, x, NET_BATCH)
        t2 = time.perf_counter()
        if not cached:
            r = matched_filter_snr(x, bank, workers=-1 if threads is None else threads)
            stat["matched_filter"][lo : lo + len(x)] = r.snr
            template[lo : lo + len(x)], when[lo : lo + len(x)] = r.template, r.time
        seconds += (t1 - t0, t2 - t1, time.perf_counter() - t2)
    if cached:
        stat["matched_filter"], template, when = cached["snr"], cached["template"], cached["time"]
    elif mf_key:  # the values are computed: a cache that cannot be written loses nothing
        with contextlib.suppress(OSError, RuntimeError):
            mf_cache.store(
                mf_key, task, {"snr": stat["matched_filter"], "template": template, "time": when}
            )
    out = {"task": np.int64(task), "segments": np.int64(n), "seconds": seconds,
           "key": np.str_(study["key"])}  # fmt: skip
    k = min(study["keep"], n)
    for m in METHODS:
        s = stat[m]
        if not np.all(np.isfinite(s)):
            raise FloatingPointError(f"task {task}: a non-finite {m} statistic")
        out[f"{m}_top"] = -np.sort(-s)[:k]  # descending
        out[f"{m}_hist"] = _histogram(m, s)
        loud = np.argsort(-s, kind="stable")[:LOUD]
        # seeds apart: 63 bits do not survive float64
        out[f"{m}_loud_seed"] = seeds[loud]
        out[f"{m}_loud"] = np.stack([stat["network"][loud], stat["matched_filter"][loud],
                                     template[loud], when[loud]], axis=1)  # fmt: skip
    return out


# -- the results directory -------------------------------------------------------------------
def task_path(out: Path, task: int) -> Path:
    return out / "tasks" / f"task-{task:06d}.npz"


def write_task(out: Path, task: int, result: dict, study: dict) -> None:
    """Task ``task``'s result, checked against the study (a worker may be anyone's), written
    to a temporary name and renamed."""
    check_task(result, study, task, f"the result of task {task}")
    with replacing(task_path(out, task), ".npz") as tmp:
        np.savez_compressed(tmp, **result)  # the histograms are mostly zeros


def read_task(out: Path, task: int, study: dict) -> dict | None:
    """A finished task's result; None when it is missing or cannot be read back (torn: it is
    computed again). A file that reads but is not this task of this study raises ValueError
    naming the file and the field."""
    path = task_path(out, task)
    if not path.exists():
        return None
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as z:
            r = {k: z[k] for k in z.files}
    except Exception:
        return None
    return check_task(r, study, task, str(path))


def _fields(study: dict) -> dict[str, tuple[tuple, str]]:
    """Each array of a task's result: its shape and dtype."""
    n = study["per_task"]
    keep, loud = min(study["keep"], n), min(LOUD, n)
    out = {"task": ((), "int64"), "segments": ((), "int64"), "seconds": ((3,), "float64")}
    out["key"] = ((), "unicode")
    for m in METHODS:
        out[f"{m}_top"] = ((keep,), "float64")
        out[f"{m}_hist"] = ((EDGES[m][2],), "int64")
        out[f"{m}_loud_seed"] = ((loud,), "int64")
        out[f"{m}_loud"] = ((loud, 4), "float64")
    return out


def check_task(r: dict, study: dict, task: int, where: str) -> dict:
    """``r`` when it holds what task ``task`` of ``study`` computes: its fields, each of its
    shape and type; its index, key and segment count; per statistic the kept values (finite,
    descending, each counted by the histogram), the histogram (counting every segment), the
    loudest segments (the task's own seeds, with the kept values and a template of the bank).
    Else ValueError naming ``where`` and the field: a count or shape another study's would
    have (``segments = 10**6`` moved every threshold) is never merged."""

    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"{where}: {field} {why}; remove it to compute the task again")

    fields = _fields(study)
    extra = sorted(set(r) - set(fields))
    if extra:
        raise bad(extra[0][:40], "is not a field of a task")
    for k, (shape, dtype) in fields.items():
        if k not in r:
            raise bad(k, "is missing")
        a = np.asarray(r[k])  # a worker's result holds numpy scalars
        typed = a.dtype.kind == "U" if dtype == "unicode" else a.dtype == dtype
        if a.shape != shape or not typed:
            raise bad(k, f"is {a.dtype} {a.shape}, a task's is {dtype} {shape}")
    n = study["per_task"]
    if int(r["task"]) != task:
        raise bad("task", f"is {int(r['task'])}, expected {task}")
    if str(r["key"]) != study["key"]:
        raise bad("key", "is another study's")
    if int(r["segments"]) != n:
        raise bad("segments", f"is {int(r['segments'])}, the study's tasks hold {n}")
    if not np.all(np.isfinite(r["seconds"]) & (r["seconds"] >= 0)):
        raise bad("seconds", "are not finite and >= 0")
    seeds = task_seeds(study["seed"], task, n)
    for i, m in enumerate(METHODS):
        top, hist = r[f"{m}_top"], r[f"{m}_hist"]
        if not (np.all(np.isfinite(top)) and np.all(np.diff(top) <= 0)):
            raise bad(f"{m}_top", "is not finite and descending")
        if np.any(hist < 0) or int(hist.sum()) != n:
            raise bad(f"{m}_hist", f"counts {int(hist.sum())} segments, the task has {n}")
        counted = _histogram(m, top)
        if np.any(counted > hist) or (len(top) == n and np.any(counted != hist)):
            raise bad(f"{m}_top", f"holds values that {m}_hist does not count")
        loud, loud_seed = r[f"{m}_loud"], r[f"{m}_loud_seed"]
        if len(np.unique(loud_seed)) != len(loud_seed) or not np.all(np.isin(loud_seed, seeds)):
            raise bad(f"{m}_loud_seed", "holds seeds that are not the task's")
        k = min(len(top), len(loud))
        other = r[f"{METHODS[1 - i]}_top"]
        t = loud[:, 2]
        if not (
            np.all(np.isfinite(loud))
            and np.array_equal(loud[:k, i], top[:k])
            and np.all(loud[:, 1 - i] <= other[0])
            and np.all((t == np.round(t)) & (t >= 0) & (t < study["templates"]))
        ):
            raise bad(
                f"{m}_loud", "does not hold the loudest kept values and templates of the bank"
            )
    return r


def _fingerprint(spec: dict, sc: StudyConfig) -> str:
    what = {"format": FORMAT, "model": spec["model_key"], "seed": sc.seed,
            "per_task": sc.per_task, "keep": sc.keep, "loud": LOUD, "edges": EDGES}  # fmt: skip
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def _claim(out: Path, key: str, sc: StudyConfig, weights: str) -> None:
    """``out/study.json``: whose tasks the directory holds (and which weights they scored, by
    sha256); another study's are refused."""
    path = out / "study.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            old = None
        old = old if isinstance(old, dict) else {}
        if old.get("key") is not None and old.get("key") != key:
            scored = old.get("weights")
            why = (
                "another format (a study from before 2026-12), model, bank, seed, per_task or keep"
            )
            if isinstance(scored, str) and scored != weights:
                why = f"its tasks scored weights sha256 {scored[:16]}, the run's are now "
                why += weights[:16]
            raise ConfigError(
                f"{out} holds the tasks of another study ({why}); choose another --out or remove it"
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tasks").mkdir(exist_ok=True)
    what = {"key": key, "seed": sc.seed, "per_task": sc.per_task, "keep": sc.keep}
    with replacing(path) as tmp:
        tmp.write_text(json.dumps({**what, "weights": weights}, indent=1) + "\n")


# -- merging the tasks -----------------------------------------------------------------------
def merge(results) -> dict:
    """The whole background from the tasks' results (any iterable: read one at a time, so
    only the kept values, not every task's histograms, are held): per statistic the loudest
    values (with ``floor``, above which they hold every value of the background), the
    histogram, the loudest events; and the segment count and seconds (``mf_filtered``: the
    segments and seconds of the tasks that ran the matched filter, not read it from the
    cache: reading takes under 1% of the network's time, filtering 5x the network's)."""
    out: dict = {"segments": 0, "tasks": 0, "seconds": np.zeros(3), "mf_filtered": [0, 0.0]}
    parts: dict = {
        m: {"top": [], "partial": [], "loud": [], "seed": [], "hist": 0} for m in METHODS
    }
    for r in results:
        out["segments"] += int(r["segments"])
        out["tasks"] += 1
        out["seconds"] = out["seconds"] + r["seconds"]
        if r["seconds"][2] > 0.01 * r["seconds"][1]:
            out["mf_filtered"][0] += int(r["segments"])
            out["mf_filtered"][1] += float(r["seconds"][2])
        for m, p in parts.items():
            p["top"].append(r[f"{m}_top"])
            # a task that dropped values dropped only ones at or below its smallest kept one
            if len(r[f"{m}_top"]) < int(r["segments"]):
                p["partial"].append(r[f"{m}_top"][-1])
            p["loud"].append(r[f"{m}_loud"])
            p["seed"].append(r[f"{m}_loud_seed"])
            p["hist"] = p["hist"] + r[f"{m}_hist"]
    for m, p in parts.items():
        loud, seed = np.concatenate(p["loud"]), np.concatenate(p["seed"])
        order = np.lexsort((seed, -loud[:, METHODS.index(m)]))[:LOUD]
        out[m] = {"top": -np.sort(-np.concatenate(p["top"])),
                  "floor": max(p["partial"]) if p["partial"] else -np.inf, "hist": p["hist"],
                  "loud": loud[order], "loud_seed": seed[order], "edges": hist_edges(m)}  # fmt: skip
    return out


def run_study(
    run: Path,
    out: Path | None = None,
    sc: StudyConfig | None = None,
    *,
    workers: int = 1,
    scheduler: str | None = None,
    connect_timeout: float = 10.0,
    client=None,
    progress: bool = False,
    log=print,
    on_task=None,
    mf_cache: bool = True,
) -> dict:
    """The background study of the run in ``run``, written to ``out`` (default
    ``run/background``): the tasks that are not finished yet, then the thresholds, the
    efficiencies and the report. Returns the summary (also ``out/background.json``). The tasks
    run on ``workers`` local processes, the workers of the Dask scheduler at ``scheduler``, or
    those of ``client`` (a ``dask.distributed.Client``, left open). ``mf_cache``: take the
    matched filter's values of tasks that a study on the same noise and bank computed before
    from the private cache (:mod:`.mf_cache`), and keep those computed now."""
    from tqdm.auto import tqdm

    from rootclad.gw.run import background_report

    sc = (sc or StudyConfig()).check()
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    run = Path(run)
    out = Path(out) if out is not None else run / "background"
    owned = client is None and bool(scheduler)
    if owned:
        from rootclad.gw.run.connect import dask_client

        client = dask_client(scheduler, connect_timeout)
    where = scheduler or (f"{len(client.nthreads())} Dask workers" if client
                          else f"{workers} local process" + ("es" if workers > 1 else ""))  # fmt: skip
    try:
        spec = load_run(run, log, sc.min_match)
        check_disjoint(spec["config"], sc.tasks, lambda i: task_seeds(sc.seed, i, sc.per_task))
        key = _fingerprint(spec, sc)
        sha = spec["weights_from"]["sha256"]
        _claim(out, key, sc, sha)
        study = {"seed": sc.seed, "per_task": sc.per_task, "keep": sc.keep, "key": key}
        study["templates"] = len(spec["bank"]["masses"])
        study["mf_cache"] = bool(mf_cache)
        todo = [i for i in range(sc.tasks) if read_task(out, i, study) is None]
        log(f"weights: {spec['weights_from']['file']} (sha256 {sha[:16]})")
        log(
            f"background: {sc.tasks} tasks of {sc.per_task} segments, {sc.tasks - len(todo)} "
            f"finished before, {len(todo)} to run on "
            f"{where}"
        )
        t0 = time.perf_counter()
        if client is not None:
            results = run_dask(run_task, client, spec, study, todo)
        elif workers > 1 and len(todo) > 1:
            results = run_local(run_task, spec, study, todo, min(workers, len(todo)))
        else:
            results = ((i, run_task(spec, study, i)) for i in todo)
        with tqdm(total=len(todo), unit="task", disable=not progress, desc="background") as bar:
            for i, r in results:
                write_task(out, i, r, study)
                bar.update(1)
                if on_task is not None:
                    on_task(i)
        wall = time.perf_counter() - t0
    finally:
        if owned:
            client.close()
    bg = merge(_finished(out, study, sc.tasks))
    signals = signal_stats(spec, run, out, key, log)
    return background_report.write(out, run, spec, sc, bg, signals,
                                   {"tasks_run": len(todo), "wall_seconds": wall,
                                    "workers": where if client is not None else workers})  # fmt: skip


def _finished(out: Path, study: dict, tasks: int):
    for i in range(tasks):
        r = read_task(out, i, study)
        if r is None:
            raise OSError(f"{task_path(out, i)}: a finished task's file cannot be read back")
        yield r


def signal_stats(spec: dict, run: Path, out: Path, key: str, log) -> dict:
    """Both statistics of the run's test signals (and their injected SNR), computed once and
    kept in ``out/signals.npz``."""
    from rootclad.gw.matched_filter import matched_filter_snr
    from rootclad.gw.run.inputs import read_test, strain_chunks
    from rootclad.gw.run.train import scores

    test = run / "data" / "test.root"
    meta = read_test(test)
    snr = meta["snr"][meta["label"] == 1].astype(np.float64)
    path = out / "signals.npz"
    if path.exists():
        try:
            with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as z:
                kept = {k: z[k] for k in z.files}
        except Exception:  # torn: computed again
            kept = {}
        if str(kept.get("key")) == key:
            return _check_signals(kept, snr, path)
    cfg, cm, bank, _ = scorer(spec, None)
    net, mf, pos = [], [], 0
    for x in strain_chunks(test, 1024):
        sig = meta["label"][pos : pos + len(x)] == 1
        pos += len(x)
        if sig.any():
            net.append(scores(cm, cfg, x[sig], NET_BATCH))
            mf.append(matched_filter_snr(x[sig], bank).snr)
    result = {"snr": snr, "network": np.concatenate(net), "matched_filter": np.concatenate(mf)}
    with replacing(path, ".npz") as tmp:
        np.savez(tmp, key=np.str_(key), **result)
    log(f"test signals: {len(result['snr'])} scored by both methods")
    return result


def _check_signals(r: dict, snr: np.ndarray, path: Path) -> dict:
    """signals.npz's statistics when they are the test file's signals': one finite float64
    value per signal of each, the injected SNRs the file's. Else ValueError naming the field."""
    for k in sorted(set(r) - {"key", "snr", *METHODS}):
        raise ValueError(f"{path}: {k[:40]} is not a field of it; remove it to compute it again")
    for k in ("snr", *METHODS):
        a = r.get(k)
        ok = isinstance(a, np.ndarray) and a.dtype == np.float64 and a.shape == snr.shape
        if not (ok and np.all(np.isfinite(a))) or (k == "snr" and not np.array_equal(a, snr)):
            got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else "missing"
            raise ValueError(
                f"{path}: {k} is not a finite value per test signal ({got}, the test file has "
                f"{len(snr)} signals); remove it to compute it again"
            )
    return {k: r[k] for k in ("snr", *METHODS)}
