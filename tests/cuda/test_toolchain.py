"""Finding the CUDA toolchain: cuBLAS next to the nvcc in use."""

from __future__ import annotations

import stat

from rootclad.toolchain import find


def test_cublas_is_found_next_to_the_nvcc_in_use(tmp_path, monkeypatch):
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    (root / "lib64").mkdir()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 99.0'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("ROOTCLAD_NVCC", str(nvcc))
    find.find_nvcc.cache_clear()
    try:
        assert find.find_nvcc() == (str(nvcc), "Cuda compilation tools, release 99.0")
        lib = root / "lib64" / "libcublas.so.99"
        lib.write_bytes(b"")
        assert find.find_cublas() == str(lib)
    finally:
        find.find_nvcc.cache_clear()
