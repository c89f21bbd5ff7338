"""How far torch's own Adam trajectories part on a zoo model when its weights change by one
part in 10^15: the limit of any comparison of training runs (tests/models/test_zoo.py).

Two copies of the model (torch only, no rootclad), the second's parameters multiplied by
1 + 1e-15, take the same 20 Adam steps in train mode (BatchNorm on the batch's statistics)
on the zoo test's data; reported is the relative difference of their losses at each learning
rate, and how far their parameters part after the last step, relative to the largest move of
any parameter (the measure tests/models/test_zoo.py compares rootclad with), with the
parameter that parts most.

usage: python benchmarks/models/check_adam_chaos.py [MODEL]   (default regnet_y_400mf)
Writes benchmarks/results/adam_chaos.json (adam_chaos_MODEL.json for another model).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "benchmarks" / "results" / "adam_chaos.json"
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
STEPS, LRS = 20, (1e-3, 1e-4, 1e-5)


def parting(name: str, lr: float) -> tuple[list[float], float, str]:
    from fixtures.core import torch_loss
    from fixtures.zoo import ZOO, vision

    torch.manual_seed(0)
    net = ZOO[name](*vision()).double()
    for m in net.modules():
        if isinstance(m, nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    net.train()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(24, 3, 32, 32, dtype=torch.float64, generator=gen)
    y = torch.randint(0, 3, (24,), generator=gen)
    a, b = copy.deepcopy(net), copy.deepcopy(net)
    with torch.no_grad():
        for p in b.parameters():
            p.mul_(1 + 1e-15)
    opts = [torch.optim.Adam(m.parameters(), lr=lr) for m in (a, b)]
    out = []
    for step in range(STEPS):
        idx = torch.arange(step % 3 * 8, step % 3 * 8 + 8)
        losses = []
        for m, opt in zip((a, b), opts, strict=True):
            opt.zero_grad()
            loss = torch_loss("cross_entropy", m(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out.append(abs(losses[0] - losses[1]) / abs(losses[0]))
    start = dict(net.named_parameters())
    moved = max(
        float((q.detach() - start[k].detach()).abs().max()) for k, q in a.named_parameters()
    )
    apart = [(float((p.detach() - q.detach()).abs().max()) / moved, k)
             for (k, p), q in zip(a.named_parameters(), b.parameters(), strict=True)]  # fmt: skip
    worst, which = max(apart)
    return out, worst, which


def main(argv=None) -> int:
    from report import run_header

    name = (argv if argv is not None else sys.argv[1:] or ["regnet_y_400mf"])[0]
    report = run_header(model=name, steps=STEPS, perturbation=1e-15, lr={})
    for lr in LRS:
        curve, worst, which = parting(name, lr)
        report["lr"][str(lr)] = {"last": curve[-1], "per_step": curve,
                                 "parameters_part": worst, "parameter": which}  # fmt: skip
        print(
            f"{name} lr {lr:g}: losses part by {curve[-1]:.3g} after {STEPS} steps, "
            f"parameters by {worst:.3g} of the largest move ({which})",
            flush=True,
        )
    out = RESULT if name == "regnet_y_400mf" else RESULT.with_name(f"adam_chaos_{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
