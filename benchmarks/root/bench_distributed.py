"""Distributed scoring on Dask: a distributed RDataFrame with rootclad.root.define_score and
rootclad.root.score_files, with 1 and 2 local worker processes, against the single-process
define_score and score_tree.

The GW CNN of benchmarks/core (2048 samples in, one logit out), exported once; simulated GW
files of --per-file events each (rootclad.gw.simulate): a "test" dataset of --files files
(4096 events by default, the size of bench_scoring.py's file) and one 10x larger (10x the
files). Methods:
- "define_score" / "score_tree": one process (a fresh one per pass, as bench_scoring.py),
  1 thread, or 2 (ROOT.EnableImplicitMT(2) / rootclad's pool of 2 splitting each batch);
- "dist_define_score": ROOT.RDataFrame("events", files, executor=client, npartitions=files)
  with define_score, the scores taken with AsNumpy;
- "score_files": one Dask task per file, each writing its friend tree (a fresh output
  directory per pass, so nothing is skipped).
The Dask clusters are LocalClusters of 1 and 2 worker processes with one thread each
(ROOTCLAD_NUM_THREADS=1); each is warmed up by one pass of each method (worker start, import
ROOT, the model opened, the JIT) before the timed passes, which take turns; the median is
reported. Fixed costs, on a fresh 1-worker cluster: staging the export (hash and copy),
uploading it, importing ROOT on a worker, opening the model there, the first computation
(cold), and the cost per task of each route from 8 files of 8 events.

usage: python benchmarks/root/bench_distributed.py [--per-file 2048] [--files 2] [--quick]
Writes benchmarks/results/root_distributed.json and docs/benchmarks/root_distributed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "root_distributed.json"
TABLE = REPO / "docs" / "benchmarks" / "root_distributed.md"
sys.path.insert(0, str(REPO / "benchmarks"))

_CHILD = r"""
import json, sys, time
method, threads, stem, outdir, repeats = sys.argv[1:6]
files = sys.argv[6:]
threads, repeats = int(threads), int(repeats)
import ROOT, rootclad.root
if threads > 1 and method == "define_score":
    ROOT.EnableImplicitMT(threads)
def run():
    if method == "define_score":
        df = rootclad.root.define_score(ROOT.RDataFrame("events", files), stem, inputs="strain")
        return len(df.AsNumpy(["score"])["score"])
    for i, f in enumerate(files):
        rootclad.root.score_tree(f, stem, inputs="strain", output=f"{outdir}/{i}.root")
run()
times, cpu = [], []
for _ in range(repeats):
    t, c = time.perf_counter(), time.process_time()
    run()
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
print(json.dumps({"times_s": times, "cpu_s": cpu}))
"""


def one_process(method: str, threads: int, stem: str, files: list[str], work: Path) -> tuple:
    """(wall, CPU) seconds of one pass, in a fresh process after a warm-up pass."""
    env = {**os.environ, "ROOTCLAD_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", _CHILD, method, str(threads), stem, str(work),
                          "1", *files], capture_output=True, text=True, env=env, timeout=1800)  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"{method} x{threads}: {out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["times_s"][0], r["cpu_s"][0]


def cluster(workers: int):
    from distributed import Client, LocalCluster

    c = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                     dashboard_address=None)  # fmt: skip
    return c, Client(c)


def dist_pass(method: str, client, stem: str, files: list[str], work: Path) -> tuple:
    """(wall, CPU) seconds of one pass; CPU: the workers' and this process's (the client and
    the LocalCluster's scheduler), which a loaded machine does not inflate as it does wall
    time."""
    import ROOT

    import rootclad.root

    workers0 = client.run(time.process_time)
    t, c = time.perf_counter(), time.process_time()
    if method == "dist_define_score":
        df = ROOT.RDataFrame("events", files, executor=client, npartitions=len(files))
        n = len(rootclad.root.define_score(df, stem, inputs="strain").AsNumpy(["score"])["score"])
    else:
        out = Path(tempfile.mkdtemp(dir=work))
        done = rootclad.root.score_files(files, stem, client, inputs="strain", output_dir=out)
        n = len(done.scored)
    elapsed, cpu = time.perf_counter() - t, time.process_time() - c
    workers1 = client.run(time.process_time)
    cpu += sum(workers1[w] - workers0[w] for w in workers1)
    assert n, f"{method}: nothing scored"
    return elapsed, cpu


def _timed_import():
    t = time.perf_counter()
    from rootclad.data.cling import declare_header, import_root

    import_root()
    declare_header("model.h")
    return time.perf_counter() - t


def _timed_open(model, want):
    from rootclad.root import shipping

    t = time.perf_counter()
    shipping.open_on_worker(model, want)
    return time.perf_counter() - t


def fixed_costs(stem: str, work: Path) -> dict:
    """On a fresh 1-worker cluster: shipping, opening, the cold first call, the cost per task."""
    from rootclad.gw import simulate
    from rootclad.root import shipping

    tiny = []
    for i in range(8):
        tiny.append(str(work / f"tiny{i}.root"))
        simulate(tiny[-1], 8, seed=100 + i, progress=False)
    out = {}
    shipping._ship_cached.cache_clear()
    shipping._STAGE.clear()  # a new staging directory: hash and copy again
    t = time.perf_counter()
    model = shipping.ship(stem)
    out["stage_s"] = time.perf_counter() - t
    out["model_bytes"] = sum(os.path.getsize(stem + e) for e in (".so", ".root"))
    c, client = cluster(1)
    try:
        client.wait_for_workers(1)
        t = time.perf_counter()
        for ext in (".so", ".root"):
            client.upload_file(model.local + ext, load=False)
        out["upload_s"] = time.perf_counter() - t
        out["worker_import_root_s"] = list(client.run(_timed_import).values())[0]
        out["worker_open_s"] = list(client.run(_timed_open, model, shipping.expected()).values())[0]
        out["cold_first_dist_define_score_s"] = dist_pass("dist_define_score", client, stem, tiny,
                                                          work)[0]  # fmt: skip
        out["cold_first_score_files_s"] = dist_pass("score_files", client, stem, tiny, work)[0]
        for method in ("dist_define_score", "score_files"):
            passes = [dist_pass(method, client, stem, tiny, work) for _ in range(3)]
            out[f"{method}_per_task_s"] = statistics.median(p[0] for p in passes) / len(tiny)
            out[f"{method}_cpu_per_task_s"] = statistics.median(p[1] for p in passes) / len(tiny)
    finally:
        client.close()
        c.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-file", type=int, default=2048)
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--table", type=Path, default=None)
    args = ap.parse_args(argv)
    repeats = 2 if args.quick else 3
    os.environ["ROOTCLAD_NUM_THREADS"] = "1"  # the workers inherit it: one thread each
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    from report import run_header

    import rootclad
    from rootclad.gw import simulate
    from rootclad.gw.models import make

    work = Path(tempfile.mkdtemp(prefix="bench-dist-"))
    n_large = 10 * args.files
    all_files = []
    for i in range(n_large):
        all_files.append(str(work / f"gw{i}.root"))
        simulate(all_files[-1], args.per_file, seed=11 + i, progress=False)
    datasets = {"test": all_files[: args.files], "10x": all_files}
    torch.manual_seed(0)
    cm = rootclad.compile(make("cnn").eval(), example_input=torch.zeros(1, 1, 2048))
    stem = str(work / "cnn")
    cm.export(stem)
    report = run_header(
        what="scoring simulated GW files (events x 2048 float32) with the GW CNN on Dask",
        per_file=args.per_file,
        datasets={
            k: {"files": len(v), "events": len(v) * args.per_file} for k, v in datasets.items()
        },
        repeats=repeats,
        engine=cm.engine,
        load_before=os.getloadavg(),
        rows=[],
    )

    def add(dataset, method, workers, threads, passes):
        times, cpu = [p[0] for p in passes], [p[1] for p in passes]
        med, med_cpu = statistics.median(times), statistics.median(cpu)
        events = report["datasets"][dataset]["events"]
        report["rows"].append({"dataset": dataset, "method": method, "workers": workers,
                               "threads": threads, "times_s": times, "median_s": med,
                               "events_per_s": events / med, "cpu_s": cpu,
                               "events_per_cpu_s": events / med_cpu})  # fmt: skip
        print(f"{dataset:4s} {method:17s} w{workers} t{threads} {events / med:9.0f} events/s "
              f"{events / med_cpu:9.0f} events/CPU-s")  # fmt: skip

    for name, files in datasets.items():
        for threads in (1, 2):
            times = {m: [] for m in ("define_score", "score_tree")}
            for _ in range(repeats):
                for m in times:
                    times[m].append(one_process(m, threads, stem, files, work))
            for m, t in times.items():
                add(name, m, 0, threads, t)
    for workers in (1, 2):
        c, client = cluster(workers)
        try:
            client.wait_for_workers(workers)
            for m in ("dist_define_score", "score_files"):  # warm-up: start, ROOT, JIT, model
                dist_pass(m, client, stem, datasets["test"], work)
            for name, files in datasets.items():
                times = {m: [] for m in ("dist_define_score", "score_files")}
                for _ in range(repeats):
                    for m in times:
                        times[m].append(dist_pass(m, client, stem, files, work))
                for m, t in times.items():
                    add(name, m, workers, 1, t)
        finally:
            client.close()
            c.close()
    report["fixed"] = fixed_costs(stem, work)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report["fixed"], indent=1))
    return write_report(report, args.out, args.table)


def write_report(report: dict, out: Path, md: Path | None = None) -> int:
    from report import write_report as write

    return write(report, out, RESULT, TABLE, render_markdown, md)


def render_markdown(r: dict) -> str:
    rate = {(x["dataset"], x["method"], x["workers"], x["threads"]): x["events_per_s"]
            for x in r["rows"]}  # fmt: skip
    per_cpu = {(x["dataset"], x["method"], x["workers"], x["threads"]): x["events_per_cpu_s"]
               for x in r["rows"]}  # fmt: skip
    f = r["fixed"]
    lines = [
        "# Distributed scoring (Dask)",
        "",
        "Generated by `python benchmarks/root/bench_distributed.py` from "
        "`benchmarks/results/root_distributed.json`; do not edit by hand.",
        "",
        f"{r['what']}; files of {r['per_file']} events; machine: {r['machine']}, shared with "
        f"other work (load average {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} "
        f"after); torch {r['torch']}, rootclad {r['rootclad']} ({r['engine']}); median of "
        f"{r['repeats']} passes after a warm-up, the methods taking turns.",
        "",
        "Events per second; in brackets, against one process with one thread of the same "
        "method (define_score for the distributed RDataFrame, score_tree for score_files):",
        "",
        "| dataset | define_score 1 thread | 2 threads | distributed RDataFrame 1 worker "
        "| 2 workers | score_tree 1 thread | 2 threads | score_files 1 worker | 2 workers |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in r["datasets"].items():
        b1, b2 = rate[(name, "define_score", 0, 1)], rate[(name, "score_tree", 0, 1)]
        cells = [
            f"{b1:.0f}",
            f"{rate[(name, 'define_score', 0, 2)]:.0f} (x{rate[(name, 'define_score', 0, 2)] / b1:.2f})",
            *(f"{rate[(name, 'dist_define_score', w, 1)]:.0f} "
              f"(x{rate[(name, 'dist_define_score', w, 1)] / b1:.2f})" for w in (1, 2)),
            f"{b2:.0f}",
            f"{rate[(name, 'score_tree', 0, 2)]:.0f} (x{rate[(name, 'score_tree', 0, 2)] / b2:.2f})",
            *(f"{rate[(name, 'score_files', w, 1)]:.0f} "
              f"(x{rate[(name, 'score_files', w, 1)] / b2:.2f})" for w in (1, 2)),
        ]  # fmt: skip
        lines.append(f"| {name} ({d['files']} files, {d['events']} events) | "
                     + " | ".join(cells) + " |")  # fmt: skip
    lines += ["", "Scaling efficiency from 1 to 2 workers: wall-clock (rate with 2 / twice the "
              "rate with 1), and CPU (events per CPU-second with 2 / with 1: the work added by "
              "a second worker, whatever else runs on the machine):", "",
              "| dataset | distributed RDataFrame, wall | CPU | score_files, wall | CPU |",
              "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name in r["datasets"]:
        cells = []
        for m in ("dist_define_score", "score_files"):
            cells += [f"{rate[(name, m, 2, 1)] / (2 * rate[(name, m, 1, 1)]):.0%}",
                      f"{per_cpu[(name, m, 2, 1)] / per_cpu[(name, m, 1, 1)]:.0%}"]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Events per CPU-second (all processes of the run: workers, client, scheduler):",
              "", "| dataset | define_score 1 thread | 2 threads | distributed RDataFrame 1 "
              "worker | 2 workers | score_tree 1 thread | 2 threads | score_files 1 worker | "
              "2 workers |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name in r["datasets"]:
        keys = [("define_score", 0, 1), ("define_score", 0, 2), ("dist_define_score", 1, 1),
                ("dist_define_score", 2, 1), ("score_tree", 0, 1), ("score_tree", 0, 2),
                ("score_files", 1, 1), ("score_files", 2, 1)]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(f"{per_cpu[(name, *k)]:.0f}" for k in keys) + " |")
    lines += [
        "",
        "Fixed costs (a fresh 1-worker cluster):",
        "",
        f"- staging the export (sha256 of {f['model_bytes'] / 1e6:.1f} MB, copies): "
        f"{f['stage_s'] * 1e3:.0f} ms; uploading it to the worker: {f['upload_s'] * 1e3:.0f} ms",
        f"- on the worker, once per process: import ROOT and declare rootclad's host "
        f"{f['worker_import_root_s']:.2f} s, open the model (copy, hash, rootclad::Model) "
        f"{f['worker_open_s'] * 1e3:.0f} ms",
        f"- the first computation on that worker (8 files of 8 events): distributed "
        f"RDataFrame {f['cold_first_dist_define_score_s']:.1f} s, then score_files "
        f"{f['cold_first_score_files_s']:.1f} s",
        f"- per task, warm (8 files of 8 events, one worker): distributed RDataFrame "
        f"{f['dist_define_score_per_task_s'] * 1e3:.0f} ms "
        f"({f['dist_define_score_cpu_per_task_s'] * 1e3:.0f} ms CPU), score_files "
        f"{f['score_files_per_task_s'] * 1e3:.0f} ms "
        f"({f['score_files_cpu_per_task_s'] * 1e3:.0f} ms CPU)",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
