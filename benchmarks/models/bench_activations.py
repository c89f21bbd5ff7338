"""The cost of transcendental activations per value: rootclad's elementwise kernels next to
torch's, same process, same thread count.

A model of ``tanh(sigmoid(x))`` on (32, 6250) float32 values (200,000 per op) is run forward
(``predict``, eval mode) by rootclad and under ``torch.inference_mode()`` by torch; the median
time over repeated calls, divided by the values the two ops write, gives nanoseconds per value
and op. This is what bounds a recurrent layer's step at larger batches (docs/benchmarks).

usage: python benchmarks/models/bench_activations.py [--out PATH]
Writes benchmarks/results/activations.json and docs/benchmarks/activations.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "activations.json"
TABLE = REPO / "docs" / "benchmarks" / "activations.md"
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "core"))


class TanhSigmoid(nn.Module):
    def forward(self, x):
        return torch.tanh(torch.sigmoid(x))


def main(argv=None) -> int:
    from bench_train_step import time_steps
    from report import run_header, write_report

    import rootclad

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    x = torch.randn(32, 6250, generator=torch.Generator().manual_seed(0))
    cm = rootclad.compile(TanhSigmoid(), x, loss="mse", engine="pullback").eval()
    torch.testing.assert_close(cm.predict(x), TanhSigmoid()(x))

    def torch_fwd():
        with torch.inference_mode():
            TanhSigmoid()(x)

    calls = {"torch eager": torch_fwd, "rootclad": lambda: cm.predict(x)}
    times = {k: [] for k in calls}
    for _ in range(3):
        for k, fn in calls.items():
            times[k] += time_steps(fn, 0.5)
    ns = {k: round(statistics.median(v) * 1e6 / (2 * x.numel()), 3) for k, v in times.items()}
    report = run_header(threads=torch.get_num_threads(), values=2 * x.numel(),
                        ns_per_value=ns)  # fmt: skip
    print(ns)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    ns = report["ns_per_value"]
    return (
        "# Transcendental activations: cost per value\n\n"
        f"`benchmarks/models/bench_activations.py`, {report['date']}, {report['machine']}, "
        f"{report['threads']} threads, torch {report['torch']}. `tanh(sigmoid(x))` forward on "
        f"{report['values'] // 2:,} float32 values per op, median of repeated calls.\n\n"
        "| implementation | ns per value and op |\n|---|---:|\n"
        + "".join(f"| {k} | {v} |\n" for k, v in ns.items())
    )


if __name__ == "__main__":
    sys.exit(main())
