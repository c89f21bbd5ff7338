"""What ROOT spends on rootclad's C++ before the first event: Cling's JIT of the model host in
PyROOT and in root.exe, and an ACLiC build of a macro (issue 43).

An MLP (4-8-1) is exported; then, each in a fresh process: PyROOT's ``define_score`` on a
1,000-event tree (the call, then the first event loop, which JIT-compiles the column's code);
``root -b -q macro.C`` that includes the export's header, opens the model and predicts once
(the whole process, and the same with an empty macro: ROOT's own start); ``root -b -q
macro.C+`` (ACLiC: rootcling's dictionary and g++ of the macro with the header), from an
empty build directory. Medians of REPEATS runs.

usage: python benchmarks/root/bench_jit.py [--repeats N] [--out PATH]
Writes benchmarks/results/root_jit.json and docs/benchmarks/root_jit.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "root_jit.json"
TABLE = REPO / "docs" / "benchmarks" / "root_jit.md"
sys.path.insert(0, str(REPO / "benchmarks"))

SCORE = """
import json, sys, time
import ROOT
import rootclad
d = sys.argv[1]
df = ROOT.RDataFrame("events", d + "/events.root")
t0 = time.perf_counter()
df = rootclad.root.define_score(df, d + "/net", inputs="x", column="score")
t1 = time.perf_counter()
df.Mean("score").GetValue()
t2 = time.perf_counter()
print(json.dumps({"define_score": t1 - t0, "first_loop": t2 - t1}))
"""

MACRO = """#include "net.h"
int macro() {
  rootclad::Model m("net");
  std::vector<float> x(4, 0.5f), out(1);
  m.predict(x.data(), out.data(), 1);
  return out[0] == out[0] ? 0 : 1;
}
"""


def timed(cmd, cwd) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{cmd}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def main(argv=None) -> int:
    from report import run_header, write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    import numpy as np
    import torch
    import uproot

    import rootclad

    runs = {"define_score": [], "first_loop": [], "macro": [], "empty_macro": [], "aclic": []}
    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        cm = rootclad.compile(net, torch.zeros(2, 4), "bce_with_logits", engine="pullback")
        cm.export(Path(d) / "net")
        with uproot.recreate(Path(d) / "events.root") as f:
            f["events"] = {"x": np.random.default_rng(0).random((1000, 4), dtype=np.float32)}
        (Path(d) / "macro.C").write_text(MACRO)
        (Path(d) / "empty.C").write_text("int empty() { return 0; }\n")
        for _ in range(args.repeats):
            proc = subprocess.run(
                [sys.executable, "-c", SCORE, d], capture_output=True, text=True, check=True
            )
            for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                runs[k].append(v)
            runs["macro"].append(timed(["root", "-b", "-q", "-l", "macro.C"], d))
            runs["empty_macro"].append(timed(["root", "-b", "-q", "-l", "empty.C"], d))
            for built in Path(d).glob("macro_C*"):
                built.unlink() if built.is_file() else shutil.rmtree(built)
            runs["aclic"].append(timed(["root", "-b", "-q", "-l", "macro.C+"], d))
            print({k: round(v[-1], 2) for k, v in runs.items()}, flush=True)
    report = run_header(
        repeats=args.repeats,
        median={k: round(statistics.median(v), 2) for k, v in runs.items()},
        runs=runs,
    )
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    m = report["median"]
    return "\n".join(
        [
            "# ROOT's JIT of the model host",
            "",
            f"`benchmarks/root/bench_jit.py`, {report['date']}, {report['machine']}, medians of "
            f"{report['repeats']} runs, each in a fresh process; an exported MLP (4-8-1).",
            "",
            "| what | seconds |",
            "| --- | ---: |",
            f"| PyROOT: `define_score` (Cling declares the host) | {m['define_score']:.1f} |",
            f"| PyROOT: the first event loop after it (the column's code JIT-compiled) | {m['first_loop']:.1f} |",
            f"| `root -b -q macro.C`: open the export, predict (the whole process) | {m['macro']:.1f} |",
            f"| `root -b -q empty.C`: ROOT's own start, for comparison | {m['empty_macro']:.1f} |",
            f"| `root -b -q macro.C+` (ACLiC: dictionary and g++ of the macro with the header) | {m['aclic']:.1f} |",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
