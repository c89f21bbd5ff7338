"""Speed of real architectures (issues 27, 45): rootclad next to torch eager and onnxruntime,
same process, same thread count.

Models: torchvision's resnet18, mobilenet_v2 and efficientnet_b0 at (3, 64, 64), 3 classes; a
small transformer encoder (two nn.TransformerEncoderLayer of width 64, 4 heads, over 32 tokens
of 16 features, no dropout, mean over the tokens classified); the GW ResNet (rootclad.gw, 2048
samples, one logit, binary cross-entropy); a 2-layer LSTM tagger (8 features over 25 steps,
hidden 32, its last state classified); and, from tests/models/test_hep.py, the
Particle-Transformer-style encoder and DeepSets (16 particles, with their masks). At batch 1
and 32: one Adam training step (forward, loss, backward, update) for torch eager and rootclad's
pullback engine, and inference: rootclad's ``predict``, torch eager under
``torch.inference_mode()`` and onnxruntime (CPU provider, as many intra-op threads as torch) on
the file torch's exporter writes. The implementations take turns for ROUNDS rounds; each
reports the median of all its calls. The first compile (fresh cache) is recorded too. Then the
layer families (LAYERS): GFLOP/s against this run's sgemm peak.

usage: python benchmarks/models/bench_zoo_speed.py [--quick] [--models a,b] [--no-layers]
[--out PATH]
Writes benchmarks/results/zoo_speed.json and docs/benchmarks/zoo_speed.md.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "zoo_speed.json"
TABLE = REPO / "docs" / "benchmarks" / "zoo_speed.md"
for p in (REPO / "benchmarks", REPO / "benchmarks" / "core", REPO / "tests",
          REPO / "tests" / "models"):  # fmt: skip
    sys.path.insert(0, str(p))
BATCHES = (1, 32)
ROUNDS = 3
MODELS = (
    "resnet18",
    "mobilenet_v2",
    "efficientnet_b0",
    "transformer-encoder",
    "gw-resnet",
    "lstm-tagger",
    "particle-transformer",
    "deepsets",
)
VISION = ("resnet18", "mobilenet_v2", "efficientnet_b0")
BINARY = ("gw-resnet",)  # one logit: bce_with_logits


class Encoder(nn.Module):
    """Two nn.TransformerEncoderLayer (width 64, 4 heads, no dropout) over 32 tokens of 16
    features, the tokens' mean classified."""

    def __init__(self, features=16, width=64, classes=3):
        super().__init__()
        self.embed = nn.Linear(features, width)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x):  # (B, tokens, features)
        return self.head(self.blocks(self.embed(x)).mean(1))


class LSTMTagger(nn.Module):
    def __init__(self, features=8, hidden=32, classes=3):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):  # (B, steps, features)
        return self.head(self.lstm(x)[1][0][-1])


def case(name: str, batch: int):
    """(module, inputs tuple, class labels) at ``batch``."""
    g = torch.Generator().manual_seed(batch)
    torch.manual_seed(0)
    y = torch.randint(0, 3, (batch,), generator=g)
    if name in BINARY:
        from rootclad.gw.models import gw_resnet

        return gw_resnet(), (torch.randn(batch, 1, 2048, generator=g),), (y > 0).float()
    if name == "transformer-encoder":
        return Encoder(), (torch.randn(batch, 32, 16, generator=g),), y
    if name in VISION:
        from fixtures.zoo import vision

        tv, _ = vision()
        net = getattr(tv, name)(num_classes=3)
        return net, (torch.randn(batch, 3, 64, 64, generator=g),), y
    if name == "lstm-tagger":
        return LSTMTagger(), (torch.randn(batch, 25, 8, generator=g),), y
    from test_hep import DeepSets, ParticleTransformer

    x = torch.randn(batch, 16, 4, generator=g)
    mask = torch.rand(batch, 16, generator=g) > 0.3
    mask[:, 0] = True
    x = x * mask.unsqueeze(-1)
    if name == "deepsets":
        return DeepSets(), (x, mask.float()), y
    return ParticleTransformer(), (x, mask), y


# Layer families at batch 32, one layer each (the shapes the models above run): forward and
# train step (forward and the weight's gradient, twice the forward's FLOPs: the input needs no
# gradient) in GFLOP/s, next to this run's sgemm peak. (name, layer, per-sample input shape)
LAYER_BATCH = 32
LAYERS = (
    (
        "conv 7x7/2, 3->64, 64x64 (resnet stem)",
        lambda: nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        (3, 64, 64),
    ),
    (
        "conv 3x3, 64->64, 16x16 (resnet18 layer1)",
        lambda: nn.Conv2d(64, 64, 3, 1, 1, bias=False),
        (64, 16, 16),
    ),
    (
        "conv 3x3, 256->256, 4x4 (resnet18 layer3)",
        lambda: nn.Conv2d(256, 256, 3, 1, 1, bias=False),
        (256, 4, 4),
    ),
    (
        "conv 1x1, 96->24, 16x16 (mobilenet_v2 projection)",
        lambda: nn.Conv2d(96, 24, 1, bias=False),
        (96, 16, 16),
    ),
    (
        "depthwise 3x3, 144 ch, 16x16",
        lambda: nn.Conv2d(144, 144, 3, 1, 1, groups=144, bias=False),
        (144, 16, 16),
    ),
    (
        "depthwise 3x3/2, 96 ch, 32x32",
        lambda: nn.Conv2d(96, 96, 3, 2, 1, groups=96, bias=False),
        (96, 32, 32),
    ),
    ("linear 64->128, 32 tokens (encoder's feed-forward)", lambda: nn.Linear(64, 128), (32, 64)),
)


def bench_layers(report, threads, min_time) -> None:
    """Each layer family's GFLOP/s (rootclad, torch eager) against the sgemm peak."""
    from bench_train_step import _openblas, sgemm_peak_gflops, taking_turns
    from torch.utils.flop_counter import FlopCounterMode

    import rootclad

    peak = sgemm_peak_gflops(threads)
    _openblas().scipy_openblas_set_num_threads(1)  # rootclad's chunks run single-threaded GEMMs
    layers = report["layers"] = {
        "batch": LAYER_BATCH,
        "sgemm_peak_gflops": round(peak, 1),
        "families": {},
    }
    for name, build, shape in LAYERS:
        torch.manual_seed(0)
        layer = build()
        x = torch.randn(LAYER_BATCH, *shape)
        with FlopCounterMode(display=False) as fc:
            out = layer(x)
        flops = fc.get_total_flops()
        target = torch.zeros_like(out)
        cm = rootclad.compile(copy.deepcopy(layer), x, loss="mse", engine="pullback")
        opt = rootclad.optim.Adam(cm, lr=1e-4)
        ref = copy.deepcopy(layer)
        topt = torch.optim.Adam(ref.parameters(), lr=1e-4)
        inf = copy.deepcopy(layer).eval()

        def torch_step(ref=ref, topt=topt, x=x, target=target):
            topt.zero_grad()
            nn.functional.mse_loss(ref(x), target).backward()
            topt.step()

        def torch_fwd(inf=inf, x=x):
            with torch.inference_mode():
                inf(x)

        calls = {
            "forward": {"torch eager": torch_fwd, "rootclad": lambda cm=cm, x=x: cm.predict(x)},
            "train": {
                "torch eager": torch_step,
                "rootclad": lambda cm=cm, x=x, t=target, o=opt: cm.train_step(x, t, o),
            },
        }
        entry = layers["families"][name] = {"forward_gflop": round(flops / 1e9, 4)}
        for kind, impls in calls.items():
            times = taking_turns(impls, min_time, ROUNDS)
            work = flops * (2 if kind == "train" else 1)
            entry[kind] = {
                k: {
                    "median_ms": round(statistics.median(v), 4),
                    "gflops": round(work / statistics.median(v) / 1e6, 1),
                }
                for k, v in times.items()
            }
        print(name, {k: {i: v["gflops"] for i, v in entry[k].items()} for k in calls}, flush=True)


def onnx_session(net, xs, threads):
    """An onnxruntime session on torch's export of ``net`` (None, reason where it fails)."""
    import onnxruntime as ort

    buf = io.BytesIO()
    names = [f"x{i}" for i in range(len(xs))]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, xs, buf, dynamo=False, input_names=names,
                              dynamic_axes={n: {0: "B"} for n in names})  # fmt: skip
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # the exporter or onnxruntime: reported, not fatal
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return (sess, names), ""


def main(argv=None) -> int:
    from report import run_header, write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short timing windows")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--no-layers", action="store_true", help="skip the layer families")
    args = ap.parse_args(argv)
    min_time = 0.3 if args.quick else 1.5
    threads = torch.get_num_threads()
    import onnxruntime as ort

    report = run_header(threads=threads, onnxruntime=ort.__version__, rounds=ROUNDS, models={})
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:  # a fresh cache: the first compile
            os.environ["ROOTCLAD_CACHE_DIR"] = cache
            bench_model(report, name, threads, min_time)
    if not args.no_layers:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["ROOTCLAD_CACHE_DIR"] = cache
            bench_layers(report, threads, min_time)
    return write_report(report, args.out, RESULT, TABLE, render)


def _loss(name):
    """(rootclad's loss, torch's) for ``name``."""
    if name in BINARY:
        return "bce_with_logits", lambda out, y: nn.functional.binary_cross_entropy_with_logits(
            out.squeeze(1), y
        )
    return "cross_entropy", nn.CrossEntropyLoss()


def _compile(net, xs, name="resnet18"):
    import rootclad

    return rootclad.compile(
        copy.deepcopy(net).train(),
        xs if len(xs) > 1 else xs[0],
        loss=_loss(name)[0],
        engine="pullback",
    )


def bench_model(report, name, threads, min_time) -> None:
    import numpy as np
    from bench_train_step import taking_turns

    import rootclad

    lossf = _loss(name)[1]
    net, xs, _ = case(name, 4)
    cm = _compile(net, xs, name)
    entry = report["models"].setdefault(name, {
        "compile_s": round(cm.compile_seconds, 2), "ops": len(cm.graph.nodes),
        "params": sum(p.numel() for p in net.parameters()), "batches": {}})  # fmt: skip
    session, why = onnx_session(copy.deepcopy(net).eval(), xs, threads)
    if session is None:
        entry["onnxruntime"] = why
    print(name, "compiled in", entry["compile_s"], "s,", entry["ops"], "ops", flush=True)
    for batch in BATCHES:
        net, xs, y = case(name, batch)
        cm = _compile(net, xs, name)  # the same weights as net's (from the cache: no build)
        ref = copy.deepcopy(net).train()
        topt = torch.optim.Adam(ref.parameters(), lr=1e-4)
        opt = rootclad.optim.Adam(cm, lr=1e-4)
        inf = copy.deepcopy(net).eval()
        arg = xs if len(xs) > 1 else xs[0]

        def torch_step(ref=ref, topt=topt, xs=xs, y=y):
            topt.zero_grad()
            lossf(ref(*xs), y).backward()
            topt.step()

        def torch_fwd(inf=inf, xs=xs):
            with torch.inference_mode():
                inf(*xs)

        cm.train()
        calls = {
            "train": {
                "torch eager": torch_step,
                "rootclad": lambda cm=cm, arg=arg, y=y, opt=opt: cm.train_step(arg, y, opt),
            },
            "inference": {
                "torch eager": torch_fwd,
                "rootclad": lambda cm=cm, xs=xs: cm.predict(*xs),
            },
        }
        if session is not None:
            sess, names = session
            feed = {n: x.numpy() for n, x in zip(names, xs, strict=True)}
            calls["inference"]["onnxruntime"] = lambda sess=sess, feed=feed: sess.run(None,
                                                                                    feed)  # fmt: skip
        cm.eval()  # the check: rootclad's inference equals torch's
        np.testing.assert_allclose(cm.predict(*xs).numpy(), inf(*xs).detach().numpy(),
                                   rtol=1e-3, atol=1e-4)  # fmt: skip
        if session is not None:
            np.testing.assert_allclose(sess.run(None, feed)[0], inf(*xs).detach().numpy(),
                                       rtol=1e-3, atol=1e-4)  # fmt: skip
        result = entry["batches"][str(batch)] = {}
        for kind, impls in calls.items():
            (cm.train if kind == "train" else cm.eval)()
            times = taking_turns(impls, min_time, ROUNDS)
            med = {k: statistics.median(v) for k, v in times.items()}
            result[kind] = {
                "median_ms": {k: round(v, 4) for k, v in med.items()},
                "rootclad_speedup": {
                    k: round(v / med["rootclad"], 2) for k, v in med.items() if k != "rootclad"
                },  # fmt: skip
                "runs": {k: len(v) for k, v in times.items()},
            }
        print(name, batch, {k: v["median_ms"] for k, v in result.items()}, flush=True)


def _ms(v: float) -> str:
    return f"{v:.3g} ms"


def render(report: dict) -> str:
    lines = [
        "# Real architectures: train step and inference next to torch eager and onnxruntime",
        "",
        f"`benchmarks/models/bench_zoo_speed.py`, {report['date']}, {report['machine']}, "
        f"{report['threads']} threads, torch {report['torch']}, onnxruntime "
        f"{report['onnxruntime']}. Median of all calls over {report['rounds']} interleaved "
        "rounds; (xN) = the other's time / rootclad's (above 1: rootclad is faster). rootclad: "
        "the pullback engine, float32.",
        "",
        "| model | batch | train: torch eager | train: rootclad | inference: torch eager | "
        "inference: onnxruntime | inference: rootclad |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in report["models"].items():
        for batch, r in entry["batches"].items():
            tr, inf = r["train"], r["inference"]
            ort_ms = inf["median_ms"].get("onnxruntime")
            lines.append(
                f"| {name} | {batch} | {_ms(tr['median_ms']['torch eager'])} | "
                f"{_ms(tr['median_ms']['rootclad'])} (x{tr['rootclad_speedup']['torch eager']}) | "
                f"{_ms(inf['median_ms']['torch eager'])} | "
                + (f"{_ms(ort_ms)} | " if ort_ms is not None else "- | ")
                + f"{_ms(inf['median_ms']['rootclad'])} "
                f"(x{inf['rootclad_speedup']['torch eager']} torch"
                + (f", x{inf['rootclad_speedup']['onnxruntime']} ort" if ort_ms else "")
                + ") |"
            )
    lines += [
        "",
        "First compile: into a fresh cache, so with the build of the runtime library (the kernels,"
        " once per machine and compiler).",
        "",
        "| model | parameters | ops | first compile |",
        "|---|---:|---:|---:|",
    ]
    for name, entry in report["models"].items():
        lines.append(f"| {name} | {entry['params']:,} | {entry['ops']} | {entry['compile_s']} s |")
    if "layers" in report:
        lay = report["layers"]
        peak = lay["sgemm_peak_gflops"]

        def cell(r):
            return f"{r['gflops']} ({100 * r['gflops'] / peak:.0f}%)"

        lines += [
            "",
            f"Layer families at batch {lay['batch']}: GFLOP/s (share of this run's "
            f"sgemm peak, {peak} GFLOP/s on {report['threads']} threads). Train: forward "
            "and the weight's gradient (twice the forward's FLOPs), with Adam's update.",
            "",
            "| layer | forward GFLOP | forward: torch eager | forward: rootclad | "
            "train: torch eager | train: rootclad |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, e in lay["families"].items():
            f, tr = e["forward"], e["train"]
            lines.append(
                f"| {name} | {e['forward_gflop']} | {cell(f['torch eager'])} | "
                f"{cell(f['rootclad'])} | {cell(tr['torch eager'])} | "
                f"{cell(tr['rootclad'])} |"
            )
    failed = {n: e["onnxruntime"] for n, e in report["models"].items() if "onnxruntime" in e}
    if failed:
        lines += ["", "No onnxruntime column where torch's exporter or onnxruntime failed:", ""]
        lines += [f"- {n}: {why}" for n, why in failed.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
