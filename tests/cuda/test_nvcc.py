"""The device kernels compile for NVIDIA GPUs: nvcc builds every kernel of
rootclad/device_kernels.h (tests/cuda/device_kernels.cu instantiates each for float and
double, each activation functor too) to PTX for the H100/H200 generation (sm_90). Skipped, saying so, where nvcc is not
installed; no GPU is needed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import rootclad
from rootclad.ir.ops import OPS
from rootclad.toolchain import find_nvcc

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def nvcc():
    found = find_nvcc()
    if found is None:
        pytest.skip("nvcc not found: set ROOTCLAD_NVCC or put nvcc on PATH")
    return found[0]


def test_every_device_kernel_compiles_for_the_gpu(nvcc, tmp_path):
    ptx = tmp_path / "device_kernels.ptx"
    functors = sorted({s.functor for s in OPS.values() if s.functor and not s.params})
    parametric = sorted({s.functor for s in OPS.values() if s.functor and s.params})

    def values(names):
        return ", ".join(f"rootclad::{f}{{}}" for f in names)

    # (nvcc splits a -D value at its commas: the lists go in a header)
    (tmp_path / "test_functors.h").write_text(
        f"#define ROOTCLAD_TEST_FUNCTORS {values(functors)}\n"
        f"#define ROOTCLAD_TEST_PARAMETRIC {values(parametric)}\n"
    )
    cmd = [nvcc, "-std=c++17", "--extended-lambda", "-arch=sm_90", f"-I{rootclad.get_include()}",
           f"-I{tmp_path}", "--ptx", str(HERE / "device_kernels.cu"), "-o", str(ptx)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    entries = re.findall(r"^\.visible \.entry|^\.entry|\.entry ", ptx.read_text(), re.M)
    device = Path(rootclad.get_include()) / "rootclad" / "device"
    source = "\n".join(p.read_text() for p in sorted(device.glob("*.h")))
    launches = len(re.findall(r"each_index\(\s*on,", source))
    assert launches >= 15  # the GW MLP's and CNN's ops, forward and backward, and Adam
    # unary_forward and unary_backward launch one kernel per elementwise functor (f and grad),
    # loss_and_gradient one per elementwise loss functor (loss and grad), and pool2d_backward
    # one per pooling (max and average)
    losses = len(re.findall(r"ROOTCLAD_HD T grad\(T z, T y\)", source))
    pools = len(re.findall(r"struct \w+PoolShare", source))
    assert len(functors) >= 9 and losses == 3 and pools == 2
    # one GPU kernel per launch and functor, float and double (the generic unary and
    # parametric launches once per functor of theirs)
    n = launches - 4 - 3 + 2 * len(functors) + 3 * len(parametric) + losses + pools
    assert len(parametric) >= 1 and len(entries) == 2 * n
