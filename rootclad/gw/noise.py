"""Stationary Gaussian detector noise coloured by a PSD.

Noise is drawn on the Fourier grid of the segment: independent complex
Gaussians with ``E|X_k|^2 = n S(f_k) / (2 dt)`` (real for DC and Nyquist),
then transformed back. The segment is therefore exactly periodic, which makes
whitening by the same PSD exact (see :mod:`rootclad.gw.whiten`).
"""

from __future__ import annotations

import numpy as np

from rootclad.gw.psd import PSDLike, psd_on_grid


def _check_length(n: int) -> None:
    if n < 2 or n & (n - 1):
        raise ValueError(f"segment length must be a power of two, got {n} samples")


def noise_spectrum(
    rng: np.random.Generator, shape: tuple[int, ...], psd_grid: np.ndarray, n: int, dt: float
) -> np.ndarray:
    """rfft of coloured noise: complex (*shape, n // 2 + 1) for a PSD sampled on the rfft grid.

    Draws ``(*shape, n // 2 + 1, 2)`` standard normals (real and imaginary parts).
    """
    return spectrum_from_normals(rng.standard_normal((*shape, n // 2 + 1, 2)), psd_grid, n, dt)


def spectrum_from_normals(z: np.ndarray, psd_grid: np.ndarray, n: int, dt: float) -> np.ndarray:
    """Coloured-noise rfft from standard normals ``z`` (..., n // 2 + 1, 2).

    Interior bins get ``sqrt(n S / (4 dt)) (z0 + i z1)``; DC and Nyquist are
    real, ``sqrt(n S / (2 dt)) z0``, so ``E|X_k|^2 = n S_k / (2 dt)`` for all k.
    """
    nf = n // 2 + 1
    if z.shape[-2:] != (nf, 2):
        raise ValueError(f"expected normals of shape (..., {nf}, 2), got {z.shape}")
    scale = np.sqrt(n * np.broadcast_to(psd_grid, (nf,)) / (4.0 * dt))
    out = scale * (z[..., 0] + 1j * z[..., 1])
    out[..., 0] = np.sqrt(2.0) * scale[0] * z[..., 0, 0]
    out[..., -1] = np.sqrt(2.0) * scale[-1] * z[..., -1, 0]
    return out


def colored_noise(
    n_segments: int = 1,
    duration: float = 1.0,
    sample_rate: float = 2048.0,
    psd: PSDLike = "aligo",
    seed: int | np.random.Generator | None = None,
) -> np.ndarray:
    """Stationary Gaussian noise with one-sided PSD ``psd``: float64 (n_segments, n).

    ``n = duration * sample_rate`` must be a power of two. ``seed``: an int or
    a ``numpy.random.Generator``.
    """
    n = int(round(duration * sample_rate))
    _check_length(n)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    spec = noise_spectrum(
        rng, (n_segments,), psd_on_grid(psd, n, sample_rate), n, 1.0 / sample_rate
    )
    return np.fft.irfft(spec, n=n, axis=-1)
