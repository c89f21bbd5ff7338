"""Finding compilers, Clad and BLAS, and building cached shared libraries."""

from rootclad.toolchain.build import (
    CacheError,
    CompileError,
    build_library,
    cache_dir,
    load_library,
)
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
    "CacheError",
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
    "load_library",
]
