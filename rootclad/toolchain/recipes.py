"""Every build recipe of a compiled model: the CPU library (g++ or Clad's clang), the device
program for a GPU (nvcc and cuBLAS) and for the host loops (g++), each a function that builds
one source into the cache (:func:`rootclad.toolchain.build.build_library`) for
:func:`rootclad.toolchain.build.load_library` to load."""

from __future__ import annotations

import functools
from pathlib import Path

from rootclad.paths import get_include
from rootclad.toolchain.build import CompileError, build_library, link_library
from rootclad.toolchain.find import ToolchainError, blas_flags, find_cublas, find_cxx, find_nvcc

# -fvisibility=hidden and the linker's version script (exports.map): a model library exports
# its C API only (model_runtime.h), nothing of the header-only runtime or of libstdc++'s
# templates, whose inline functions and statics were otherwise shared between the model
# libraries of one process: one library's ThreadPool::run met another's gemm and a training
# step deadlocked
OPT_FLAGS = ["-O3", "-march=native", "-std=c++17", "-fno-math-errno", "-fopenmp-simd",
             "-fvisibility=hidden"]  # fmt: skip
EXPORTS_MAP = Path(__file__).resolve().parent / "exports.map"


# The runtime library: every CPU kernel for float and double and the model runtime, built once
# per compiler, flags and CPU (include/rootclad/runtime.cpp). Its symbols keep the default
# visibility; its version script exports rootclad's own and nothing of libstdc++'s.
RUNTIME_SOURCE = Path(get_include()) / "rootclad" / "runtime.cpp"
RUNTIME_EXPORTS = 'extern "C++" { *rootclad::*; }; rootclad_*'
# A model's own code: calls into the runtime and pointer arithmetic, nothing worth -O3
GLUE_FLAGS = ["-O1", "-std=c++17", "-fno-math-errno", "-fvisibility=hidden"]


def runtime_object(cxx: str) -> Path:
    """The runtime library's object file (compiled on first use, then cached)."""
    bc, _, _ = blas_flags()
    flags = [f for f in OPT_FLAGS if f != "-fvisibility=hidden"]
    flags += [f"-I{get_include()}/rootclad", f"-I{get_include()}", *bc]
    obj, _ = build_library(RUNTIME_SOURCE.read_text(), name="rootclad_rt", cxx=cxx, flags=flags,
                           kind="object", timeout=1800)  # fmt: skip
    return obj


def runtime_library(cxx: str) -> Path:
    """The shared runtime library models built by ``cxx`` link against."""
    _, bl, _ = blas_flags()
    so, _ = link_library([runtime_object(cxx)], name="librootclad_rt", cxx=cxx, link_flags=bl,
                         exports=RUNTIME_EXPORTS)  # fmt: skip
    return so


def cpu_library(source: str, name: str, cxx: str, engine_flags: list[str], pullbacks: bool,
                self_contained: bool = False):  # fmt: skip
    """The build of a CPU model library (codegen/cpu.py's source) with ``cxx`` (Clad's clang
    and its flags for the clad engine): the model's own code, which declares the kernels and
    calls them in the runtime library (built once: :func:`runtime_library`), found beside it
    ($ORIGIN); the C API exported alone. ``pullbacks=False``: Clad differentiates the kernels,
    so their definitions are compiled with the model (-O3, ROOTCLAD_NO_PULLBACKS: no BLAS, no
    SIMD hints); the runtime still runs the batch. ``self_contained``: the runtime linked in
    (its archive, none of its symbols exported): a library that works wherever it is copied,
    for exports."""
    if pullbacks:
        flags = [*GLUE_FLAGS, f"-I{get_include()}", "-DROOTCLAD_DECLARATIONS_ONLY", *engine_flags]
    else:
        flags = [*OPT_FLAGS, f"-I{get_include()}", "-DROOTCLAD_NO_PULLBACKS", *engine_flags]

    def build(rebuild: bool = False):
        exports = f"-Wl,--version-script={EXPORTS_MAP}"
        if self_contained:
            obj = runtime_object(cxx)
            archive, _ = link_library([obj], name="librootclad_rt", cxx=cxx, archive=True)
            link = [str(archive), *blas_flags()[1], "-Wl,--exclude-libs,ALL", exports]
        else:
            link = [str(runtime_library(cxx)), "-Wl,-rpath,$ORIGIN", exports]
        return build_library(source, name=name, cxx=cxx, flags=flags, link_flags=link,
                             rebuild=rebuild)  # fmt: skip

    return build


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
