"""Two commits of rootclad side by side: the kept benchmarks' training steps and inference,
timed for each commit in turn, so that a change that should not move the speed (a redesign)
shows whether it did.

Each commit is unpacked from git (``git archive``) into a temporary directory and imported
from there (PYTHONPATH), with a cache of its own. For ROUNDS rounds, a fresh process per
commit, the commits taking turns, compiles and times the cases: one Adam training step of the
GW MLP, CNN and ResNet (with and without BatchNorm) and of the 2-D digit CNN at batch 1, 64 and
256 (pullback engine, float32; the clad engine too where Clad is found), and inference of the
GW CNN imported from torch's ONNX export at batch 1 and 256. Each case reports the median of
all its steps over the rounds, per commit, and the ratio head / base. Each case's second
loss (after one update, so the backward counts) or first prediction is compared between the
commits.

usage: python benchmarks/core/compare_commits.py BASE [HEAD] [--rounds N] [--out PATH]
Writes benchmarks/results/compare_commits.json and docs/benchmarks/compare_commits.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULT = REPO / "benchmarks" / "results" / "compare_commits.json"
TABLE = REPO / "docs" / "benchmarks" / "compare_commits.md"
sys.path.insert(0, str(REPO / "benchmarks"))
ROUNDS = 5
WINDOW = 0.4  # seconds of steps per case and round

# one round for one commit: compile every case (cached after the first round), time it
CHILD = """
import io, json, sys, time, warnings
import torch
import rootclad
from rootclad.gw.models import gw_cnn, gw_mlp, gw_resnet
from rootclad.nets import digits_cnn
window, engines = float(sys.argv[1]), sys.argv[2].split(",")

def steps(fn, seconds):
    fn(); fn()
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(out) < 5:
        t = time.perf_counter(); fn(); out.append((time.perf_counter() - t) * 1e3)
    return out

MODELS = {
    "gw-mlp": (gw_mlp, (2048,), "bce_with_logits"),
    "gw-cnn": (gw_cnn, (1, 2048), "bce_with_logits"),
    "gw-resnet": (gw_resnet, (1, 2048), "bce_with_logits"),
    "gw-resnet-bn": (lambda: gw_resnet(batch_norm=True), (1, 2048), "bce_with_logits"),
    "digits-cnn": (digits_cnn, (1, 28, 28), "cross_entropy"),
}
result = {}
for engine in engines:
    for name, (make, shape, loss) in MODELS.items():
        torch.manual_seed(0)
        net = make()
        cm = rootclad.compile(net, torch.zeros(2, *shape), loss, engine=engine)
        for batch in (1, 64, 256):
            g = torch.Generator().manual_seed(batch)
            x = torch.randn(batch, *shape, generator=g)
            if loss == "cross_entropy":
                y = torch.randint(0, 10, (batch,), generator=g)
            else:
                y = torch.randint(0, 2, (batch, 1), generator=g).float()
            cm.load_state_dict(net.state_dict())
            opt = rootclad.optim.Adam(cm, lr=1e-4)
            cm.train_step(x, y, opt)
            first = float(cm.train_step(x, y, opt))  # after an update: forward and backward
            result[f"train {name} {engine} B={batch}"] = {
                "first": first, "ms": steps(lambda: cm.train_step(x, y, opt), window)}

import onnx
torch.manual_seed(0)
net = gw_cnn().eval()
buf = io.BytesIO()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(net, torch.zeros(2, 1, 2048), buf, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "B"}})
cm = rootclad.onnx.load(onnx.load_from_string(buf.getvalue()), engine="pullback")
for batch in (1, 256):
    x = torch.randn(batch, 1, 2048, generator=torch.Generator().manual_seed(batch))
    first = float(cm.predict(x).sum())
    result[f"onnx gw-cnn predict B={batch}"] = {
        "first": first, "ms": steps(lambda: cm.predict(x), window)}
print(json.dumps(result))
"""


def unpack(rev: str, where: Path) -> tuple[str, Path]:
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    tree = where / sha
    tree.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", sha], capture_output=True,
                             check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (tree / "cache").mkdir(mode=0o700)
    return sha, tree


def one_round(tree: Path, engines: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), ROOTCLAD_CACHE_DIR=str(tree / "cache"))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(WINDOW), ",".join(engines)],
                          cwd=tree, env=env, capture_output=True, text=True)  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"{tree.name}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from report import run_header, write_report

    from rootclad.toolchain import find_clad

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("head", nargs="?", default="HEAD")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    engines = ["pullback"] + (["clad"] if find_clad()[0] else [])
    with tempfile.TemporaryDirectory(prefix="rootclad-compare-") as tmp:
        trees = dict(unpack(rev, Path(tmp)) for rev in (args.base, args.head))
        times: dict[str, dict[str, list]] = {sha: {} for sha in trees}
        firsts: dict[str, dict[str, float]] = {sha: {} for sha in trees}
        if len(trees) < 2:
            raise SystemExit(f"{args.base} and {args.head} are the same commit")
        for r in range(args.rounds):
            order = list(trees.items())
            for sha, tree in order if r % 2 == 0 else order[::-1]:  # each goes first in turn
                for case, res in one_round(tree, engines).items():
                    times[sha].setdefault(case, []).extend(res["ms"])
                    firsts[sha].setdefault(case, res["first"])
                print(f"round {r + 1}/{args.rounds}: {sha} done", flush=True)
    base, head = trees
    report = run_header(base=base, head=head, rounds=args.rounds, window_s=WINDOW,
                        engines=engines, cases={})  # fmt: skip
    for case in times[base]:
        b, h = statistics.median(times[base][case]), statistics.median(times[head][case])
        fb, fh = firsts[base][case], firsts[head][case]
        same = abs(fb - fh) <= 1e-4 * max(abs(fb), abs(fh), 1e-6)
        report["cases"][case] = {"base_ms": round(b, 4), "head_ms": round(h, 4),
                                 "head_over_base": round(h / b, 3),
                                 "same_result": same}  # fmt: skip
    return write_report(report, args.out, RESULT, TABLE, render)


def render(report: dict) -> str:
    ratios = [c["head_over_base"] for c in report["cases"].values()]
    lines = [
        f"# Two commits side by side: {report['base']} (base) and {report['head']} (head)",
        "",
        f"`benchmarks/core/compare_commits.py {report['base']} {report['head']}`, "
        f"{report['date']}, {report['machine']}, torch {report['torch']}. Engines: "
        f"{', '.join(report['engines'])}; float32; Adam. {report['rounds']} rounds, the "
        f"commits taking turns, {report['window_s']} s of steps per case and round in a fresh "
        "process per commit and round, each commit first in every other round; median step of "
        "all rounds. 'same': the second step's loss "
        "(after one update) or the first prediction's sum agreed to 1e-4 between the commits.",
        "",
        "| case | base ms | head ms | head / base | same |",
        "| --- | ---: | ---: | ---: | :---: |",
    ]
    for case, c in report["cases"].items():
        lines.append(f"| {case} | {c['base_ms']:.3f} | {c['head_ms']:.3f} | "
                     f"{c['head_over_base']:.2f} | {'yes' if c['same_result'] else 'NO'} |")  # fmt: skip
    lines += [
        "",
        f"Median ratio head / base over the {len(ratios)} cases: "
        f"{statistics.median(ratios):.3f} (range {min(ratios):.2f} to {max(ratios):.2f}).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
