"""Every build recipe of a compiled model: the CPU library (g++ or Clad's clang), the device
program for a GPU (nvcc and cuBLAS) and for the host loops (g++), each a function that builds
one source into the cache (:func:`rootclad.toolchain.build.build_library`) for
:func:`rootclad.toolchain.build.load_library` to load."""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rootclad.paths import get_include
from rootclad.toolchain.build import CompileError, build_library, link_library
from rootclad.toolchain.find import (
    ToolchainError,
    blas_flags,
    find_cublas,
    find_cxx,
    find_nvcc,
    run_tool,
)

# -fvisibility=hidden and the linker's version script (exports.map): a model library exports
# its C API only (model_runtime.h), nothing of the header-only runtime or of libstdc++'s
# templates, whose inline functions and statics were otherwise shared between the model
# libraries of one process: one library's ThreadPool::run met another's gemm and a training
# step deadlocked. -fno-trapping-math: no kernel runs with floating-point traps enabled, and
# without it g++ may not compute both sides of a select (LeakyReLU's slope * x, Hardtanh's
# bounds), so those loops stayed scalar; it changes no result (no reassociation).
OPT_FLAGS = [
    "-O3",
    "-march=native",
    "-std=c++17",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fopenmp-simd",
    "-fvisibility=hidden",
]
EXPORTS_MAP = Path(__file__).resolve().parent / "exports.map"


# The runtime library: every CPU kernel for float and double and the model runtime, built once
# per compiler, flags and CPU (include/rootclad/runtime.cpp). Its symbols keep the default
# visibility; its version script exports rootclad's own and nothing of libstdc++'s.
RUNTIME_SOURCE = Path(get_include()) / "rootclad" / "runtime.cpp"
RUNTIME_EXPORTS = 'extern "C++" { *rootclad::*; }; rootclad_*'
# A model's own code: calls into the runtime and pointer arithmetic, nothing worth -O3
GLUE_FLAGS = ["-O1", "-std=c++17", "-fno-math-errno", "-fvisibility=hidden"]


def no_gnu_unique(cxx: str) -> list[str]:
    """g++ gives an inline function's static locals (the thread pool) STB_GNU_UNIQUE binding,
    which the dynamic loader resolves by name alone, whatever the symbol's version: two runtime
    libraries in one process would share one pool built from two layouts. Off for g++; clang
    does not emit them."""
    from rootclad.toolchain.find import _version

    return [] if "clang" in _version(cxx).lower() else ["-fno-gnu-unique"]


def runtime_object(cxx: str) -> Path:
    """The runtime library's object file (compiled on first use, then cached)."""
    bc, _, _ = blas_flags()
    flags = [f for f in OPT_FLAGS if f != "-fvisibility=hidden"] + no_gnu_unique(cxx)
    flags += [f"-I{get_include()}/rootclad", f"-I{get_include()}", *bc]
    obj, _ = build_library(
        RUNTIME_SOURCE.read_text(),
        name="rootclad_rt",
        cxx=cxx,
        flags=flags,
        kind="object",
        timeout=1800,
    )
    return obj


def runtime_library(cxx: str) -> Path:
    """The shared runtime library models built by ``cxx`` link against."""
    _, bl, _ = blas_flags()
    so, _ = link_library(
        [runtime_object(cxx)],
        name="librootclad_rt",
        cxx=cxx,
        link_flags=bl,
        exports=RUNTIME_EXPORTS,
    )
    return so


def cpu_library(
    source: str,
    name: str,
    cxx: str,
    engine_flags: list[str],
    pullbacks: bool,
    self_contained: bool = False,
):
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
        return build_library(
            source, name=name, cxx=cxx, flags=flags, link_flags=link, rebuild=rebuild
        )

    return build


# The device runtime library: every device kernel for float and double, for one executor (the
# host loops, or one GPU architecture), built once into the cache in DEVICE_PARTS translation
# units side by side (include/rootclad/device_runtime.cpp). A model's device program declares
# the kernels and holds its launches alone: the host compiler builds it, for the GPU too.
DEVICE_RUNTIME_SOURCE = Path(get_include()) / "rootclad" / "device_runtime.cpp"
DEVICE_EXPORTS = 'extern "C++" { *rootclad::dev::*; }'
HOST_DEVICE_FLAGS = ["-O2", "-std=c++17"]
CUDA_DEVICE_FLAGS = ["-O3", "-std=c++17", "--extended-lambda"]
# a device program's own code: its launches and C API, nothing worth more than -O1
DEVICE_PROGRAM_FLAGS = ["-O1", "-std=c++17", "-fvisibility=hidden", "-DROOTCLAD_DECLARATIONS_ONLY"]


def device_parts() -> int:
    """The translation units of the device runtime (its ROOTCLAD_DEVICE_PARTS)."""
    return int(
        re.search(r"#define ROOTCLAD_DEVICE_PARTS (\d+)", DEVICE_RUNTIME_SOURCE.read_text())[1]
    )


def device_runtime(arch: str | None = None, defines: tuple[str, ...] = ()) -> Path:
    """The device runtime library for the host loops (``arch=None``: the C++ compiler) or for a
    GPU of architecture ``arch`` (nvcc, linked to cuDART and cuBLAS), compiled on first use,
    then cached; ``defines``: -D flags the kernels read (a test's ROOTCLAD_CONV_GEMM_MAX_COLUMNS),
    which the program gets too. Its symbols are exported under a version named after its key,
    so a program binds to the very library it was linked against."""
    cxx = find_cxx()[0]
    include = [f"-I{get_include()}/rootclad", f"-I{get_include()}", *defines]
    if arch is None:
        flags = [*HOST_DEVICE_FLAGS, *no_gnu_unique(cxx), *include]
        compiler, suffix, link = cxx, ".cpp", []
        name = "rootclad_dev_host"
    else:
        compiler, suffix, name = find_nvcc()[0], ".cu", f"rootclad_dev_{arch}"
        flags = [*CUDA_DEVICE_FLAGS, f"-arch={arch}", *include, *_cublas_include()]
        link = [*_cudart_flags(compiler), *_cublas_link()]
    source = DEVICE_RUNTIME_SOURCE.read_text()

    def part(k: int) -> Path:
        obj, _ = build_library(
            source,
            name=f"{name}_{k}",
            cxx=compiler,
            suffix=suffix,
            flags=[*flags, f"-DROOTCLAD_DEVICE_PART={k}"],
            kind="object",
            timeout=1800,
        )
        return obj

    with ThreadPoolExecutor(max_workers=min(device_parts(), os.cpu_count() or 1)) as pool:
        objects = list(pool.map(part, range(device_parts())))
    lib, _ = link_library(
        objects, name=f"lib{name}", cxx=cxx, link_flags=link, exports=DEVICE_EXPORTS
    )
    return lib


def _device_program(source: str, name: str, runtime, flags: list[str]):
    """The build of a device program against the device runtime ``runtime()`` returns, found
    beside it ($ORIGIN); a kernel the library lacks fails the link, naming it."""

    def build(rebuild: bool = False):
        lib = runtime()
        link = [str(lib), "-Wl,-rpath,$ORIGIN", "-Wl,--no-undefined"]
        return build_library(
            source,
            name=name,
            cxx=find_cxx()[0],
            link_flags=link,
            flags=[*DEVICE_PROGRAM_FLAGS, f"-I{get_include()}", *flags],
            rebuild=rebuild,
        )

    return build


def host_device_program(
    source: str, name: str, defines: tuple[str, ...] = (), flags: tuple[str, ...] = ()
):
    """The build of a device program (codegen/cuda.py's source) as loops on the host: the C++
    compiler builds its launches, the host device runtime runs them (:func:`device_runtime`
    with ``defines``); ``flags``: the program's own (a test's
    ROOTCLAD_D_ACT_PLAN_MIN_VALUES)."""
    runtime = functools.partial(device_runtime, None, tuple(defines))
    return _device_program(source, name, runtime, [*defines, *flags])


def cuda_device_program(source: str, name: str, arch: str):
    """The build of a device program for an NVIDIA GPU of architecture ``arch`` (``sm_XY``):
    the C++ compiler builds its launches (ROOTCLAD_ON_CUDA), which run the kernels of the
    device runtime nvcc builds once for ``arch``, linked to cuBLAS; a toolkit too old for it is
    named in the error."""
    if int(arch.removeprefix("sm_").rstrip("af")) < 60:  # atomicAdd on double
        raise ToolchainError(f"device programs need a GPU of compute capability 6.0 (Pascal) or "
                             f"newer; this one is {arch}")  # fmt: skip
    nvcc, version = find_nvcc()
    if find_cublas() is None:
        raise ToolchainError(
            "device='cuda' multiplies matrices with cuBLAS and found none: install the CUDA "
            "toolkit's, or `pip install nvidia-cublas` (torch's CUDA wheels bring it along)"
        )

    def runtime():
        try:
            return device_runtime(arch)
        except CompileError as exc:
            log = exc.log_path.read_text() if exc.log_path.is_file() else str(exc)
            if "Unsupported gpu architecture" in log:
                raise ToolchainError(
                    f"nvcc {version} ({nvcc}) cannot compile for this GPU's architecture {arch}: "
                    f"it is older than the GPU; install a CUDA toolkit that lists {arch} in "
                    "`nvcc --list-gpu-arch` and point ROOTCLAD_NVCC at its nvcc"
                ) from exc
            raise

    return _device_program(source, name, runtime, ["-DROOTCLAD_ON_CUDA"])


def _cublas_include() -> list[str]:
    """The nvidia-cublas wheel's include directory, where its cuBLAS is the one linked."""
    lib = Path(find_cublas() or "")
    header = lib.parent.parent / "include"
    return [f"-I{header}"] if lib.is_absolute() and (header / "cublas_v2.h").is_file() else []


def _cublas_link() -> list[str]:
    lib = Path(find_cublas())
    if lib.is_absolute():  # by path (a wheel has libcublas.so.13, no libcublas.so), found
        return [str(lib), f"-Wl,-rpath,{lib.parent}"]  # again at run time
    return [f"-l:{lib.name}"]  # a name the dynamic loader knows (a system package's)


@functools.cache
def _cudart_flags(nvcc: str) -> list[str]:
    """What nvcc links a program's CUDA runtime with (its static cuDART and the directories
    that hold it), read from `nvcc --dryrun`: the objects it compiled are linked by the C++
    compiler, whose linker options the version script needs."""
    proc = run_tool([nvcc, "--dryrun", "-shared", "-o", "x.so", "x.o"], timeout=60)
    dirs = re.findall(r'"?-L([^"\s]+)"?', proc.stdout + proc.stderr)
    return [
        *(f"-L{d}" for d in dict.fromkeys(dirs) if not d.rstrip("/").endswith("stubs")),
        "-lcudart_static",
        "-lrt",
        "-lpthread",
        "-ldl",
    ]
