"""What the tests of tests/cuda share: the GPU build of a device program, done here with nvcc
and no GPU (see gpu_build)."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

from rootclad.toolchain import find_cxx, find_nvcc, recipes
from rootclad.toolchain.find import find_cublas

ARCH = "sm_90"  # the H100/H200 generation
# cuBLAS's entry points that device_gemm.h calls, for a stand-in where cuBLAS is not installed:
# the library then links (and loads) as on a GPU machine; nothing here runs a product
CUBLAS_STAND_IN = """
int cublasCreate_v2(void** h) { *h = 0; return 1; }
int cublasSetStream_v2(void* h, void* s) { return 1; }
int cublasSgemm_v2(void) { return 1; }
int cublasDgemm_v2(void) { return 1; }
int cublasSgemmStridedBatched(void) { return 1; }
int cublasDgemmStridedBatched(void) { return 1; }
"""


class GpuBuild:
    """Device programs built for the GPU (``ARCH``) as DeviceModel builds them: the host
    compiler builds the program, nvcc the device runtime once (recipes.cuda_device_program),
    against cuBLAS or, where there is none, a stand-in."""

    def __init__(self, cublas: str):
        self.cublas = cublas

    def runtime(self):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(recipes, "find_cublas", lambda: self.cublas)
            return recipes.device_runtime(ARCH)

    def program(self, source: str, name: str):
        """The program's library, loaded (static cuDART loads without a driver)."""
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(recipes, "find_cublas", lambda: self.cublas)
            path, _ = recipes.cuda_device_program(source, name, ARCH)()
        return ctypes.CDLL(str(path))


@pytest.fixture(scope="session")
def gpu_build(tmp_path_factory) -> GpuBuild:
    """Skipped, saying so, where nvcc is not installed; no GPU is needed."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found: set ROOTCLAD_NVCC or put nvcc on PATH")
    cublas = find_cublas()
    if cublas is None:
        where = tmp_path_factory.mktemp("cublas")
        (where / "cublas.c").write_text(CUBLAS_STAND_IN)
        cublas = str(where / "libcublas.so.13")
        cmd = [find_cxx()[0], "-x", "c", "-shared", "-fPIC", str(where / "cublas.c"), "-o", cublas]
        subprocess.run(cmd, check=True)
    return GpuBuild(cublas)
