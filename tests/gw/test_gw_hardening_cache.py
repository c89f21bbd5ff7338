"""A cached template bank (``cache/bank-*.npz``) that cannot be read (truncated by a full disk
or a kill, or not written by rootclad) is built again once, with a warning in the log; it is
read with ``allow_pickle=False``."""

from __future__ import annotations

import numpy as np
import pytest

from rootclad.gw.run.config import resolve

TINY = dict(train_events=20, val_events=10, test_events=200, batch_size=8, bank_min_match=0.8)


@pytest.fixture(scope="module")
def test_file(tmp_path_factory):
    from rootclad.gw.run.pipeline import simulate_all

    cfg = resolve(**TINY)
    return cfg, simulate_all(cfg, tmp_path_factory.mktemp("gwbank"), False, lambda *_: None)["test"]


@pytest.mark.parametrize("damage", ["truncated", "pickled"])
def test_an_unreadable_cached_bank_is_built_again(test_file, tmp_path, damage):
    from rootclad.gw.run.pipeline import template_bank

    cfg, path = test_file
    lines = []
    first = template_bank(cfg, path, tmp_path, lines.append)
    (cached,) = tmp_path.glob("bank-*.npz")
    if damage == "truncated":
        cached.write_bytes(cached.read_bytes()[:1000])
    else:  # an object array needs the unpickler: refused, never unpickled
        np.savez(cached, masses=np.array([object()], dtype=object))
    lines.clear()
    again = template_bank(cfg, path, tmp_path, lines.append)
    assert any(line.startswith(f"warning: the cached template bank {cached}") for line in lines)
    np.testing.assert_array_equal(again.masses, first.masses)
    np.testing.assert_array_equal(again.templates, first.templates)
    lines.clear()
    template_bank(cfg, path, tmp_path, lines.append)  # the rebuilt bank was cached
    assert lines == [f"template bank: {len(first)} templates, cached in {cached}"]
