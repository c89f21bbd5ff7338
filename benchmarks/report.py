"""Writing a benchmark's result: the JSON and its markdown table, each to a temporary name and
renamed. The tracked table is written only for the tracked result: a run with --out elsewhere
writes its table beside its JSON, so a scratch run never overwrites the docs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


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
