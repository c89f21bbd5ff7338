"""Train-step speed and memory: rootclad's engines next to torch eager, torch.compile and LibTorch.

For the issue's MLP (2048-256-64-1) and CNN (three Conv1d/ReLU/MaxPool1d blocks + two Linear)
at batch 1, 16, 64 and 256, one full training step with Adam (forward, BCE-with-logits loss,
backward, update) is timed in this process, side by side: torch eager, torch.compile
(inductor), rootclad's pullback engine and, where Clad is installed, the clad engine with and
without custom pullbacks. Torch eager and the rootclad engines with pullbacks take turns
(ROUNDS rounds each), so that the host's load changes fall on all of them. A LibTorch C++
program runs the same step in its own process.
Reported: median step time, achieved GFLOP/s (3 x the forward FLOPs per step) as a fraction
of this machine's sgemm peak (measured here, same threads), first-compile and warm-cache load
times and peak RSS (in fresh processes).

usage: python benchmarks/core/bench_train_step.py [--quick] [--no-torch-compile] [--no-libtorch]
Writes benchmarks/results/train_step.json and docs/benchmarks/train_step.md (with --out
elsewhere: that JSON and a table beside it).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "train_step.json"
TABLE = REPO / "docs" / "benchmarks" / "train_step.md"
sys.path.insert(0, str(REPO / "benchmarks"))
BATCHES = (1, 16, 64, 256)
ROUNDS = 3  # turns each in-process implementation takes (see main)
ENGINES = (("pullback", True), ("clad", True), ("clad", False))


def make_model(name: str) -> torch.nn.Module:
    from rootclad.gw.models import make

    return make(name)


def example(name: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(batch)
    shape = (batch, 2048) if name == "mlp" else (batch, 1, 2048)
    return torch.randn(shape, generator=g), torch.randint(0, 2, (batch,), generator=g).float()


def forward_flops(net: torch.nn.Module, x: torch.Tensor) -> float:
    """2 x multiply-adds of the Linear and Conv1d layers for one forward pass of x."""
    total = 0

    def hook(mod, inp, out):
        nonlocal total
        if isinstance(mod, torch.nn.Linear):
            total += 2 * out.numel() * mod.in_features
        elif isinstance(mod, torch.nn.Conv1d):
            total += 2 * out.numel() * mod.in_channels * mod.kernel_size[0]

    handles = [m.register_forward_hook(hook) for m in net.modules()]
    with torch.no_grad():
        net(x)
    for h in handles:
        h.remove()
    return float(total)


def sgemm_peak_gflops(threads: int, n: int = 2048) -> float:
    """Best GFLOP/s of OpenBLAS sgemm (n x n) with `threads` threads, in this process
    (so with the OpenBLAS kernels that rootclad's own calls use)."""
    import numpy as np

    lib = _openblas()
    f = lib.scipy_cblas_sgemm
    P = ctypes.c_void_p
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, P, ctypes.c_int, P, ctypes.c_int,
                                       ctypes.c_float, P, ctypes.c_int]  # fmt: skip
    lib.scipy_openblas_set_num_threads(threads)
    a, b = (np.random.default_rng(0).random((n, n), dtype=np.float32) for _ in range(2))
    c = np.zeros((n, n), np.float32)
    best, start, runs = float("inf"), time.perf_counter(), 0
    while runs < 10 or time.perf_counter() - start < 2.0:  # the best of >= 2 s of runs
        t = time.perf_counter()
        f(101, 111, 111, n, n, n, 1.0, a.ctypes.data, n, b.ctypes.data, n, 0.0, c.ctypes.data, n)
        best = min(best, time.perf_counter() - t)
        runs += 1
    return 2 * n**3 / best / 1e9


def _openblas():
    import scipy_openblas32 as ob

    lib = ctypes.CDLL(os.path.join(ob.get_lib_dir(), f"lib{ob.get_library()}.so"))
    lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
    return lib


def sgemm_peaks(threads: int) -> dict:
    """sgemm peaks with the OpenBLAS kernels this process uses and, on a CPU with AVX-512
    whose OpenBLAS kernels were chosen otherwise (OPENBLAS_CORETYPE, or a CPU OpenBLAS
    does not know), with its AVX-512 kernels in a child process. The machine's peak is the
    larger: rootclad's own kernels use AVX-512 wherever -march=native allows it."""
    core = _openblas().scipy_openblas_get_corename().decode()
    peaks = {core: {str(t): sgemm_peak_gflops(t) for t in (1, threads)}}
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " avx512f" in flags and core != "SkylakeX":
        env = {**os.environ, "OPENBLAS_CORETYPE": "SkylakeX"}
        out = subprocess.run([sys.executable, __file__, "--peak-child", str(threads)], env=env,
                             capture_output=True, text=True, check=True)  # fmt: skip
        peaks.update(json.loads(out.stdout))
    return peaks


def time_steps(step, min_time: float, min_reps: int = 5, max_reps: int = 300) -> list[float]:
    """Times of repeated calls (ms), after warm-up calls, for at least min_time seconds."""
    t = time.perf_counter()
    step()
    if time.perf_counter() - t < 0.5:  # slow implementations get one warm-up call only
        for _ in range(2):
            step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (
        len(times) < min_reps or time.perf_counter() - start < min_time
    ):
        t = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t))
    return times


def taking_turns(impls: dict, min_time: float, rounds: int) -> dict[str, list[float]]:
    """Each implementation's call times (ms), the implementations taking turns for ``rounds``
    rounds of ``min_time / rounds`` seconds each (a machine that slows down slows them all)."""
    times: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(rounds):
        for k, fn in impls.items():
            times[k] += time_steps(fn, min_time / rounds)
    return times


def torch_step(net, x, y, compiled: bool = False):
    model = torch.compile(net, dynamic=False) if compiled else net
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    lossf = torch.nn.BCEWithLogitsLoss()

    def step():
        opt.zero_grad()
        lossf(model(x).squeeze(1), y).backward()
        opt.step()

    return step


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM belongs to the address space, which exec
    replaces; ru_maxrss would carry over the parent's peak into a child."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_child(model: str, impl: str, batch: int) -> dict:
    """Runs in a fresh process: warm-cache load time and peak RSS of one implementation."""
    import rootclad

    torch.manual_seed(0)
    net = make_model(model)
    x, y = example(model, batch)
    base = peak_rss_mb()
    out = {"baseline_rss_mb": base}
    if impl == "torch-eager":
        step = torch_step(net, x, y)
    else:
        engine, pullbacks = impl.split("/")
        t = time.perf_counter()
        cm = rootclad.compile(net, x, engine=engine, pullbacks=pullbacks == "pullbacks")
        out["warm_load_s"] = time.perf_counter() - t
        out["built_now"] = cm.built_now
        opt = rootclad.optim.Adam(cm, lr=1e-3)

        def step():
            cm.train_step(x, y, opt)

    for _ in range(5):
        step()
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def run_rss_child(model: str, impl: str, batch: int) -> dict:
    cmd = [sys.executable, __file__, "--rss-child", model, impl, str(batch)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        return {"error": res.stderr[-2000:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def impl_name(engine: str, pullbacks: bool) -> str:
    return f"{engine}/{'pullbacks' if pullbacks else 'no-pullbacks'}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short timing windows")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--no-libtorch", action="store_true")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument(
        "--memory-only",
        action="store_true",
        help="redo only the load-time/peak-RSS part of an existing result file",
    )
    ap.add_argument("--out", type=Path, default=RESULT, help=f"the JSON result (default {RESULT})")
    ap.add_argument(
        "--table",
        type=Path,
        default=None,
        help=f"the markdown table (default {TABLE} with the default --out, else the --out "
        "path with .md: a scratch run never overwrites the tracked docs table)",
    )
    ap.add_argument(
        "--rss-child", nargs=3, metavar=("MODEL", "IMPL", "BATCH"), help=argparse.SUPPRESS
    )
    ap.add_argument("--peak-child", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peak_child:
        core = _openblas().scipy_openblas_get_corename().decode()
        peaks = {str(t): sgemm_peak_gflops(t) for t in (1, args.peak_child)}
        print(json.dumps({core: peaks}))
        return 0
    if args.rss_child:
        m, impl, b = args.rss_child
        print(json.dumps(rss_child(m, impl, int(b))))
        return 0

    if args.memory_only:
        report = json.loads(args.out.read_text())
        for model in report["compile"]:
            for impl in ["torch-eager", *(k for k in report["compile"][model] if "/" in k)]:
                report["memory"].setdefault(model, {})[impl] = run_rss_child(model, impl, 256)
        return write_report(report, args.out, args.table)

    import rootclad
    from rootclad.toolchain import find_clad

    # Cold compiles go to a fresh cache; the children then load from it (warm).
    os.environ["ROOTCLAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="rootclad-bench-")
    threads = torch.get_num_threads()
    clad, why = find_clad()
    engines = [e for e in ENGINES if e[0] != "clad" or clad]
    min_time = 0.3 if args.quick else 1.5
    report = {
        "what": "one Adam training step (forward, BCE-with-logits, backward, update), float32",
        "rounds": ROUNDS,
        "fresh_start": True,  # every timed block from the same weights (see the loop below)
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": threads,
            "rootclad_threads": threads,
        },  # fmt: skip
        "clad": f"Clad at {clad.plugin}" if clad else f"absent: {why}",
        "sgemm_peaks_by_openblas_core": sgemm_peaks(threads),
        "compile": {},
        "memory": {},
        "results": [],
    }
    by_core = report["sgemm_peaks_by_openblas_core"]
    report["sgemm_peak_gflops"] = {
        k: max(p[k] for p in by_core.values()) for k in next(iter(by_core.values()))
    }
    peak = report["sgemm_peak_gflops"][str(threads)]
    print(f"sgemm peaks: {by_core} GFLOP/s", flush=True)

    libtorch_exe = None
    if not args.no_libtorch:
        from rootclad.torch.libtorch import build_program

        t = time.perf_counter()
        libtorch_exe, _ = build_program(HERE / "libtorch_train_step.cpp", "bench_train_step",
                                        opt_flags=("-O2",))  # fmt: skip
        print(f"built the LibTorch program in {time.perf_counter() - t:.0f} s", flush=True)

    for model in args.models.split(","):
        torch.manual_seed(0)
        compiled = {}
        for engine, pullbacks in engines:
            name = impl_name(engine, pullbacks)
            x, _ = example(model, 16)
            t = time.perf_counter()
            compiled[name] = rootclad.compile(make_model(model), x, engine=engine,
                                              pullbacks=pullbacks)  # fmt: skip
            report["compile"].setdefault(model, {})[name] = {
                "first_compile_s": time.perf_counter() - t,
                "built_now": compiled[name].built_now,
            }
            print(f"{model} {name}: first compile {time.perf_counter() - t:.1f} s", flush=True)
        for batch in BATCHES:
            x, y = example(model, batch)
            flops = 3 * forward_flops(make_model(model), x)
            # Every timed block starts from the same weights and a fresh optimizer: trained
            # on one batch, a network's Adam moments of zero-gradient weights decay into
            # subnormal floats after some 800 steps (0.9^n), and every step then took ~6x
            # longer (the MLP at batch 1), so whichever implementation had taken more steps
            # looked slower.
            init = make_model(model).state_dict()

            def torch_eager(init=init, x=x, y=y, model=model):
                net = make_model(model)
                net.load_state_dict(init)
                return torch_step(net, x, y)

            def fresh(cm, init=init, x=x, y=y):
                cm.load_state_dict(init)
                opt = rootclad.optim.Adam(cm, lr=1e-3)
                return lambda: cm.train_step(x, y, opt)

            steps = {"torch-eager": torch_eager}
            for name, cm in compiled.items():
                steps[name] = lambda cm=cm, fresh=fresh: fresh(cm)
            # torch eager and the fast engines take turns, ROUNDS times, so that a burst of
            # load on this shared host falls on all of them alike; Clad without pullbacks
            # (seconds a step) is timed once
            rows = {name: [] for name in steps}
            for _ in range(ROUNDS):
                for name, make_step in steps.items():
                    if not name.endswith("no-pullbacks"):
                        rows[name] += time_steps(make_step(), min_time / ROUNDS)
            for name, make_step in steps.items():
                if name.endswith("no-pullbacks"):
                    reps = 3 if batch >= 64 else 5
                    rows[name] = time_steps(make_step(), min_time, min_reps=reps)
            if not args.no_torch_compile:
                torch._dynamo.reset()
                t = time.perf_counter()
                step = torch_step(make_model(model), x, y, compiled=True)
                step()
                report["compile"].setdefault(model, {}).setdefault("torch.compile", {})[
                    str(batch)] = time.perf_counter() - t  # fmt: skip
                rows["torch.compile"] = time_steps(step, min_time)
            if libtorch_exe is not None:
                reps = max(
                    5,
                    min(
                        200, int(min_time * 1e3 / max(statistics.median(rows["torch-eager"]), 0.05))
                    ),
                )
                res = subprocess.run([str(libtorch_exe), model, str(batch), str(reps)],
                                     capture_output=True, text=True, timeout=900)  # fmt: skip
                rows["libtorch"] = json.loads(res.stdout)["times_ms"]
            eager = statistics.median(rows["torch-eager"])
            for impl, times in rows.items():
                med = statistics.median(times)
                entry = {"model": model, "batch": batch, "impl": impl, "median_ms": med,
                         "repeats": len(times), "times_ms": times,
                         "gflops": flops / med / 1e6, "fraction_of_peak": flops / med / 1e6 / peak,
                         "speedup_vs_eager": eager / med}  # fmt: skip
                report["results"].append(entry)
                print(
                    f"{model:3s} B={batch:<4d} {impl:22s} {med:9.3f} ms  x{eager / med:5.2f} "
                    f"vs eager  {100 * entry['fraction_of_peak']:5.1f}% of sgemm peak",
                    flush=True,
                )
        for impl in ["torch-eager", *compiled]:
            report["memory"].setdefault(model, {})[impl] = run_rss_child(model, impl, 256)

    return write_report(report, args.out, args.table)


def write_report(report: dict, out: Path, md: Path | None = None) -> int:
    """The JSON result and its markdown table (benchmarks/report.py)."""
    from report import write_report as write

    return write(report, out, RESULT, TABLE, render_markdown, md)


def render_markdown(report: dict) -> str:
    impls = []
    for r in report["results"]:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    peak = report["sgemm_peak_gflops"]
    m = report["machine"]
    lines = [
        "# Train-step benchmark",
        "",
        "Generated by `python benchmarks/core/bench_train_step.py` from "
        "`benchmarks/results/train_step.json`; do not edit by hand.",
        "",
        f"{report['what']}. Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} with "
        f"{m['torch_threads']} threads, rootclad with {m['rootclad_threads']} threads. "
        "OpenBLAS sgemm peaks measured in the same run: "
        + "; ".join(
            f"{core} kernels "
            + ", ".join(
                f"{v:.0f} GFLOP/s ({k} thread{'s' if k != '1' else ''})" for k, v in p.items()
            )  # fmt: skip
            for core, p in report.get("sgemm_peaks_by_openblas_core", {"": peak}).items()
        )
        + ". The % below is of the larger."
        + f" Clad: {report['clad']}.",
        "",
        "Median step time in ms (speed-up over torch eager in brackets; % = achieved GFLOP/s "
        "of 3x the forward FLOPs, as a fraction of the sgemm peak). Torch eager and the "
        f"engines with pullbacks were timed in {report.get('rounds', 1)} alternating rounds"
        + (
            ", each block from the same initial weights and a fresh Adam"
            if report.get("fresh_start")
            else ""
        )
        + ":",
        "",
    ]
    for model in dict.fromkeys(r["model"] for r in report["results"]):
        lines += [f"## {model.upper()}", "", "| batch | " + " | ".join(impls) + " |",
                  "|---:|" + "---:|" * len(impls)]  # fmt: skip
        for batch in dict.fromkeys(r["batch"] for r in report["results"] if r["model"] == model):
            cells = []
            for impl in impls:
                r = next((r for r in report["results"] if r["model"] == model and
                          r["batch"] == batch and r["impl"] == impl), None)  # fmt: skip
                cells.append("—" if r is None else
                             f"{r['median_ms']:.2f} (x{r['speedup_vs_eager']:.2f}, "
                             f"{100 * r['fraction_of_peak']:.0f}%)")  # fmt: skip
            lines.append(f"| {batch} | " + " | ".join(cells) + " |")
        comp = report["compile"].get(model, {})
        mem = report["memory"].get(model, {})
        lines += ["", "| implementation | first compile (s) | warm-cache load (s) | peak RSS at "
                  "batch 256 (MB) |", "|---|---:|---:|---:|"]  # fmt: skip
        for impl, c in comp.items():
            if impl == "torch.compile":
                first = ", ".join(f"B={b}: {s:.1f}" for b, s in c.items())
                lines.append(f"| torch.compile | {first} | — | — |")
                continue
            mm = mem.get(impl, {})
            lines.append(f"| {impl} | {c['first_compile_s']:.2f} | "
                         f"{mm.get('warm_load_s', float('nan')):.3f} | "
                         f"{mm.get('peak_rss_mb', float('nan')):.0f} |")  # fmt: skip
        if "torch-eager" in mem:
            lines.append(
                f"| torch-eager | — | — | {mem['torch-eager'].get('peak_rss_mb', 0):.0f} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
