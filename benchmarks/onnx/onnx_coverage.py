"""How many of the export front-end's model families load from ONNX files and match
onnxruntime, with either of torch's exporters: the TorchScript-based one (``dynamo=False``) and
the default one (``dynamo=True``, which writes Reshape with ``allowzero=1``). Families: the
architectures no issue names (tests/fixtures/fresh_models.py), the model zoo's torchvision/timm
classifiers and the HEP models (tests/models/test_hep.py), all in eval mode, the batch axis
dynamic in the file.

Each file: exported by torch (a failure there is torch's, counted apart), loaded by
``rootclad.onnx.load`` in float32, and its output for a batch of 3 compared with onnxruntime's
(CPU provider) on the same file: max |a - b| <= 1e-4 (1 + max |b|) + 4 n, n how far torch's
own float32 output is from its float64 one (perturbed deep models lose up to 0.2 of outputs
near 60 to rounding, whoever runs them). A refusal is counted by
the ONNX op it names; anything else raised is a crash.

    python benchmarks/onnx/onnx_coverage.py [--families fresh,zoo,hep] [--out PATH]

Writes benchmarks/results/onnx_coverage.json.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import re
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "benchmarks" / "results" / "onnx_coverage.json"
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "models"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

EXPORTERS = ("torchscript", "dynamo")


def fresh():
    from fixtures.fresh_models import FRESH, fresh_inputs

    for name, build, shapes, _ in FRESH:
        torch.manual_seed(0)
        yield name, build().eval(), tuple(x.float() for x in fresh_inputs(shapes))


def zoo():
    from test_zoo import ZOO, _build

    for name in ZOO:
        x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        # not perturbed: in float32 the perturbed densenet121 overflows in torch itself
        yield name, _build(name, perturb=False).float().eval(), (x,)


def hep():
    from test_hep import MODELS

    for name, (build, inputs) in MODELS.items():
        torch.manual_seed(0)
        xs, _, _ = inputs(3, torch.Generator().manual_seed(1))
        net = build().float().eval()
        yield name, net, tuple(x.float() if x.is_floating_point() else x for x in xs)


def export(net, xs, exporter: str) -> bytes:
    names = [f"x{i}" for i in range(len(xs))]
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes = {n: {0: "B"} for n in names}
            torch.onnx.export(net, xs, buf, dynamo=False, input_names=names, dynamic_axes=axes)
        else:
            batch = torch.export.Dim("B", min=1)
            program = torch.onnx.export(
                net,
                xs,
                dynamo=True,
                input_names=names,
                dynamic_shapes=tuple({0: batch} for _ in xs),
                verbose=False,
            )
            program.save(buf)
    return buf.getvalue()


def float32_noise(net, xs) -> float:
    """How far torch's own float32 output is from its float64 one (the same float32 weights):
    deep models with perturbed weights lose that much to rounding, whoever runs them."""
    import copy

    with torch.no_grad():
        wide = copy.deepcopy(net).double()(
            *(x.double() if x.is_floating_point() else x for x in xs)
        )
        return float((net(*xs).double() - wide).abs().max())


def check(data: bytes, xs, noise: float = 0.0) -> None:
    import onnxruntime as ort

    import rootclad.onnx

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), xs, strict=True)}
    want = sess.run(None, feed)[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cm = rootclad.onnx.load(path, loss="mse", engine="pullback", dtype=torch.float32)
    got = cm.predict(*xs)
    got = next(iter(got.values())) if isinstance(got, dict) else got
    got = got[0] if isinstance(got, (tuple, list)) else got
    err = float(np.max(np.abs(got.numpy() - want)))
    if not err <= 1e-4 * (1 + float(np.max(np.abs(want)))) + 4 * noise:
        raise AssertionError(
            f"max |rootclad - onnxruntime| = {err:.3g} (float32 noise {noise:.3g})"
        )


def _outcome(data, xs, noise) -> tuple[str, str]:
    """('matched', ''), or ('refused' | 'wrong' | 'crashed', why)."""
    from rootclad.ir.graph import IRError

    try:
        check(data, xs, noise)
        return "matched", ""
    except IRError as exc:
        found = re.search(r"\((\w+), opset \d+\)|ATen op \S+", str(exc))
        return "refused", found.group(0) if found else str(exc)[:200]
    except AssertionError as exc:
        return "wrong", str(exc)[:300]
    except Exception as exc:
        return "crashed", f"{type(exc).__name__}: {str(exc)[:300]}"


def main(argv=None) -> int:

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="fresh,zoo,hep")
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    out = {"torch": torch.__version__}
    for family in args.families.split(","):
        got = {e: collections.defaultdict(dict) for e in EXPORTERS}
        for name, net, xs in globals()[family]():
            noise = float32_noise(net, xs)
            for exporter in EXPORTERS:
                try:
                    data = export(net, xs, exporter)
                except Exception as exc:  # torch's exporter: not rootclad's to count
                    got[exporter]["not exported"][name] = f"{type(exc).__name__}: {exc}"[:200]
                    continue
                kind, why = _outcome(data, xs, noise)
                got[exporter][kind][name] = why
                print(family, exporter, name, kind, flush=True)
        out[family] = {e: {k: dict(v) for k, v in r.items()} for e, r in got.items()}
        for e, r in got.items():
            n = sum(len(v) for v in r.values())
            print(family, e, {k: len(v) for k, v in r.items()}, "of", n, flush=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
