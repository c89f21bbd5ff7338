"""Scoring and training through ROOT: rootclad's RDataFrame column and batched scorer next to
the torch route, a Cling-driven training step next to Python's, and the load time.

For the GW CNN and MLP of benchmarks/core (2048 samples in, one logit out), on a simulated GW
test file, single-threaded and with 2 threads:
- "define_score": RDataFrame with rootclad.root.define_score (per event, one Model per slot;
  2 threads: ROOT.EnableImplicitMT(2)), the scores taken with AsNumpy;
- "score_tree": rootclad.root.score_tree (batches sized to the cache, 2 threads: rootclad's
  pool splits each batch), the scores written to a friend tree;
- "torch": uproot batches of 256 into the torch model under torch.inference_mode(), with
  torch.set_num_threads(threads).
Each pass is timed in a fresh process (implicit MT is process-wide) after one warm-up pass;
the three methods take turns for REPEATS rounds and the median pass is reported. Also: one training step (batch 64, Adam) driven
from Cling (a JIT-ed loop over rootclad::Model::train_step, as a macro runs it) next to
CompiledModel.train_step from Python, in one process taking turns; and
rootclad.root.load of an exported model in a fresh process after `import ROOT`; LibTorch
training inside ROOT to its first step, with the torch headers in Cling and through the compiled
trainer library (libtorch_start.py).

usage: python benchmarks/root/bench_scoring.py [--events 4096] [--quick]
Writes benchmarks/results/root_scoring.json and docs/benchmarks/root.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "root_scoring.json"
TABLE = REPO / "docs" / "benchmarks" / "root.md"
sys.path.insert(0, str(REPO / "benchmarks" / "core"))
sys.path.insert(0, str(REPO / "benchmarks"))

METHODS = ("define_score", "score_tree", "torch")

_CHILD = r"""
import json, statistics, sys, time
import numpy as np
method, model, threads, path, stem, repeats = sys.argv[1:7]
threads, repeats = int(threads), int(repeats)
import os
os.environ["ROOTCLAD_NUM_THREADS"] = str(threads)
def run():
    if method == "define_score":
        df = ROOT.RDataFrame("events", path)
        df = rootclad.root.define_score(df, stem, inputs="strain", column="score")
        return len(df.AsNumpy(["score"])["score"])
    if method == "score_tree":
        out = rootclad.root.score_tree(path, stem, inputs="strain", output=path + f".{threads}.scores.root")
        return 0
    n = 0
    with torch.inference_mode():
        for batch in uproot.iterate(path + ":events", ["strain"], step_size=256, library="np"):
            x = torch.from_numpy(batch["strain"])
            if model == "cnn":
                x = x.unsqueeze(1)
            n += len(net(x))
    return n
if method == "torch":
    import torch, uproot
    sys.path.insert(0, sys.argv[7])
    from bench_train_step import make_model
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = make_model(model).eval()
else:
    import ROOT, rootclad.root
    if threads > 1:
        ROOT.EnableImplicitMT(threads)
run()
times = []
for _ in range(repeats):
    t = time.perf_counter()
    run()
    times.append(time.perf_counter() - t)
print(json.dumps({"times_s": times}))
"""

_LOAD = r"""
import json, sys, time
t = time.perf_counter()
import ROOT
ROOT.gInterpreter  # ROOT's own set-up
t_root = time.perf_counter() - t
import rootclad.root
t = time.perf_counter()
m = rootclad.root.load(sys.argv[1])
print(json.dumps({"import_root_s": t_root, "load_s": time.perf_counter() - t}))
"""

_STEP_LOOP = """
#include <chrono>
double rootclad_bench_steps(rootclad::Model& m, const float* x, const float* y, int B,
                            rootclad::Optimizer& opt, int n) {
  auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i)
    m.train_step(x, y, B, opt);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / n;
}
"""


def child(method, model, threads, path, stem, repeats) -> list[float]:
    env = {**os.environ, "ROOTCLAD_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, method, model, str(threads), str(path), str(stem),
         str(repeats), str(REPO / "benchmarks" / "core")],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{method} {model} x{threads}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["times_s"]


def train_step_times(model: str, stem: str, rounds: int, n: int) -> dict:
    """Cling-driven rootclad::Model::train_step vs CompiledModel.train_step, taking turns."""
    import numpy as np
    import torch

    import rootclad
    import rootclad.root
    from rootclad.data.cling import declare

    torch.manual_seed(0)
    from bench_train_step import example, make_model

    net = make_model(model)
    x, y = example(model, 64)
    cm = rootclad.compile(net, example_input=x[:1])
    cm.export(stem)
    m = rootclad.root.load(stem)
    import ROOT

    declare(_STEP_LOOP)
    opt_cpp = ROOT.rootclad.Adam(m, 1e-3)
    opt_py = rootclad.optim.Adam(cm, lr=1e-3)
    xs, ys = np.ascontiguousarray(x.numpy()), np.ascontiguousarray(y.numpy())
    ROOT.rootclad_bench_steps(m, xs, ys, 64, opt_cpp, 5)  # warm-up, JIT
    for _ in range(5):
        cm.train_step(x, y.unsqueeze(1), opt_py)
    cling, python = [], []
    for _ in range(rounds):
        cling.append(ROOT.rootclad_bench_steps(m, xs, ys, 64, opt_cpp, n) * 1e3)
        t = time.perf_counter()
        for _ in range(n):
            cm.train_step(x, y.unsqueeze(1), opt_py)
        python.append((time.perf_counter() - t) / n * 1e3)
    return {"engine": cm.engine, "cling_ms": cling, "python_ms": python}


def libtorch_start_times(stem: str, repeats: int = 2) -> list[dict]:
    """Both routes to LibTorch training inside ROOT (libtorch_start.py), each in a fresh
    process to the end of its first training step; the routes take turns."""
    from rootclad.torch.libtorch import build_trainer

    trainer = str(build_trainer())  # built (once) outside the timing
    out = []
    for _ in range(repeats):
        for route in ("cling", "trainer"):
            cmd = [sys.executable, str(HERE / "libtorch_start.py"), route, stem, trainer]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode:
                raise RuntimeError(f"LibTorch start ({route}) failed:\n{proc.stderr[-3000:]}")
            out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print("LibTorch in ROOT, to the first step:", out)
    return out


def _mlp_stem(work: Path) -> str:
    import torch
    from bench_train_step import make_model

    import rootclad

    torch.manual_seed(0)
    cm = rootclad.compile(make_model("mlp"), example_input=torch.zeros(1, 2048),
                          loss="bce_with_logits")  # fmt: skip
    cm.export(work / "libtorch-mlp")
    return str(work / "libtorch-mlp")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--table", type=Path, default=None)
    ap.add_argument(
        "--libtorch-only",
        action="store_true",
        help="redo only the LibTorch-in-ROOT start-up timing of an existing result",
    )
    args = ap.parse_args(argv)
    if args.libtorch_only:
        report = json.loads(args.out.read_text())
        report.pop("torch_headers", None)
        report["libtorch_start"] = libtorch_start_times(_mlp_stem(Path(tempfile.mkdtemp())))
        return write_report(report, args.out, args.table)
    repeats = 2 if args.quick else 5
    import torch

    import rootclad
    from rootclad.gw import simulate

    work = Path(tempfile.mkdtemp(prefix="bench-root-"))
    path = work / "gw_test.root"
    simulate(path, args.events, seed=11, progress=False)
    from bench_train_step import make_model

    report = {
        "what": "scoring a simulated GW test file (events x 2048 float32) and training steps",
        "events": args.events,
        "repeats": repeats,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "rootclad": rootclad.__version__},
        "scoring": [],
    }  # fmt: skip
    for model in ("cnn", "mlp"):
        torch.manual_seed(0)
        net = make_model(model).eval()
        x0 = torch.zeros(1, 1, 2048) if model == "cnn" else torch.zeros(1, 2048)
        cm = rootclad.compile(net, example_input=x0)
        stem = work / model
        cm.export(stem)
        report.setdefault("engine", cm.engine)
        for threads in (1, 2):
            # the methods take turns, one timed pass each per round, so that a change in the
            # host's load falls on all of them
            times = {m: [] for m in METHODS}
            for _ in range(repeats):
                for method in METHODS:
                    times[method] += child(method, model, threads, path, stem, 1)
            for method in METHODS:
                med = statistics.median(times[method])
                row = {"model": model, "threads": threads, "method": method,
                       "times_s": times[method], "median_s": med,
                       "events_per_s": args.events / med}  # fmt: skip
                report["scoring"].append(row)
                print(f"{model} x{threads} {method:13s} {args.events / med:10.0f} events/s")
    report["train_step"] = {
        m: train_step_times(m, str(work / f"step-{m}"), 3, 20 if args.quick else 60)
        for m in ("cnn", "mlp")
    }
    for m, r in report["train_step"].items():
        print(f"train step {m}: Cling {statistics.median(r['cling_ms']):.2f} ms, "
              f"Python {statistics.median(r['python_ms']):.2f} ms")  # fmt: skip
    loads = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", _LOAD, str(work / "cnn")],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        loads.append(json.loads(out.stdout.strip().splitlines()[-1]))
    report["load"] = loads
    print("load:", loads)
    report["libtorch_start"] = libtorch_start_times(_mlp_stem(work))
    return write_report(report, args.out, args.table)


def write_report(report: dict, out: Path, md: Path | None = None) -> int:
    """The JSON result and its markdown table (benchmarks/report.py)."""
    from report import write_report as write

    return write(report, out, RESULT, TABLE, render_markdown, md)


def render_markdown(r: dict) -> str:
    rate = {(s["model"], s["threads"], s["method"]): s["events_per_s"] for s in r["scoring"]}
    lines = [
        "# Scoring and training through ROOT",
        "",
        "Generated by `python benchmarks/root/bench_scoring.py` from "
        "`benchmarks/results/root_scoring.json`; do not edit by hand.",
        "",
        f"{r['what']}; {r['events']} events, median of {r['repeats']} passes after a warm-up, "
        f"each pass in a fresh process, the methods taking turns. Machine: {r['machine']['cores']} cores, torch "
        f"{r['machine']['torch']}; rootclad engine: {r['engine']}.",
        "",
        "Events per second (ratio to the torch route in brackets):",
        "",
        "| model | threads | define_score (per event) | score_tree (batched) | torch |",
        "|---|---:|---:|---:|---:|",
    ]
    for model in ("cnn", "mlp"):
        for t in (1, 2):
            torch_rate = rate[(model, t, "torch")]
            cells = [f"{rate[(model, t, m)]:.0f} (x{rate[(model, t, m)] / torch_rate:.2f})"
                     for m in METHODS]  # fmt: skip
            lines.append(f"| {model} | {t} | " + " | ".join(cells) + " |")
    lines += ["", "Training step, batch 64, Adam (ms, median of 3 rounds):", "",
              "| model | from Cling (rootclad::Model) | from Python (CompiledModel) |",
              "|---|---:|---:|"]  # fmt: skip
    for m, s in r["train_step"].items():
        lines.append(f"| {m} | {statistics.median(s['cling_ms']):.2f} | "
                     f"{statistics.median(s['python_ms']):.2f} |")  # fmt: skip
    load = statistics.median(x["load_s"] for x in r["load"])
    imp = statistics.median(x["import_root_s"] for x in r["load"])
    lines += ["", f"`rootclad.root.load` in a fresh process after `import ROOT`: {load:.2f} s "
              f"(`import ROOT` itself: {imp:.2f} s; no torch headers on that path).", ""]  # fmt: skip
    if "libtorch_start" in r:
        med = {route: statistics.median(x["first_step_s"] for x in r["libtorch_start"]
                                        if x["route"] == route)
               for route in ("cling", "trainer")}  # fmt: skip
        lines += [
            "LibTorch training inside ROOT, from `import ROOT` in a fresh process to the end of "
            "the first training step (MLP, batch 8, torch::optim::Adam): "
            f"{med['cling']:.1f} s with the torch headers and `rootclad/torch_function.h` "
            f"declared to Cling (what `macros/train_libtorch.C` does), {med['trainer']:.2f} s "
            "through the compiled library of `rootclad/libtorch_trainer.h` (built once, "
            "outside the timing). `rootclad::Model` needs no torch at all.",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
