"""What ``rootclad gw run`` writes besides the numbers: ``scores.root`` read back through ROOT,
from evaluation results of synthetic statistics, and the saliency plot's axes (no training:
seconds)."""

from __future__ import annotations

import numpy as np
import pytest

from rootclad.gw.run import evaluate as ev

N_NOISE, N_SIGNAL = 300, 240
ONE_SIGMA = 0.6826894921370859  # P(|z| < 1): evaluate.wilson's z = 1 as a confidence level


@pytest.fixture(scope="module")
def ROOT():
    pytest.importorskip("ROOT", reason="scores.root is written through PyROOT")
    from rootclad.data.cling import import_root

    return import_root()


@pytest.fixture(scope="module")
def synthetic():
    """Labels, SNRs and both statistics of a made-up test set, and their evaluation."""
    rng = np.random.default_rng(5)
    label = np.r_[np.zeros(N_NOISE, np.int32), np.ones(N_SIGNAL, np.int32)]
    snr = np.where(label == 1, rng.uniform(4, 16, len(label)), 0.0)
    network = rng.standard_normal(len(label)) - 3 + 0.5 * snr  # a logit: negative and positive
    # the network's logits are float32 (ROOT's scores equal them): the extremes are exact
    network = network.astype(np.float32).astype(np.float64)
    mf = np.hypot(rng.standard_normal(len(label)), rng.standard_normal(len(label))) + 0.35 * snr
    stat = {"network": network, "matched_filter": mf}
    out = ev.evaluate(stat, label, snr, bootstrap=2, seed=0)
    return label, snr, stat, out


def _write(ROOT, tmp_path, synthetic):
    from rootclad.gw.run.pipeline import _write_scores_file

    label, _, stat, out = synthetic
    # what RDataFrame hands back: the network's scores as float32
    cols = {"score": stat["network"].astype(np.float32), "label": label}
    path = tmp_path / "scores.root"
    _write_scores_file(ROOT, path, path, cols, stat["matched_filter"], out)
    return path


def test_efficiencies_are_tefficiencies_with_roots_wilson_interval(ROOT, tmp_path, synthetic):
    """Per method and false-alarm probability: a TEfficiency whose passed/total counts are the
    test's own count of signals above the threshold per SNR bin, and whose interval (ROOT's
    own Wilson computation, at one standard deviation) equals evaluate.wilson's; the graph beside it is a
    TGraphAsymmErrors with those bounds."""
    label, snr, stat, out = synthetic
    f = ROOT.TFile.Open(str(_write(ROOT, tmp_path, synthetic)))
    try:
        sig = label == 1
        edges = np.linspace(snr[sig].min(), snr[sig].max() + 1e-9, 11)  # evaluate's 10 bins
        for method, s in stat.items():
            for fap in ev.FAPS:
                key = ev.fap_key(fap)
                res = out["methods"][method]["fap"][key]
                above = s[sig] > np.quantile(s[~sig], 1 - fap)
                total, _ = np.histogram(snr[sig], edges)
                passed, _ = np.histogram(snr[sig][above], edges)
                teff = f.Get(f"tefficiency_{method}_{key}")
                assert teff and teff.ClassName() == "TEfficiency", (method, key)
                assert teff.GetName() == f"tefficiency_{method}_{key}"
                assert teff.GetStatisticOption() == ROOT.TEfficiency.kFWilson
                assert teff.GetConfidenceLevel() == pytest.approx(ONE_SIGMA, abs=1e-12)
                # ROOT 6.40 reads the option back but not the interval function it selects
                # (Clopper-Pearson stays): setting the option again restores it
                teff.SetStatisticOption(teff.GetStatisticOption())
                axis = teff.GetTotalHistogram().GetXaxis()
                assert axis.GetNbins() == 10
                np.testing.assert_allclose([axis.GetBinLowEdge(b) for b in range(1, 12)], edges)
                got_total = [teff.GetTotalHistogram().GetBinContent(b) for b in range(1, 11)]
                got_passed = [teff.GetPassedHistogram().GetBinContent(b) for b in range(1, 11)]
                assert got_total == total.tolist() and got_passed == passed.tolist()
                e = res["efficiency"]
                bins = [axis.FindFixBin(x) for x in e["snr"]]
                assert [int(total[b - 1]) for b in bins] == e["n"]
                lo = [teff.GetEfficiency(b) - teff.GetEfficiencyErrorLow(b) for b in bins]
                hi = [teff.GetEfficiency(b) + teff.GetEfficiencyErrorUp(b) for b in bins]
                np.testing.assert_allclose(lo, e["low"], atol=1e-9)
                np.testing.assert_allclose(hi, e["high"], atol=1e-9)
                g = f.Get(f"efficiency_{method}_{key}")
                assert g.ClassName() == "TGraphAsymmErrors"
                y = np.array([g.GetPointY(i) for i in range(g.GetN())])
                np.testing.assert_allclose(y, passed[total > 0] / total[total > 0])
                glo = [g.GetPointY(i) - g.GetErrorYlow(i) for i in range(g.GetN())]
                ghi = [g.GetPointY(i) + g.GetErrorYhigh(i) for i in range(g.GetN())]
                np.testing.assert_allclose(glo, lo, atol=1e-9)
                np.testing.assert_allclose(ghi, hi, atol=1e-9)
                # an interval, not a symmetric error: the two sides differ near 0 and 1
                assert any(abs(g.GetErrorYlow(i) - g.GetErrorYhigh(i)) > 1e-3
                           for i in range(g.GetN()))  # fmt: skip
    finally:
        f.Close()


HISTOGRAMS = {"network": "score_{}", "matched_filter": "score_matched_filter_{}"}


def test_score_histograms_of_both_methods_hold_every_event(ROOT, tmp_path, synthetic):
    """Per method and class a histogram whose range holds every entry: nothing in the
    underflow or overflow bin, the integral the number of events, the mean theirs (a range set
    on the data's own extremes put the largest entry in the overflow)."""
    label, _, stat, _ = synthetic
    f = ROOT.TFile.Open(str(_write(ROOT, tmp_path, synthetic)))
    try:
        total = 0
        for method, s in stat.items():
            for cls, name in ((0, "noise"), (1, "signal")):
                h = f.Get(HISTOGRAMS[method].format(name))
                assert h and h.InheritsFrom("TH1"), (method, name)
                x = s[label == cls].astype(np.float32 if method == "network" else np.float64)
                nbins = h.GetNbinsX()
                assert h.GetBinContent(0) == 0 and h.GetBinContent(nbins + 1) == 0, (method, name)
                assert h.Integral() == len(x) == h.GetEntries()
                assert h.GetMean() == pytest.approx(float(np.mean(x, dtype=np.float64)), abs=1e-9)
                total += h.Integral()
            # both classes of a method share one binning: the two can be compared bin by bin
            a, b = (f.Get(HISTOGRAMS[method].format(n)).GetXaxis() for n in ("noise", "signal"))
            assert (a.GetXmin(), a.GetXmax()) == (b.GetXmin(), b.GetXmax())
        assert total == 2 * len(label)
    finally:
        f.Close()


def _titles(obj):
    """(title, x-axis title, y-axis title) of a histogram, graph or TEfficiency."""
    if obj.InheritsFrom("TEfficiency"):
        h = obj.GetTotalHistogram()
        return obj.GetTitle().split(";")[0], h.GetXaxis().GetTitle(), h.GetYaxis().GetTitle()
    h = obj if obj.InheritsFrom("TH1") else obj.GetHistogram()
    return h.GetTitle(), h.GetXaxis().GetTitle(), h.GetYaxis().GetTitle()


def test_scores_file_titles_are_words_with_axis_titles(ROOT, tmp_path, synthetic):
    """Every object has a title and both axis titles, none with a raw identifier such as
    matched_filter; the matched filter's objects say "matched filter"."""
    f = ROOT.TFile.Open(str(_write(ROOT, tmp_path, synthetic)))
    try:
        keys = [k.GetName() for k in f.GetListOfKeys()]
        assert sum("matched_filter" in k for k in keys) >= 2 + 1 + 2 * len(ev.FAPS)
        for key in keys:
            titles = _titles(f.Get(key))
            assert all(t.strip() for t in titles), (key, titles)
            assert not any("_" in t for t in titles), (key, titles)
            if "matched_filter" in key:
                assert "matched filter" in titles[0] or "matched-filter" in titles[0], key
    finally:
        f.Close()


def test_saliency_plot_labels_both_axes_and_says_what_the_band_is():
    """Left axis: the whitened strain, labelled; right axis: the band's scale (0 to 1, with
    ticks and a label), the legend naming the band as the saliency over its maximum, and each
    panel's title giving that maximum (computed here from the saliency)."""
    from rootclad.gw.run import report

    rng = np.random.default_rng(2)
    n, k = 256, 2
    sal = rng.standard_normal((k, n)) * np.array([[0.02], [3.0]])
    examples = {"index": [7, 11], "snr": [9.0, 14.0], "strain": rng.standard_normal((k, n)),
                "signal": np.zeros((k, n)), "saliency": sal}  # fmt: skip
    plt = report._fig()
    fig = report.saliency_figure(plt, examples, 1024.0)
    try:
        left = [a for a in fig.axes if a.yaxis.get_label_position() == "left"]
        right = [a for a in fig.axes if a.yaxis.get_label_position() == "right"]
        assert len(left) == len(right) == k
        for i, (ax, ax2) in enumerate(zip(left, right, strict=True)):
            assert "strain" in ax.get_ylabel()
            assert "d logit / d strain" in ax2.get_ylabel() and "max" in ax2.get_ylabel()
            ticks = [float(t) for t in ax2.get_yticks()]
            assert 0.0 in ticks and 1.0 in ticks, ticks
            assert ax2.get_ylim()[0] == 0 and 1 <= ax2.get_ylim()[1] < 1.2
            band = ax2.collections[0].get_paths()[0].vertices[:, 1]
            assert band.max() == pytest.approx(1.0)  # scaled to the event's largest value
            assert f"{np.abs(sal[i]).max():.2e}" in ax.get_title()
        legend = [t.get_text() for t in left[0].get_legend().get_texts()]
        assert any("d logit / d strain" in t and "maximum" in t for t in legend), legend
        assert left[-1].get_xlabel() == "time (s)"
    finally:
        plt.close(fig)
