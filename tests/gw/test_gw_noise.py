"""Coloured noise: its Welch PSD (scipy) against the target PSD."""

import numpy as np
import pytest
from fixtures.gw import assert_mean_matches, assert_ratio_close
from scipy.signal import welch

from rootclad.gw.noise import colored_noise
from rootclad.gw.psd import aligo_psd

FS = 2048.0


def _welch_vs_target(noise, target):
    f, s = welch(noise.ravel(), fs=FS, nperseg=int(FS))
    band = (f >= 30) & (f <= 800)
    return s[band], target(f[band])


def test_welch_psd_of_noise_matches_the_design_psd():
    noise = colored_noise(1, duration=128.0, sample_rate=FS, seed=1)
    est, target = _welch_vs_target(noise, aligo_psd)
    assert_ratio_close(est, target, 0.10, "Welch PSD vs aLIGO design, 30-800 Hz")


def test_welch_check_catches_a_wrong_noise_level():
    noise = colored_noise(1, duration=128.0, sample_rate=FS, seed=1) * np.sqrt(1.25)
    est, target = _welch_vs_target(noise, aligo_psd)
    with pytest.raises(AssertionError):
        assert_ratio_close(est, target, 0.10)


def test_noise_from_lalsuite_psd_matches_lalsuite():
    ls = pytest.importorskip(
        "lalsimulation", reason="lalsuite (optional extra 'lal') not installed"
    )

    def lal_curve(f):
        return np.array([ls.SimNoisePSDaLIGOZeroDetHighPower(float(x)) for x in f])

    noise = colored_noise(1, duration=64.0, sample_rate=FS, psd="lal:aLIGOZeroDetHighPower", seed=2)
    est, target = _welch_vs_target(noise, lal_curve)
    assert_ratio_close(est, target, 0.10, "Welch PSD vs lalsuite curve")


def test_noise_variance_is_the_integral_of_the_psd():
    # Parseval: the variance of a sample is the integral of the one-sided PSD to Nyquist
    from scipy.integrate import quad

    n = 1024
    psd = lambda f: 1e-46 * (1 + (np.asarray(f) / 300.0) ** 2)  # noqa: E731
    x = colored_noise(4000, duration=n / FS, sample_rate=FS, psd=psd, seed=3)
    expected = quad(psd, 0, FS / 2)[0]
    assert_mean_matches(x.var(axis=1) / expected, 1.0, what="variance / integral of PSD")


def test_segment_length_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        colored_noise(1, duration=1.5, sample_rate=FS)


def test_same_seed_same_noise():
    a = colored_noise(3, seed=7)
    np.testing.assert_array_equal(a, colored_noise(3, seed=7))
    assert not np.array_equal(a, colored_noise(3, seed=8))
