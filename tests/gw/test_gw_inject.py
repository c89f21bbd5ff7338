"""SNR calibration: whitened excess power, injection scaling, matched-filter recovery."""

import numpy as np
import pytest
from fixtures.gw import assert_mean_matches

from rootclad.gw.dataset import SimulationConfig, event_seeds, generate_events
from rootclad.gw.inject import inject_signal, scale_to_snr
from rootclad.gw.noise import colored_noise
from rootclad.gw.waveforms import waveform
from rootclad.gw.whiten import band_dimensions, optimal_snr

FS = 2048.0
N = 2048


def _excess_power(config, n_events, seed):
    ev = generate_events(event_seeds(seed, 0, n_events), config)
    sig = ev["label"] == 1
    w = ev["strain"][sig].astype(np.float64)
    return (w**2).sum(axis=1) - N, ev["snr"][sig].astype(np.float64) ** 2


def test_excess_power_equals_snr_squared_over_the_whole_band():
    # whitening over the whole spectrum: E[sum(w^2) - n] = E[snr^2] exactly
    config = SimulationConfig(signal_fraction=1.0, snr=(4.0, 12.0), band=(0.0, FS / 2))
    excess, snr2 = _excess_power(config, 3000, seed=21)
    assert_mean_matches(excess - snr2, 0.0, what="sum(w^2) - n - snr^2, full band")


def test_excess_power_with_the_default_band():
    # band-limited noise fills D = 2 x 981 of the n = 2048 dimensions; with unit
    # variance per sample each carries n / D, so E[sum(w^2) - n] = (n / D) E[snr^2]
    config = SimulationConfig(signal_fraction=1.0, snr=(4.0, 12.0))
    excess, snr2 = _excess_power(config, 3000, seed=22)
    dims = 2 * 981  # integer frequencies 20..1000 Hz
    assert band_dimensions(N, FS, (20.0, 1000.0)) == dims
    assert_mean_matches(excess - (N / dims) * snr2, 0.0, what="excess power, 20-1000 Hz")


def test_noise_events_have_no_excess_power():
    config = SimulationConfig(signal_fraction=0.0)
    ev = generate_events(event_seeds(23, 0, 2000), config)
    excess = (ev["strain"].astype(np.float64) ** 2).sum(axis=1) - N
    assert_mean_matches(excess, 0.0, what="noise-only excess power")
    assert np.all(ev["snr"] == 0) and np.all(ev["label"] == 0)


def test_injection_scales_to_the_requested_snr():
    h = waveform(np.array([20.0, 40.0]), np.array([10.0, 35.0]), np.array([0.6, 0.8]), 0.0)
    scaled = scale_to_snr(h, np.array([8.0, 15.0]))
    np.testing.assert_allclose(optimal_snr(scaled), [8.0, 15.0], rtol=1e-12)
    noise = colored_noise(2, seed=3)
    data = inject_signal(noise, h, np.array([8.0, 15.0]))
    np.testing.assert_allclose(optimal_snr(data - noise), [8.0, 15.0], rtol=1e-9)


def test_matched_filter_with_the_true_template_recovers_the_snr():
    # textbook matched filter, written here independently of rootclad.gw.matched_filter:
    # z = <d, h> / sqrt(<h, h>) with <a, b> = 4 df Re sum a b* / S, maximised over phase
    rng = np.random.default_rng(5)
    k = 200
    m1 = rng.uniform(10, 60, k)
    m2 = rng.uniform(5, 10, k)
    tm = rng.uniform(0.5, 0.9, k)
    snr = rng.uniform(8, 16, k)
    h = scale_to_snr(waveform(m1, m2, tm, rng.uniform(0, 2 * np.pi, k)), snr)
    d = colored_noise(k, seed=rng) + h
    from rootclad.gw.psd import aligo_psd

    f = np.fft.rfftfreq(N, 1 / FS)
    band = (f >= 20) & (f <= 1000)
    s = aligo_psd(np.maximum(f, 1.0))
    dt, df = 1 / FS, FS / N
    dfd, hfd = np.fft.rfft(d) * dt, np.fft.rfft(h) * dt
    inner = 4 * df * np.sum(np.where(band, dfd * np.conj(hfd) / s, 0), axis=1)
    norm = np.sqrt(4 * df * np.sum(np.where(band, np.abs(hfd) ** 2 / s, 0), axis=1))
    recovered = np.abs(inner) / norm
    ratio = recovered / snr
    assert abs(ratio.mean() - 1) < 0.10, f"mean recovered/injected = {ratio.mean():.3f}"
    # and per event within the noise: |z| - snr has unit-ish spread
    assert np.std(recovered - snr) < 1.5


def test_a_wrongly_scaled_injection_is_caught():
    config = SimulationConfig(signal_fraction=1.0, snr=(4.0, 12.0), band=(0.0, FS / 2))
    excess, snr2 = _excess_power(config, 3000, seed=21)
    with pytest.raises(AssertionError):
        assert_mean_matches(excess - 1.1 * snr2, 0.0)
