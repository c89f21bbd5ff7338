"""How many of the fx front-end's op cases the export front-end (frontend="export") compiles
and matches, float64, against torch autograd (output, input and parameter gradients), and
what it refuses, by ATen op. Writes benchmarks/results/export_coverage.json.

    python benchmarks/core/export_coverage.py
"""

from __future__ import annotations

import collections
import copy
import json
import re
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "benchmarks" / "results" / "export_coverage.json"
sys.path.insert(0, str(REPO / "tests"))

import torch  # noqa: E402
from fixtures.core import check_against_torch  # noqa: E402
from fixtures.op_cases import CASES, TORCH_RTOL_F64, sample_input  # noqa: E402

from rootclad.frontends.aten import graph_from_export  # noqa: E402
from rootclad.ir.graph import IRError  # noqa: E402


def main() -> None:
    warnings.simplefilter("ignore")
    matched, wrong, crashed, refused = [], {}, {}, collections.Counter()
    for name, build, shape, *_ in CASES:
        torch.manual_seed(0)
        net, x = build(), sample_input(shape)
        try:
            graph_from_export(copy.deepcopy(net).double(), x[:1].double(), "float64")
        except IRError as exc:
            found = re.search(r"ATen op \S+|module '[^']*' \(\w+\)|torch\.export[^:]*", str(exc))
            refused[found.group(0) if found else str(exc)[:80]] += 1
            continue
        except Exception as exc:  # a crash: counted, named
            crashed[name] = repr(exc)[:300]
            continue
        try:
            check_against_torch(
                net,
                x,
                engine="pullback",
                loss="mse",
                frontend="export",
                against_all=any(True for _ in net.parameters()),
                rtol=TORCH_RTOL_F64.get(name),
            )
            matched.append(name)
        except AssertionError as exc:
            wrong[name] = str(exc)[:300]
        except Exception as exc:
            crashed[name] = repr(exc)[:300]
    out = {
        "cases": len(CASES),
        "matched": len(matched),
        "wrong": wrong,
        "crashed": crashed,
        "refused": dict(refused.most_common()),
        "torch": torch.__version__,
    }
    RESULT.write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{len(matched)} of {len(CASES)} match, {len(wrong)} wrong, {len(crashed)} crashed, "
        f"{sum(refused.values())} refused; {RESULT}"
    )


if __name__ == "__main__":
    main()
