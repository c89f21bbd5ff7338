"""Compact-binary waveforms: a built-in TaylorF2 inspiral and LALSimulation approximants.

The built-in waveform is the stationary-phase (TaylorF2) inspiral of two
non-spinning point masses: 3.5PN phase and Newtonian amplitude, ending at the
Schwarzschild innermost stable circular orbit, f_ISCO = 1 / (6^1.5 pi M). Its
phase coefficients are those of LALSimulation's TaylorF2 (Buonanno, Iyer,
Ochsner, Pan & Sathyaprakash 2009, table I); ``tests/gw/test_waveforms.py``
compares it with lalsuite's own TaylorF2 when lalsuite is installed.

Conventions: ``h~(f) = dt * rfft(h)`` (the sign of numpy's forward FFT, as in
LAL), so a signal that coalesces at ``t_c`` carries ``exp(-2 pi i f t_c)``.
Only the plus polarisation of a face-on binary is produced. For one detector
and this (2,2)-mode model, any sky position, inclination and polarisation
only rescales the signal and shifts its phase, and both are set afterwards by
the requested SNR and a uniformly drawn ``phase``.

:func:`waveform` turns either model into what a detector records in one
segment: the chirp placed so that it coalesces ``t_merger`` seconds after the
segment start, cut to the segment and faded in over its first ``taper``
seconds (the earlier inspiral is outside the segment). In frequency it is
switched on smoothly (a cos^2 ramp of the stationary-phase time before
merger, before the segment starts) and, for the built-in model, rolled off
over the last 10 % below f_ISCO, so the time series has no Gibbs ringing.
"""

from __future__ import annotations

import math

import numpy as np

# LAL constants (lal/LALConstants.h).
MTSUN_SI = 4.925490947641266978e-06  # G M_sun / c^3, seconds
MRSUN_SI = 1.476625038050124729e03  # G M_sun / c^2, metres
PC_SI = 3.085677581491367279e16  # parsec, metres
GAMMA_E = 0.577215664901532860606512090082402431

BUILTIN = "builtin"
PRE_ROLL = 0.1  # seconds: the frequency-domain switch-on ends this long before the segment starts
ISCO_ROLLOFF = 0.1  # the built-in amplitude rolls off over [0.9, 1.0] f_ISCO


def chirp_mass(m1, m2):
    """Chirp mass (same units as the masses)."""
    m1, m2 = np.asarray(m1, dtype=np.float64), np.asarray(m2, dtype=np.float64)
    return (m1 * m2) ** 0.6 / (m1 + m2) ** 0.2


def isco_frequency(m1, m2):
    """GW frequency (Hz) at the Schwarzschild ISCO of total mass ``m1 + m2`` (solar masses)."""
    m = (np.asarray(m1, dtype=np.float64) + np.asarray(m2, dtype=np.float64)) * MTSUN_SI
    return 1.0 / (6.0**1.5 * np.pi * m)


def _phase_coefficients(eta):
    """TaylorF2 3.5PN phase coefficients ``(a_k, l_k)``, k = 0..7, as in LALSimulation.

    Psi(v) = 3 / (128 eta) * sum_k (a_k + l_k ln v) v^(k - 5).
    ``eta`` may be an array; each coefficient broadcasts with it.
    """
    pi = np.pi
    a = [
        np.ones_like(eta),
        np.zeros_like(eta),
        5.0 / 9.0 * (743.0 / 84.0 + 11.0 * eta),
        -16.0 * pi * np.ones_like(eta),
        5.0 / 72.0 * (3058673.0 / 7056.0 + 5429.0 / 7.0 * eta + 617.0 * eta**2),
        5.0 / 9.0 * (7729.0 / 84.0 - 13.0 * eta) * pi,
        (
            11583231236531.0 / 4694215680.0
            - 640.0 / 3.0 * pi**2
            - 6848.0 / 21.0 * GAMMA_E
            + eta * (-15737765635.0 / 3048192.0 + 2255.0 / 12.0 * pi**2)
            + eta**2 * 76055.0 / 1728.0
            - eta**3 * 127825.0 / 1296.0
            - 6848.0 / 21.0 * math.log(4.0)
        ),
        pi * (77096675.0 / 254016.0 + 378515.0 / 1512.0 * eta - 74045.0 / 756.0 * eta**2),
    ]
    zero = np.zeros_like(eta)
    log_terms = [zero, zero, zero, zero, zero, 5.0 / 3.0 * (7729.0 / 84.0 - 13.0 * eta) * pi]
    log_terms += [-6848.0 / 21.0 * np.ones_like(eta), zero]
    return a, log_terms


def _pn_phase_and_time(f, m1, m2):
    """PN phase Psi(f) and stationary-phase time before coalescence tau(f).

    ``f`` (..., nf) Hz, masses broadcastable to (..., 1). Returns two arrays of
    the broadcast shape. tau = -Psi'(f) / (2 pi).
    """
    m = (m1 + m2) * MTSUN_SI
    eta = m1 * m2 / (m1 + m2) ** 2
    a, log_terms = _phase_coefficients(eta)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.cbrt(np.pi * m * f)
        logv = np.log(v)
        psi = np.zeros(np.broadcast_shapes(np.shape(v), np.shape(eta)))
        dpsi = np.zeros_like(psi)  # dPsi/dv * v^6 / pfaN
        vk = np.ones_like(psi)
        for k in range(8):
            term = a[k] + log_terms[k] * logv
            psi += term * vk
            dpsi += (k - 5) * term * vk + log_terms[k] * vk
            vk = vk * v
        pfa_n = 3.0 / (128.0 * eta)
        v5 = v**5
        psi = pfa_n * psi / v5
        # tau = -(1/2pi) dPsi/dv dv/df, dv/df = v / (3 f)
        tau = -pfa_n * dpsi / (v5 * v) * v / (3.0 * f) / (2.0 * np.pi)
    return psi, tau


def taylorf2(
    f,
    m1,
    m2,
    t_c=0.0,
    phase=0.0,
    distance=1.0,
    f_lower: float = 10.0,
    f_upper=None,
    rolloff: bool = False,
) -> np.ndarray:
    """Built-in TaylorF2 plus polarisation, face-on, at frequencies ``f`` (Hz).

    ``f``: (nf,) or broadcastable; ``m1, m2``: solar masses; ``t_c``: coalescence
    time (s); ``phase``: GW phase at coalescence (rad); ``distance``: Mpc.
    Zero outside ``[f_lower, min(f_upper, f_ISCO)]``. ``rolloff`` multiplies the
    amplitude by a cos^2 roll-off over the last 10 % below the upper cut.
    Returns complex h~(f) in strain/Hz, shape ``broadcast(f, m1, m2, ...)``.
    Pass column vectors ``m1[:, None]`` to get (B, nf).
    """
    f = np.asarray(f, dtype=np.float64)
    m1 = np.asarray(m1, dtype=np.float64)
    m2 = np.asarray(m2, dtype=np.float64)
    f_stop = isco_frequency(m1, m2)
    if f_upper is not None:
        f_stop = np.minimum(f_stop, f_upper)
    inside = (f >= f_lower) & (f <= f_stop)
    fs = np.where(inside, f, f_lower)  # keeps the PN series finite outside the support
    psi, _ = _pn_phase_and_time(fs, m1, m2)
    mc = chirp_mass(m1, m2) * MTSUN_SI
    d_lightsec = np.asarray(distance, dtype=np.float64) * 1e6 * PC_SI / (MRSUN_SI / MTSUN_SI)
    amp = math.sqrt(5.0 / 24.0) * np.pi ** (-2.0 / 3.0) * mc ** (5.0 / 6.0) * fs ** (-7.0 / 6.0)
    amp = amp / d_lightsec
    if rolloff:
        amp = amp * _cos2_ramp((f_stop - fs) / (ISCO_ROLLOFF * f_stop))
    total = 2.0 * np.pi * fs * np.asarray(t_c, dtype=np.float64) - phase + psi - np.pi / 4.0
    return np.where(inside, amp * np.exp(-1j * total), 0.0)


def _cos2_ramp(x):
    """0 for x <= 0, 1 for x >= 1, sin^2(pi x / 2) between (smooth at both ends)."""
    x = np.clip(x, 0.0, 1.0)
    return np.sin(0.5 * np.pi * x) ** 2


def lal_frequency_waveform(
    m1, m2, delta_f: float, n_freq: int, f_lower: float, approximant: str
) -> np.ndarray:
    """Plus polarisation of a LALSimulation FD approximant, face-on, at 1 Mpc, phase 0.

    Returns (B, n_freq) complex on the grid ``k * delta_f``, coalescing at t = 0
    in LAL's convention for that approximant, ending where the approximant
    ends by default (f_ISCO for TaylorF2). Needs lalsuite.
    """
    try:
        import lal
        import lalsimulation as ls
    except ImportError as err:
        raise ImportError(
            f"approximant {approximant!r} needs lalsuite (pip install 'rootclad[lal]'); "
            f"use approximant='{BUILTIN}' for the built-in TaylorF2"
        ) from err
    try:
        approx = ls.GetApproximantFromString(approximant)
    except RuntimeError as err:
        raise ValueError(f"lalsimulation does not know approximant {approximant!r}") from err
    if not ls.SimInspiralImplementedFDApproximants(approx):
        raise ValueError(f"{approximant!r} is not a frequency-domain approximant in lalsimulation")
    m1 = np.atleast_1d(np.asarray(m1, dtype=np.float64))
    m2 = np.atleast_1d(np.asarray(m2, dtype=np.float64))
    out = np.zeros((m1.size, n_freq), dtype=np.complex128)
    for i, (a, b) in enumerate(zip(m1, m2, strict=True)):
        hp, _ = ls.SimInspiralChooseFDWaveform(
            a * lal.MSUN_SI, b * lal.MSUN_SI, 0, 0, 0, 0, 0, 0, 1e6 * lal.PC_SI,
            0.0, 0.0, 0.0, 0.0, 0.0, delta_f, f_lower, 0.0, f_lower, None, approx,
        )  # fmt: skip
        data = hp.data.data
        k = min(n_freq, data.size)
        out[i, :k] = data[:k]
    return out


def _long_grid(n: int, sample_rate: float) -> int:
    """Samples of the scratch grid: a power-of-two multiple of n with >= 0.5 s to spare."""
    long = 2 * n
    while (long - n) / sample_rate < 0.5:
        long *= 2
    return long


def segment_window(n: int, sample_rate: float, taper: float, end: float = 0.02) -> np.ndarray:
    """Fade-in over the first ``taper`` seconds and fade-out over the last ``end`` seconds."""
    t = np.arange(n) / sample_rate
    duration = n / sample_rate
    w = np.ones(n)
    if taper > 0:
        w *= _cos2_ramp(t / taper)
    if end > 0:
        w *= _cos2_ramp((duration - t) / end)
    return w


def waveform(
    m1,
    m2,
    t_merger,
    phase=0.0,
    *,
    n: int = 2048,
    sample_rate: float = 2048.0,
    approximant: str = BUILTIN,
    f_lower: float = 15.0,
    taper: float = 0.1,
) -> np.ndarray:
    """Signal recorded in one segment: (B, n) float64 strain, unscaled (face-on, 1 Mpc).

    ``m1, m2`` (B,) solar masses; ``t_merger`` (B,) seconds from the segment
    start to coalescence (TaylorF2 ``t_c``; for LAL approximants, LAL's
    reference time, the peak for IMRPhenomD); ``phase`` (B,) radians.
    ``approximant``: ``"builtin"`` (TaylorF2 here) or any LALSimulation FD
    approximant name, e.g. ``"TaylorF2"``, ``"IMRPhenomD"`` (needs lalsuite).
    ``f_lower``: lowest frequency generated; ``taper``: fade-in (s) at the
    segment start.
    """
    m1 = np.atleast_1d(np.asarray(m1, dtype=np.float64))
    m2 = np.atleast_1d(np.asarray(m2, dtype=np.float64))
    t_merger = np.broadcast_to(np.asarray(t_merger, dtype=np.float64), m1.shape)
    phase = np.broadcast_to(np.asarray(phase, dtype=np.float64), m1.shape)
    if np.any(m1 <= 0) or np.any(m2 <= 0):
        raise ValueError("masses must be positive")
    long = _long_grid(n, sample_rate)
    duration_long = long / sample_rate
    df = 1.0 / duration_long
    f = np.fft.rfftfreq(long, d=1.0 / sample_rate)
    # the segment is the last n samples of the scratch grid
    t_c = (duration_long - n / sample_rate) + t_merger
    # the window switches the chirp on when its time before merger falls from
    # t_merger + 2 PRE_ROLL to t_merger + PRE_ROLL, i.e. before the segment starts
    switch_on = t_merger + 2.0 * PRE_ROLL
    out = np.zeros((m1.size, n))
    # events of similar total mass share a narrow band of nonzero bins: evaluate only those
    order = np.argsort(m1 + m2)
    step = 64
    for lo in range(0, m1.size, step):
        idx = order[lo : lo + step]
        a, b = m1[idx, None], m2[idx, None]
        if approximant == BUILTIN:
            # below 0.8 x the Newtonian frequency at the switch-on time the
            # window is zero (PN corrections only lengthen the chirp there)
            f_newton = _newtonian_frequency(switch_on[idx], m1[idx], m2[idx])
            k_lo = int(max(f_lower, 0.8 * f_newton.min()) / df)
            k_hi = min(f.size, int(isco_frequency(a, b).max() / df) + 2)
            fk = f[k_lo:k_hi]
            hk = taylorf2(fk, a, b, t_c[idx, None], phase[idx, None], 1.0, f_lower, rolloff=True)
        else:
            k_lo, k_hi, fk = 0, f.size, f
            hk = lal_frequency_waveform(m1[idx], m2[idx], df, f.size, f_lower, approximant)
            hk = hk * np.exp(-2j * np.pi * f * t_c[idx, None] + 1j * phase[idx, None])
        _, tau = _pn_phase_and_time(np.maximum(fk, f_lower), a, b)
        tau = np.where(np.isfinite(tau), tau, np.inf)
        hk = hk * _cos2_ramp((switch_on[idx, None] - tau) / PRE_ROLL)
        hf = np.zeros((idx.size, f.size), dtype=np.complex128)
        hf[:, k_lo:k_hi] = hk
        h = np.fft.irfft(hf, n=long, axis=-1) * sample_rate
        out[idx] = h[:, long - n :]
    return out * segment_window(n, sample_rate, taper)


def _newtonian_frequency(tau, m1, m2):
    """GW frequency (Hz) a Newtonian chirp has ``tau`` seconds before coalescence."""
    mc = chirp_mass(m1, m2) * MTSUN_SI
    return (5.0 / (256.0 * tau)) ** 0.375 / (np.pi * mc**0.625)
