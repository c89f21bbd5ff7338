"""Train step of transformer encoders on a GPU: rootclad's DeviceModel next to torch eager on
the same device, same process.

The device program multiplies attention's products (q kᵀ, then by v) as one strided
batched cuBLAS GEMM per product and direction, Linear layers through cuBLAS, the rest
(softmax, LayerNorm, permutes, slices) as rootclad's own kernels; torch runs fused
attention. Two encoders of nn.TransformerEncoderLayer (batch_first, ReLU, no dropout) over a
sequence of tokens, mean over the tokens, then one logit: "small" (32 tokens of width 64, 4
heads) and "wide" (128 tokens of width 256, 8 heads). Per model and batch (1, 32, 256): the
median step time over ROUNDS interleaved rounds and the kernel launches per step
(torch.profiler). Both start from the same weights and batch: their first losses must agree
(float32), or the run stops.
``--device cpu`` checks the script with the device kernels as loops (not a benchmark);
``--profile`` prints rootclad's kernels by their time in one step of the wide model at 256.

usage: python benchmarks/cuda/bench_attention.py [--device cuda|cpu] [--profile] [--out PATH]
Writes benchmarks/results/cuda_attention.json and docs/benchmarks/cuda_attention.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "cuda_attention.json"
TABLE = REPO / "docs" / "benchmarks" / "cuda_attention.md"
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(HERE))
ROUNDS = 3
BATCHES = (1, 32, 256)
# name -> (tokens, features per token, width, heads)
MODELS = {"small": (32, 16, 64, 4), "wide": (128, 32, 256, 8)}


def _encoder(tokens: int, features: int, width: int, heads: int):
    import torch
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(features, width)
            layer = nn.TransformerEncoderLayer(
                width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(width, 1)

        def forward(self, x):
            return self.head(self.blocks(self.embed(x)).mean(1))

    torch.manual_seed(0)
    return Encoder()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--profile", action="store_true", help="rootclad's kernels in one step")
    args = ap.parse_args(argv)
    import torch
    from bench_train_step import _device_model, _launches, _time
    from report import run_header, write_report

    import rootclad

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine (or --device cpu to check the script)")
        return 2
    if args.profile:
        return _profile(device)
    gpu = {}
    if device.type == "cuda":
        gpu = {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    batches, min_time = (BATCHES, 0.6) if device.type == "cuda" else ((1, 2), 0.05)
    models = MODELS if device.type == "cuda" else {"small": MODELS["small"]}
    report = run_header(device=args.device, **gpu, rounds=ROUNDS, models={})
    for name, (tokens, features, width, heads) in models.items():
        net = _encoder(tokens, features, width, heads)
        init = {k: v.clone() for k, v in net.state_dict().items()}
        for B in batches:
            gen = torch.Generator().manual_seed(B)
            x = torch.randn(B, tokens, features, generator=gen).to(device)
            y = torch.randint(0, 2, (B,), generator=gen).float().to(device)
            net.load_state_dict(init)
            prog = _device_model(net, x)
            ropt = rootclad.optim.Adam(prog, lr=1e-3)
            eager = _encoder(tokens, features, width, heads).to(device)
            eager.load_state_dict(init)
            opt = torch.optim.Adam(eager.parameters(), lr=1e-3)

            def torch_step(opt=opt, model=eager, x=x, y=y):
                opt.zero_grad()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x)[:, 0], y)
                loss.backward()
                opt.step()
                return loss

            first = float(prog.train_step(x, y, ropt)), float(torch_step())
            if abs(first[0] - first[1]) > 1e-4 * max(1.0, abs(first[1])):
                raise SystemExit(f"{name} at batch {B}: rootclad's first loss {first[0]} is not "
                                 f"torch's {first[1]}")  # fmt: skip

            steps = {
                "rootclad": lambda p=prog, x=x, y=y, o=ropt: p.train_step(
                    x, y, o, check_finite=False
                ),
                "torch eager": torch_step,
            }
            times = {k: [] for k in steps}
            for _ in range(ROUNDS):
                for k, step in steps.items():
                    times[k] += _time(step, device, min_time / ROUNDS)
            med = {k: statistics.median(v) for k, v in times.items()}
            entry = {
                "median_ms": {k: round(v, 4) for k, v in med.items()},
                "rootclad_vs_eager": round(med["torch eager"] / med["rootclad"], 2),
                "first_loss": {"rootclad": first[0], "torch eager": first[1]},
                "launches_per_step": {k: _launches(s, device) for k, s in steps.items()},
            }
            report["models"].setdefault(name, {})[str(B)] = entry
            print(name, B, entry, flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def _profile(device) -> int:
    """torch.profiler's table of one train step of the wide model at batch 256 (CUDA)."""
    import torch
    from bench_train_step import _device_model
    from torch.profiler import ProfilerActivity, profile

    import rootclad

    if device.type != "cuda":
        print("--profile times the GPU's kernels: run it on a GPU machine")
        return 2
    gen = torch.Generator().manual_seed(0)
    tokens, features, _, _ = MODELS["wide"]
    x = torch.randn(256, tokens, features, generator=gen).to(device)
    y = torch.randint(0, 2, (256,), generator=gen).float().to(device)
    prog = _device_model(_encoder(*MODELS["wide"]), x)
    opt = rootclad.optim.Adam(prog, lr=1e-3)
    for _ in range(3):
        prog.train_step(x, y, opt, check_finite=False)
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        prog.train_step(x, y, opt, check_finite=False)
        torch.cuda.synchronize(device)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20))
    return 0


def render(report: dict) -> str:
    where = report.get("gpu") or f"the CPU ({report['machine']}; a check of the script only)"
    lines = [
        "# Transformer encoders' train step on a GPU: rootclad's device program next to torch",
        "",
        f"`benchmarks/cuda/bench_attention.py`, {report['date']}, {where}, torch "
        f"{report['torch']}. Median of {report['rounds']} interleaved rounds. Two "
        "`nn.TransformerEncoderLayer`s (no dropout), mean over the tokens, one logit; Adam. "
        "rootclad multiplies attention's products by strided batched cuBLAS GEMMs.",
        "",
        "| model (tokens x width, heads) | batch | rootclad | torch eager | rootclad vs eager | "
        "launches per step (rootclad / eager) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, by_batch in report["models"].items():
        tokens, _, width, heads = MODELS[name]
        for B, e in by_batch.items():
            ms, n = e["median_ms"], e["launches_per_step"]
            lines.append(
                f"| {name} ({tokens} x {width}, {heads}) | {B} | {ms['rootclad']:.4g} ms | "
                f"{ms['torch eager']:.4g} ms | x{e['rootclad_vs_eager']} | "
                f"{n['rootclad']} / {n['torch eager']} |"
            )
    return "\n".join(lines + [""])


if __name__ == "__main__":
    raise SystemExit(main())
