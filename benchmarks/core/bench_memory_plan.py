"""Activation memory with and without the arena planner, and what a training step's process
peaks at.

For each model, the compiled library's own sizes (``act_size(B)`` and ``d_act_size(B)``: what
every host allocates) are compared with one region per value (``ACT_FLAT_PER_SAMPLE`` each).
The peak resident memory of a process that compiles the model and runs TRAIN_STEPS Adam steps
at batch BATCH is measured twice, in fresh processes: with the plan, and with the
``ROOTCLAD_CHECK_PLAN=1`` build, which lays out one region per value (it also fills dead
regions with NaN, which costs time, not memory). Models: the GW CNN and MLP
(``rootclad.gw.models``), the residual GW classifier with BatchNorm (``gw_resnet``), and the
2-D digit CNN (``rootclad.nets.digits_cnn``); float32, pullback engine.

usage: python benchmarks/core/bench_memory_plan.py [--out PATH]
Writes benchmarks/results/memory_plan.json and docs/benchmarks/memory_plan.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "memory_plan.json"
TABLE = REPO / "docs" / "benchmarks" / "memory_plan.md"
sys.path.insert(0, str(REPO / "benchmarks"))
BATCH = 256
TRAIN_STEPS = 3
MODELS = ("gw-cnn", "gw-mlp", "gw-resnet-batchnorm", "digits-cnn")

# run in a fresh process: compile, train TRAIN_STEPS steps at BATCH, report sizes and peak RSS
CHILD = """
import json, resource, sys, torch, rootclad
from rootclad.gw.models import gw_cnn, gw_mlp, gw_resnet
from rootclad.nets import digits_cnn
name, B, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
if name == "digits-cnn":
    net, x, loss = digits_cnn(), torch.randn(B, 1, 28, 28), "cross_entropy"
    y = torch.randint(0, 10, (B,))
else:
    make = {"gw-cnn": gw_cnn, "gw-mlp": gw_mlp,
            "gw-resnet-batchnorm": lambda: gw_resnet(batch_norm=True)}[name]
    net = make()
    x = torch.randn(B, 2048) if name == "gw-mlp" else torch.randn(B, 1, 2048)
    y, loss = torch.randint(0, 2, (B, 1)).float(), "bce_with_logits"
cm = rootclad.compile(net, x[:4], loss=loss, engine="pullback")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
opt = rootclad.optim.Adam(cm, lr=1e-3)
for _ in range(steps):
    cm.train_step(x, y, opt)
em = cm._em
print(json.dumps({
    "act_per_sample": em.act_per_sample, "d_act_per_sample": em.d_act_per_sample,
    "flat_per_sample": em.flat_per_sample,
    "arena_bytes": (cm._lib.act_size(B) + cm._lib.d_act_size(B)) * 4,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rss_before_steps_mb": before / 1024,
}))
"""


def measure(name: str, check_plan: bool) -> dict:
    env = dict(os.environ, ROOTCLAD_CHECK_PLAN="1" if check_plan else "0")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(BATCH), str(TRAIN_STEPS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from report import run_header, write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    report = run_header(batch=BATCH, train_steps=TRAIN_STEPS, models={})
    for name in MODELS:
        planned, flat = measure(name, False), measure(name, True)
        per = planned["act_per_sample"] + planned["d_act_per_sample"]
        report["models"][name] = {
            "per_sample_elements": {
                "act": planned["act_per_sample"],
                "d_act": planned["d_act_per_sample"],
                "one_region_per_value": planned["flat_per_sample"],
            },
            "arena_mb": {
                "planned": round(planned["arena_bytes"] / 2**20, 1),
                "one_region_per_value": round(flat["arena_bytes"] / 2**20, 1),
            },
            "saved_fraction": round(1 - per / (2 * planned["flat_per_sample"]), 3),
            "peak_rss_mb": {
                "planned": round(planned["peak_rss_mb"], 1),
                "one_region_per_value": round(flat["peak_rss_mb"], 1),
            },
        }
        print(name, report["models"][name], flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    lines = [
        "# Activation memory: the arena plan against one region per value",
        "",
        f"`benchmarks/core/bench_memory_plan.py`, {report['date']}, {report['machine']}, "
        f"torch {report['torch']}. float32, pullback engine. The arena is act + d_act as the "
        f"compiled library sizes it at batch {report['batch']} (what every host allocates); "
        f"peak RSS is that of a fresh process that compiles the model and runs "
        f"{report['train_steps']} Adam steps at batch {report['batch']}, with the plan and with "
        "the `ROOTCLAD_CHECK_PLAN=1` build (one region per value).",
        "",
        "| model | act / d_act / unplanned (per sample) | arena planned | arena unplanned | "
        "saved | peak RSS planned | peak RSS unplanned |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in report["models"].items():
        e, a, r = m["per_sample_elements"], m["arena_mb"], m["peak_rss_mb"]
        lines.append(
            f"| {name} | {e['act']} / {e['d_act']} / {e['one_region_per_value']} | "
            f"{a['planned']} MB | {a['one_region_per_value']} MB | "
            f"{m['saved_fraction']:.0%} | {r['planned']} MB | {r['one_region_per_value']} MB |"
        )
    lines += [
        "",
        "Adjoints gain most: a chain's adjoints live two or three at a time. Activations gain",
        "where no pullback reads a value (the input of a ReLU, whose pullback reads its output;",
        "the operands of a residual addition). The model inputs' and the output's regions are",
        "never shared: hosts write and read them.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
