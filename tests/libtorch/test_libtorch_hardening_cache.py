"""The LibTorch trainer library (``build_trainer``) is loaded once where it is built, so a
cached copy that does not load is built again, with a warning, instead of failing in every
ROOT session that loads it."""

from __future__ import annotations

import pytest

from rootclad.toolchain import build_library, find_cxx
from rootclad.torch import libtorch


def test_a_cached_trainer_that_does_not_load_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path / "cache"))
    garbage = tmp_path / "libtorch_trainer-garbage.so"
    garbage.write_bytes(b"not an ELF file\n" * 100)
    calls = []

    def build(source, *, name, rebuild=False, **kw):
        calls.append((name, rebuild))
        if not rebuild:
            return garbage, False  # the cached copy, verified against its manifest
        return build_library("int f() { return 1; }\n", name=name, cxx=find_cxx()[0], flags=[])

    monkeypatch.setattr(libtorch, "build_library", build)
    with pytest.warns(UserWarning, match=f"the cached library {garbage} failed to load"):
        path = libtorch.build_trainer()
    assert calls == [("libtorch_trainer", False), ("libtorch_trainer", True)]
    assert path != garbage and path.is_file()
