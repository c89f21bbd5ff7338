"""Report stage: summary.json (machine-readable), PNG plots, report.md and a self-contained
report.html (the plots embedded)."""

from __future__ import annotations

import base64
import html
import json
import math
import os
import platform
import re
from pathlib import Path

import numpy as np
from scipy import special

from rootclad.gw.run.evaluate import FAPS, fap_key
from rootclad.paths import replacing

METHODS = {"network": "network", "matched_filter": "matched filter"}


def _methods(cfg) -> dict[str, str]:
    """The methods' labels: the network named as the run's model (CNN or MLP)."""
    return {**METHODS, "network": f"network (compiled {cfg.model.upper()})"}


def _num(v):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def _device(cfg) -> str:
    if cfg.device != "cuda":
        return "cpu"
    import torch

    return f"cuda ({torch.cuda.get_device_name()})"


def summary(cfg, tr, ev, bank_size, in_root, times, versions) -> dict:

    out = {
        "engine": tr.engine,
        "device": _device(cfg),
        "model": cfg.model,
        "auc": {m: ev["methods"][m]["auc"] for m in ev["methods"]},
        "snr50": {},
        "efficiency": {},
        "ratio": {},
        "test_events": {"noise": ev["noise_events"], "signal": ev["signal_events"]},
        "template_bank": bank_size,
        "training": {
            "epochs_run": len(tr.history),
            "best_epoch": tr.best_epoch,
            "stopped_early": tr.stopped_early,
            "resumed_after_epoch": tr.resumed_from,
            "ranks": tr.ranks,
            "rank_timings": tr.timings,  # per rank: compute, all-reduce, update seconds
            "history": tr.history,
        },  # fmt: skip
        "root": in_root,
        "config": {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()
        },  # fmt: skip
        "seconds": times,
        "versions": versions,
        "machine": machine(),
    }
    for fap in FAPS:
        k = fap_key(fap)
        out["snr50"][k] = {m: {"value": _num(ev["methods"][m]["fap"][k]["snr50"]),
                               "std": _num(ev["methods"][m]["fap"][k]["snr50_std"]),
                               "probit_width": _num(ev["methods"][m]["fap"][k]["probit_width"])}
                           for m in ev["methods"]}  # fmt: skip
        # per SNR bin: the efficiency, its Wilson 68% interval and the counts behind it
        out["efficiency"][k] = {
            m: {key: ev["methods"][m]["fap"][k]["efficiency"][key]
                for key in ("snr", "efficiency", "low", "high", "n", "k")}
            for m in ev["methods"]
        }  # fmt: skip
        r = ev.get("ratio", {}).get(k, {})
        out["ratio"][k] = {"value": _num(r.get("value")), "std": _num(r.get("std"))}
    return out


def _fig():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plots(out: Path, cfg, tr, ev, test, network, mf, examples) -> list[tuple[str, str]]:
    plt = _fig()
    d = out / "plots"
    d.mkdir(parents=True, exist_ok=True)
    made = []

    def save(fig, name, caption):
        try:
            with replacing(d / f"{name}.png", ".png") as tmp:
                fig.savefig(tmp, dpi=110, bbox_inches="tight")
        finally:
            plt.close(fig)
        made.append((f"plots/{name}.png", caption))

    h = tr.history
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([e["epoch"] for e in h], [e["train_loss"] for e in h], "o-", label="train")
    pauc = cfg.select == "pauc"
    val = "validation 1 - partial AUC (FAP <= 1e-3)" if pauc else "validation"
    ax.plot([e["epoch"] for e in h], [e["val_loss"] for e in h], "s-", label=val)
    ax.axvline(tr.best_epoch, color="grey", ls=":", label=f"best (epoch {tr.best_epoch})")
    ax.set(
        xlabel="epoch",
        ylabel="binary cross-entropy" + (" / 1 - pAUC" if pauc else ""),
        title=f"training ({tr.engine} engine)",
    )
    ax.legend()
    save(fig, "loss", "Training loss and the validation number monitored per epoch.")

    fig, ax = plt.subplots(figsize=(5, 4.5))
    for m, label in _methods(cfg).items():
        r = ev["methods"][m]
        ax.plot(r["roc"]["fpr"], r["roc"]["tpr"], label=f"{label}, AUC {r['auc']:.4f}")
    floor = 1.0 / max(1, int(np.sum(np.asarray(test["label"]) == 0)))
    ax.axvline(floor, color="grey", ls=":", label=f"1 / noise events ({floor:.1e})")
    ax.set(xscale="log", xlim=(floor / 2, 1), ylim=(0, 1), xlabel="false-alarm probability",
           ylabel="efficiency (all injected SNRs)", title="ROC")  # fmt: skip
    ax.legend(loc="lower right")
    save(fig, "roc", "ROC of both methods on the same test events; below the dotted line "
         "(one noise event) the test set measures no false-alarm probability.")  # fmt: skip

    fig, axes = plt.subplots(1, len(FAPS), figsize=(4.2 * len(FAPS), 3.6), sharey=True)
    for ax, fap in zip(axes, FAPS, strict=True):
        k = fap_key(fap)
        for i, (m, label) in enumerate(_methods(cfg).items()):
            f = ev["methods"][m]["fap"][k]
            e, s50, std = f["efficiency"], f["snr50"], f.get("snr50_std", float("nan"))
            eff = np.asarray(e["efficiency"])
            yerr = np.clip([eff - np.asarray(e.get("low", eff)),
                            np.asarray(e.get("high", eff)) - eff], 0, None)  # fmt: skip
            colour = f"C{i}"
            ax.errorbar(e["snr"], eff, yerr, fmt="o", ms=3, color=colour, capsize=2,
                        label=f"{label}: SNR50 {s50:.2f} ± {std:.2f}")  # fmt: skip
            width = f.get("probit_width")
            if width is not None and np.isfinite(s50) and np.isfinite(width):
                grid = np.linspace(min(e["snr"]), max(e["snr"]), 200)
                ax.plot(grid, special.ndtr((grid - s50) / width), color=colour, lw=1)
        ax.axhline(0.5, color="grey", ls=":")
        ax.set(xlabel="injected optimal SNR", ylim=(-0.02, 1.3),
               title=f"false-alarm probability {k}")  # fmt: skip
        ax.legend(fontsize=8, loc="upper left")  # above the curves: ylim leaves it room
    axes[0].set_ylabel("efficiency")
    save(
        fig,
        "efficiency",
        "Detection efficiency against injected SNR at three false-alarm "
        "probabilities (thresholds set on the noise-only test events): points with Wilson 68% "
        "intervals, lines the fitted probit curves whose 50% crossing is SNR50 (± its "
        "bootstrap standard deviation in the legend).",
    )

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    lab = test["label"]
    for ax, (stat, name) in zip(axes, ((network, "network logit"), (mf, "matched-filter SNR")),
                                strict=True):  # fmt: skip
        bins = np.linspace(np.min(stat), np.max(stat), 60)
        ax.hist(stat[lab == 0], bins, histtype="step", label="noise")
        ax.hist(stat[lab == 1], bins, histtype="step", label="signal")
        ax.set(xlabel=name, ylabel="events", yscale="log")
        ax.legend()
    save(fig, "scores", "Distributions of both statistics per class.")

    if len(examples["index"]):
        save(
            saliency_figure(plt, examples, cfg.sample_rate),
            "saliency",
            "Saliency (gradient of the logit with respect to the strain, from the compiled "
            "backward; the blue band, right axis, is its magnitude divided by the event's "
            "largest, which the panel's title gives) with the injected waveform over the "
            "whitened strain (left axis, in units of the noise's standard deviation).",
        )
    return made


def saliency_figure(plt, examples: dict, sample_rate: float):
    """One panel per example event: whitened strain and injected signal (left axis), and
    |d logit / d strain| scaled to its largest value as a band (right axis, 0 to 1)."""
    k = len(examples["index"])
    n = examples["strain"].shape[1]
    t = np.arange(n) / sample_rate
    fig, axes = plt.subplots(k, 1, figsize=(9, 2.4 * k), sharex=True, squeeze=False)
    for i, ax in enumerate(axes[:, 0]):
        ax.plot(t, examples["strain"][i], color="0.7", lw=0.6, label="whitened strain")
        ax.plot(t, examples["signal"][i], color="C1", lw=1.0, label="injected signal")
        ax.set_ylabel("whitened strain\n(noise σ = 1)", fontsize=8)
        ax2 = ax.twinx()
        sal = np.abs(examples["saliency"][i])
        top = max(float(sal.max()), 1e-30)
        ax2.fill_between(t, 0, sal / top, color="C0", alpha=0.3,
                         label="|d logit / d strain| / its maximum (right axis)")  # fmt: skip
        ax2.set_ylim(0, 1.05)
        ax2.set_yticks([0, 0.5, 1])
        ax2.set_ylabel("|d logit / d strain|\n/ its maximum", fontsize=8)
        ax.set_title(f"test event {examples['index'][i]}, injected SNR "
                     f"{examples['snr'][i]:.1f}; max |d logit / d strain| {top:.2e}",
                     fontsize=9)  # fmt: skip
        if i == 0:
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("time (s)")
    return fig


def table(s: dict) -> list[str]:
    rows = ["| | network | matched filter | network / matched filter |", "|---|---:|---:|---:|",
            f"| AUC | {s['auc']['network']:.4f} | {s['auc']['matched_filter']:.4f} | |"]  # fmt: skip

    def pm(v):
        return "n/a" if v["value"] is None else f"{v['value']:.2f} ± {v['std'] or float('nan'):.2f}"

    def pm3(v):
        return "n/a" if v["value"] is None else f"{v['value']:.3f} ± {v['std'] or float('nan'):.3f}"

    for k, v in s["snr50"].items():
        rows.append(f"| SNR at 50% efficiency, false-alarm probability {k} | "
                    f"{pm(v['network'])} | {pm(v['matched_filter'])} | {pm3(s['ratio'][k])} |")  # fmt: skip
    return rows


def markdown(s: dict, figures) -> str:
    t = s["training"]
    lines = [
        "# rootclad gw run: a gravitational-wave classifier against the matched filter", "",
        f"Engine: **{s['engine']}** (the backward pass of the compiled {s['model'].upper()}) "
        f"on {s.get('device', 'cpu')}; "
        f"{t['epochs_run']} epochs (best at {t['best_epoch']}"
        f"{', stopped early' if t['stopped_early'] else ''}); test set: "
        f"{s['test_events']['noise']} noise and {s['test_events']['signal']} signal events; "
        f"template bank: {s['template_bank']} templates.", "",
        *table(s), "",
        "SNR50: the injected optimal SNR at which half the signals are found at the given "
        "false-alarm probability (fit of a normal CDF to the detections; ± one bootstrap "
        "standard deviation). A ratio above 1 means the network needs louder signals.", "",
    ]  # fmt: skip
    for path, caption in figures:
        lines += [f"![{caption}]({path})", "", caption, ""]
    via = s.get("onnx", {})
    if "file" in via:
        lines += [f"ONNX: the trained network exported to `{Path(via['file']).name}` and read "
                  f"back with `rootclad.onnx.load` ({via['engine']} engine) scores the "
                  f"{via['events']} test events within {via['max_abs_diff_scores']:.2e} of the "
                  f"trained model (logits); its saliency differs by at most "
                  f"{via['max_rel_diff_saliency']:.2e} of the largest value.", ""]  # fmt: skip
    elif via:
        lines += [f"ONNX stage skipped: {via.get('skipped')}.", ""]
    root = s["root"]
    if "file" in root:
        lines += [f"ROOT: {root['events']} test events scored through RDataFrame "
                  f"(`define_score`), largest difference to the Python scores "
                  f"{root['max_abs_diff_to_python']:.2e}; histograms and curves in "
                  f"`{Path(root['file']).name}`.", ""]  # fmt: skip
    else:
        lines += [f"ROOT stage skipped: {root.get('skipped')}.", ""]
    lines += ["Time per stage (s): " + ", ".join(f"{k} {v:.1f}" for k, v in s["seconds"].items()),
              "", "Versions: " + ", ".join(f"{k} {v}" for k, v in s["versions"].items()), "",
              "Reproduce: `rootclad gw run --config config.toml` (the resolved configuration).", ""]  # fmt: skip
    return "\n".join(lines)


def _inline(text: str) -> str:
    """The report's inline markdown as HTML: `code` and **bold**, the rest escaped."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def html_page(md_text: str, out: Path) -> str:
    """A self-contained page: the markdown's paragraphs and table, images inlined."""
    body = []
    table_rows: list[str] = []
    for line in md_text.splitlines() + [""]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):
                cells = [_inline(c.strip()) for c in line.strip("|").split("|")]
                tag = "th" if not table_rows else "td"
                table_rows.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            continue
        if table_rows:
            body.append("<table>" + "".join(table_rows) + "</table>")
            table_rows = []
        if line.startswith("# "):
            body.append(f"<h1>{_inline(line[2:])}</h1>")
        elif line.startswith("!["):
            src = line[line.rindex("](") + 2 : -1]
            data = base64.b64encode((out / src).read_bytes()).decode()
            body.append(f'<img src="data:image/png;base64,{data}" style="max-width:100%">')
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:.3em .6em}"
             "td{text-align:right}")  # fmt: skip
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>rootclad gw run</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")  # fmt: skip


def write_text(path: Path, text: str) -> None:
    """``text`` to a temporary name beside ``path``, then renamed: never a truncated file."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def write(out: Path, cfg, tr, ev, test, network, mf, examples, s: dict) -> None:
    figures = plots(out, cfg, tr, ev, test, network, mf, examples)
    md_text = markdown(s, figures)
    write_text(out / "report.md", md_text)
    write_text(out / "report.html", html_page(md_text, out))
    write_text(out / "summary.json", json.dumps(s, indent=1, default=float) + "\n")


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cores": os.cpu_count()}  # fmt: skip
