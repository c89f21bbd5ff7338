"""torch's own OpInfo sample inputs through the export front-end (tests/fixtures/opinfo.py: up
to 8 samples of each op rootclad lowers, each applied to every sample of a batch of 3), one
model per sample, float64, against torch autograd: the output and the input's gradient.
Counts per op: matched, wrong, crashed, refused (by reason), and those torch.export cannot
capture (vmap of the op, torch's limit, not rootclad's). Writes
benchmarks/results/export_opinfo.json.

    python benchmarks/core/export_opinfo.py
"""

from __future__ import annotations

import collections
import json
import re
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "benchmarks" / "results" / "export_opinfo.json"
sys.path.insert(0, str(REPO / "tests"))

import torch  # noqa: E402
from fixtures.core import assert_close_rel, compiled_vjp, torch_vjp  # noqa: E402
from fixtures.opinfo import RTOL, sample_models  # noqa: E402

import rootclad  # noqa: E402
from rootclad.frontends.aten import graph_from_export  # noqa: E402
from rootclad.ir.graph import IRError  # noqa: E402


def check(mod, x, rtol: float) -> None:
    """Output and input gradient against torch's (an all-zero reference must be met exactly:
    a comparison's output, a sign's gradient)."""
    cm = rootclad.compile(mod, x, loss="mse", engine="pullback")
    out_ref, d_out, dx_ref, _ = torch_vjp(mod, x)
    out, dx, _ = compiled_vjp(cm, x, d_out)
    assert_close_rel(out, out_ref, rtol, "forward", nonzero=False)
    assert_close_rel(dx, dx_ref, rtol, "d_input", nonzero=False)


def main() -> None:
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    per_op = collections.defaultdict(collections.Counter)
    wrong, crashed, refused = {}, {}, collections.Counter()
    for name, mod, x in sample_models(limit=8):
        op = name.split("#")[0]
        try:
            graph_from_export(mod, x, "float64")
        except IRError as exc:
            text = str(exc)
            if text.startswith("torch.export could not capture"):
                per_op[op]["not captured by torch.export"] += 1
                continue
            found = re.search(r"ATen op \S+", text)
            refused[f"{op}: {found.group(0) if found else text[:90]}"] += 1
            per_op[op]["refused"] += 1
            continue
        except Exception as exc:
            crashed[name] = repr(exc)[:300]
            per_op[op]["crashed"] += 1
            continue
        try:
            check(mod, x, RTOL.get(op, 1e-10))
            per_op[op]["matched"] += 1
        except AssertionError as exc:
            wrong[name] = str(exc)[:300]
            per_op[op]["wrong"] += 1
        except Exception as exc:
            crashed[name] = repr(exc)[:300]
            per_op[op]["crashed"] += 1
    total = collections.Counter()
    for counts in per_op.values():
        total.update(counts)
    out = {
        "samples": dict(total),
        "ops": len(per_op),
        "ops_matching_every_sample_taken": sorted(
            op
            for op, c in per_op.items()
            if c["matched"] and set(c) <= {"matched", "not captured by torch.export"}
        ),
        "per_op": {op: dict(c) for op, c in sorted(per_op.items())},
        "wrong": wrong,
        "crashed": crashed,
        "refused": dict(refused.most_common()),
        "torch": torch.__version__,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    RESULT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{dict(total)} over {len(per_op)} ops; {RESULT}")


if __name__ == "__main__":
    main()
