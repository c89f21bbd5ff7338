"""Evaluation stage: the network and the matched filter on the same test events.

For each method (its statistic: the network's raw logit, the matched filter's maximised SNR):
the ROC and its AUC; thresholds set on the noise-only test events at false-alarm
probabilities 1e-1, 1e-2 and 1e-3; the detection efficiency of the signal events against
their injected optimal SNR; and the SNR at 50% efficiency from a fit of a normal CDF to the
detections (maximum likelihood on the events counted in SNR bins of 0.02), with a bootstrap
uncertainty that resamples noise and signal events together for both methods (so the ratio's
uncertainty is right too).
"""

from __future__ import annotations

import numpy as np
from scipy import optimize, special, stats

FAPS = (1e-1, 1e-2, 1e-3)


def fap_key(fap: float) -> str:
    return f"{fap:.0e}".replace("e-0", "e-")  # 0.01 -> "1e-2"


def roc(score: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false-positive rate, true-positive rate) at every threshold, from (0, 0) to (1, 1)."""
    order = np.argsort(-score, kind="stable")
    s, y = score[order], label[order]
    last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # the end of each run of equal scores
    tp = np.cumsum(y)[last]
    fp = np.cumsum(1 - y)[last]
    return np.r_[0.0, fp / max(fp[-1], 1)], np.r_[0.0, tp / max(tp[-1], 1)]


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """P(a signal event outscores a noise event), ties counted half (Mann-Whitney)."""
    ranks = stats.rankdata(score)
    n1 = int(label.sum())
    n0 = len(label) - n1
    return float((ranks[label == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def threshold(noise_scores: np.ndarray, fap: float) -> float:
    """The statistic that noise exceeds with probability ``fap``."""
    return float(np.quantile(noise_scores, 1.0 - fap))


def fit_snr50(snr: np.ndarray, detected: np.ndarray, step: float = 0.02) -> float:
    """SNR at 50% efficiency: ``a`` of :func:`fit_probit`; NaN when the fit has no crossing
    inside the injected range."""
    return fit_probit(snr, detected, step)[0]


def fit_probit(snr: np.ndarray, detected: np.ndarray, step: float = 0.02) -> tuple[float, float]:
    """Fit P(detected) = Phi((snr - a) / b) (a statistic that is about Gaussian with a mean
    growing with the SNR gives this shape) by maximum likelihood (Fisher scoring; a simplex
    search where the counts separate and the width runs to 0); (a, b). The events are
    counted in SNR bins of ``step`` (the likelihood of the counts, 50 times faster than event
    by event, for a shift below step / 2). (NaN, NaN) when the fit has no crossing inside the
    injected range."""
    if detected.all() or not detected.any():
        return float("nan"), float("nan")
    lo = snr.min()
    idx = ((snr - lo) / step).astype(np.int64)
    n = np.bincount(idx)
    k = np.bincount(idx, weights=detected)
    keep = n > 0
    x, n, k = lo + (np.flatnonzero(keep) + 0.5) * step, n[keep], k[keep]
    a0 = float(np.median(snr))
    fitted = _probit_scoring(x, n, k, a0)
    if fitted is None:  # separated counts (the width runs to 0): the simplex search's answer
        fitted = _probit_simplex(x, n, k, a0)
    a, b = fitted
    return (a, b) if snr.min() <= a <= snr.max() else (float("nan"), float("nan"))


def _loglik(c, x, n, k) -> float:
    eta = c[0] + c[1] * x
    return float(np.sum(k * special.log_ndtr(eta) + (n - k) * special.log_ndtr(-eta)))


def _probit_scoring(x, n, k, a0: float, iterations: int = 60):
    """Fisher scoring (the probit GLM's iteratively reweighted least squares) for P = Phi(c0 +
    c1 x) on binned counts, with step halving: (a, b) = (-c0 / c1, 1 / c1), or None when it
    does not converge to a rising curve. About 1 ms a fit, against the simplex's 7-18 ms: the
    bootstrap's 1,200 fits of a run take about a second."""
    c = np.array([-a0, 1.0])
    design = np.stack([np.ones_like(x), x], axis=1)
    current = _loglik(c, x, n, k)
    for _ in range(iterations):
        eta = c[0] + c[1] * x
        logpdf = -0.5 * eta * eta - 0.5 * np.log(2.0 * np.pi)
        up = np.exp(logpdf - special.log_ndtr(eta))  # pdf / P, stable in both tails
        down = np.exp(logpdf - special.log_ndtr(-eta))  # pdf / (1 - P)
        grad = design.T @ (k * up - (n - k) * down)
        info = design.T @ ((n * np.exp(logpdf) * (up + down))[:, None] * design)
        try:
            delta = np.linalg.solve(info, grad)
        except np.linalg.LinAlgError:
            return None
        if np.abs(delta).max() < 1e-9 * max(1.0, np.abs(c).max()):
            break  # the full step is nothing: converged
        t = 1.0
        while True:
            trial = c + t * delta
            value = _loglik(trial, x, n, k)
            if value >= current - 1e-12:  # False for NaN: halved too
                break
            t *= 0.5
            if t < 1e-6:
                return None  # no step uphill: let the simplex decide
        c, current = trial, value
    else:
        return None
    if not (np.isfinite(c).all() and c[1] > 0):
        return None
    return float(-c[0] / c[1]), float(1.0 / c[1])


def _probit_simplex(x, n, k, a0: float) -> tuple[float, float]:
    """The same likelihood's maximum by Nelder-Mead over (a, log b)."""

    def nll(p):
        return -_loglik((-p[0] / np.exp(p[1]), 1.0 / np.exp(p[1])), x, n, k)

    res = optimize.minimize(nll, [a0, 0.0], method="Nelder-Mead",
                            options={"xatol": 1e-4, "fatol": 1e-7, "maxiter": 2000})  # fmt: skip
    return float(res.x[0]), float(np.exp(res.x[1]))


def wilson(k: float, n: int, z: float = 1.0) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion k / n at ``z`` standard deviations
    (one: 68%): asymmetric, inside [0, 1], and not empty at 0 or n detections."""
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # exactly 0 and 1 at no and all detections (rounding gave 1 - 2e-16: p outside its interval)
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return float(low), float(high)


def efficiency_curve(snr, detected, edges) -> dict:
    """Per SNR bin: the efficiency, its Wilson 68% interval (``low``, ``high``), the counts, and
    ``error`` (half the interval's width, for symmetric error bars)."""
    idx = np.digitize(snr, edges) - 1
    out: dict = {k: [] for k in ("snr", "efficiency", "low", "high", "error", "n", "k")}
    for b in range(len(edges) - 1):
        d = detected[idx == b]
        if len(d) == 0:
            continue
        low, high = wilson(float(d.sum()), len(d))
        for key, v in (("snr", 0.5 * (edges[b] + edges[b + 1])), ("efficiency", d.mean()),
                       ("low", low), ("high", high), ("error", (high - low) / 2),
                       ("n", len(d)), ("k", d.sum())):  # fmt: skip
            out[key].append(float(v) if key not in ("n", "k") else int(v))
    return out


def evaluate(stat: dict[str, np.ndarray], label: np.ndarray, snr: np.ndarray, *,
             bootstrap: int = 200, seed: int = 0, bins: int = 10) -> dict:  # fmt: skip
    """``stat``: method name -> statistic per test event. Returns per method: auc, roc,
    thresholds, efficiency curves and snr50 (value, bootstrap std) per false-alarm
    probability, the ratio of the first method's snr50 to the second's, and ``snr_edges``, the
    SNR bins of the efficiency curves."""
    noise, signal = np.flatnonzero(label == 0), np.flatnonzero(label == 1)
    if len(noise) < 100 or len(signal) < 20:
        raise ValueError(f"the test set has {len(noise)} noise and {len(signal)} signal events; "
                         "at least 100 and 20 are needed")  # fmt: skip
    # float64: past the loudest signal even when the SNRs are float32 (max + 1e-9 rounded
    # back to max there, and that event fell out of every bin)
    top = float(snr[signal].max())
    edges = np.linspace(float(snr[signal].min()), np.nextafter(top, np.inf), bins + 1)
    out: dict = {"methods": {}, "noise_events": int(len(noise)), "signal_events": int(len(signal)),
                 "snr_edges": edges.tolist()}  # fmt: skip
    for name, s in stat.items():
        fpr, tpr = roc(s, label)
        m = {"auc": auc(s, label), "roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()},
             "fap": {}}  # fmt: skip
        for fap in FAPS:
            t = threshold(s[noise], fap)
            det = (s[signal] > t).astype(float)
            a, b = fit_probit(snr[signal], det)
            m["fap"][fap_key(fap)] = {
                "threshold": t,
                "snr50": a,
                "probit_width": b,
                "efficiency": efficiency_curve(snr[signal], det, edges),
                "noise_above": int((s[noise] > t).sum()),
            }
        out["methods"][name] = m
    names = list(stat)
    rng = np.random.default_rng(seed)
    draws = {(n, fap_key(f)): [] for n in names for f in FAPS}
    for _ in range(bootstrap):
        bn = rng.choice(noise, len(noise))
        bs = rng.choice(signal, len(signal))
        for name in names:
            s = stat[name]
            for fap in FAPS:
                det = (s[bs] > threshold(s[bn], fap)).astype(float)
                draws[(name, fap_key(fap))].append(fit_snr50(snr[bs], det))
    for (name, key), values in draws.items():
        v = np.asarray(values)
        ok = v[np.isfinite(v)]
        out["methods"][name]["fap"][key]["snr50_std"] = (
            float(ok.std(ddof=1)) if len(ok) > 1 else float("nan")
        )
    if len(names) == 2:
        a, b = names
        out["ratio"] = {}
        for fap in FAPS:
            k = fap_key(fap)
            va, vb = np.asarray(draws[(a, k)]), np.asarray(draws[(b, k)])
            r = va / vb
            r = r[np.isfinite(r)]
            point = out["methods"][a]["fap"][k]["snr50"] / out["methods"][b]["fap"][k]["snr50"]
            out["ratio"][k] = {
                "value": point,
                "std": float(r.std(ddof=1)) if len(r) > 1 else float("nan"),
            }
    return out


def at_thresholds(signal: dict[str, np.ndarray], snr: np.ndarray, thresholds: dict,
                  draws: dict, *, bootstrap: int = 200, seed: int = 0, bins: int = 10) -> dict:  # fmt: skip
    """:func:`evaluate` with thresholds set elsewhere (a background study's, on far more noise
    than a test set holds). ``signal``: method -> statistic of each signal event;
    ``thresholds``: method -> {fap key: threshold}; ``draws``: method -> {fap key: ``bootstrap``
    thresholds of resampled backgrounds}, drawn with the signals' resampling, so the SNR50's
    bootstrap error holds both the background's and the signals' finite counts. Returns the
    same structure as :func:`evaluate` (per method and false-alarm probability: threshold,
    snr50, probit_width, efficiency, snr50_std; ``ratio`` of the first method to the second)."""
    n = len(snr)
    if n < 20:
        raise ValueError(f"{n} signal events; at least 20 are needed")
    top = float(snr.max())
    edges = np.linspace(float(snr.min()), np.nextafter(top, np.inf), bins + 1)
    out: dict = {"methods": {}, "signal_events": int(n), "snr_edges": edges.tolist()}
    for name, s in signal.items():
        out["methods"][name] = {"fap": {}}
        for key, t in thresholds[name].items():
            det = (s > t).astype(float)
            a, b = fit_probit(snr, det)
            out["methods"][name]["fap"][key] = {"threshold": t, "snr50": a, "probit_width": b,
                                                "efficiency": efficiency_curve(snr, det, edges)}  # fmt: skip
    rng = np.random.default_rng(seed)
    fits = {(m, k): [] for m in signal for k in thresholds[m]}
    for i in range(bootstrap):
        bs = rng.integers(0, n, n)
        for (m, k), values in fits.items():
            values.append(fit_snr50(snr[bs], (signal[m][bs] > draws[m][k][i]).astype(float)))
    for (m, k), values in fits.items():
        v = np.asarray(values)
        ok = v[np.isfinite(v)]
        out["methods"][m]["fap"][k]["snr50_std"] = (
            float(ok.std(ddof=1)) if len(ok) > 1 else float("nan")
        )
    names = list(signal)
    if len(names) == 2:
        a, b = names
        out["ratio"] = {}
        for k in thresholds[a]:
            if k not in thresholds[b]:
                continue
            r = np.asarray(fits[(a, k)]) / np.asarray(fits[(b, k)])
            r = r[np.isfinite(r)]
            point = out["methods"][a]["fap"][k]["snr50"] / out["methods"][b]["fap"][k]["snr50"]
            out["ratio"][k] = {"value": point,
                               "std": float(r.std(ddof=1)) if len(r) > 1 else float("nan")}  # fmt: skip
    return out
