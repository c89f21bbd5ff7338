"""How the clad engine's compile grows with the model's depth: Clad's gradient of groups of at
most CLAD_GROUP_NODES ops (what rootclad asks for) against one gradient of the whole forward
(what it asked for before issue 26), with the pullback engine's plain g++ build beside them.

The models are chains of DEPTHS ops, Linear(8, 8) alternating with Tanh, Sigmoid, ReLU and
GELU, float64, MSE loss: tiny layers, so the time and memory measured are the compiler's, not
the kernels'. Each build runs in a fresh process with a fresh cache; reported are the median
wall time of the compile over REPEATS builds and the compiler's peak resident memory (the
largest child process's). Each built model's gradient is checked against the pullback
engine's on one batch, so a fast build that computes the wrong thing cannot count. One request
over the whole forward is built up to --whole-max ops (Clad took 246 s on 400 before).

Needs Clad (``CLAD_PREFIX`` or the ``ROOTCLAD_CLAD_*`` variables; ``rootclad doctor``).

usage: python benchmarks/core/bench_clad_compile.py [--whole-max N] [--out PATH]
Writes benchmarks/results/clad_compile.json and docs/benchmarks/clad_compile.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "clad_compile.json"
TABLE = REPO / "docs" / "benchmarks" / "clad_compile.md"
sys.path.insert(0, str(REPO / "benchmarks"))
DEPTHS = (50, 100, 200, 400)
REPEATS = 3
WHOLE = 10**9  # a group size no model reaches: one request for the whole forward

# in a fresh process with a fresh cache: build one chain, time it, check its gradient
CHILD = """
import json, os, resource, shutil, sys, tempfile, time
os.environ["ROOTCLAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="rootclad-bench-")
import torch
from torch import nn
import rootclad
from rootclad.codegen import cpu_sweeps
depth, engine, group = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cpu_sweeps.CLAD_GROUP_NODES = group
acts = (nn.Tanh, nn.Sigmoid, nn.ReLU, nn.GELU)
torch.manual_seed(0)
layers = [nn.Linear(8, 8) if i % 2 == 0 else acts[i // 2 % 4]() for i in range(depth - 1)]
net = nn.Sequential(*layers, nn.Linear(8, 1)).double()
x, y = torch.randn(16, 8, dtype=torch.float64), torch.randn(16, 1, dtype=torch.float64)
t0 = time.perf_counter()
cm = rootclad.compile(net, x[:2], "mse", engine=engine)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
ref = rootclad.compile(net, x[:2], "mse", engine="pullback")
_, g = cm.loss_and_grad(x, y)
_, g_ref = ref.loss_and_grad(x, y)
scale = max(float(v.abs().max()) for v in g_ref.values())
err = max(float((g[k] - g_ref[k]).abs().max()) for k in g_ref) / scale
lines = len(open(cm.source_path).read().splitlines())
shutil.rmtree(os.environ["ROOTCLAD_CACHE_DIR"], ignore_errors=True)
print(json.dumps({"seconds": seconds, "compiler_peak_mb": peak, "grad_err": err,
                  "engine": cm.engine, "lines": lines}))
"""


def build(depth: int, engine: str, group: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(depth), engine, str(group)],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"depth {depth}, {engine}, group {group}: {proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["engine"] != engine or out["grad_err"] > 1e-10:
        raise SystemExit(f"depth {depth}, {engine}, group {group}: {out}")
    return out


def measure(depth: int, engine: str, group: int) -> dict:
    runs = [build(depth, engine, group) for _ in range(REPEATS)]
    return {
        "seconds": round(statistics.median(r["seconds"] for r in runs), 2),
        "compiler_peak_mb": round(max(r["compiler_peak_mb"] for r in runs)),
        "source_lines": runs[0]["lines"],
        "grad_err_vs_pullback": max(r["grad_err"] for r in runs),
    }


def main(argv=None) -> int:
    from report import run_header, write_report

    from rootclad.codegen.cpu_sweeps import CLAD_GROUP_NODES
    from rootclad.toolchain import find_clad

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--whole-max", type=int, default=200,
                    help="the deepest chain to build as one request (default 200)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    clad, why = find_clad()
    if clad is None:
        raise SystemExit(f"needs Clad ({why}): set CLAD_PREFIX; rootclad doctor says more")
    report = run_header(clad=str(clad.plugin), group=CLAD_GROUP_NODES, repeats=REPEATS,
                        depths={})  # fmt: skip
    for depth in DEPTHS:
        row = {
            "clad_groups": measure(depth, "clad", CLAD_GROUP_NODES),
            "pullback_engine": measure(depth, "pullback", CLAD_GROUP_NODES),
        }
        if depth <= args.whole_max:
            row["clad_one_request"] = measure(depth, "clad", WHOLE)
        report["depths"][str(depth)] = row
        print(depth, row, flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    lines = [
        "# The clad engine's compile against the model's depth",
        "",
        f"`benchmarks/core/bench_clad_compile.py`, {report['date']}, {report['machine']}, "
        f"torch {report['torch']}, Clad at `{report['clad']}`. Chains of Linear(8, 8) and "
        "activations, float64, MSE; each build in a fresh process with a fresh cache, median "
        f"wall time of {report['repeats']} builds, the compiler's peak resident memory; every "
        "build's gradient matched the pullback engine's (relative error under 1e-10).",
        "",
        f"| ops | clad, groups of {report['group']} | clad, one request | pullback engine (g++) |",
        "| ---: | ---: | ---: | ---: |",
    ]

    def cell(m):
        return f"{m['seconds']:.1f} s, {m['compiler_peak_mb']} MB" if m else "not built"

    for depth, row in report["depths"].items():
        lines.append(f"| {depth} | {cell(row['clad_groups'])} | "
                     f"{cell(row.get('clad_one_request'))} | {cell(row['pullback_engine'])} |")  # fmt: skip
    lines += [
        "",
        "One request makes Clad hold the whole forward's reverse pass at once: its time and "
        "memory grow faster than the depth. In groups, each request is the same size, so the "
        "build grows with the number of groups, as the plain build does.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
