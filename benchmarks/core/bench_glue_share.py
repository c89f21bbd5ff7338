"""What share of a training step runs in a model's own generated code, and what a plan of op
records run by a loop over the prebuilt kernels (no per-model C++) could therefore save.

The GW MLP and CNN are compiled (pullback engine, float32) with a runtime library for x86-64-v3
(valgrind runs no AVX-512), and benchmarks/core/glue_driver.cpp runs STEPS Adam steps through
each one's C API under callgrind, one thread. Instructions are counted per function (whatever
else the machine runs: callgrind counts instructions, not seconds); the model's own code is
every function of its library (the rc_<hash> prefix), the rest the runtime's kernels and
BLAS.

usage: python benchmarks/core/bench_glue_share.py [--steps N] [--out PATH]
Writes benchmarks/results/glue_share.json and docs/benchmarks/glue_share.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "glue_share.json"
TABLE = REPO / "docs" / "benchmarks" / "glue_share.md"
sys.path.insert(0, str(REPO / "benchmarks"))
BATCHES = (1, 64)


def instructions(out_file: Path) -> tuple[int, int]:
    """(all instructions, the model library's) of a callgrind output."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out_file)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total = own = 0
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S+):(.*)", line)
        if m:
            n = int(m.group(1).replace(",", ""))
            total += n
            own += n if re.search(r"rc_[0-9a-f]{12}", m.group(2) + m.group(3)) else 0
    return total, own


def main(argv=None) -> int:
    from report import run_header, write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        os.environ["ROOTCLAD_CACHE_DIR"] = str(Path(d) / "cache")
        os.environ["ROOTCLAD_NUM_THREADS"] = "1"
        import torch

        import rootclad
        from rootclad.gw.models import gw_cnn, gw_mlp
        from rootclad.toolchain import find_cxx, recipes

        recipes.OPT_FLAGS = [
            f.replace("-march=native", "-march=x86-64-v3") for f in recipes.OPT_FLAGS
        ]
        driver = Path(d) / "glue_driver"
        subprocess.run(
            [find_cxx()[0], "-O2", str(HERE / "glue_driver.cpp"), "-o", str(driver), "-ldl"],
            check=True,
        )
        report = run_header(steps=args.steps, models={})
        for name, make in (("gw-mlp", gw_mlp), ("gw-cnn", gw_cnn)):
            torch.manual_seed(0)
            cm = rootclad.compile(
                make(), torch.zeros(2, 1, 2048), "bce_with_logits", engine="pullback"
            )
            report["models"][name] = {}
            for B in BATCHES:
                cg = Path(d) / f"{name}-{B}.out"
                cmd = [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={cg}",
                    str(driver),
                    str(cm.library_path),
                    cm._em.prefix,
                    str(B),
                    str(args.steps),
                ]
                subprocess.run(cmd, check=True, capture_output=True)
                total, own = instructions(cg)
                report["models"][name][str(B)] = {"instructions": total, "model_code": own}
                print(name, B, total, own, f"{100 * own / total:.3f}%", flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    lines = [
        "# The model's own code in a training step",
        "",
        f"`benchmarks/core/bench_glue_share.py`, {report['date']}, {report['machine']}: "
        f"{report['steps']} Adam steps of each model through its C API under callgrind (one "
        "thread, the runtime built for x86-64-v3), instructions per function; the model's own "
        "code is its library's (the generated C++), the rest the runtime's kernels and BLAS. "
        "A plan of op records run by a loop over the prebuilt kernels could save no more "
        "than the model's share, and adds a dispatch per op.",
        "",
        "| model | batch | instructions | in the model's code | share |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, by_batch in report["models"].items():
        for B, r in by_batch.items():
            share = 100 * r["model_code"] / r["instructions"]
            lines.append(
                f"| {name} | {B} | {r['instructions']:,} | {r['model_code']:,} | {share:.3f}% |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
