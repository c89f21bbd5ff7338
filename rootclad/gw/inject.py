"""Signal injection at a chosen optimal SNR."""

from __future__ import annotations

import numpy as np

from rootclad.gw.psd import PSDLike
from rootclad.gw.whiten import DEFAULT_BAND, optimal_snr


def scale_to_snr(
    signal: np.ndarray,
    snr,
    sample_rate: float = 2048.0,
    psd: PSDLike = "aligo",
    band: tuple[float, float] = DEFAULT_BAND,
) -> np.ndarray:
    """Rescale signals (..., n) so that each has optimal SNR ``snr`` over ``band``."""
    signal = np.asarray(signal, dtype=np.float64)
    rho = optimal_snr(signal, sample_rate, psd, band)
    if np.any(rho <= 0):
        raise ValueError("a signal has no power in the band; it cannot be scaled to an SNR")
    return signal * (np.asarray(snr, dtype=np.float64) / rho)[..., None]


def inject_signal(
    noise: np.ndarray,
    signal: np.ndarray,
    snr,
    sample_rate: float = 2048.0,
    psd: PSDLike = "aligo",
    band: tuple[float, float] = DEFAULT_BAND,
) -> np.ndarray:
    """``noise + signal`` with the signal scaled to optimal SNR ``snr`` (both (..., n), unwhitened)."""
    return np.asarray(noise, dtype=np.float64) + scale_to_snr(signal, snr, sample_rate, psd, band)
