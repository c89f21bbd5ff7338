"""Benchmark ``rootclad gw background``: segments per second per worker for simulation and
whitening, network scoring and the matched filter; the wall time of a small study with 1 and 2
local workers; and what they predict for a 1e-5 study here and on 100 workers.

    python benchmarks/gw/bench_background.py [--run DIR] [--segments 8192] [--per-task 1024]

Without ``--run``, a run directory of the default configuration (1 s at 2048 Hz, the default
bank's minimal match 0.97) is made with an untrained CNN: the throughput does not depend on the
weights (use a trained run's directory for its thresholds too). Writes
``benchmarks/results/gw_background.json``. On a busy machine (load average recorded before and
after) the times are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

QUIET = lambda *_: None  # noqa: E731


def make_run(d: Path, test_events: int) -> Path:
    from rootclad.gw.dataset import simulate
    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.train import compile_model

    cfg = resolve(engine="pullback", test_events=test_events)
    (d / "data").mkdir(parents=True)
    (d / "config.toml").write_text(cfg.to_toml())
    kwargs = cfg.simulation("test")
    simulate(d / "data" / "test.root", kwargs.pop("n_events"), workers=1, progress=False,
             **kwargs)  # fmt: skip
    (d / "model").mkdir()
    compile_model(cfg).export(d / "model" / "gwnet")
    return d


def per_worker(spec, tasks: int, per_task: int) -> dict:
    """One worker's throughput on one core, as a worker process runs (one thread for the
    network and the FFTs), from ``tasks`` tasks run here."""
    from rootclad.gw.run import background as bgm

    study = {"seed": 99, "per_task": per_task, "keep": 100, "key": "bench"}
    bgm.scorer(spec, 1)
    seconds = sum(bgm.run_task(spec, study, i, 1)["seconds"] for i in range(tasks))
    n = tasks * per_task
    names = ("simulation_and_whitening", "network", "matched_filter")
    rates = {k: n / float(v) for k, v in zip(names, seconds, strict=True)}
    return {"segments": n, "segments_per_second": rates,
            "seconds_per_segment": float(sum(seconds)) / n}  # fmt: skip


_START = """
import sys, time
t = time.perf_counter()
from rootclad.gw.run import background as bgm
spec = bgm.load_run(sys.argv[1], lambda *_: None)
t1 = time.perf_counter()
bgm.scorer(spec, 1)
print(time.perf_counter() - t1, t1 - t)
"""


def worker_start(run: Path) -> dict:
    """A fresh process's start: imports and reading the run, then the model compiled (from
    the warm cache) and the bank and generator set up, as each worker does once."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _START, str(run)], capture_output=True,
                         text=True, check=True, env={**os.environ, "ROOTCLAD_NUM_THREADS": "1"})  # fmt: skip
    scorer, load = (float(v) for v in out.stdout.split())
    return {"import_and_load_run_seconds": load, "compile_and_setup_seconds": scorer}


def main() -> int:
    from rootclad.gw.run.background import StudyConfig, load_run, run_study

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", help="a `rootclad gw run` directory (default: made, untrained)")
    p.add_argument("--segments", type=int, default=8192)
    p.add_argument("--per-task", type=int, default=1024)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--target-segments",
        type=int,
        default=1_000_000,
        help="segments of the extrapolated 1e-5 study (10 above its threshold)",
    )
    p.add_argument("--out", default=str(HERE.parent / "results" / "gw_background.json"))
    args = p.parse_args()

    load_before = os.getloadavg()
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cores": os.cpu_count(),
              "load_average_before": load_before, "python": platform.python_version(),
              "segments": args.segments, "per_task": args.per_task, "runs": []}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        run = Path(args.run) if args.run else make_run(Path(tmp) / "run", 2048)
        result["make_run_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        spec = load_run(run, QUIET)  # the bank: built once, then cached in the run directory
        result["load_run_seconds"] = time.perf_counter() - t
        result["template_bank"] = len(spec["bank"]["masses"])
        result["segment_samples"] = int(spec["bank"]["n"])
        # one core per worker, as in a worker process: set before this process's first model
        # library starts its thread pool
        os.environ.setdefault("ROOTCLAD_NUM_THREADS", "1")
        result["per_worker"] = per_worker(spec, 4, args.per_task)
        result["worker_start"] = worker_start(run)
        print(json.dumps(result["per_worker"]), json.dumps(result["worker_start"]))
        for w in args.workers:
            sc = StudyConfig(segments=args.segments, per_task=args.per_task, seed=w,
                             faps=(1e-2, 1e-3), bootstrap=50)  # fmt: skip
            t = time.perf_counter()
            s = run_study(run, Path(tmp) / f"bg{w}", sc, workers=w, log=QUIET)
            total = time.perf_counter() - t
            row = {"workers": w, "segments": s["segments"], "tasks": s["tasks"],
                   "tasks_wall_seconds": s["this_call"]["wall_seconds"], "total_seconds": total,
                   "segments_per_second": s["segments"] / s["this_call"]["wall_seconds"],
                   "per_worker_in_study": s["segments_per_second_per_worker"]}  # fmt: skip
            result["runs"].append(row)
            print(json.dumps(row))
    result["load_average_after"] = os.getloadavg()
    one = result["runs"][0]
    per_seg = result["per_worker"]["seconds_per_segment"]
    n = args.target_segments
    tasks = math.ceil(n / 4096)
    # fixed costs: the driver's (test signals, report) and a worker's start (the compile)
    fixed = one["total_seconds"] - one["tasks_wall_seconds"]
    fixed += sum(result["worker_start"].values())
    here = max(result["runs"], key=lambda r: r["segments_per_second"])
    result["extrapolation"] = {
        "target_segments": n,
        "smallest_fap": 1 / n,
        "seconds_per_segment_per_worker": per_seg,
        "this_machine": {
            "workers": here["workers"],
            "hours": (n / here["segments_per_second"] + fixed) / 3600,
        },  # fmt: skip
        "workers_100": {
            "tasks_of_4096": tasks,
            "rounds": math.ceil(tasks / 100),
            "minutes": (math.ceil(tasks / 100) * 4096 * per_seg + fixed) / 60,
        },  # fmt: skip
        "fixed_seconds": fixed,
    }
    print(json.dumps(result["extrapolation"], indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
