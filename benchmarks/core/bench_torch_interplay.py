"""torch and rootclad in one process: does a rootclad call slow torch's next step down, and
torch's step rootclad's next call?

A training loop that also runs torch code alternates the two. rootclad's pool workers spin for
up to 200 us after each call before they sleep (parallel.h: SPIN_NS), on the cores torch's
OpenMP threads want next. Measured here, in one process, median of REPEATS rounds:

- ``torch alone``: torch's step of the GW CNN or MLP (forward, backward, SGD) at batch
  TORCH_BATCH;
- ``rootclad alone``: ``cm.train_step`` of the compiled GW CNN at batch RC_BATCH;
- ``alternating``: one rootclad call, then one torch step, each timed on its own.

for torch with 1 and 2 threads (``torch.set_num_threads``); rootclad's pool has the machine's
cores (ROOTCLAD_NUM_THREADS unset). Take the numbers on a quiet machine: on a busy one
torch's two OpenMP threads collapse whatever rootclad does.

usage: python benchmarks/core/bench_torch_interplay.py [--out PATH] [--repeats N]
Writes benchmarks/results/torch_interplay.json and docs/benchmarks/torch_interplay.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "torch_interplay.json"
TABLE = REPO / "docs" / "benchmarks" / "torch_interplay.md"
sys.path.insert(0, str(REPO / "benchmarks"))
# a pool that spins only while rootclad's calls follow each other within 200 us was built and
# measured on 2026-11-27 (the MLP's torch step at 1 thread, alone -> alternating: 0.91 -> 1.04
# ms with it, 0.90 -> 1.00 ms without, in the same hour): it moved neither side beyond noise
TRIED = (
    "Not the spinning: a pool whose workers spin only while rootclad's calls follow each "
    "other within 200 us, and sleep at once after a longer gap, was built and measured here "
    "(the MLP's torch step, 1 thread: 0.91 -> 1.04 ms with it, 0.90 -> 1.00 ms without, in "
    "the same hour). It moved neither side beyond noise and was not kept. What remains is "
    "what each leaves the other: rootclad's workers slept through torch's step and must be "
    "woken (20-40 us each), and both models' data left the caches. The slowdown the issue "
    "measured on a busy machine (2.33 -> 2.92 ms) is larger than any seen here."
)
TORCH_BATCH = 16
RC_BATCH = 4


def _ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def measure(repeats: int) -> dict:
    import torch

    import rootclad
    from rootclad.gw.models import gw_cnn, gw_mlp

    torch.manual_seed(0)
    cm = rootclad.compile(gw_cnn(), torch.zeros(1, 1, 2048), engine="pullback")
    x_r, y_r = torch.randn(RC_BATCH, 1, 2048), torch.randint(0, 2, (RC_BATCH, 1)).float()
    opt_r = rootclad.optim.SGD(cm, lr=1e-3)

    def rc_step():
        cm.train_step(x_r, y_r, opt_r)

    med = statistics.median
    rows = []
    for name, make, shape in (("GW CNN", gw_cnn, (1, 2048)), ("GW MLP", gw_mlp, (2048,))):
        net = make()
        x_t = torch.randn(TORCH_BATCH, *shape)
        y_t = torch.randint(0, 2, (TORCH_BATCH, 1)).float()
        opt_t = torch.optim.SGD(net.parameters(), lr=1e-3)
        loss_fn = torch.nn.BCEWithLogitsLoss()

        def torch_step(net=net, x_t=x_t, y_t=y_t, opt_t=opt_t, loss_fn=loss_fn):
            opt_t.zero_grad()
            loss_fn(net(x_t), y_t).backward()
            opt_t.step()

        for threads in (1, 2):
            torch.set_num_threads(threads)
            for _ in range(5):  # warm both
                torch_step()
                rc_step()
            alone_t = [_ms(torch_step) for _ in range(repeats)]
            time.sleep(0.01)
            alone_r = [_ms(rc_step) for _ in range(repeats)]
            alt_t, alt_r = [], []
            for _ in range(repeats):
                alt_r.append(_ms(rc_step))
                alt_t.append(_ms(torch_step))
            rows.append({
                "torch_model": name, "torch_threads": threads,
                "torch_alone_ms": med(alone_t), "torch_alternating_ms": med(alt_t),
                "rootclad_alone_ms": med(alone_r), "rootclad_alternating_ms": med(alt_r),
            })  # fmt: skip
            r = rows[-1]
            print(f"{name}, torch {threads} thread(s): torch {r['torch_alone_ms']:.2f} -> "
                  f"{r['torch_alternating_ms']:.2f} ms, rootclad {r['rootclad_alone_ms']:.2f} "
                  f"-> {r['rootclad_alternating_ms']:.2f} ms")  # fmt: skip
    return {"rows": rows}


def render(report: dict) -> str:
    lines = [
        "# torch and rootclad in one process",
        "",
        f"`benchmarks/core/bench_torch_interplay.py`, {report['date']}, {report['machine']}, "
        f"torch {report['torch']}; median of {report['repeats']} rounds. torch: the GW CNN's "
        f"or MLP's step (forward, backward, SGD) at batch {report['torch_batch']}; rootclad: "
        f"`cm.train_step` of the compiled GW CNN at batch {report['rc_batch']} (pullback "
        "engine, its pool on every core). *Alternating*: one rootclad call, then one torch "
        "step, as a training loop that also runs torch code does; each timed on its own.",
        "",
        "| torch's model | torch threads | torch alone (ms) | torch alternating (ms) | slowdown | "
        "rootclad alone (ms) | rootclad alternating (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['torch_model']} | {r['torch_threads']} | {r['torch_alone_ms']:.2f} | "
            f"{r['torch_alternating_ms']:.2f} | "
            f"{r['torch_alternating_ms'] / r['torch_alone_ms']:.2f}x | "
            f"{r['rootclad_alone_ms']:.2f} | {r['rootclad_alternating_ms']:.2f} |"
        )
    rows = report["rows"]
    t = [r["torch_alternating_ms"] / r["torch_alone_ms"] - 1 for r in rows]
    c = [r["rootclad_alternating_ms"] / r["rootclad_alone_ms"] - 1 for r in rows]
    lines += ["", f"On this machine a rootclad call changed torch's next step by {min(t):+.0%} "
              f"to {max(t):+.0%}, and a torch step rootclad's next call by {min(c):+.0%} to "
              f"{max(c):+.0%}. " + TRIED, ""]  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    from report import run_header, write_report

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--repeats", type=int, default=60)
    args = p.parse_args()
    report = run_header(repeats=args.repeats, torch_batch=TORCH_BATCH, rc_batch=RC_BATCH)
    report.update(measure(args.repeats))
    return write_report(report, args.out, RESULT, TABLE, render)


if __name__ == "__main__":
    sys.exit(main())
