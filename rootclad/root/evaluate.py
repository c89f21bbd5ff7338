"""A classifier's evaluation as TMVA gives it: ROC and AUC (with a bootstrap error), the
overtraining check (train and test score distributions, Kolmogorov-Smirnov probabilities from
ROOT's TH1::KolmogorovTest), signal efficiency and background rejection against the cut (ROOT's
TEfficiency), and the input variables ranked by the compiled model's input gradients and by
permutation. Written to a ROOT file (TH1D, TGraph, TEfficiency), PNG plots and an HTML page.

    ev = rootclad.root.evaluate("build/net", test={"signal": sig_df, "background": bkg_df},
                                train={"signal": sig_train, "background": bkg_train},
                                output="build/net_evaluation.root")
    print(ev)                     # the summary TMVA prints: AUC, KS probabilities, rankings

A source is an RDataFrame (its filters and defines applied), a file name (``tree=`` names its
TTree or RNTuple) or a ``(file, tree)`` pair; ``label=`` splits one source per sample into
signal (label > 0) and background instead. The model is an export (``cm.export(stem)``); its
inputs are the columns it was exported with, or ``inputs=``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rootclad.data.cling import CLING_LOCK, import_root
from rootclad.paths import check_outputs
from rootclad.root import evaluate_output
from rootclad.root.rdf import _cached_model, _stem, columns_of, model_files


@dataclass
class Sample:
    """The inputs, scores and weights of one sample (signal or background, train or test)."""

    x: np.ndarray  # (n, input_size) float64
    w: np.ndarray  # (n,) float64
    score: np.ndarray = field(default=None)  # (n,) float64


@dataclass
class Evaluation:
    """What :func:`evaluate` measured; ``str()`` reads as TMVA's evaluation summary."""

    stem: str
    auc: float
    auc_error: float  # bootstrap standard deviation
    roc: tuple[np.ndarray, np.ndarray]  # (signal efficiency, background rejection)
    ks: dict[str, float] = field(default_factory=dict)  # "signal"/"background": KS probability
    cuts: np.ndarray = field(default=None)
    efficiency: dict[str, np.ndarray] = field(default_factory=dict)  # per class, per cut
    importance: dict[str, dict[str, float]] = field(default_factory=dict)  # method: column: value
    files: list[Path] = field(default_factory=list)

    def signal_efficiency_at(self, background_efficiency: float) -> float:
        """The signal efficiency where the background's is ``background_efficiency`` (linear
        between the ROC's points)."""
        sig, rej = self.roc
        return float(np.interp(background_efficiency, 1 - rej, sig))  # 1 - rej ascends

    def __str__(self) -> str:
        lines = [
            f"Evaluation of {self.stem}",
            "",
            f"  ROC integral (AUC): {self.auc:.4f} +- {self.auc_error:.4f} (bootstrap)",
        ]
        for cls, p in self.ks.items():
            lines.append(f"  Kolmogorov-Smirnov test, {cls} train vs test: probability {p:.3f}")
        for eff in (0.01, 0.1, 0.3):
            at = self.signal_efficiency_at(eff)
            lines.append(f"  signal efficiency at background efficiency {eff:g}: {at:.4f}")
        for method, ranks in self.importance.items():
            lines += ["", f"  Variable ranking ({method}):"]
            for i, (name, v) in enumerate(sorted(ranks.items(), key=lambda kv: -kv[1]), 1):
                lines.append(f"    {i:>3}  {name:<24} {v:.4g}")
        if self.files:
            lines += ["", "  Written: " + ", ".join(str(f) for f in self.files)]
        return "\n".join(lines)


# ---- reading the samples -----------------------------------------------------------------
def _sources(part) -> list:
    """The sources of a ``test=``/``train=`` argument."""
    if part is None:
        return []
    return list(part.values()) if isinstance(part, dict) else [part]


def _file_of(source):
    """The file a source names (a path or (path, tree)); None for an RDataFrame."""
    if isinstance(source, tuple) and len(source) == 2:
        source = source[0]
    return source if isinstance(source, (str, os.PathLike)) else None


def _frame(source, tree: str):
    root = import_root()
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isfile(source):
            raise FileNotFoundError(f"evaluate: {source}: no such file")
        try:
            return root.RDataFrame(tree, str(source))
        except Exception as err:  # noqa: BLE001  (PyROOT's runtime_error: no such tree)
            first = (str(err).strip().splitlines() or [type(err).__name__])[-1]
            raise ValueError(
                f"evaluate: {source}: cannot read the tree '{tree}' ({first})"
            ) from None
    if isinstance(source, tuple) and len(source) == 2:
        return _frame(source[0], str(source[1]))
    if hasattr(source, "AsNumpy"):
        return source
    raise TypeError(
        "evaluate: a source is an RDataFrame, a file name or (file, tree), got "
        + type(source).__name__
    )


def _read(df, cols: list[str], n_in: int, weight: str | None, what: str, extra=()):
    """(x, w, extras, widths) of an RDataFrame: the input columns concatenated in order, and
    the values per event of each."""
    names = [str(c) for c in df.GetColumnNames()]
    for c in [*cols, *([weight] if weight else []), *extra]:
        if c not in names:
            raise ValueError(f"evaluate: {what} has no column '{c}'")
    got = df.AsNumpy([*cols, *([weight] if weight else []), *extra])
    if not len(got[cols[0]]):
        raise ValueError(f"evaluate: {what} holds no events")
    parts = []
    for c in cols:
        a = got[c]
        if a.dtype == object:  # RVecs, vectors, arrays: one row each
            a = np.stack([np.asarray(v, dtype=np.float64) for v in a])
        parts.append(np.asarray(a, dtype=np.float64).reshape(len(a), -1))
    x = np.concatenate(parts, axis=1)
    if x.shape[1] != n_in:
        said = ", ".join(f"{c} ({p.shape[1]})" for c, p in zip(cols, parts, strict=True))
        raise ValueError(
            f"evaluate: {what}: columns {said} hold {x.shape[1]} values per event; the model "
            f"takes {n_in}"
        )
    w = np.asarray(got[weight], dtype=np.float64) if weight else np.ones(len(x))
    if not np.isfinite(w).all():
        raise ValueError(f"evaluate: {what}: the weight column '{weight}' holds a non-finite value")
    if not np.isfinite(x).all():
        raise ValueError(f"evaluate: {what}: an input column holds a non-finite value")
    return x, w, [np.asarray(got[e]) for e in extra], [p.shape[1] for p in parts]


def _samples(sources, tree, cols, n_in, weight, label, split: str):
    """({"signal": Sample, "background": Sample}, the columns' widths); ({}, None) for none."""
    if sources is None:
        return {}, None
    if label is None:
        if not isinstance(sources, dict) or set(sources) != {"signal", "background"}:
            raise ValueError(
                f"evaluate: {split}= takes {{'signal': ..., 'background': ...}}, or one source "
                "with label="
            )
        out = {}
        for cls, src in sources.items():
            what = f"the {split} {cls} source"
            x, w, _, widths = _read(_frame(src, tree), cols, n_in, weight, what)
            out[cls] = Sample(x, w)
        return out, widths
    what = f"the {split} source"
    x, w, (y,), widths = _read(_frame(sources, tree), cols, n_in, weight, what, [label])
    sig = y > 0
    return {"signal": Sample(x[sig], w[sig]), "background": Sample(x[~sig], w[~sig])}, widths


# ---- the numbers ---------------------------------------------------------------------------
def roc_curve(s: Sample, b: Sample):
    """(signal efficiency, background rejection, cut) at every distinct score, weighted,
    cuts descending (score >= cut passes)."""
    scores = np.concatenate([s.score, b.score])
    ws = np.concatenate([s.w, np.zeros_like(b.w)])
    wb = np.concatenate([np.zeros_like(s.w), b.w])
    order = np.argsort(-scores, kind="stable")
    scores, ws, wb = scores[order], ws[order], wb[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]  # the end of each tie
    tps, fps = np.cumsum(ws)[last], np.cumsum(wb)[last]
    sig = np.r_[0.0, tps / tps[-1]]
    bkg = np.r_[0.0, fps / fps[-1]]
    return sig, 1.0 - bkg, np.r_[np.inf, scores[last]]


def auc(s: Sample, b: Sample) -> float:
    """The area under the ROC (signal efficiency against background efficiency)."""
    sig, rej, _ = roc_curve(s, b)
    return float(_trapezoid(sig, 1.0 - rej))


_trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy 2 renamed it


def _bootstrap_auc(s: Sample, b: Sample, n: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n):
        i, j = rng.integers(0, len(s.w), len(s.w)), rng.integers(0, len(b.w), len(b.w))
        si, bj = Sample(s.x[:0], s.w[i], s.score[i]), Sample(b.x[:0], b.w[j], b.score[j])
        values.append(auc(si, bj))
    return float(np.std(values, ddof=1)) if n > 1 else float("nan")


def _chunks(model, n: int):
    """Slices of at most the model's cache batch: the workspace a call grows stays that of
    scoring (a whole sample at once would keep activations for every event)."""
    step = max(1, int(model.cache_batch()))
    return (slice(i, min(i + step, n)) for i in range(0, n, step))


def _scores(model, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    out = np.zeros((len(x), int(model.output_size())))
    with CLING_LOCK:
        for sl in _chunks(model, len(x)):
            model.predict(x[sl], out[sl], sl.stop - sl.start)
    return out[:, 0].copy()


def _gradient_importance(model, x, w, cols, widths) -> dict[str, float]:
    """Per column: the weighted mean of |d score / d x_i| * std(x_i), summed over its values
    (a gradient scaled by how far the variable moves in the data)."""
    x = np.ascontiguousarray(x)
    dx = np.zeros_like(x)
    with CLING_LOCK:
        for sl in _chunks(model, len(x)):
            model.input_grad(x[sl], dx[sl], sl.stop - sl.start)
    spread = np.sqrt(np.average((x - np.average(x, axis=0, weights=w)) ** 2, axis=0, weights=w))
    per = np.average(np.abs(dx), axis=0, weights=w) * spread
    return _by_column(per, cols, widths)


def _permutation_importance(model, s: Sample, b: Sample, cols, widths, seed) -> dict[str, float]:
    """Per column: the AUC lost when its values are shuffled across the events."""
    rng = np.random.default_rng(seed)
    base = auc(s, b)
    x = np.concatenate([s.x, b.x])
    starts = np.cumsum([0, *widths])
    out = {}
    for c, lo, hi in zip(cols, starts[:-1], starts[1:], strict=True):
        xp = x.copy()
        xp[:, lo:hi] = x[rng.permutation(len(x)), lo:hi]
        sc = _scores(model, xp)
        n = len(s.w)
        out[c] = base - auc(Sample(s.x[:0], s.w, sc[:n]), Sample(b.x[:0], b.w, sc[n:]))
    return out


def _by_column(per_value, cols, widths) -> dict[str, float]:
    starts = np.cumsum([0, *widths])
    bounds = zip(cols, starts[:-1], starts[1:], strict=True)
    return {c: float(per_value[lo:hi].sum()) for c, lo, hi in bounds}


@evaluate_output.keeps_directory
def evaluate(
    stem,
    test,
    train=None,
    *,
    inputs=None,
    tree: str = "events",
    label: str | None = None,
    weight: str | None = None,
    output=None,
    plots: bool = True,
    bootstrap: int = 200,
    seed: int = 0,
) -> Evaluation:
    """Evaluate the exported classifier ``stem`` on ``test`` (and, for the overtraining check,
    ``train``): each ``{"signal": source, "background": source}``, or one source split by
    ``label``. ``weight`` names an event-weight column. Writes ``output`` (default
    ``<stem>_evaluation.root``: TH1D score distributions per class and split, TGraph "roc",
    TEfficiency "efficiency_signal"/"efficiency_background" against the cut, TH1D rankings)
    and, with ``plots``, PNGs and ``<output stem>.html`` beside it; every file whole or not at
    all. Returns the :class:`Evaluation`."""
    stem = _stem(stem)
    model = _cached_model(stem)
    cols = columns_of(stem, inputs, "evaluate")
    cols = [cols] if isinstance(cols, str) else [str(c) for c in cols]
    n_in = int(model.input_size())
    if int(model.output_size()) != 1:
        raise ValueError(
            f"evaluate: the model {stem} has {int(model.output_size())} outputs; it evaluates a "
            "classifier of one output (its score: larger is more signal-like)"
        )
    output = Path(output) if output else Path(stem + "_evaluation.root")
    outputs = [output]
    if plots:
        base = output.with_suffix("")
        outputs += [output.with_suffix(".html")]
        outputs += [Path(f"{base}_{name}.png") for name in evaluate_output.PLOTS]
    files = [_file_of(src) for part in (test, train) for src in _sources(part)]
    check_outputs(
        inputs=[f for f in files if f],
        outputs=outputs,
        model_files=model_files(stem),
        what="evaluate",
    )
    te, widths = _samples(test, tree, cols, n_in, weight, label, "test")
    tr, _ = _samples(train, tree, cols, n_in, weight, label, "train")
    for split, samples in (("test", te), ("train", tr)):
        for cls, smp in samples.items():
            if not len(smp.w):
                raise ValueError(f"evaluate: the {split} {cls} sample holds no events")
            smp.score = _scores(model, smp.x)
    s, b = te["signal"], te["background"]
    sig, rej, _ = roc_curve(s, b)
    lo = min(smp.score.min() for part in (te, tr) for smp in part.values())
    hi = max(smp.score.max() for part in (te, tr) for smp in part.values())
    hi = hi if hi > lo else lo + 1.0
    cuts = np.linspace(lo, hi, evaluate_output.BINS + 1)[:-1]
    error = _bootstrap_auc(s, b, bootstrap, seed)
    ev = Evaluation(stem=stem, auc=auc(s, b), auc_error=error, roc=(sig, rej), cuts=cuts)
    ev.efficiency = {
        cls: np.array([smp.w[smp.score >= c].sum() / smp.w.sum() for c in cuts])
        for cls, smp in te.items()
    }
    x_all = np.concatenate([s.x, b.x])
    w_all = np.concatenate([s.w, b.w])
    ev.importance = {
        "input gradient": _gradient_importance(model, x_all, w_all, cols, widths),
        "permutation (AUC lost)": _permutation_importance(model, s, b, cols, widths, seed),
    }
    ev.ks = evaluate_output.write_root(output, ev, te, tr, (lo, hi))
    ev.files.append(output)
    if plots:
        ev.files += evaluate_output.write_plots(output, ev, te, tr, (lo, hi))
    return ev


__all__ = ["Evaluation", "auc", "evaluate", "roc_curve"]
