"""Comparison helpers for the GW tests; each has a must-fail test in test_gw_helpers.py.

References are independent of rootclad: lalsuite, scipy, analytic formulas.
"""

from __future__ import annotations

import numpy as np


def overlap(a: np.ndarray, b: np.ndarray, weight: np.ndarray) -> float:
    """Normalised overlap of two one-sided spectra, maximised over time shift and phase.

    ``a``, ``b``: complex (nf,) on the same uniform grid; ``weight``: 1/S(f) on the
    bins that count, 0 elsewhere. Time is maximised with a zero-padded complex FFT
    (8x oversampled), phase by taking the modulus.
    """
    a, b, w = np.asarray(a), np.asarray(b), np.asarray(weight, dtype=float)
    norm = np.sqrt(np.sum(np.abs(a) ** 2 * w) * np.sum(np.abs(b) ** 2 * w))
    if norm == 0:
        raise AssertionError("overlap of a waveform with no power in the band")
    prod = a * np.conj(b) * w
    series = np.fft.ifft(prod, n=8 * len(prod)) * 8 * len(prod)
    return float(np.abs(series).max() / norm)


def assert_overlap_above(a, b, weight, minimum: float, what: str = "") -> float:
    value = overlap(a, b, weight)
    assert value >= minimum, f"{what}: overlap {value:.5f} < {minimum}"
    return value


def assert_mean_matches(sample, expected: float, n_sigma: float = 4.0, what: str = "") -> None:
    """The mean of ``sample`` equals ``expected`` within ``n_sigma`` standard errors."""
    sample = np.asarray(sample, dtype=float).ravel()
    assert sample.size >= 10, f"{what}: too few samples ({sample.size}) to compare a mean"
    assert np.all(np.isfinite(sample)), f"{what}: non-finite values"
    err = sample.std(ddof=1) / np.sqrt(sample.size)
    diff = sample.mean() - expected
    assert abs(diff) <= n_sigma * err, (
        f"{what}: mean {sample.mean():.5g} vs expected {expected:.5g}: "
        f"{diff / err:+.2f} standard errors (allowed {n_sigma})"
    )


def assert_ratio_close(actual, expected, tol: float, what: str = "") -> None:
    """mean |actual / expected - 1| <= tol, and the mean ratio within tol of 1."""
    actual = np.asarray(actual, dtype=float)
    expected = np.asarray(expected, dtype=float)
    assert actual.shape == expected.shape, f"{what}: shapes {actual.shape} != {expected.shape}"
    assert np.all(expected > 0) and np.all(np.isfinite(actual)), f"{what}: bad values"
    ratio = actual / expected
    mad = np.mean(np.abs(ratio - 1))
    assert mad <= tol, f"{what}: mean |ratio - 1| = {mad:.4f} > {tol}"
    assert abs(ratio.mean() - 1) <= tol, (
        f"{what}: mean ratio {ratio.mean():.4f} not within {tol} of 1"
    )
