"""Cold compile time of the model zoo (tests/fixtures/zoo.py) and of the GW models.

Each build runs in a fresh process with an empty cache: the time of ``rootclad.compile``
(tracing, emitting and the C++ compiler), float32, inputs (B, 3, 32, 32) for the zoo and the
main job's (B, 1, 2048) for the GW models, on the pullback engine and, where Clad is found,
the clad engine. The GW models' compile must stay under 10 s (issue 27).

usage: python benchmarks/models/bench_zoo_compile.py [--out PATH]
Writes benchmarks/results/zoo_compile.json and docs/benchmarks/zoo_compile.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "zoo_compile.json"
TABLE = REPO / "docs" / "benchmarks" / "zoo_compile.md"
sys.path.insert(0, str(REPO / "benchmarks"))

CHILD = """
import json, os, shutil, sys, tempfile, time
os.environ["ROOTCLAD_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="rootclad-zoo-")
sys.path.insert(0, sys.argv[3])
import torch
import rootclad
name, engine = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
if name.startswith("gw-"):
    from rootclad.gw.models import gw_cnn, gw_mlp, gw_resnet
    net = {"gw-mlp": gw_mlp, "gw-cnn": gw_cnn, "gw-resnet": gw_resnet}[name]()
    x = torch.zeros(2, 1, 2048)
else:
    from fixtures.zoo import ZOO, vision
    net = ZOO[name](*vision()).eval()
    x = torch.zeros(2, 3, 32, 32)
t0 = time.perf_counter()
cm = rootclad.compile(net, x, "cross_entropy" if not name.startswith("gw-") else
                      "bce_with_logits", engine=engine)
seconds = time.perf_counter() - t0
shutil.rmtree(cache, ignore_errors=True)
print(json.dumps({"seconds": seconds, "engine": cm.engine}))
"""


def build(name: str, engine: str) -> float:
    proc = subprocess.run([sys.executable, "-c", CHILD, name, engine, str(REPO / "tests")],
                          capture_output=True, text=True, cwd=REPO)  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"{name} on {engine}: {proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["engine"] == engine, result
    return round(result["seconds"], 2)


def main(argv=None) -> int:
    from report import run_header, write_report

    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.zoo import ZOO

    from rootclad.toolchain import find_clad

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    clad = find_clad()[0]
    engines = ["pullback"] + (["clad"] if clad else [])
    report = run_header(engines=engines, clad=str(clad.plugin) if clad else None, models={})
    for name in ("gw-mlp", "gw-cnn", "gw-resnet", *ZOO):
        report["models"][name] = {engine: build(name, engine) for engine in engines}
        print(name, report["models"][name], flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    engines = report["engines"]
    lines = [
        "# Cold compile of the model zoo and the GW models",
        "",
        f"`benchmarks/models/bench_zoo_compile.py`, {report['date']}, {report['machine']}, "
        f"torch {report['torch']}. Each build in a fresh process with an empty cache: "
        "`rootclad.compile` from the module to the loaded library (tracing, emitting, the C++ "
        "compiler), float32; the zoo at (3, 32, 32), the GW models at (1, 2048)."
        + ("" if "clad" in engines else " Clad was not found: the clad engine is not timed."),
        "",
        "| model | " + " | ".join(f"{e} engine" for e in engines) + " |",
        "| --- | " + " | ".join("---:" for _ in engines) + " |",
    ]
    for name, times in report["models"].items():
        lines.append(f"| {name} | " + " | ".join(f"{times[e]:.1f} s" for e in engines) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
