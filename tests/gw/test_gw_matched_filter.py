"""The matched-filter baseline: noise statistics, true-template recovery, bank coverage."""

import numpy as np
import pytest
from fixtures.gw import assert_mean_matches

from rootclad.gw.dataset import SimulationConfig, event_seeds, generate_events
from rootclad.gw.matched_filter import (
    TemplateBank,
    _snr_series,
    make_template_bank,
    match,
    matched_filter_snr,
    whitened_templates,
)
from rootclad.gw.whiten import band_dimensions

N, FS, BAND = 2048, 2048.0, (20.0, 1000.0)


def _bank(m1, m2, t_ref):
    t = whitened_templates(m1, m2, t_ref=t_ref)
    return TemplateBank(np.c_[m1, m2], t, N, FS, BAND, "aligo", t_ref)


def test_filter_output_on_noise_is_unit_variance_per_quadrature():
    ev = generate_events(event_seeds(31, 0, 2000), SimulationConfig(signal_fraction=0.0))
    bank = _bank([20.0], [12.0], 0.6)
    z = _snr_series(np.fft.rfft(ev["strain"].astype(np.float64)), bank.templates[0], N)
    # |z|^2 at a fixed time is chi^2 with 2 degrees of freedom: mean 2
    assert_mean_matches(z[:, 100] ** 2, 2.0, what="|z|^2 on noise")
    assert_mean_matches(z[:, 1500] ** 2, 2.0, what="|z|^2 on noise")


def test_true_template_recovers_the_injected_snr():
    config = SimulationConfig(signal_fraction=1.0, snr=(8.0, 16.0))
    ev = generate_events(event_seeds(32, 0, 60), config)
    ratios = []
    for i in range(60):
        bank = _bank([ev["m1"][i]], [ev["m2"][i]], float(ev["t_merger"][i]))
        r = matched_filter_snr(ev["strain"][i : i + 1], bank)
        ratios.append(r.snr[0] / ev["snr"][i])
        assert min(r.time[0], 1.0 - r.time[0]) < 0.03  # found near zero shift
    assert abs(np.mean(ratios) - 1) < 0.10, np.mean(ratios)


def test_match_of_a_template_with_itself_is_one():
    t = whitened_templates([30.0, 31.0], [20.0, 5.0], t_ref=0.6)
    dims = band_dimensions(N, FS, BAND)
    assert match(t[0], t[0], N, dims) == pytest.approx(1.0, rel=1e-9)
    assert match(t[1], t[0], N, dims) < 0.9


def test_bank_covers_the_mass_range():
    bank = make_template_bank((5.0, 95.0), min_match=0.9, max_misses=60, seed=1, t_ref=0.5)
    assert 5 <= len(bank) < 400
    assert np.all(bank.masses >= 5.0) and np.all(bank.masses <= 95.0)
    assert np.all(bank.masses[:, 0] >= bank.masses[:, 1])
    rng = np.random.default_rng(2)
    m = rng.uniform(5, 95, (40, 2))
    probes = whitened_templates(m.max(1), m.min(1), t_ref=0.5)
    dims = band_dimensions(N, FS, BAND)
    ff = np.array([match(bank.templates, p, N, dims).max() for p in probes])
    assert np.median(ff) > 0.9 and np.mean(ff) > 0.85, ff


def test_bank_separates_signals_from_noise():
    bank = make_template_bank((5.0, 95.0), min_match=0.9, max_misses=60, seed=1, t_ref=0.5)
    sig = generate_events(
        event_seeds(33, 0, 100), SimulationConfig(signal_fraction=1.0, snr=(10.0, 12.0))
    )
    noise = generate_events(event_seeds(34, 0, 100), SimulationConfig(signal_fraction=0.0))
    s = matched_filter_snr(sig["strain"], bank).snr
    b = matched_filter_snr(noise["strain"].reshape(100, 1, N), bank).snr
    assert np.median(s / sig["snr"]) > 0.85
    assert np.mean(s > b.max()) > 0.9


def test_wrong_input_shape_is_refused():
    bank = _bank([20.0], [12.0], 0.6)
    with pytest.raises(ValueError, match="strain must be"):
        matched_filter_snr(np.zeros((3, 1024)), bank)


def test_single_precision_search_is_the_double_precision_series_maximum():
    """matched_filter_snr (complex64 FFTs) against the double-precision |z(t)| of every
    template, maximised here: the SNR to 1e-6 of itself, the same template and time, across a
    batch boundary (batches of 16 over 40 segments)."""
    ev = generate_events(event_seeds(33, 0, 40), SimulationConfig(signal_fraction=0.5))
    bank = _bank([20.0, 35.0, 12.0], [12.0, 30.0, 6.0], 0.6)
    r = matched_filter_snr(ev["strain"], bank, batch_size=16)
    wf = np.fft.rfft(ev["strain"].astype(np.float64))
    z = np.stack([_snr_series(wf, t, N) for t in bank.templates])  # (K, B, n)
    flat = z.reshape(len(bank), len(wf), N).transpose(1, 0, 2).reshape(len(wf), -1)
    best = flat.argmax(axis=1)
    np.testing.assert_allclose(r.snr, flat.max(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(r.template, best // N)
    np.testing.assert_allclose(r.time, (best % N) / FS)
    assert not np.allclose(r.snr, flat.max(axis=1) * (1 + 1e-5), rtol=1e-6)  # it can tell
