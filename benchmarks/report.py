"""Writing a benchmark's result: the JSON and its markdown table, each to a temporary name and
renamed. The tracked table is written only for the tracked result: a run with --out elsewhere
writes its table beside its JSON, so a scratch run never overwrites the docs."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path


def run_header(**extra) -> dict:
    """What every result starts with: the day, the machine, the versions of torch and
    rootclad, then ``extra``."""
    import torch

    import rootclad

    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "torch": torch.__version__,
        "rootclad": rootclad.__version__,
        **extra,
    }


def write_report(report: dict, out: Path, result: Path, table: Path,
                 render: Callable[[dict], str], md: Path | None = None) -> int:  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    if md is None:
        md = table if out.resolve() == result.resolve() else out.with_suffix(".md")
    md.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((out, json.dumps(report, indent=1)), (md, render(report))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    print(f"wrote {out} and {md}")
    return 0
