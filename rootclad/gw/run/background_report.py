"""The background study's results: thresholds from the background, the efficiencies and SNR50
of both methods at them on the run's test signals (:func:`.evaluate.at_thresholds`), the ROC on
a log axis, ``background.json``, PNG plots and ``background.md`` / ``background.html`` in the
style of the run's report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from rootclad.gw.run.evaluate import at_thresholds, fap_key
from rootclad.gw.run.report import _fig, _num, html_page, machine, write_text

METHODS = ("network", "matched_filter")
LABELS = {"network": "network (raw logit)", "matched_filter": "matched filter (SNR)"}
# the network keeps up where its SNR50 is at most this much above the matched filter's
KEEPS_UP = 1.05


def threshold(bg: dict, n: int, fap: float) -> tuple[float, bool]:
    """numpy.quantile(all values, 1 - fap) (linear interpolation) and whether it is exact:
    from the loudest values where both order statistics are known, else from the histogram."""
    top, floor = bg["top"], bg["floor"]
    h = (n - 1) * (1.0 - fap)
    lo = int(math.floor(h))
    frac = h - lo
    a = n - 1 - lo  # descending rank of the lo-th smallest value
    if a < len(top) and top[a] >= floor:
        x0 = top[a]
        x1 = top[a - 1] if a >= 1 else x0
        return float(x0 + frac * (x1 - x0)) if frac else float(x0), True
    return _hist_quantile(bg["hist"], bg["edges"], n, fap), False


def _hist_quantile(hist, edges, n: int, fap: float) -> float:
    above = np.cumsum(hist[::-1])[::-1]  # values in bin i or above
    want = fap * n
    i = int(np.flatnonzero(above >= want)[-1]) if (above >= want).any() else 0
    inside = hist[i] or 1
    excess = (above[i] - want) / inside  # the share of bin i above the threshold
    return float(edges[i] + (edges[i + 1] - edges[i]) * min(max(excess, 0.0), 1.0))


def threshold_draws(bg: dict, n: int, fap: float, rng, size: int) -> np.ndarray:
    """Thresholds of ``size`` bootstrap resamplings of the background: in a resampling, the
    number of values at or above the j-th loudest is Binomial(n, (j + 1) / n), so the
    resampled quantile's rank follows from one uniform draw each (the loudest values
    suffice; a rank past them takes the last exact one)."""
    from scipy import stats

    top = bg["top"][bg["top"] >= bg["floor"]]
    m = n - int(math.floor((n - 1) * (1.0 - fap)))  # values at or above the threshold
    j = np.arange(len(top))
    cdf = stats.binom.sf(m - 1, n, (j + 1) / n)  # P(rank <= j)
    u = rng.random(size)
    idx = np.minimum(np.searchsorted(cdf, u), len(top) - 1)
    return top[idx] if len(top) else np.full(size, np.nan)


def thresholds(bg: dict, faps, bootstrap: int, seed: int) -> tuple[dict, dict, dict]:
    """Per method and measurable false-alarm probability (at least one background segment
    expected above): the threshold, whether it is exact, and its bootstrap draws."""
    n = bg["segments"]
    rng = np.random.default_rng(seed)
    table: dict = {m: {} for m in METHODS}
    values: dict = {m: {} for m in METHODS}
    draws: dict = {m: {} for m in METHODS}
    for fap in faps:
        k = fap_key(fap)
        for m in METHODS:
            if n * fap < 1:
                table[m][k] = {"threshold": None, "exact": None, "noise_above": None,
                               "needs_segments": math.ceil(1 / fap)}  # fmt: skip
                continue
            t, exact = threshold(bg[m], n, fap)
            above = int(np.sum(bg[m]["top"] > t)) if exact else round(n * fap)
            table[m][k] = {"threshold": t, "exact": exact, "noise_above": above}
            values[m][k] = t
            draws[m][k] = threshold_draws(bg[m], n, fap, rng, bootstrap)
    return table, values, draws


def roc(bg: dict, signals: dict, points: int = 60) -> dict:
    """Efficiency on the test signals against the background's false-alarm probability, from
    0.5 down to the smallest one measured (one segment in ``segments``)."""
    n = bg["segments"]
    faps = np.logspace(math.log10(0.5), math.log10(1.0 / n), points) if n > 2 else np.array([0.5])
    out = {"fap": faps.tolist()}
    for m in METHODS:
        ts = [threshold(bg[m], n, f)[0] for f in faps]
        out[m] = [float(np.mean(signals[m] > t)) for t in ts]
    return out


def _loudest(bg: dict) -> dict:
    cols = ("network", "matched_filter", "template", "time")
    return {m: [{"seed": int(seed), **{c: int(v) if c == "template" else float(v)
                                       for c, v in zip(cols, row, strict=True)}}
                for seed, row in zip(bg[m]["loud_seed"], bg[m]["loud"], strict=True)]
            for m in METHODS}  # fmt: skip


def verdict(ev: dict) -> str:
    """Whether the network keeps up with the matched filter at the smallest false-alarm
    probabilities measured, said from the SNR50 ratios and their bootstrap errors."""
    ratios = {k: r for k, r in ev.get("ratio", {}).items() if r["value"] is not None
              and math.isfinite(r["value"])}  # fmt: skip
    if not ratios:
        return (
            "No SNR50 ratio could be measured (too few segments for the requested "
            "false-alarm probabilities, or an efficiency curve without a 50% crossing)."
        )
    low = min(ratios, key=lambda k: float(k))
    r = ratios[low]
    parts = [f"{k}: {v['value']:.3f} ± {v['std']:.3f}" for k, v in sorted(ratios.items(),
             key=lambda kv: -float(kv[0]))]  # fmt: skip
    head = (
        f"SNR50 of the network over the matched filter's, by false-alarm probability: "
        f"{'; '.join(parts)}. "
    )
    if r["value"] <= KEEPS_UP:
        return head + (f"At {low} the network keeps up with the matched filter (within "
                       f"{100 * (KEEPS_UP - 1):.0f}%).")  # fmt: skip
    return head + (f"At {low} the network does not keep up: it needs "
                   f"{100 * (r['value'] - 1):.0f}% more SNR than the matched filter for 50% "
                   "efficiency.")  # fmt: skip


def plots(out: Path, bg: dict, rc: dict, ev: dict, table: dict) -> list[tuple[str, str]]:
    plt = _fig()
    d = out / "plots"
    d.mkdir(parents=True, exist_ok=True)
    n = bg["segments"]
    made = []

    def save(fig, name, caption):
        path = d / name
        with write_png(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append((f"plots/{name}", caption))

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for m in METHODS:
        ax.plot(rc["fap"], rc[m], label=LABELS[m])
    ax.set(xscale="log", xlabel="false-alarm probability (background)",
           ylabel="efficiency (test signals)", title=f"ROC down to 1/{n} segments")  # fmt: skip
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    save(fig, "background_roc.png", "ROC on the background's false-alarm probabilities")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, m in zip(axes, METHODS, strict=True):
        top = bg[m]["top"][bg[m]["top"] >= bg[m]["floor"]]
        ax.step(top, (np.arange(len(top)) + 1) / n, where="post")
        for k, row in table[m].items():
            if row["threshold"] is not None:
                ax.axvline(row["threshold"], ls=":", color="grey")
                ax.text(row["threshold"], float(k), f" {k}", fontsize=8)
        ax.set(yscale="log", xlabel=LABELS[m], ylabel="false-alarm probability",
               title=f"background, {n} segments")  # fmt: skip
        ax.grid(alpha=0.3, which="both")
    save(fig, "background_tail.png", "False-alarm probability against each statistic")

    keys = [k for k in ev["methods"]["network"]["fap"]]
    if keys:
        fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.8), squeeze=False)
        for ax, k in zip(axes[0], keys, strict=True):
            for m in METHODS:
                e = ev["methods"][m]["fap"][k]["efficiency"]
                ax.errorbar(e["snr"], e["efficiency"], yerr=e["error"], marker="o", ms=3,
                            capsize=2, label=LABELS[m])  # fmt: skip
            ax.set(xlabel="injected optimal SNR", ylabel="efficiency", ylim=(-0.02, 1.02),
                   title=f"false-alarm probability {k}")  # fmt: skip
            ax.grid(alpha=0.3)
        axes[0][0].legend()
        save(
            fig,
            "background_efficiency.png",
            "Efficiency against SNR at the background's thresholds",
        )
    return made


def write_png(path: Path):
    from rootclad.paths import replacing

    return replacing(path, ".png")


def bank_min_match(spec: dict) -> float:
    """The minimal match of the bank a study used (its configuration's)."""
    import tomllib

    return float(tomllib.loads(spec["config"])["bank_min_match"])


def markdown(s: dict, figures) -> str:
    lines = ["# rootclad gw background", "",
             f"Run `{s['run']}`: {s['segments']} noise-only segments in {s['tasks']} tasks of "
             f"{s['per_task']} (study seed {s['seed']}), scored by the network and by a bank of "
             f"{s['template_bank']} templates (minimal match {s['bank_min_match']}); "
             f"{s['signal_events']} test signals.", "",
             f"Weights: `{s['weights']['file']}` (sha256 {s['weights']['sha256'][:16]}...).", "",
             "| false-alarm probability | method | threshold | exact | SNR50 | ± |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for k in s["faps"]:
        for m in METHODS:
            t = s["thresholds"][m][k]
            if t["threshold"] is None:
                lines.append(f"| {k} | {LABELS[m]} | needs {t['needs_segments']} segments | | | |")
                continue
            v = s["snr50"].get(k, {}).get(m, {})
            fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
            lines.append(f"| {k} | {LABELS[m]} | {t['threshold']:.4f} | "
                         f"{'yes' if t['exact'] else 'histogram'} | {fmt(v.get('value'))} | "
                         f"{fmt(v.get('std'))} |")  # fmt: skip
    lines += ["", f"**{s['verdict']}**", ""]
    for path, caption in figures:
        lines += [f"![{caption}]({path})", ""]
    lines += ["Loudest background events (regenerate them with "
              "`rootclad.gw.generate_events(seeds, config)` and the test file's configuration "
              "with signal_fraction 0):", "",
              "| by | seed | network | matched filter | template | time (s) |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for m in METHODS:
        for e in s["loudest"][m][:5]:
            lines.append(f"| {LABELS[m]} | {e['seed']} | {e['network']:.3f} | "
                         f"{e['matched_filter']:.3f} | {e['template']} | {e['time']:.4f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write(out: Path, run: Path, spec: dict, sc, bg: dict, signals: dict, timing: dict) -> dict:
    table, values, draws = thresholds(bg, sc.faps, sc.bootstrap, sc.seed)
    usable = {m: values[m] for m in METHODS}
    ev = at_thresholds({m: signals[m] for m in METHODS}, signals["snr"], usable, draws,
                       bootstrap=sc.bootstrap, seed=sc.seed)  # fmt: skip
    rc = roc(bg, signals)
    seg = bg["segments"]
    sim, net, _ = (float(x) for x in bg["seconds"])
    filtered, mf = bg.get("mf_filtered", (seg, float(bg["seconds"][2])))
    s = {
        "run": str(run),
        "segments": seg,
        "tasks": bg["tasks"],
        "per_task": sc.per_task,
        "seed": sc.seed,
        "template_bank": len(spec["bank"]["masses"]),
        "bank_min_match": bank_min_match(spec),
        # which weights were scored: the run's current best (gw/run/weights.py)
        "weights": spec["weights_from"],
        "signal_events": int(len(signals["snr"])),
        "faps": [fap_key(f) for f in sc.faps],
        "smallest_fap_measured": 1.0 / seg,
        "thresholds": table,
        "snr50": {
            k: {
                m: {
                    "value": _num(ev["methods"][m]["fap"][k]["snr50"]),
                    "std": _num(ev["methods"][m]["fap"][k]["snr50_std"]),
                    "probit_width": _num(ev["methods"][m]["fap"][k]["probit_width"]),
                }
                for m in METHODS
                if k in ev["methods"][m]["fap"]
            }
            for k in values["network"]
        },  # fmt: skip
        "ratio": {
            k: {"value": _num(r["value"]), "std": _num(r["std"])}
            for k, r in ev.get("ratio", {}).items()
        },  # fmt: skip
        "efficiency": {
            k: {m: ev["methods"][m]["fap"][k]["efficiency"] for m in METHODS}
            for k in values["network"]
        },  # fmt: skip
        "roc": rc,
        "loudest": _loudest(bg),
        # per worker: each task's seconds summed over all tasks, so per process and core
        "segments_per_second_per_worker": {
            "simulation_and_whitening": seg / sim if sim else None,
            "network": seg / net if net else None,
            # over the tasks that ran it (the others read it from the cache)
            "matched_filter": filtered / mf if mf else None,
        },
        "matched_filter_tasks_from_cache": (seg - filtered) // sc.per_task,
        "this_call": timing,
        "machine": machine(),
    }
    s["verdict"] = verdict({"ratio": s["ratio"]})
    figures = plots(out, bg, rc, ev, table)
    md_text = markdown(s, figures)
    write_text(out / "background.md", md_text)
    write_text(out / "background.html", html_page(md_text, out))
    write_text(out / "background.json", json.dumps(s, indent=1, default=float) + "\n")
    return s
