"""Detector noise power spectral densities (one-sided, strain^2 / Hz).

The built-in curve is an analytic fit to the Advanced LIGO design sensitivity
("zero-detuned, high power", LIGO-T0900288). Its form is a small noise budget:

    S(f) = 1e-48 [ A x^-p1 + B x^-p2 + C (1 + (f / f_p)^2) ],   x = f / 100 Hz

a steep low-frequency wall (seismic, suspension and radiation-pressure
noise), a shallow thermal-noise term and shot noise rising above the arm
cavity pole f_p. The six coefficients were fitted once, in log space, to
LALSimulation's ``SimNoisePSDaLIGOZeroDetHighPower`` on 10-4096 Hz, where the
fit stays within 1 % of it; ``tests/gw/test_psd.py`` checks that against
lalsuite when it is installed. Below 10 Hz the curve is held at its 10 Hz
value: the real detector is not modelled there and every analysis here starts
at 15-20 Hz.

A PSD can be given to the functions of this package as

- ``"aligo"``: the built-in fit;
- ``"lal:<name>"``: ``lalsimulation.SimNoisePSD<name>`` (needs lalsuite),
  e.g. ``"lal:aLIGOZeroDetHighPower"``;
- a callable ``f -> S(f)`` taking and returning numpy arrays;
- a pair ``(frequencies, values)``, e.g. a Welch estimate, interpolated in
  log-log space onto the frequencies needed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

PSDLike = str | Callable[[np.ndarray], np.ndarray] | tuple

# Fitted coefficients (see the module docstring).
_A, _P1, _B, _P2, _C, _FP = 0.2688, 4.541, 5.795, 0.7225, 8.963, 721.6
ALIGO_F_MIN = 10.0


def aligo_psd(f: np.ndarray) -> np.ndarray:
    """Advanced LIGO design PSD (analytic fit), strain^2/Hz at frequencies ``f`` (Hz)."""
    f = np.maximum(np.asarray(f, dtype=np.float64), ALIGO_F_MIN)
    x = f / 100.0
    return 1e-48 * (_A * x**-_P1 + _B * x**-_P2 + _C * (1.0 + (f / _FP) ** 2))


def lal_psd(
    f: np.ndarray, name: str = "aLIGOZeroDetHighPower", f_min: float = ALIGO_F_MIN
) -> np.ndarray:
    """A LALSimulation noise curve ``SimNoisePSD<name>`` evaluated at ``f``.

    Below ``f_min`` the curve is held at its value there, as for
    :func:`aligo_psd`: the aLIGO curves rise by ten orders of magnitude
    towards 0 Hz, and noise drawn from them would be nothing but that
    ultra-low-frequency rumble (which real data has filtered out).
    """
    try:
        import lalsimulation
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(f"PSD 'lal:{name}' needs lalsuite (pip install 'rootclad[lal]')") from err
    fn = getattr(lalsimulation, "SimNoisePSD" + name, None)
    if fn is None:
        raise ValueError(f"lalsimulation has no noise curve SimNoisePSD{name}")
    f = np.maximum(np.asarray(f, dtype=np.float64), f_min)
    out = np.array([fn(float(x)) for x in f.ravel()]).reshape(f.shape)
    if np.any(out <= 0):
        raise ValueError(f"SimNoisePSD{name} is zero at some requested frequency above {f_min} Hz")
    return out


def psd_function(psd: PSDLike) -> Callable[[np.ndarray], np.ndarray]:
    """Turn any accepted PSD description (see the module docstring) into ``f -> S(f)``."""
    if isinstance(psd, str):
        if psd == "aligo":
            return aligo_psd
        if psd.startswith("lal:"):
            name = psd[4:]
            return lambda f: lal_psd(f, name)
        raise ValueError(f"unknown PSD {psd!r}: use 'aligo', 'lal:<name>', a callable or (f, S)")
    if callable(psd):
        return psd
    if isinstance(psd, tuple) and len(psd) == 2:
        freqs = np.asarray(psd[0], dtype=np.float64)
        values = np.asarray(psd[1], dtype=np.float64)
        if freqs.shape != values.shape or freqs.ndim != 1:
            raise ValueError("a tabulated PSD is a pair of 1-d arrays of equal length")
        keep = (freqs > 0) & (values > 0) & np.isfinite(values)
        if keep.sum() < 2:
            raise ValueError("a tabulated PSD needs at least two positive, finite points")
        lf, lv = np.log(freqs[keep]), np.log(values[keep])

        def interpolated(f: np.ndarray) -> np.ndarray:
            f = np.asarray(f, dtype=np.float64)
            return np.exp(np.interp(np.log(np.maximum(f, freqs[keep][0])), lf, lv))

        return interpolated
    raise TypeError(f"cannot use {type(psd).__name__} as a PSD")


def rfft_frequencies(n: int, sample_rate: float) -> np.ndarray:
    """Frequencies (Hz) of the ``n // 2 + 1`` bins of ``numpy.fft.rfft`` of ``n`` samples."""
    return np.fft.rfftfreq(n, d=1.0 / sample_rate)


def psd_on_grid(psd: PSDLike, n: int, sample_rate: float) -> np.ndarray:
    """The PSD evaluated on the rfft grid of an ``n``-sample segment, shape ``(n // 2 + 1,)``."""
    values = np.asarray(psd_function(psd)(rfft_frequencies(n, sample_rate)), dtype=np.float64)
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError("the PSD must be positive and finite on every frequency bin")
    return values


def welch_psd(
    x: np.ndarray, sample_rate: float, segment_seconds: float = 1.0, average: str = "mean"
) -> tuple[np.ndarray, np.ndarray]:
    """Welch estimate (Hann window, 50 % overlap) of a one-sided PSD from a noise stretch.

    ``x``: (n,) or (k, n) samples; several rows are averaged. Returns ``(f, S)``,
    usable directly as a ``psd`` argument.
    """
    from scipy.signal import welch

    nper = int(round(segment_seconds * sample_rate))
    f, s = welch(np.asarray(x, dtype=np.float64), fs=sample_rate, nperseg=nper, average=average)
    if s.ndim == 2:
        s = s.mean(axis=0)
    return f, s
