"""The built-in Advanced LIGO PSD against lalsuite, and the PSD descriptions."""

import numpy as np
import pytest
from fixtures.gw import assert_ratio_close

from rootclad.gw.psd import aligo_psd, psd_function, psd_on_grid


def _lal_zdhp(f):
    ls = pytest.importorskip(
        "lalsimulation", reason="lalsuite (optional extra 'lal') not installed"
    )
    return np.array([ls.SimNoisePSDaLIGOZeroDetHighPower(float(x)) for x in f])


def test_builtin_fit_matches_lalsuite_zero_det_high_power():
    f = np.geomspace(10.0, 4096.0, 500)
    ref = _lal_zdhp(f)
    ratio = aligo_psd(f) / ref
    assert np.abs(ratio - 1).max() < 0.02, f"worst ratio {ratio[np.argmax(np.abs(ratio - 1))]}"
    assert_ratio_close(aligo_psd(f), ref, 0.005, "aLIGO fit vs lalsuite")


def test_lal_psd_by_name_is_lalsuite():
    f = np.array([20.0, 100.0, 500.0])
    ref = _lal_zdhp(f)
    np.testing.assert_allclose(psd_function("lal:aLIGOZeroDetHighPower")(f), ref, rtol=1e-12)


def test_design_sensitivity_landmarks():
    # independent of lalsuite: the design curve's minimum strain noise is about
    # 3.5-4e-24 / sqrt(Hz) between 150 and 400 Hz (LIGO-T0900288)
    f = np.linspace(20, 1000, 2000)
    asd = np.sqrt(aligo_psd(f))
    assert 150 < f[np.argmin(asd)] < 400
    assert 3.0e-24 < asd.min() < 4.5e-24
    assert aligo_psd(np.array([10.0]))[0] > 100 * aligo_psd(np.array([100.0]))[0]


def test_tabulated_psd_is_interpolated_in_log_log():
    f = np.geomspace(10, 1024, 50)
    table = (f, aligo_psd(f))
    x = np.geomspace(12, 1000, 300)
    np.testing.assert_allclose(psd_function(table)(x), aligo_psd(x), rtol=0.02)


def test_bad_psd_descriptions_are_refused():
    with pytest.raises(ValueError, match="unknown PSD"):
        psd_function("virgo")
    with pytest.raises(TypeError):
        psd_function(3.0)
    with pytest.raises(ValueError, match="positive and finite"):
        psd_on_grid(lambda f: np.zeros_like(f), 256, 256.0)
