"""Whitening: flat, unit-variance, band-limited output; the band's dimension count."""

import numpy as np
import pytest
from fixtures.gw import assert_mean_matches, assert_ratio_close
from scipy.signal import welch

from rootclad.gw.noise import colored_noise
from rootclad.gw.psd import aligo_psd, welch_psd
from rootclad.gw.whiten import band_dimensions, excess_power_factor, optimal_snr, whiten

FS = 2048.0


def test_whitened_noise_has_unit_variance_per_sample():
    w = whiten(colored_noise(3000, seed=11), FS)
    per_segment = (w**2).mean(axis=1)
    assert_mean_matches(per_segment, 1.0, what="whitened variance per sample")
    # every sample position, not only the average: compare across segments
    assert np.abs(w.var(axis=0) - 1).max() < 5 * np.sqrt(2 / 3000) * 1.1


def test_whitened_noise_is_flat_in_band_and_empty_outside():
    w = whiten(colored_noise(1, duration=128.0, seed=12), FS, band=(20.0, 1000.0))
    f, s = welch(w.ravel(), fs=FS, nperseg=1024)
    n, dims = 128 * 2048, band_dimensions(128 * 2048, FS, (20.0, 1000.0))
    level = 2.0 / FS * n / dims  # one-sided PSD of the whitened noise in band
    inside = (f >= 40) & (f <= 980)
    assert_ratio_close(s[inside], np.full(inside.sum(), level), 0.10, "flat whitened PSD")
    # 16 sub-bands, each flat within 5 %
    for chunk in np.array_split(s[inside], 16):
        assert abs(chunk.mean() / level - 1) < 0.05
    # the segment is periodic and whitening zeroes whole bins: exactly nothing outside
    spec = np.abs(np.fft.rfft(w.ravel())) ** 2
    fb = np.fft.rfftfreq(w.size, 1 / FS)
    outside = (fb < 20) | (fb > 1000)
    assert spec[outside].max() < 1e-20 * spec[~outside].mean()


def test_whitening_with_a_welch_estimate():
    fs = FS
    psd_est = welch_psd(colored_noise(1, duration=256.0, seed=13)[0], fs, segment_seconds=4.0)
    w = whiten(colored_noise(500, seed=14), fs, psd=psd_est)
    assert abs(w.var() - 1) < 0.05


def test_band_dimension_count_is_analytic():
    # 1 s at 2048 Hz: bins every 1 Hz; 20..1000 Hz holds 981 complex bins
    assert band_dimensions(2048, FS, (20.0, 1000.0)) == 2 * 981
    assert excess_power_factor(2048, FS, (20.0, 1000.0)) == pytest.approx(2048 / 1962)
    # the whole spectrum: DC and Nyquist are real, so all n dimensions
    assert excess_power_factor(2048, FS, (0.0, 1024.0)) == 1.0


def test_optimal_snr_of_a_sinusoid_is_analytic():
    # h = A cos(2 pi f0 t) on a bin: rho^2 = A^2 T / S(f0)
    n, f0, amp = 4096, 250.0, 3e-22
    t = np.arange(n) / FS
    h = amp * np.cos(2 * np.pi * f0 * t)
    expected = amp * np.sqrt((n / FS) / aligo_psd(np.array([f0]))[0])
    assert optimal_snr(h, FS) == pytest.approx(expected, rel=1e-9)
    # outside the band it is invisible
    h_low = amp * np.cos(2 * np.pi * 10.0 * t)
    assert optimal_snr(h_low, FS) < 1e-6 * expected


def test_bad_band_is_refused():
    with pytest.raises(ValueError, match="band"):
        whiten(np.zeros(2048), FS, band=(500.0, 100.0))
