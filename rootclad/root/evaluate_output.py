"""What :func:`rootclad.root.evaluate` writes: the ROOT file (TH1D score distributions, the
TGraph of the ROC, TEfficiency against the cut, TH1D variable rankings, the summary as JSON in
a TObjString "rootclad_evaluation") and the PNG plots and HTML page beside it, each whole or not
at all."""

from __future__ import annotations

import functools
import html
import json
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import numpy as np

from rootclad.data.cling import CLING_LOCK, import_root
from rootclad.paths import replacing

CLASSES = ("signal", "background")
PLOTS = ("roc", "scores", "efficiency", "importance")  # <output stem>_<name>.png
BINS = 50  # score histograms and cut values


def _hist(root, name: str, title: str, values, weights, lo: float, hi: float, bins: int):
    h = root.TH1D(name, title, bins, lo, hi)
    h.SetDirectory(0)  # written by WriteObject below: no name clash in gDirectory
    h.Sumw2()
    v = np.ascontiguousarray(values, dtype=np.float64)
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if len(v):
        h.FillN(len(v), v, w)
    return h


@contextmanager
def _detached(root):
    """Histograms made here join no directory: made in the user's current directory (an open
    file), one named as one of the user's would take its place there. (No current directory
    for this thread while they are made: TH1::AddDirectory is a switch of the whole process.)"""
    none = root.TDirectory.TContext(root.nullptr)
    try:
        yield
    finally:
        del none


def keeps_directory(function):
    """``function`` leaves ROOT's current directory as it found it (opening the model's
    weights, the sources and the output moves it: the user's open file would no longer be
    where their next histogram goes)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        context = import_root().TDirectory.TContext()  # restores it when destroyed
        try:
            return function(*args, **kwargs)
        finally:
            del context

    return wrapper


def _edges(span) -> tuple[float, float]:
    lo, hi = span
    # the largest score inside the last bin (ROOT's upper edge belongs to the overflow); at
    # least a few float steps above it, however large the scores
    return lo, hi + max(1e-9 * max(abs(hi - lo), 1.0), 4 * float(np.spacing(hi)))


def write_root(output: Path, ev, test: dict, train: dict, span) -> dict[str, float]:
    """Writes ``output``; returns the Kolmogorov-Smirnov probability of train against test
    per class (ROOT's TH1::KolmogorovTest on the score histograms), {} without train."""
    root = import_root()
    lo, hi = _edges(span)
    ks: dict[str, float] = {}
    with CLING_LOCK, replacing(Path(output), ".root") as tmp, _detached(root):
        objects = []
        hists = {}
        for split, samples in (("test", test), ("train", train)):
            for cls, smp in samples.items():
                name = f"score_{split}_{cls}"
                hists[split, cls] = _hist(
                    root, name, f"{cls} ({split});score;events", smp.score, smp.w, lo, hi, BINS
                )
                objects.append((name, hists[split, cls]))
        for cls in CLASSES:
            if ("train", cls) in hists:
                ks[cls] = float(hists["train", cls].KolmogorovTest(hists["test", cls]))
        sig, rej = ev.roc
        roc = root.TGraph(len(sig), np.asarray(sig, float), np.asarray(rej, float))
        roc.SetTitle("ROC;signal efficiency;background rejection")
        objects.append(("roc", roc))
        for cls in CLASSES:
            smp = test[cls]
            passed = root.TH1D(f"passed_{cls}", "", BINS, lo, hi)
            total = root.TH1D(f"total_{cls}", "", BINS, lo, hi)
            for h in (passed, total):
                h.SetDirectory(0)
                h.Sumw2()
            for i, cut in enumerate(ev.cuts, 1):
                keep = smp.score >= cut
                passed.SetBinContent(i, smp.w[keep].sum())
                passed.SetBinError(i, np.sqrt((smp.w[keep] ** 2).sum()))
                total.SetBinContent(i, smp.w.sum())
                total.SetBinError(i, np.sqrt((smp.w**2).sum()))
            eff = root.TEfficiency(passed, total)
            eff.SetName(f"efficiency_{cls}")
            eff.SetTitle(f"{cls} efficiency;cut on the score (score >= cut passes);efficiency")
            eff.SetDirectory(0)
            objects.append((f"efficiency_{cls}", eff))
        for method, ranks in ev.importance.items():
            key = "importance_" + method.split()[0]
            h = root.TH1D(key, f"variable ranking: {method};;importance", len(ranks), 0, len(ranks))
            h.SetDirectory(0)
            for i, (col, v) in enumerate(ranks.items(), 1):
                h.SetBinContent(i, v)
                h.GetXaxis().SetBinLabel(i, col)
            objects.append((key, h))
        summary = {
            "model": ev.stem,
            "auc": ev.auc,
            "auc_error": ev.auc_error,
            "ks": ks,
            "importance": ev.importance,
        }
        objects.append(("rootclad_evaluation", root.TObjString(json.dumps(summary))))
        f = root.TFile.Open(str(tmp), "RECREATE")
        if not f or f.IsZombie():
            raise OSError(f"evaluate: ROOT cannot create {tmp}")
        for name, obj in objects:
            f.WriteObject(obj, name)
        f.Close()  # writes the keys and the header too: a failure there counts
        if f.TestBit(root.TFile.kWriteError):
            raise OSError(f"evaluate: ROOT could not write {output}")
        check = root.TFile.Open(str(tmp))
        whole = bool(check) and not check.IsZombie() and bool(check.GetKey("rootclad_evaluation"))
        if check:
            check.Close()
        if not whole:
            raise OSError(f"evaluate: {output} did not read back whole after writing")
    return ks


def write_plots(output: Path, ev, test: dict, train: dict, span) -> list[Path]:
    """The PNGs (roc, scores, efficiency, importance) and ``<output>.html``; their paths."""
    from matplotlib.figure import Figure  # no pyplot: a notebook's backend stays as it is

    output = Path(output)
    stem = output.with_suffix("")
    lo, hi = _edges(span)
    bins = np.linspace(lo, hi, BINS + 1)
    written = []

    def save(fig, name):
        path = Path(f"{stem}_{name}.png")
        with replacing(path, ".png") as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
        written.append(path)

    sig, rej = ev.roc
    fig = Figure(figsize=(5, 4.5))
    ax = fig.subplots()
    ax.plot(sig, rej, lw=2, label=f"AUC {ev.auc:.4f} ± {ev.auc_error:.4f}")
    ax.set(
        xlabel="signal efficiency",
        ylabel="background rejection",
        title="ROC",
        xlim=(0, 1),
        ylim=(0, 1.01),
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    save(fig, "roc")

    fig = Figure(figsize=(6, 4.5))
    ax = fig.subplots()
    colors = {"signal": "tab:blue", "background": "tab:red"}
    for cls in CLASSES:
        smp = test[cls]
        ax.hist(
            smp.score,
            bins,
            weights=smp.w,
            density=True,
            alpha=0.35,
            color=colors[cls],
            label=f"{cls} (test)",
        )
        if cls in train:
            t = train[cls]
            counts, _ = np.histogram(t.score, bins, weights=t.w, density=True)
            ks = ev.ks.get(cls)
            ax.plot(
                0.5 * (bins[1:] + bins[:-1]),
                counts,
                "o",
                ms=3,
                color=colors[cls],
                label=f"{cls} (train), KS p = {ks:.3f}",
            )
    ax.set(xlabel="score", ylabel="normalised", title="overtraining check")
    ax.legend(fontsize=8)
    save(fig, "scores")

    fig = Figure(figsize=(6, 4.5))
    ax = fig.subplots()
    for cls in CLASSES:
        ax.plot(ev.cuts, ev.efficiency[cls], color=colors[cls], label=f"{cls} efficiency")
    ax.plot(
        ev.cuts,
        1 - ev.efficiency["background"],
        "--",
        color=colors["background"],
        label="background rejection",
    )
    ax.set(xlabel="cut (score >= cut passes)", ylabel="fraction", title="efficiency vs cut")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, "efficiency")

    methods = list(ev.importance)
    fig = Figure(figsize=(5 * len(methods), 3.5))
    axes = fig.subplots(1, len(methods), squeeze=False)
    for ax, method in zip(axes[0], methods, strict=True):
        ranks = sorted(ev.importance[method].items(), key=lambda kv: kv[1])
        ax.barh([k for k, _ in ranks], [v for _, v in ranks], color="tab:green")
        ax.set(title=method, xlabel="importance")
    save(fig, "importance")

    page = output.with_suffix(".html")
    with replacing(page, ".html") as tmp:
        tmp.write_text(_html(ev, written), encoding="utf-8")
    written.append(page)
    return written


def _html(ev, images: list[Path]) -> str:
    esc = html.escape
    rows = [
        f"<tr><td>ROC integral (AUC)</td><td>{ev.auc:.4f} ± {ev.auc_error:.4f} "
        "(bootstrap)</td></tr>"
    ]
    rows += [
        f"<tr><td>Kolmogorov-Smirnov, {esc(c)} train vs test</td><td>{p:.3f}</td></tr>"
        for c, p in ev.ks.items()
    ]
    ranking = []
    for method, ranks in ev.importance.items():
        items = sorted(ranks.items(), key=lambda kv: -kv[1])
        body = "".join(
            f"<tr><td>{i}</td><td>{esc(k)}</td><td>{v:.4g}</td></tr>"
            for i, (k, v) in enumerate(items, 1)
        )
        ranking.append(
            f"<h3>Variable ranking: {esc(method)}</h3><table><tr><th>rank</th>"
            f"<th>variable</th><th>importance</th></tr>{body}</table>"
        )
    imgs = "".join(f'<img src="{esc(quote(p.name))}" alt="{esc(p.stem)}">' for p in images)
    return (
        "<!doctype html><meta charset='utf-8'><title>rootclad evaluation</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px;text-align:left}"
        "img{max-width:48%;margin:4px}</style>"
        f"<h1>Evaluation of {esc(ev.stem)}</h1><table>{''.join(rows)}</table>"
        f"{''.join(ranking)}<h2>Plots</h2>{imgs}"
    )
