"""Inference through ONNX: rootclad (the file imported by rootclad.onnx.load) next to
onnxruntime and torch eager, same process, same thread count.

Models: the GW CNN and MLP (``rootclad.gw.models``) and the 2-D digit CNN
(``rootclad.nets.digits_cnn``), exported by torch's TorchScript-based exporter. Measured:
latency at batch 1 and throughput at batch 256 (median of repeated calls, the three taking
turns for ROUNDS rounds), and rootclad's input gradient (``cm.input_grad``) against its own
forward pass. torch runs under ``torch.inference_mode()`` with glibc's allocator tuned
(MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ large: the script re-executes itself with them,
which roughly halves torch's CNN inference time on these machines); onnxruntime uses the CPU
provider with as many intra-op threads as torch.

usage: python benchmarks/onnx/bench_inference.py [--quick] [--out PATH]
Writes benchmarks/results/onnx_inference.json and docs/benchmarks/onnx_inference.md.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "onnx_inference.json"
TABLE = REPO / "docs" / "benchmarks" / "onnx_inference.md"
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "core"))
ROUNDS = 3
MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def _model(name: str):
    import torch

    from rootclad.gw.models import gw_cnn, gw_mlp
    from rootclad.nets import digits_cnn

    torch.manual_seed(0)
    if name == "gw-cnn":
        return gw_cnn(2048).eval(), (1, 2048)
    if name == "gw-mlp":
        return gw_mlp(2048).eval(), (2048,)
    return digits_cnn().eval(), (1, 28, 28)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short timing windows")
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    if any(os.environ.get(k) != v for k, v in MALLOC.items()):  # torch's allocator, tuned
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})

    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from bench_train_step import time_steps
    from report import run_header, write_report

    import rootclad

    threads = torch.get_num_threads()
    min_time = 0.3 if args.quick else 1.5
    report = run_header(threads=threads, onnxruntime=ort.__version__, rounds=ROUNDS, models={})
    for name in ("gw-cnn", "gw-mlp", "digits-cnn"):
        net, shape = _model(name)
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, torch.zeros(2, *shape), buf, dynamo=False,
                              input_names=["x"], dynamic_axes={"x": {0: "B"}})  # fmt: skip
        model = onnx.load_from_string(buf.getvalue())
        cm = rootclad.onnx.load(model, engine="pullback")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
        entry = report["models"].setdefault(name, {"engine": cm.engine})
        for batch in (1, 256):
            x = torch.randn(batch, *shape)
            xn = x.numpy()
            np.testing.assert_allclose(cm.predict(x).numpy(), sess.run(None, {"x": xn})[0],
                                       rtol=1e-3, atol=1e-4)  # fmt: skip

            def torch_fwd(x=x, net=net):
                with torch.inference_mode():
                    net(x)

            calls = {
                "rootclad": lambda x=x, cm=cm: cm.predict(x),
                "onnxruntime": lambda xn=xn, sess=sess: sess.run(None, {"x": xn}),
                "torch eager": torch_fwd,
                "rootclad input_grad": lambda x=x, cm=cm: cm.input_grad(x),
            }
            times = {k: [] for k in calls}
            for _ in range(ROUNDS):
                for k, fn in calls.items():
                    times[k] += time_steps(fn, min_time / ROUNDS)
            med = {k: statistics.median(v) for k, v in times.items()}
            entry[str(batch)] = {
                "median_ms": {k: round(v, 4) for k, v in med.items()},
                "samples_per_s": {k: round(batch / v * 1e3, 1) for k, v in med.items()},
                "rootclad_speedup": {
                    k: round(med[k] / med["rootclad"], 2) for k in ("onnxruntime", "torch eager")
                },
                "input_grad_over_forward": round(med["rootclad input_grad"] / med["rootclad"], 2),
            }
            print(name, batch, entry[str(batch)], flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    lines = [
        "# Inference of imported ONNX models: rootclad next to onnxruntime and torch eager",
        "",
        f"`benchmarks/onnx/bench_inference.py`, {report['date']}, {report['machine']}, "
        f"{report['threads']} threads, torch {report['torch']}, onnxruntime "
        f"{report['onnxruntime']}. Median of repeated calls over {report['rounds']} interleaved "
        "rounds; torch under inference_mode with glibc's allocator tuned; speed-up = the other's "
        "time / rootclad's.",
        "",
        "| model | batch | rootclad | onnxruntime | torch eager | vs onnxruntime | vs torch | "
        "input gradient / forward |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in report["models"].items():
        for batch in ("1", "256"):
            e = entry[batch]
            ms, sp = e["median_ms"], e["rootclad_speedup"]
            lines.append(
                f"| {name} | {batch} | {ms['rootclad']:.4g} ms | {ms['onnxruntime']:.4g} ms | "
                f"{ms['torch eager']:.4g} ms | x{sp['onnxruntime']} | x{sp['torch eager']} | "
                f"{e['input_grad_over_forward']} |"
            )
    lines += [""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
