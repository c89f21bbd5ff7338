"""The host's share of a device training step: DeviceModel.train_step of a model so small that
its kernels cost next to nothing (Linear(4, 8), ReLU, Linear(8, 1) at batch 1), run as the
device program's host loops, next to torch eager's step of the same model on the CPU in the
same process. What is left is Python, the argument checks, the input copy and the ctypes
calls: the time a GPU step spends on the CPU before and between its launches, the part of a
small batch's step that no kernel makes faster. Median over ROUNDS interleaved rounds.

usage: python benchmarks/cuda/bench_host_overhead.py [--out PATH]
Writes benchmarks/results/device_host_overhead.json and docs/benchmarks/device_host_overhead.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "device_host_overhead.json"
TABLE = REPO / "docs" / "benchmarks" / "device_host_overhead.md"
sys.path.insert(0, str(REPO / "benchmarks"))
ROUNDS, CALLS = 7, 2000


def _per_call_us(step) -> float:
    t = time.perf_counter()
    for _ in range(CALLS):
        step()
    return 1e6 * (time.perf_counter() - t) / CALLS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    import torch
    from report import run_header, write_report

    import rootclad
    from rootclad.compiler import compile_device

    torch.set_num_threads(1)
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    dm = compile_device(net, torch.zeros(2, 4), device="cpu")
    ropt = rootclad.optim.Adam(dm, lr=1e-3)
    topt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.randn(1, 4), torch.ones(1)

    def torch_step():
        topt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(net(x).squeeze(1), y).backward()
        topt.step()

    steps = {"DeviceModel.train_step": lambda: dm.train_step(x, y, ropt, check_finite=False),
             "torch eager step (CPU)": torch_step}  # fmt: skip
    times = {k: [] for k in steps}
    for step in steps.values():
        for _ in range(200):  # warm-up
            step()
    for _ in range(ROUNDS):
        for k, step in steps.items():
            times[k].append(_per_call_us(step))
    report = run_header(rounds=ROUNDS, calls_per_round=CALLS, batch=1,
                        median_us={k: round(statistics.median(v), 2) for k, v in times.items()})  # fmt: skip
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    lines = [
        "# The host's share of a device training step",
        "",
        f"`benchmarks/cuda/bench_host_overhead.py`, {report['date']}, {report['machine']}, "
        f"torch {report['torch']}: Linear(4, 8), ReLU, Linear(8, 1) at batch "
        f"{report['batch']}, median of {report['rounds']} rounds of {report['calls_per_round']} "
        "steps, one thread. The device program runs as host loops, whose kernels cost next to "
        "nothing at this size: what is left is what a GPU step spends on the CPU besides its "
        "launches.",
        "",
        "| step | µs per step |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v:.1f} |" for k, v in report["median_us"].items()]
    return "\n".join(lines + [""])


if __name__ == "__main__":
    raise SystemExit(main())
