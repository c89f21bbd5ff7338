"""Train-step speed of graph models (not chains): rootclad next to torch eager, same process.

Models: the ResNet-style GW classifier (``rootclad.gw.models.gw_resnet``: residual blocks,
global pooling; input (B, 1, 2048), BCE-with-logits), without and with BatchNorm (which makes
a batch run in one chunk: no threads, no micro-batches), and the 2-D digit CNN
(``rootclad.nets.digits_cnn``: input (B, 1, 28, 28), cross-entropy over 10 classes). At batch
1, 16, 64 and 256 one full training step with Adam (forward, loss, backward, update) is timed
for torch eager, rootclad's pullback engine and, where Clad is installed, the clad engine;
the implementations take turns for ROUNDS rounds and each reports the median of all its
steps. Also recorded: the first compile (fresh cache) and the activation memory per sample.

usage: python benchmarks/core/bench_graph_models.py [--quick] [--out PATH]
Writes benchmarks/results/graph_models.json and docs/benchmarks/graph_models.md.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "graph_models.json"
TABLE = REPO / "docs" / "benchmarks" / "graph_models.md"
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(HERE))
BATCHES = (1, 16, 64, 256)
ROUNDS = 3


def model_case(name: str, batch: int):
    """(module, x, y, rootclad loss, torch loss function) for ``name`` at ``batch``."""
    from rootclad.gw.models import gw_resnet
    from rootclad.nets import digits_cnn

    g = torch.Generator().manual_seed(batch)
    torch.manual_seed(0)
    if name.startswith("gw-resnet"):
        x = torch.randn(batch, 1, 2048, generator=g)
        y = torch.randint(0, 2, (batch, 1), generator=g).float()
        net = gw_resnet(batch_norm=name.endswith("batchnorm"))
        return net, x, y, "bce_with_logits", torch.nn.BCEWithLogitsLoss()
    x = torch.randn(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return digits_cnn(), x, y, "cross_entropy", torch.nn.CrossEntropyLoss()


def main(argv=None) -> int:
    from bench_train_step import time_steps
    from report import write_report

    import rootclad
    from rootclad.toolchain import find_clad

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short timing windows")
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    min_time = 0.3 if args.quick else 1.5
    engines = ["pullback"] + (["clad"] if find_clad()[0] is not None else [])
    threads = torch.get_num_threads()
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "threads": threads,
        "torch": torch.__version__,
        "rootclad": rootclad.__version__,
        "engines": engines,
        "rounds": ROUNDS,
        "models": {},
    }
    for name in ("gw-resnet", "gw-resnet-batchnorm", "digits-cnn"):
        entry = report["models"].setdefault(name, {"compile_s": {}, "steps": {}})
        with tempfile.TemporaryDirectory() as cache:  # a fresh cache: the first compile
            os.environ["ROOTCLAD_CACHE_DIR"] = cache
            net, x, y, loss, _ = model_case(name, 4)
            for engine in engines:
                cm = rootclad.compile(copy.deepcopy(net), x, loss=loss, engine=engine)
                entry["compile_s"][engine] = round(cm.compile_seconds, 2)
            entry["params"] = sum(p.numel() for p in net.parameters())
            entry["activation_bytes_per_sample"] = cm._em.act_per_sample * 4
            for batch in BATCHES:
                net, x, y, loss, lossf = model_case(name, batch)
                ref = copy.deepcopy(net)
                topt = torch.optim.Adam(ref.parameters(), lr=1e-3)

                def torch_step(ref=ref, topt=topt, lossf=lossf, x=x, y=y):
                    topt.zero_grad()
                    lossf(ref(x), y).backward()
                    topt.step()

                steps = {"torch eager": torch_step}
                for engine in engines:
                    cm = rootclad.compile(copy.deepcopy(net), x, loss=loss, engine=engine)
                    opt = rootclad.optim.Adam(cm, lr=1e-3)
                    steps[f"rootclad {engine}"] = lambda cm=cm, opt=opt, x=x, y=y: cm.train_step(
                        x, y, opt
                    )
                times = {k: [] for k in steps}
                for _ in range(ROUNDS):
                    for k, step in steps.items():
                        times[k] += time_steps(step, min_time / ROUNDS)
                med = {k: statistics.median(v) for k, v in times.items()}
                entry["steps"][str(batch)] = {
                    "median_ms": {k: round(v, 4) for k, v in med.items()},
                    "speedup_vs_torch": {
                        k: round(med["torch eager"] / v, 2)
                        for k, v in med.items()
                        if k != "torch eager"
                    },
                    "runs": {k: len(v) for k, v in times.items()},
                }
                print(name, batch, entry["steps"][str(batch)]["median_ms"], flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    lines = [
        "# Graph models: train step next to torch eager",
        "",
        f"`benchmarks/core/bench_graph_models.py`, {report['date']}, {report['machine']}, "
        f"{report['threads']} threads, torch {report['torch']}. One Adam training step, median "
        f"of all steps over {report['rounds']} interleaved rounds; speedup = torch eager's "
        "time / rootclad's.",
        "",
        "| model | engine | batch 1 | batch 16 | batch 64 | batch 256 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, entry in report["models"].items():
        steps = entry["steps"]
        impls = list(next(iter(steps.values()))["median_ms"])
        for impl in impls:
            cells = []
            for b in steps.values():
                ms = b["median_ms"][impl]
                speed = b["speedup_vs_torch"].get(impl)
                cells.append(f"{ms:.3g} ms" + (f" (x{speed})" if speed else ""))
            lines.append(f"| {name} | {impl} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | parameters | activations per sample | first compile |",
        "|---|---:|---:|---|",
    ]
    for name, entry in report["models"].items():
        compile_s = ", ".join(f"{k} {v} s" for k, v in entry["compile_s"].items())
        kib = entry["activation_bytes_per_sample"] / 1024
        lines.append(f"| {name} | {entry['params']:,} | {kib:.0f} KiB | {compile_s} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
