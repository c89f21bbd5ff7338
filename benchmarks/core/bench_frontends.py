"""The same models compiled by either front-end (frontend="fx" and "export"), side by side in
one process: the graph each gives (IR nodes), the time to capture and lower it, and the time
of a training step (forward, loss, backward, Adam) and of inference at batch 1 and 32. The
two compiled models take turns for ROUNDS rounds; each reports the median of all its calls.
The export front-end is to replace the fx one only where it costs no more than 3% anywhere.

Models: bench_zoo_speed's (resnet18, mobilenet_v2 at 64x64, an LSTM tagger, the
Particle-Transformer-style encoder and DeepSets), a 2-layer transformer encoder (d=64, T=32)
and the GW job's CNN, ResNet and MLP (bench_train_step's).

usage: python benchmarks/core/bench_frontends.py [--quick] [--models a,b] [--out PATH]
Writes benchmarks/results/frontend_speed.json and docs/benchmarks/frontend_speed.md.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "frontend_speed.json"
TABLE = REPO / "docs" / "benchmarks" / "frontend_speed.md"
for p in (
    REPO / "benchmarks",
    REPO / "benchmarks" / "models",
    HERE,
    REPO / "tests",
    REPO / "tests" / "models",
):
    sys.path.insert(0, str(p))
BATCHES = (1, 32)
ROUNDS = 3
FRONTENDS = ("fx", "export")
MODELS = (
    "gw-cnn",
    "gw-resnet",
    "gw-mlp",
    "resnet18",
    "mobilenet_v2",
    "transformer",
    "lstm-tagger",
    "particle-transformer",
    "deepsets",
)


class Encoder(nn.Module):
    """issue 45's transformer encoder: 2 layers, d=64, 4 heads, T=32, its mean classified."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


def case(name: str, batch: int):
    """(module, inputs tuple, targets, loss) at ``batch``."""
    from bench_zoo_speed import case as zoo_case

    if name.startswith("gw-"):
        from bench_train_step import example, make_model

        torch.manual_seed(0)
        x, y = example(name[3:], batch)
        return make_model(name[3:]), (x,), y.reshape(-1, 1), "bce_with_logits"
    if name == "transformer":
        g = torch.Generator().manual_seed(batch)
        torch.manual_seed(0)
        y = torch.randint(0, 3, (batch,), generator=g)
        return Encoder(), (torch.randn(batch, 32, 64, generator=g),), y, "cross_entropy"
    net, xs, y = zoo_case(name, batch)
    return net, xs, y, "cross_entropy"


def _compile(net, xs, loss, frontend):
    import rootclad

    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = rootclad.compile(
            copy.deepcopy(net).train(),
            xs if len(xs) > 1 else xs[0],
            loss=loss,
            engine="pullback",
            frontend=frontend,
        )
    return cm, time.perf_counter() - t


def bench_model(report, name, min_time) -> None:
    import numpy as np
    from bench_train_step import taking_turns

    import rootclad
    from rootclad.compiler import _FRONTENDS

    entry = report["models"].setdefault(name, {"batches": {}})
    net, xs, _, _ = case(name, 4)
    for fe in FRONTENDS:  # the capture alone (no build), best of two
        example = xs if len(xs) > 1 else xs[0]
        took = []
        for _ in range(2):
            t = time.perf_counter()
            graph = _FRONTENDS[fe](copy.deepcopy(net), example, "float32")
            took.append(time.perf_counter() - t)
        entry[fe] = {"ops": len(graph.nodes), "capture_s": round(min(took), 3)}
    print(name, {fe: entry[fe] for fe in FRONTENDS}, flush=True)
    for batch in BATCHES:
        net, xs, y, loss = case(name, batch)
        models = {fe: _compile(net, xs, loss, fe)[0] for fe in FRONTENDS}
        arg = xs if len(xs) > 1 else xs[0]
        ref = models["fx"].eval().predict(*xs).numpy()
        np.testing.assert_allclose(
            models["export"].eval().predict(*xs).numpy(), ref, rtol=1e-4, atol=1e-5
        )
        opts = {fe: rootclad.optim.Adam(cm, lr=1e-4) for fe, cm in models.items()}
        calls = {
            "train": {
                fe: (lambda cm=cm, o=opts[fe], a=arg, y=y: cm.train_step(a, y, o))
                for fe, cm in models.items()
            },
            "inference": {fe: (lambda cm=cm, xs=xs: cm.predict(*xs)) for fe, cm in models.items()},
        }
        result = entry["batches"][str(batch)] = {}
        for kind, impls in calls.items():
            for cm in models.values():
                (cm.train if kind == "train" else cm.eval)()
            times = taking_turns(impls, min_time, ROUNDS)
            med = {k: statistics.median(v) for k, v in times.items()}
            result[kind] = {
                "median_ms": {k: round(v, 4) for k, v in med.items()},
                "export_over_fx": round(med["export"] / med["fx"], 3),
                "runs": {k: len(v) for k, v in times.items()},
            }
        print(name, batch, {k: v["export_over_fx"] for k, v in result.items()}, flush=True)


def main(argv=None) -> int:
    from report import run_header, write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short timing windows")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    min_time = 0.3 if args.quick else 1.5
    report = run_header(threads=torch.get_num_threads(), rounds=ROUNDS, models={})
    for name in args.models.split(","):
        bench_model(report, name, min_time)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    lines = [
        "# Either front-end: the graph, its capture, and its speed",
        "",
        f"`python benchmarks/core/bench_frontends.py` on {report['date']}, {report['machine']}, "
        f"torch {report['torch']}, {report['threads']} threads, {report['rounds']} alternating "
        "rounds, medians. export/fx: the export front-end's time over the fx one's (below 1: "
        "faster).",
        "",
        "| model | IR ops fx / export | capture fx / export | batch | train export/fx | "
        "inference export/fx |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name, entry in report["models"].items():
        fx, ex = entry["fx"], entry["export"]
        for batch, got in entry["batches"].items():
            lines.append(
                f"| {name} | {fx['ops']} / {ex['ops']} | {fx['capture_s']} s / "
                f"{ex['capture_s']} s | {batch} | {got['train']['export_over_fx']} | "
                f"{got['inference']['export_over_fx']} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
