"""Simplified gravitational-wave physics and datasets (no ROOT import here).

Public names are loaded lazily, so ``import rootclad.gw`` stays cheap:

- :func:`simulate`, :func:`generate_events`, :func:`read_config`,
  :func:`read_psd`, :class:`SimulationConfig` (:mod:`.dataset`);
- :func:`waveform`, :func:`taylorf2` (:mod:`.waveforms`);
- :func:`aligo_psd`, :func:`lal_psd`, :func:`welch_psd` (:mod:`.psd`);
- :func:`colored_noise` (:mod:`.noise`);
- :func:`optimal_snr`, :func:`excess_power_factor` (:mod:`.whiten`; the
  function ``whiten`` is ``rootclad.gw.whiten.whiten``);
- :func:`inject_signal`, :func:`scale_to_snr` (:mod:`.inject`);
- :func:`make_template_bank`, :func:`matched_filter_snr`, :func:`bank_for_file`,
  :class:`TemplateBank` (:mod:`.matched_filter`).

Submodules keep their own names (``rootclad.gw.whiten``,
``rootclad.gw.matched_filter``); no exported function shares a submodule's
name, so what ``rootclad.gw.<name>`` is never depends on import order.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "simulate": "dataset",
    "generate_events": "dataset",
    "read_config": "dataset",
    "read_psd": "dataset",
    "SimulationConfig": "dataset",
    "waveform": "waveforms",
    "taylorf2": "waveforms",
    "aligo_psd": "psd",
    "lal_psd": "psd",
    "welch_psd": "psd",
    "colored_noise": "noise",
    "optimal_snr": "whiten",
    "excess_power_factor": "whiten",
    "inject_signal": "inject",
    "scale_to_snr": "inject",
    "make_template_bank": "matched_filter",
    "matched_filter_snr": "matched_filter",
    "bank_for_file": "matched_filter",
    "TemplateBank": "matched_filter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rootclad.gw' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rootclad.gw.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
