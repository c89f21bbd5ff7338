"""The comparison helpers must be able to fail."""

import numpy as np
import pytest
from fixtures.gw import assert_mean_matches, assert_overlap_above, assert_ratio_close, overlap


def _chirp(f, mc):
    g = np.maximum(f, 1.0)
    return np.where(f > 20, g ** (-7 / 6) * np.exp(-200j * (g / mc) ** (-5 / 3)), 0)


def test_overlap_is_one_for_shifted_and_rotated_copies():
    f = np.arange(2049) * 0.5
    w = (f > 20).astype(float)
    a = _chirp(f, 30.0)
    shift = 37 / (0.5 * 8 * f.size)  # on the helper's time grid
    b = a * np.exp(-2j * np.pi * f * shift + 0.7j) * 3.0
    assert overlap(a, b, w) == pytest.approx(1.0, abs=1e-9)


def test_overlap_helper_fails_for_a_different_waveform():
    f = np.arange(2049) * 0.5
    w = (f > 20).astype(float)
    with pytest.raises(AssertionError, match="overlap"):
        assert_overlap_above(_chirp(f, 30.0), _chirp(f, 40.0), w, 0.99, "different chirp")


def test_mean_helper_fails_for_a_wrong_expectation():
    rng = np.random.default_rng(0)
    sample = rng.normal(1.0, 1.0, 10000)
    assert_mean_matches(sample, 1.0)
    with pytest.raises(AssertionError, match="standard errors"):
        assert_mean_matches(sample, 1.1)


def test_ratio_helper_fails_for_a_10_percent_error():
    x = np.linspace(1, 2, 100)
    assert_ratio_close(x * 1.02, x, 0.05)
    with pytest.raises(AssertionError, match="ratio"):
        assert_ratio_close(x * 1.11, x, 0.10)
