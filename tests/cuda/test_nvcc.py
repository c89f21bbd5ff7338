"""The device runtime compiles for NVIDIA GPUs: nvcc builds every kernel of device_kernels.h for
float and double, each elementwise functor, fusable activation and loss too
(include/rootclad/device_runtime.cpp), for the H100/H200 generation (sm_90), and the library
exports what the programs may call (test_device_runtime.py derives that from the registry and
the emitter). Skipped, saying so, where nvcc is not installed; no GPU is needed (conftest.py:
gpu_build)."""

from __future__ import annotations

import subprocess

from test_device_runtime import declared_kernels, expected_symbols, missing_symbols


def test_the_gpu_runtime_exports_every_kernel_the_programs_may_call(gpu_build):
    library = gpu_build.runtime()
    want = expected_symbols("Cuda")
    assert len(want) > 300 and missing_symbols(want, library) == []
    # each launch a GPU kernel: nvcc's launch stubs, a few for every kernel declared
    nm = subprocess.run(["nm", str(library)], capture_output=True, text=True, check=True)
    stubs = {line.split()[-1] for line in nm.stdout.splitlines() if "__device_stub__" in line}
    assert len(stubs) > 2 * len(declared_kernels())
