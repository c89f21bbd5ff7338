"""How many of the fx front-end's op cases, of the model zoo's torchvision/timm classifiers
and of architectures no issue names (tests/fixtures/fresh_models.py), the export front-end
(frontend="export") compiles and matches, float64, against
torch autograd (output, input and parameter gradients, as tests/models/test_zoo.py checks the
fx front-end), and what it refuses, by ATen op. Writes benchmarks/results/export_coverage.json.

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
from fixtures.core import check_against_torch, perturbed  # noqa: E402
from fixtures.op_cases import CASES, TORCH_RTOL_F64, sample_input  # noqa: E402

import rootclad  # noqa: E402
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
                against_all=any(True for _ in net.parameters()),
                rtol=TORCH_RTOL_F64.get(name),
            )
            matched.append(name)
        except AssertionError as exc:
            wrong[name] = str(exc)[:300]
        except Exception as exc:
            crashed[name] = repr(exc)[:300]
    zoo, fresh, hep, recurrent = _zoo(), _fresh(), _hep(), _recurrent()
    out = {
        "zoo": zoo,
        "fresh": fresh,
        "hep": hep,
        "recurrent": recurrent,
        "cases": len(CASES),
        "matched": len(matched),
        "wrong": wrong,
        "crashed": crashed,
        "refused": dict(refused.most_common()),
        "torch": torch.__version__,
    }
    RESULT.write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"zoo: {len(zoo['matched'])} of {zoo['models']} match, {len(zoo['wrong'])} wrong, "
        f"{len(zoo['crashed'])} crashed, refused: {zoo['refused']}"
    )
    for family, got in (("fresh", fresh), ("hep", hep), ("recurrent", recurrent)):
        print(
            f"{family}: {len(got['matched'])} of {got['models']} match, {len(got['wrong'])} "
            f"wrong, {len(got['crashed'])} crashed, refused: {got['refused']}"
        )
    print(
        f"{len(matched)} of {len(CASES)} match, {len(wrong)} wrong, {len(crashed)} crashed, "
        f"{sum(refused.values())} refused; {RESULT}"
    )


def _zoo() -> dict:
    from fixtures.zoo import RTOL
    from models.test_zoo import ZOO, _build

    def check(name):
        net = _build(name).eval()
        x = torch.randn(
            2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
        )
        check_against_torch(
            net,
            x,
            torch.float64,
            engine="pullback",
            rtol=RTOL.get(name, 1e-9),
            loss="cross_entropy",
            against_all=True,
        )

    return _family(list(ZOO), check)


def _fresh() -> dict:
    """tests/fixtures/fresh_models.py: architectures no issue names, as their authors wrote
    them (as tests/frontends/test_aten_fresh.py checks them)."""
    from fixtures.fresh_models import FRESH, fresh_inputs

    builds = {name: (build, shapes) for name, build, shapes, _ in FRESH}

    def check(name):
        torch.manual_seed(0)
        build, shapes = builds[name]
        xs = fresh_inputs(shapes)
        check_against_torch(
            build().double(),
            xs if len(xs) > 1 else xs[0],
            engine="pullback",
            loss="mse",
            against_all=True,
        )

    return _family(list(builds), check)


def _hep() -> dict:
    """tests/models/test_hep.py's architectures (masks as bool inputs), in eval mode: output,
    float inputs' and parameters' gradients (as that test checks the fx front-end)."""
    from models.test_hep import MODELS

    def check(name):
        build, inputs = MODELS[name]
        torch.manual_seed(0)
        net = perturbed(build().double()).eval()
        xs, _, loss = inputs(3, torch.Generator().manual_seed(1))
        cm = rootclad.compile(
            copy.deepcopy(net),
            xs if len(xs) > 1 else xs[0],
            loss=loss,
            engine="pullback",
        )
        _compare(net, cm, xs)

    return _family(list(MODELS), check)


def _recurrent() -> dict:
    """tests/torch/test_recurrent.py's LSTM and GRU taggers (layers, directions, time first,
    no bias, an initial state computed from the input)."""
    import importlib.util

    from torch import nn

    # tests/torch/ is no package ("torch" is torch's): the file read by its path
    spec = importlib.util.spec_from_file_location(
        "recurrent_cases", REPO / "tests" / "torch" / "test_recurrent.py"
    )
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    CONFIGS, Tagger = cases.CONFIGS, cases.Tagger

    def check(name):
        kind, config = name.split(":")
        torch.manual_seed(0)
        net = perturbed(Tagger(getattr(nn, kind), **CONFIGS[config]).double()).eval()
        x = torch.randn(3, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="pullback")
        _compare(net, cm, (x,))

    return _family([f"{k}:{c}" for k in ("LSTM", "GRU") for c in CONFIGS], check)


def _compare(net, cm, xs) -> None:
    """Output, the float inputs' and the parameters' gradients against torch's, float64."""
    from fixtures.core import assert_close_rel, assert_grads_close
    from models.test_hep import _vjp

    out_ref = net(*xs)
    d_out = torch.randn(
        out_ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4)
    )
    out_ref, dx_ref, dp_ref = _vjp(net, list(net.parameters()), xs, d_out)
    out, dx, dp = _vjp(cm, list(cm.parameters()), xs, d_out)
    assert_close_rel(out, out_ref, 1e-9, "forward")
    for a, e in zip(dx, dx_ref, strict=True):
        if e is None:
            assert a is None or float(a.abs().max()) == 0
        else:
            assert_close_rel(a, e, 1e-9, "d_input")
    names = [n for n, _ in net.named_parameters()]
    zero = [torch.zeros_like(p) for p in net.parameters()]
    dp, dp_ref = (
        [z if g is None else g for g, z in zip(d, zero, strict=True)] for d in (dp, dp_ref)
    )
    assert_grads_close(
        dict(zip(names, dp, strict=True)),
        dict(zip(names, dp_ref, strict=True)),
        1e-9,
        "parameters",
        against_all=True,
    )


def _family(names, check) -> dict:
    """Each model of ``names`` checked by ``check(name)``: matched, wrong, crashed, refused."""
    matched, wrong, crashed, refused = [], {}, {}, {}
    for name in names:
        try:
            check(name)
            matched.append(name)
        except IRError as exc:
            found = re.search(r"ATen op \S+|module '[^']*' \(\w+\)|torch\.export[^:]*", str(exc))
            refused[name] = found.group(0) if found else str(exc)[:80]
        except AssertionError as exc:
            wrong[name] = str(exc)[:300]
        except Exception as exc:
            crashed[name] = repr(exc)[:300]
    return {
        "models": len(names),
        "matched": matched,
        "wrong": wrong,
        "crashed": crashed,
        "refused": refused,
    }


if __name__ == "__main__":
    main()
