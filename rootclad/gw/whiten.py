"""Band-limited whitening and the noise-weighted inner product that goes with it.

Conventions (used throughout ``rootclad.gw``): a segment has ``n`` samples at
``sample_rate`` Hz, ``dt = 1 / sample_rate``; ``X = numpy.fft.rfft(x)``. For
stationary noise with one-sided PSD ``S``, ``E|X_k|^2 = n S_k / (2 dt)``.

Whitening keeps the rfft bins with ``band[0] <= f <= band[1]`` and divides
them by ``sqrt(S)``; every other bin is set to zero. The result is scaled so
that whitened noise has unit variance per sample. Band-limited noise fills
only ``D`` of the ``n`` real dimensions of a segment (``D = 2 x`` the interior
bins in the band, plus 1 for DC or Nyquist if they are in it), so each of
those dimensions carries variance ``n / D``. Two consequences, both exact:

- a signal with optimal SNR ``rho`` over the band has whitened energy
  ``sum(s_w^2) = (n / D) rho^2`` (:func:`excess_power_factor` is ``n / D``,
  1.044 for 1 s at 2048 Hz and 20-1000 Hz); so for whitened data
  ``E[sum(w^2) - n] = (n / D) E[rho^2]``, and ``E[sum(w^2) - n] = E[rho^2]``
  when the band is the whole spectrum;
- the matched filter of :mod:`rootclad.gw.matched_filter` divides by this
  factor, so its output is in units of SNR.
"""

from __future__ import annotations

import numpy as np

from rootclad.gw.psd import PSDLike, psd_on_grid, rfft_frequencies

DEFAULT_BAND = (20.0, 1000.0)


def band_mask(n: int, sample_rate: float, band: tuple[float, float] = DEFAULT_BAND) -> np.ndarray:
    """Boolean mask over the ``n // 2 + 1`` rfft bins: ``band[0] <= f <= band[1]``."""
    lo, hi = float(band[0]), float(band[1])
    if not 0 <= lo < hi:
        raise ValueError(f"band must satisfy 0 <= low < high, got {band}")
    f = rfft_frequencies(n, sample_rate)
    mask = (f >= lo) & (f <= hi)
    if not mask.any():
        raise ValueError(f"band {band} Hz holds no frequency bin of a {n}-sample segment")
    return mask


def bin_weights(n: int) -> np.ndarray:
    """How many real dimensions each rfft bin carries: 2, except 1 for DC and Nyquist."""
    w = np.full(n // 2 + 1, 2.0)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    return w


def band_dimensions(n: int, sample_rate: float, band: tuple[float, float] = DEFAULT_BAND) -> float:
    """``D``: the number of real dimensions of an ``n``-sample segment inside ``band``."""
    return float(bin_weights(n)[band_mask(n, sample_rate, band)].sum())


def excess_power_factor(
    n: int, sample_rate: float, band: tuple[float, float] = DEFAULT_BAND
) -> float:
    """``n / D``: whitened signal energy per unit of optimal SNR squared (see module docstring)."""
    return n / band_dimensions(n, sample_rate, band)


def whitening_filter(
    n: int, sample_rate: float, psd: PSDLike = "aligo", band: tuple[float, float] = DEFAULT_BAND
) -> np.ndarray:
    """Real filter over the rfft bins: ``sqrt(2 dt n / D) / sqrt(S)`` in the band, 0 outside.

    ``irfft(rfft(x) * filter)`` is the whitened segment.
    """
    dt = 1.0 / sample_rate
    mask = band_mask(n, sample_rate, band)
    dims = bin_weights(n)[mask].sum()
    s = psd_on_grid(psd, n, sample_rate)
    out = np.zeros(n // 2 + 1)
    out[mask] = np.sqrt(2.0 * dt * n / dims) / np.sqrt(s[mask])
    return out


def whiten(
    x: np.ndarray,
    sample_rate: float = 2048.0,
    psd: PSDLike = "aligo",
    band: tuple[float, float] = DEFAULT_BAND,
) -> np.ndarray:
    """Whiten segments ``x`` (..., n) with a known PSD or an estimate (see :mod:`.psd`).

    Returns float64 (..., n). Whitened noise has unit variance per sample and
    a flat spectrum inside ``band``, nothing outside it. The segment is
    treated as periodic, which is exact for the noise and signals that
    :func:`rootclad.gw.simulate` writes (both are built on the segment's own
    Fourier grid); for recorded data, taper or crop the edges first.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    filt = whitening_filter(n, sample_rate, psd, band)
    return np.fft.irfft(np.fft.rfft(x, axis=-1) * filt, n=n, axis=-1)


def optimal_snr(
    h: np.ndarray,
    sample_rate: float = 2048.0,
    psd: PSDLike = "aligo",
    band: tuple[float, float] = DEFAULT_BAND,
) -> np.ndarray:
    """Optimal matched-filter SNR of time series ``h`` (..., n) over ``band``.

    ``rho^2 = 4 df sum_k |h~(f_k)|^2 / S(f_k)`` over the bins in the band (2
    instead of 4 for DC and Nyquist), with ``h~ = dt rfft(h)``, ``df = 1/(n dt)``.
    """
    h = np.asarray(h, dtype=np.float64)
    n = h.shape[-1]
    dt = 1.0 / sample_rate
    mask = band_mask(n, sample_rate, band)
    w = bin_weights(n)[mask]
    s = psd_on_grid(psd, n, sample_rate)[mask]
    hf = np.fft.rfft(h, axis=-1)[..., mask]
    return np.sqrt(2.0 * dt / n * np.sum(w * np.abs(hf) ** 2 / s, axis=-1))
