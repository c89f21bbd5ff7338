"""Device memory of the GW models' device programs per batch size: what `act` (the values, the
ops' scratch and the convolutions' workspace) and `d_act` (the values' adjoints) hold, from the
programs' own `{name}_act_size`, `_d_act_size` and `_workspace_size` (float32, 2048 samples
long). No GPU needed: the sizes are the program's, compiled here with g++ with d_act laid out
as on the GPU (planned from ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES on); d_act planned and with a
region each are also given at every size. A program without `_workspace_size` (before the
workspace was sized per batch) or without a d_act plan reports those as absent.

usage: python benchmarks/cuda/bench_device_memory.py [--out PATH]
Writes benchmarks/results/device_memory.json and docs/benchmarks/device_memory.md.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "device_memory.json"
TABLE = REPO / "docs" / "benchmarks" / "device_memory.md"
sys.path.insert(0, str(REPO / "benchmarks"))
BATCHES = (1, 5, 64, 1024, 4096)
LENGTH = 2048


def _sizes(make, tmp: Path) -> dict:
    """MB (10^6 bytes, float32) of act, its workspace and d_act at each batch size."""
    import torch

    import rootclad
    from rootclad.codegen.cuda import emit_device
    from rootclad.frontends.aten import graph_from_export
    from rootclad.toolchain import find_cxx

    graph = graph_from_export(make(LENGTH), torch.zeros(2, 1, LENGTH), "float32")
    src, so = tmp / f"{make.__name__}.cpp", tmp / f"{make.__name__}.so"
    src.write_text(emit_device(graph, "net"))
    as_gpu = "-DROOTCLAD_D_ACT_PLAN_MIN_VALUES=ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES"
    subprocess.run([find_cxx()[0], "-O0", "-std=c++17", "-shared", "-fPIC", as_gpu,
                    f"-I{rootclad.get_include()}", str(src), "-o", str(so)], check=True)  # fmt: skip
    lib = ctypes.CDLL(str(so))
    fns = {"act": lib.net_act_size, "d_act": lib.net_d_act_size}
    if hasattr(lib, "net_workspace_size"):
        fns["workspace"] = lib.net_workspace_size
    for fn in fns.values():
        fn.restype = ctypes.c_long
    per_sample = {  # d_act's two layouts, where the program has both
        k: int(m[1])
        for k, key in (("d_act_planned", "D_ACT_PLANNED"), ("d_act_flat", "D_ACT_FLAT"))
        if (m := re.search(rf"\b{key} = (\d+)", src.read_text()))
    }
    return {
        str(B): {
            **{k: round(fn(B) * 4 / 1e6, 1) for k, fn in fns.items()},
            **{k: round(B * n * 4 / 1e6, 1) for k, n in per_sample.items()},
        }
        for B in BATCHES
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    from report import run_header, write_report

    from rootclad.gw.models import gw_cnn, gw_resnet

    report = run_header(length=LENGTH, dtype="float32", models={})
    with tempfile.TemporaryDirectory() as tmp:
        for make in (gw_cnn, gw_resnet):
            report["models"][make.__name__] = _sizes(make, Path(tmp))
            print(make.__name__, report["models"][make.__name__], flush=True)
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    lines = [
        "# Device memory of the GW models' device programs",
        "",
        f"`benchmarks/cuda/bench_device_memory.py`, {report['date']}, rootclad "
        f"{report['rootclad']}: MB (float32) of `act` (values, scratch and the convolutions' "
        f"workspace, which is part of it) and `d_act` (the values' adjoints), inputs "
        f"{report['length']} samples long, from the programs' own size functions. `d_act` as "
        "the GPU lays it out: planned (adjoints alive at different times of the backward share "
        "memory) from 2^24 values on, a region each below, where one zero before the backward "
        "saves the launches that zero planned adjoints; the host loops plan at every size.",
        "",
        "| model | batch | act | of which workspace | d_act | d_act planned | d_act, a region each |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, by_batch in report["models"].items():
        for B, e in by_batch.items():
            cells = [e["act"], e.get("workspace", "-"), e["d_act"]]
            cells += [e.get("d_act_planned", "-"), e.get("d_act_flat", "-")]
            lines.append(f"| {name} | {B} | " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines + [""])


if __name__ == "__main__":
    raise SystemExit(main())
