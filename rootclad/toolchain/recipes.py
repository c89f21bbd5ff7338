"""Every build recipe of a compiled model: the CPU library (g++ or Clad's clang), the device
program for a GPU (nvcc and cuBLAS) and for the host loops (g++), each a function that builds
one source into the cache (:func:`rootclad.toolchain.build.build_library`) for
:func:`rootclad.toolchain.build.load_library` to load."""

from __future__ import annotations

import functools
from pathlib import Path

from rootclad.paths import get_include
from rootclad.toolchain.build import CompileError, build_library
from rootclad.toolchain.find import ToolchainError, blas_flags, find_cublas, find_cxx, find_nvcc

# -fvisibility=hidden and the linker's version script (exports.map): a model library exports
# its C API only (model_runtime.h), nothing of the header-only runtime or of libstdc++'s
# templates, whose inline functions and statics were otherwise shared between the model
# libraries of one process: one library's ThreadPool::run met another's gemm and a training
# step deadlocked
OPT_FLAGS = ["-O3", "-march=native", "-std=c++17", "-fno-math-errno", "-fopenmp-simd",
             "-fvisibility=hidden"]  # fmt: skip
EXPORTS_MAP = Path(__file__).resolve().parent / "exports.map"


def cpu_library(source: str, name: str, cxx: str, engine_flags: list[str], pullbacks: bool):
    """The build of a CPU model library (codegen/cpu.py's source) with ``cxx`` (Clad's clang
    and its flags for the clad engine): -O3 for this machine, BLAS for the products, the C API
    exported alone. ``pullbacks=False``: Clad differentiates the kernels, which then skip BLAS
    and SIMD hints (ROOTCLAD_NO_PULLBACKS). (-O3 is most of a long graph's build: the 798-op
    LSTM tagger compiles in 26 s, 9 s at -O2, but its step then runs 3.5x slower, its
    activations no longer vectorised: benchmarks/models/bench_zoo_speed.py, 2026-11-27.)"""
    flags = [*OPT_FLAGS, f"-I{get_include()}", *engine_flags]
    link = [f"-Wl,--version-script={EXPORTS_MAP}"]
    if pullbacks:
        bc, bl, _ = blas_flags()
        flags += bc
        link += bl
    else:
        flags.append("-DROOTCLAD_NO_PULLBACKS")
    return functools.partial(build_library, source, name=name, cxx=cxx, flags=flags,
                             link_flags=link)  # fmt: skip


def host_device_program(source: str, name: str):
    """The build of a device program (codegen/cuda.py's source) as loops on the host."""
    return functools.partial(build_library, source, name=name, cxx=find_cxx()[0],
                             flags=["-O2", "-std=c++17", f"-I{get_include()}"])  # fmt: skip


def cuda_device_program(source: str, name: str, arch: str):
    """The build of a device program for an NVIDIA GPU of architecture ``arch`` (``sm_XY``)
    with nvcc, linked to cuBLAS; a toolkit too old for it is named in the error."""
    if int(arch.removeprefix("sm_").rstrip("af")) < 60:  # atomicAdd on double
        raise ToolchainError(f"device programs need a GPU of compute capability 6.0 (Pascal) or "
                             f"newer; this one is {arch}")  # fmt: skip
    nvcc, version = find_nvcc()
    cublas = find_cublas()
    if cublas is None:
        raise ToolchainError(
            "device='cuda' multiplies matrices with cuBLAS and found none: install the CUDA "
            "toolkit's, or `pip install nvidia-cublas` (torch's CUDA wheels bring it along)"
        )
    lib = Path(cublas)
    flags = ["-O3", "-std=c++17", "--extended-lambda", f"-arch={arch}", f"-I{get_include()}"]
    if lib.is_absolute():
        if (lib.parent.parent / "include" / "cublas_v2.h").is_file():  # the wheel's header
            flags.append(f"-I{lib.parent.parent / 'include'}")
        # by path (a wheel has libcublas.so.13, no libcublas.so), found again at run time
        link = ["-Xlinker", str(lib), "-Xlinker", "-rpath", "-Xlinker", str(lib.parent)]
    else:  # a name the dynamic loader knows (a system package's)
        link = ["-Xlinker", f"-l:{lib.name}"]

    def build(rebuild: bool = False):
        try:
            return build_library(source, name=name, cxx=nvcc, flags=flags, link_flags=link,
                                 suffix=".cu", rebuild=rebuild)  # fmt: skip
        except CompileError as exc:
            log = exc.log_path.read_text() if exc.log_path.is_file() else str(exc)
            if "Unsupported gpu architecture" in log:
                raise ToolchainError(
                    f"nvcc {version} ({nvcc}) cannot compile for this GPU's architecture {arch}: "
                    f"it is older than the GPU; install a CUDA toolkit that lists {arch} in "
                    "`nvcc --list-gpu-arch` and point ROOTCLAD_NVCC at its nvcc"
                ) from exc
            raise

    return build
