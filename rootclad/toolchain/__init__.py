"""Finding compilers, Clad and BLAS, and building cached shared libraries."""

from rootclad.toolchain.build import CompileError, build_library, cache_dir
from rootclad.toolchain.find import (
    CladInstall,
    ToolchainError,
    blas_flags,
    cuda_driver_version,
    find_clad,
    find_cublas,
    find_cxx,
    find_nvcc,
)

__all__ = [
    "CladInstall",
    "CompileError",
    "ToolchainError",
    "blas_flags",
    "build_library",
    "cache_dir",
    "cuda_driver_version",
    "find_clad",
    "find_cublas",
    "find_cxx",
    "find_nvcc",
]
