"""One rule for sizes on both readers: a batch larger than the data is all of it (or, with
``drop_last``, none, as torch's DataLoader). The compiled reader allocated the whole batch up
front (``MemoryError: Unable to allocate 58.2 TiB`` for ``batch_size=10**12``) where the Python
one read the file."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.data import collect, write_uproot

from rootclad.data.loader import BatchIterator


def _readers():
    yield BatchIterator
    try:
        from rootclad.data.cling import import_root

        import_root()
    except ImportError:
        return
    from rootclad.data.compiled import CompiledBatchIterator

    yield CompiledBatchIterator


@pytest.mark.parametrize("reader", list(_readers()), ids=lambda c: c.__name__)
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_batch_larger_than_the_data_is_all_of_it(tmp_path, reader, drop_last):
    path = write_uproot(tmp_path / "x.root", np.arange(250), np.arange(250) % 2)
    it = reader(str(path), batch_size=10**12, shuffle=False, drop_last=drop_last)
    assert it.batch_size == 10**12 and len(it) == (0 if drop_last else 1)
    ids, _, sizes = collect(it)
    if drop_last:
        assert sizes == [] and len(ids) == 0
    else:
        assert sizes == [250] and np.array_equal(ids, np.arange(250))
