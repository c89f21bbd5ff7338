"""Run the reader tests with both readers: uproot (Python) and the compiled C++ one."""

import pytest


@pytest.fixture(params=["uproot", "compiled"])
def reader(request):
    """The iterator class under test."""
    if request.param == "compiled":
        pytest.importorskip("ROOT", reason="the compiled reader needs ROOT (PyROOT)")
        from rootclad.data.compiled import CompiledBatchIterator

        return CompiledBatchIterator
    from rootclad.data.loader import BatchIterator

    return BatchIterator
