"""Fixtures for every test: a private compile cache."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _rootclad_cache_dir(tmp_path_factory):
    """Compiled libraries of this session go to a tmp dir, never to ~/.cache/rootclad.

    Session-scoped, so it sets ``os.environ`` itself (monkeypatch is function-scoped);
    equal models share one library across the tests of the session.
    """
    old = os.environ.get("ROOTCLAD_CACHE_DIR")
    os.environ["ROOTCLAD_CACHE_DIR"] = str(tmp_path_factory.mktemp("rootclad-cache"))
    yield
    if old is None:
        os.environ.pop("ROOTCLAD_CACHE_DIR", None)
    else:
        os.environ["ROOTCLAD_CACHE_DIR"] = old
