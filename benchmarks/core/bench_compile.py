"""How long a model takes to compile, against the floor of any C++ build, and against a commit
from before the runtime library (compile once, issue 43).

In one run: g++ compiling an empty program that includes <vector> and <cmath> (the floor);
the runtime library's build (once per machine, compiler and flags); and, for each model and
engine, ``rootclad.compile`` from the module to the loaded library in a fresh process whose
cache holds the runtime library and nothing of the model (float32): the GW MLP and CNN,
resnet18 and densenet121 at (3, 32, 32), chains of 400 and 1500 ops (Linear(16, 16) and Tanh),
a 2-layer LSTM tagger and a CNN with a bidirectional LSTM. With ``--base COMMIT`` each model is
built by that commit too (unpacked with git archive, imported from there, its own cache),
with ``--timeout`` seconds each.

usage: python benchmarks/core/bench_compile.py [--base COMMIT] [--timeout S] [--out PATH]
Writes benchmarks/results/compile.json and docs/benchmarks/compile.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "compile.json"
TABLE = REPO / "docs" / "benchmarks" / "compile.md"
sys.path.insert(0, str(REPO / "benchmarks"))
MODELS = (
    "gw-mlp",
    "gw-cnn",
    "resnet18",
    "densenet121",
    "chain-400",
    "chain-1500",
    "lstm-tagger",
    "cnn-bilstm",
)

CHILD = """
import json, sys, time
import torch
from torch import nn
name, engine, tests = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tests)
torch.manual_seed(0)

class LSTMTagger(nn.Module):  # benchmarks/models/bench_zoo_speed.py's
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 3)
    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])

class CnnBiLstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(1, 8, 9, padding=4), nn.ReLU(), nn.MaxPool1d(4))
        self.lstm = nn.LSTM(8, 16, batch_first=True, bidirectional=True)
        self.head = nn.Linear(32, 1)
    def forward(self, x):  # (B, 1, 256)
        h = self.conv(x).transpose(1, 2)
        out, _ = self.lstm(h)
        return self.head(out[:, -1])

loss = "cross_entropy"
if name.startswith("gw-"):
    from rootclad.gw.models import gw_cnn, gw_mlp
    net, x, loss = {"gw-mlp": gw_mlp, "gw-cnn": gw_cnn}[name](), torch.zeros(2, 1, 2048), "mse"
elif name.startswith("chain-"):
    n = int(name.split("-")[1])
    net = nn.Sequential(*[m for _ in range(n // 2) for m in (nn.Linear(16, 16), nn.Tanh())])
    x, loss = torch.zeros(2, 16), "mse"
elif name == "lstm-tagger":
    net, x = LSTMTagger(), torch.zeros(2, 25, 8)
elif name == "cnn-bilstm":
    net, x, loss = CnnBiLstm(), torch.zeros(2, 1, 256), "mse"
else:
    from fixtures.zoo import ZOO, vision
    net, x = ZOO[name](*vision()).eval(), torch.zeros(2, 3, 32, 32)
import rootclad
t0 = time.perf_counter()
cm = rootclad.compile(net, x, loss, engine=engine)
print(json.dumps({"seconds": time.perf_counter() - t0, "engine": cm.engine,
                  "rootclad": rootclad.__file__}))
"""

RUNTIME = """
import sys, time
from rootclad.toolchain import find_clad, find_cxx
from rootclad.toolchain.recipes import runtime_library
cxx = find_clad()[0].cxx if sys.argv[1] == "clad" else find_cxx()[0]
t0 = time.perf_counter()
runtime_library(cxx)
print(time.perf_counter() - t0)
"""


def child(code: str, args: list[str], env: dict, timeout: float, cwd: Path) -> str | None:
    """The last line a fresh process prints, or None when it runs past ``timeout``; run in
    ``cwd`` (``python -c`` puts it first on the path: that tree's rootclad is imported)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode:
        raise SystemExit(f"{args}: {proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def floor_seconds() -> float:
    """g++ -O2 of a program that includes <vector> and <cmath>: the least any build costs."""
    from rootclad.toolchain import find_cxx

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "empty.cpp"
        src.write_text("#include <cmath>\n#include <vector>\nint main() { return 0; }\n")
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([find_cxx()[0], "-O2", str(src), "-o", str(Path(d) / "a")], check=True)
            best.append(time.perf_counter() - t0)
    return min(best)


def build_all(tree: Path, engines, timeout: float, runtime: bool) -> dict:
    """Each model on each engine in a fresh process, with ``tree``'s rootclad, one cache."""
    cache = Path(tempfile.mkdtemp(prefix="rootclad-compile-"))
    env = {**os.environ, "ROOTCLAD_CACHE_DIR": str(cache), "PYTHONPATH": str(tree)}
    out = {"runtime": {}, "models": {}}
    try:
        for engine in engines if runtime else ():
            line = child(RUNTIME, [engine], env, 3600, tree)
            out["runtime"][engine] = round(float(line), 2)
            print("runtime", engine, out["runtime"][engine], flush=True)
        for name in MODELS:
            out["models"][name] = {}
            for engine in engines:
                line = child(CHILD, [name, engine, str(REPO / "tests")], env, timeout, tree)
                got = None if line is None else json.loads(line)
                if got is not None:  # the tree's own rootclad, not an installed one
                    assert Path(got["rootclad"]).resolve().is_relative_to(tree.resolve()), got
                    got = round(got["seconds"], 2)
                out["models"][name][engine] = got
                print(tree.name, name, engine, got, flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return out


def main(argv=None) -> int:
    from report import run_header, write_report

    from rootclad.toolchain import find_clad

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a commit from before the runtime library, built side by side")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per build of --base")
    ap.add_argument(
        "--base-engines",
        default="pullback,clad",
        help="the engines --base builds (each build there takes up to --timeout)",
    )
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    clad = find_clad()[0]
    engines = ["pullback"] + (["clad"] if clad else [])
    base_engines = [e for e in engines if e in args.base_engines.split(",")]
    report = run_header(
        engines=engines, floor=round(floor_seconds(), 3), base=args.base, base_engines=base_engines
    )
    report.update(build_all(REPO, engines, 3600, runtime=True))
    if args.base:
        with tempfile.TemporaryDirectory() as d:
            archive = subprocess.run(
                ["git", "archive", args.base], cwd=REPO, check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", d], input=archive, check=True)
            base = build_all(Path(d), base_engines, args.timeout, runtime=False)
        report["base_models"] = base["models"]
        report["base_timeout"] = args.timeout
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    engines, floor = report["engines"], report["floor"]
    base = report.get("base_models")

    def cell(s):
        return f"> {report['base_timeout']:.0f} s" if s is None else f"{s:.1f} s"

    lines = [
        "# Compile time",
        "",
        f"`benchmarks/core/bench_compile.py`, {report['date']}, {report['machine']}, torch "
        f"{report['torch']}. The floor, g++ -O2 of an empty program that includes <vector> and "
        f"<cmath>, took {floor:.2f} s. The runtime library (every kernel, float and double) "
        "built once in "
        + ", ".join(f"{s:.1f} s ({e} engine)" for e, s in report["runtime"].items())
        + "; each model then in a fresh process whose cache holds it and nothing of the model: "
        "`rootclad.compile` from the module to the loaded library, float32."
        + (
            f" Beside it, commit {report['base']} (each model's C++ with the whole header-only "
            "runtime, compiled at -O3), in a cache of its own."
            if base
            else ""
        )
        + ("" if "clad" in engines else " Clad was not found: the clad engine is not timed."),
        "",
    ]
    based = report.get("base_engines", engines) if base else []
    head = "| model | " + " | ".join(
        f"{e} | x floor" + (f" | {e}, {report['base']}" if e in based else "") for e in engines
    )
    lines += [head + " |", "| --- |" + " ---: |" * (2 * len(engines) + len(based))]
    for name, times in report["models"].items():
        cells = []
        for e in engines:
            s = times[e]
            cells += [cell(s), f"x{s / floor:.1f}"]
            if e in based:
                cells.append(cell(base[name][e]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
