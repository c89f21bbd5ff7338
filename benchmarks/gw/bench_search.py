"""The GW search's ablation: each training recipe's network against the matched filter at
false-alarm probabilities 1e-3, 1e-4 and 1e-5, measured by a background study.

    python benchmarks/gw/bench_search.py --work DIR [--segments 500000] [--workers 2]
                                         [--only LABEL,...] [--min-match 0.99]
    python benchmarks/gw/bench_search.py --keep RUN

For each recipe (the default run, then one change at a time, cumulative; then the variants
tried on top of one of them and not kept), ``rootclad gw run
--config`` trains in ``DIR/<label>`` (skipped when that directory holds a finished run of the
same training) and ``rootclad gw background --seed 1`` measures it on ``--segments``
noise segments (the study seed of ``--preset search``; the matched filter's values come from
the private cache after the first study, :mod:`rootclad.gw.run.mf_cache`). Writes
``benchmarks/results/gw_search_ablation.json`` (the commands, each recipe's configuration,
training time, the run's own ratio at 1e-2, and the study's thresholds, segments above them
and SNR50 ratios with bootstrap errors) and ``docs/benchmarks/gw_search_ablation.md``.
Recipes already in the JSON and not run again are kept. ``--keep RUN`` stores a finished
``rootclad gw run --preset search --out RUN`` as ``gw_search_run.json`` (its summary) and
``gw_search_study.json`` (its study of 2e6 segments).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

# (label, the configuration keys it sets over the default run's), each on top of the last;
# "default" is the default run until 2026-12 (train.root, 12 epochs; rows kept under that name)
RECIPES = [
    ("default", {"training_data": "file", "curriculum_epochs": 0, "epochs": 12}),
    ("fresh events", {"training_data": "fresh"}),
    ("+ SNR curriculum", {"curriculum_epochs": 4}),
    ("+ hard negatives", {"hard_negatives": 1024}),
    ("+ pAUC selection", {"select": "pauc"}),
    (
        "+ 40 epochs, cosine rate",
        {"epochs": 40, "patience": 10, "lr_schedule": "cosine", "curriculum_epochs": 6},
    ),
    ("+ 49,152 events an epoch", {"train_events": 49152}),
    ("+ 98,304 events an epoch", {"train_events": 98304}),
]


# changes tried on top of a recipe and not kept (they measured worse): (that recipe, label, keys)
VARIANTS = [
    ("+ 40 epochs, cosine rate", "carried hard negatives", {"hard_mining": "carry"}),
]


def recipe_configs() -> list[tuple[str, dict]]:
    """Every recipe's configuration keys: the cumulative ones, then the variants."""
    out, acc = [], {}
    for label, keys in RECIPES:
        acc = {**acc, **keys}
        out.append((label, dict(acc)))
    base = dict(out)
    return out + [(f"{on}, {label}", {**base[on], **keys}) for on, label, keys in VARIANTS]


def kept_recipe() -> dict:
    """The last cumulative recipe's keys: what ``gw run --preset search`` trains."""
    return recipe_configs()[len(RECIPES) - 1][1]


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.strip("+ ")).strip("-").lower()


def _toml(keys: dict) -> str:
    from rootclad.gw.run.config import toml_value

    return "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items())


def train(label: str, keys: dict, work: Path) -> Path:
    """The run directory of a recipe, trained unless a finished run of the same training is
    there (`gw run --preset search` made the last one: its study does not change it)."""
    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.train import _same_training

    out = work / slug(label)
    conf = work / f"{slug(label)}.toml"
    conf.write_text(_toml(keys))
    want = resolve(conf).to_toml()
    if (out / "summary.json").exists() and _same_training((out / "config.toml").read_text(), want):
        return out
    subprocess.run(
        ["rootclad", "gw", "run", "--config", str(conf), "--out", str(out), "-q"], check=True
    )
    return out


def study(run: Path, segments: int, workers: int, min_match: float | None) -> tuple[dict, float]:
    """The recipe's background study (in RUN/background-<segments>[-mm<min match>]; the
    tasks a study of the same size ran before are read, not run)."""
    name = f"background-{segments}" + ("" if min_match is None else f"-mm{min_match}")
    out = run / name
    cmd = [
        "rootclad",
        "gw",
        "background",
        str(run),
        "--segments",
        str(segments),
        "--workers",
        str(workers),
        "--seed",
        "1",
        "--out",
        str(out),
        "-q",
    ]
    if min_match is not None:
        cmd += ["--min-match", str(min_match)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return json.loads((out / "background.json").read_text()), time.perf_counter() - t


def row(label: str, keys: dict, run: Path, bg: dict, study_s) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    tr = summary["training"]
    return {
        "label": label,
        "config": keys,
        "train_seconds": summary["seconds"]["train"],
        "epochs": len(tr.get("history", [])),
        "best_epoch": tr.get("best_epoch"),
        "run_ratio_1e-2": summary["ratio"]["1e-2"],
        "segments": bg["segments"],
        "template_bank": bg["template_bank"],
        "bank_min_match": bg.get("bank_min_match"),
        "thresholds": bg["thresholds"],
        "snr50": bg["snr50"],
        "ratio": bg["ratio"],
        "study_wall_seconds": study_s,
    }


def table(rows: list[dict]) -> str:
    faps = ("1e-3", "1e-4", "1e-5")
    head = "| recipe | segments | bank | " + " | ".join(f"ratio {f}" for f in faps)
    lines = [head + " | run's ratio 1e-2 | epochs (best) |", "|" + " --- |" * (len(faps) + 5)]
    for r in rows:
        cells = []
        for f in faps:
            v = r["ratio"].get(f, {})
            n = r["thresholds"]["network"].get(f, {}).get("noise_above")
            cells.append(
                "n/a" if v.get("value") is None else f"{v['value']:.3f} ± {v['std']:.3f} ({n})"
            )
        rr = r["run_ratio_1e-2"]
        lines.append(
            f"| {r['label']} | {r['segments']:,} | {r['template_bank']} "
            f"(mm {r['bank_min_match']}) | "
            + " | ".join(cells)
            + f" | {rr['value']:.3f} ± {rr['std']:.3f} | {r['epochs']} ({r['best_epoch']}) |"
        )
    return "\n".join(lines) + "\n"


def keep(run: Path) -> None:
    """Keep a finished ``rootclad gw run --preset search --out RUN``: its summary as
    gw_search_run.json and its study as gw_search_study.json (refused when RUN is a run of
    another configuration or its study is not there)."""
    from rootclad.gw.run.config import resolve

    summary = json.loads((run / "summary.json").read_text())
    want = json.loads(json.dumps(resolve(preset="search").__dict__))
    if summary["config"] != want:
        raise SystemExit(f"{run} holds a run of another configuration than --preset search")
    study = run / "background" / "background.json"
    if not study.exists():
        raise SystemExit(f"{run}: no background study (background/background.json)")
    results = ROOT / "benchmarks" / "results"
    (results / "gw_search_run.json").write_text(json.dumps(summary, indent=1) + "\n")
    (results / "gw_search_study.json").write_text(study.read_text())
    print(f"kept {run}: gw_search_run.json, gw_search_study.json")


def write_md(name: str, tag: str, result: dict) -> None:
    """docs/benchmarks/NAME.md: the table of an ablation JSON (``result``)."""
    (ROOT / "docs" / "benchmarks" / f"{name}.md").write_text(
        f"# GW search ablation{tag}\n\nRows from one or more runs of "
        f"`benchmarks/gw/bench_search.py`, the last `{result['command']}` "
        f"(`benchmarks/results/{name}.json`). Ratio: the network's SNR50 over the "
        "matched filter's at each false-alarm probability, with its bootstrap "
        "error and (in brackets) the background segments above the network's "
        "threshold.\n\n" + table(result["rows"])
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="the recipes' run directories (required to run)")
    ap.add_argument("--segments", type=int, default=500_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", help="labels' slugs, comma-separated (default: every recipe)")
    ap.add_argument("--min-match", type=float, help="the study's bank (default the run's)")
    ap.add_argument("--tag", default="", help="a suffix of the JSON's and table's names")
    ap.add_argument(
        "--keep", type=Path, metavar="RUN", help="keep a finished `gw run --preset search`"
    )
    args = ap.parse_args()
    if args.keep:
        return keep(args.keep)
    if args.work is None:
        ap.error("--work is required to run the recipes")
    args.work.mkdir(parents=True, exist_ok=True)
    name = f"gw_search_ablation{args.tag}"
    path = ROOT / "benchmarks" / "results" / f"{name}.json"
    kept = json.loads(path.read_text()) if path.exists() else {"rows": []}
    rows = {r["label"]: r for r in kept["rows"]}
    only = set(args.only.split(",")) if args.only else None
    for label, keys in recipe_configs():
        if only is not None and slug(label) not in only:
            continue
        run = train(label, keys, args.work)
        bg, study_s = study(run, args.segments, args.workers, args.min_match)
        rows[label] = row(label, keys, run, bg, study_s)
        order = [lab for lab, _ in recipe_configs() if lab in rows]
        result = {
            "command": " ".join(["python", "benchmarks/gw/bench_search.py", *sys.argv[1:]]),
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor()},
            "rows": [rows[lab] for lab in order],
        }
        path.write_text(json.dumps(result, indent=1, default=float) + "\n")
        write_md(name, args.tag, result)
        print(table(result["rows"]))


if __name__ == "__main__":
    main()
