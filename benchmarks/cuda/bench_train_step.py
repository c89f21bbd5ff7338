"""Train step of the GW MLP and CNN on a GPU: rootclad's DeviceModel (rootclad.compile on
CUDA) next to torch eager and torch.compile on the same device, same process.

Per model and batch (1, 64, 1024): the median step time over ROUNDS interleaved rounds
(torch.cuda.synchronize around each timed step), the speed-up over torch eager, the
achieved fraction of the GPU's measured float32 GEMM throughput (3x the forward FLOPs a step)
and the number of kernel launches per step (torch.profiler), and the memory: rootclad's
act and d_act stores, and what a step allocates beyond what is held before it (rootclad and
torch eager, torch.cuda's peak); for the CNN also rootclad with
every convolution as its direct kernels, to weigh the im2col + cuBLAS path against them, and
for both rootclad with each step replayed as one CUDA graph (DeviceModel.cuda_graphs). The
GPU, its driver and the date are recorded. ``--device cpu`` runs the same script on the CPU (the device program's kernels
as loops: only a check that the script works, not a benchmark).

usage: python benchmarks/cuda/bench_train_step.py [--device cuda|cpu] [--quick] [--out PATH]
Writes benchmarks/results/cuda_train_step.json and docs/benchmarks/cuda_train_step.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "cuda_train_step.json"
TABLE = REPO / "docs" / "benchmarks" / "cuda_train_step.md"
sys.path.insert(0, str(REPO / "benchmarks"))
ROUNDS = 3
BATCHES = (1, 64, 1024)


def _model(name: str):
    from rootclad.gw.models import gw_cnn, gw_mlp

    return (gw_mlp(2048), (2048,)) if name == "gw-mlp" else (gw_cnn(2048), (1, 2048))


def _forward_flops(net, shape) -> float:
    import torch

    total = 0

    def hook(mod, inp, out):
        nonlocal total
        if isinstance(mod, torch.nn.Linear):
            total += 2 * mod.in_features * mod.out_features
        elif isinstance(mod, torch.nn.Conv1d):
            total += 2 * out.shape[-1] * mod.out_channels * mod.in_channels * mod.kernel_size[0]

    handles = [m.register_forward_hook(hook) for m in net.modules()]
    net(torch.zeros(1, *shape))
    for h in handles:
        h.remove()
    return float(total)


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(step, device, min_time: float, max_reps: int = 300) -> list[float]:
    """Step times (ms) after warm-up, each between synchronisations."""
    for _ in range(3):
        step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < 5 or time.perf_counter() - start < min_time):
        _sync(device)
        t = time.perf_counter()
        step()
        _sync(device)
        times.append(1e3 * (time.perf_counter() - t))
    return times


def _launches(step, device) -> int | None:
    """Kernel launches of one step (CUDA only), from torch.profiler."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    step()
    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        _sync(device)
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def _step_memory_mib(step, device) -> float | None:
    """What a step allocates above what is held before it (CUDA only): torch.cuda's peak over
    one step, after a first one (torch: the activations autograd saves, the gradients and
    temporaries; rootclad: nothing once its stores exist)."""
    if device.type != "cuda":
        return None
    import torch

    step()
    _sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    _sync(device)
    return round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 2)


def _store_mib(prog) -> float:
    """rootclad's working memory: its act and d_act stores (activations, the ops' scratch and
    workspace, their adjoints), held between steps."""
    stores = (prog._act_store, prog._d_act_store)
    return round(sum(t.numel() * t.element_size() for t in stores) / 2**20, 2)


def _gemm_peak(device) -> float:
    """float32 GEMM throughput (GFLOP/s) of torch.matmul on 4096 x 4096 matrices."""
    import torch

    n = 4096 if device.type == "cuda" else 512
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    times = _time(lambda: a @ b, device, 0.5, 50)
    return 2 * n**3 / statistics.median(times) / 1e6


DIRECT = "rootclad, direct convolutions"
GRAPH = "rootclad, CUDA graph"


def _device_model(net, x):
    """rootclad's model of ``net`` on x's device: rootclad.compile on CUDA; on the CPU the
    device program's kernels as loops (rootclad.compile would give the fast CPU model)."""
    import rootclad
    from rootclad.compiler import compile_device

    if x.device.type == "cuda":
        return rootclad.compile(net, example_input=x[:1], loss="bce_with_logits")
    return compile_device(net, x[:1], device="cpu")


@contextlib.contextmanager
def _direct_convolutions():
    """Device programs built inside run every convolution as its direct kernels (no layer
    gets the workspace that im2col and gemm need: cuda_ops.CONV_GEMM_MIN_DEPTH)."""
    from rootclad.codegen import cuda_ops as ops

    saved, ops.CONV_GEMM_MIN_DEPTH = ops.CONV_GEMM_MIN_DEPTH, 1 << 62
    try:
        yield
    finally:
        ops.CONV_GEMM_MIN_DEPTH = saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="short timing windows, batch 1 and 64")
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    import torch
    from report import run_header, write_report

    import rootclad

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine (or --device cpu to check the script)")
        return 2
    gpu = {}
    if device.type == "cuda":
        from rootclad.toolchain import cuda_driver_version

        gpu = {"gpu": torch.cuda.get_device_name(device), "driver": cuda_driver_version(),
               "cuda": torch.version.cuda}  # fmt: skip
    min_time = 0.2 if args.quick else 1.0
    batches = BATCHES[:2] if args.quick else BATCHES
    if device.type == "cpu":  # the kernels as plain loops: small batches, to check the script
        batches = (1, 4)
    peak = _gemm_peak(device)
    report = run_header(device=args.device, **gpu, rounds=ROUNDS, gemm_peak_gflops=peak, models={})
    for name in ("gw-mlp", "gw-cnn"):
        torch.manual_seed(0)
        net, shape = _model(name)
        flops = 3 * _forward_flops(net, shape)
        init = {k: v.clone() for k, v in net.state_dict().items()}
        for B in batches:
            gen = torch.Generator().manual_seed(B)
            x = torch.randn(B, *shape, generator=gen).to(device)
            y = torch.randint(0, 2, (B,), generator=gen).float().to(device)
            net.load_state_dict(init)
            prog = _device_model(net, x)
            ropt = rootclad.optim.Adam(prog, lr=1e-3)
            eager = _model(name)[0].to(device)
            eager.load_state_dict(init)
            opt = torch.optim.Adam(eager.parameters(), lr=1e-3)

            def torch_step(model, opt=opt, x=x, y=y):
                opt.zero_grad()
                torch.nn.functional.binary_cross_entropy_with_logits(
                    model(x).squeeze(1), y
                ).backward()
                opt.step()

            compiled = torch.compile(eager)
            steps = {
                "rootclad": lambda prog=prog, x=x, y=y, o=ropt: prog.train_step(
                    x, y, o, check_finite=False
                ),
                "torch eager": lambda m=eager, step=torch_step: step(m),
                "torch.compile": lambda m=compiled, step=torch_step: step(m),
            }
            graphed = _device_model(net, x)
            graphed.cuda_graphs = True
            gopt = rootclad.optim.Adam(graphed, lr=1e-3)
            steps[GRAPH] = lambda prog=graphed, x=x, y=y, o=gopt: prog.train_step(
                x, y, o, check_finite=False
            )
            if name == "gw-cnn":  # the convolutions' two paths: as products, and direct
                with _direct_convolutions():
                    direct = _device_model(net, x)
                dopt = rootclad.optim.Adam(direct, lr=1e-3)
                steps[DIRECT] = lambda prog=direct, x=x, y=y, o=dopt: prog.train_step(
                    x, y, o, check_finite=False
                )
            times = {k: [] for k in steps}
            for _ in range(ROUNDS):
                for k, step in steps.items():
                    times[k] += _time(step, device, min_time / ROUNDS)
            med = {k: statistics.median(v) for k, v in times.items()}
            entry = {
                "median_ms": {k: round(v, 4) for k, v in med.items()},
                "speedup_vs_eager": {k: round(med["torch eager"] / v, 2) for k, v in med.items()},
                "fraction_of_gemm_peak": {
                    k: round(flops * B / v / 1e6 / peak, 4) for k, v in med.items()
                },
                "launches_per_step": {k: _launches(s, device) for k, s in steps.items()},
                "memory_mib": {
                    "rootclad stores": _store_mib(prog),
                    "rootclad step": _step_memory_mib(steps["rootclad"], device),
                    "torch eager step": _step_memory_mib(steps["torch eager"], device),
                },
            }
            report["models"].setdefault(name, {})[str(B)] = entry
            print(name, B, entry, flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    where = report.get("gpu") or f"the CPU ({report['machine']}; a check of the script only)"
    lines = [
        "# GW models' train step on a GPU: rootclad's device program next to torch",
        "",
        f"`benchmarks/cuda/bench_train_step.py`, {report['date']}, {where}, driver "
        f"{report.get('driver')}, torch {report['torch']}. Median of {report['rounds']} "
        f"interleaved rounds; GEMM peak measured {report['gemm_peak_gflops']:.0f} GFLOP/s.",
        "",
        "| model | batch | rootclad | torch eager | torch.compile | rootclad vs eager | "
        "rootclad % of GEMM peak | launches per step (rootclad / eager / compile) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    variants, memory = [], []
    for name, by_batch in report["models"].items():
        for B, e in by_batch.items():
            ms, n = e["median_ms"], e["launches_per_step"]
            lines.append(
                f"| {name} | {B} | {ms['rootclad']:.4g} ms | {ms['torch eager']:.4g} ms | "
                f"{ms['torch.compile']:.4g} ms | x{e['speedup_vs_eager']['rootclad']} | "
                f"{100 * e['fraction_of_gemm_peak']['rootclad']:.1f}% | "
                f"{n['rootclad']} / {n['torch eager']} / {n['torch.compile']} |"
            )
            mem = e.get("memory_mib", {})
            memory.append(f"| {name} | {B} | {mem.get('rootclad stores')} | "
                          f"{mem.get('rootclad step')} | {mem.get('torch eager step')} |")  # fmt: skip
            direct = f"{ms[DIRECT]:.4g} ms ({n[DIRECT]})" if DIRECT in ms else "-"
            variants.append(f"| {name} | {B} | {ms['rootclad']:.4g} ms ({n['rootclad']}) | "
                            f"{ms[GRAPH]:.4g} ms ({n[GRAPH]}) | {direct} |")  # fmt: skip
    lines += ["", "rootclad's variants (launches per step in brackets): as above; each step "
              "replayed as one CUDA graph (`DeviceModel.cuda_graphs`); and the CNN with every "
              "convolution as direct kernels, where above those of 32 taps or more run as "
              "im2col and cuBLAS from 4096 output positions over the batch on:", "",
              "| model | batch | as above | CUDA graph | direct convolutions |",
              "|---|---:|---:|---:|---:|", *variants]  # fmt: skip
    lines += ["", "Memory (MiB): rootclad's act and d_act stores (activations, the ops' scratch "
              "and workspace, their adjoints; held between steps), and what one step allocates "
              "above what is held before it (torch.cuda's peak; autograd's saved activations, "
              "the gradients and temporaries for torch eager; none on the CPU):", "",
              "| model | batch | rootclad stores | rootclad step | torch eager step |",
              "|---|---:|---:|---:|---:|", *memory]  # fmt: skip
    return "\n".join(lines + [""])


if __name__ == "__main__":
    raise SystemExit(main())
