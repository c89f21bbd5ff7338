"""DeviceProgram (rootclad/torch/device_program.py): a model's device program built and run
from Python. On the CPU everywhere (the kernels as loops); on a GPU where there is one, against
the CPU program and torch (the GPU tests skip, saying why, without one)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from rootclad.gw.models import gw_cnn, gw_mlp
from rootclad.toolchain import ToolchainError, build_library, find_nvcc
from rootclad.torch import device_program
from rootclad.torch.device_program import DeviceProgram

F64, F32 = torch.float64, torch.float32
GPU = torch.cuda.is_available()


def _batch(step, B, shape, dtype, device="cpu"):
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(B, *shape, generator=gen, dtype=dtype)
    y = torch.randint(0, 2, (B,), generator=gen).to(dtype)
    return x.to(device), y.to(device)


def _train_like_torch(net, shape, device, dtype, steps, tol):
    prog = DeviceProgram(net, torch.zeros(2, *shape, dtype=dtype), device=device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for step in range(1, steps + 1):
        x, y = _batch(step, 4, shape, dtype)
        loss = prog.train_step(*_batch(step, 4, shape, dtype, device))
        opt.zero_grad()
        ref = F.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
        ref.backward()
        opt.step()
        torch.testing.assert_close(loss.cpu(), ref.detach(), **tol)
    for name, p in net.named_parameters():
        torch.testing.assert_close(prog.state_dict()[name].cpu(), p.detach(), **tol)
    x, _ = _batch(0, 3, shape, dtype)
    torch.testing.assert_close(prog.forward(x.to(device)).cpu(), net(x).detach(), **tol)
    return prog


@pytest.mark.parametrize(
    "make, shape", [(lambda: gw_mlp(96), (96,)), (lambda: gw_cnn(512), (1, 512))]
)
def test_cpu_program_trains_like_torch(make, shape):
    torch.manual_seed(0)
    _train_like_torch(make().double(), shape, "cpu", F64, 20, {"rtol": 1e-9, "atol": 1e-12})


def test_bad_inputs_are_refused_naming_what_was_expected():
    torch.manual_seed(0)
    prog = DeviceProgram(gw_mlp(16).double(), torch.zeros(2, 16, dtype=F64), device="cpu")
    with pytest.raises(ValueError, match="input is on meta; this program runs on cpu"):
        prog.forward(torch.empty(2, 16, dtype=F64, device="meta"))
    with pytest.raises(TypeError, match="dtype is torch.float32, expected torch.float64"):
        prog.forward(torch.zeros(2, 16))
    with pytest.raises(ValueError, match=r"shape \(2, 15\), expected \(2, 16\)"):
        prog.forward(torch.zeros(2, 15, dtype=F64))
    with pytest.raises(ValueError, match=r"targets has shape \(3,\), expected \(2,\)"):
        prog.train_step(torch.zeros(2, 16, dtype=F64), torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match="runs on 'cuda' or 'cpu'"):
        DeviceProgram(gw_mlp(16), torch.zeros(2, 16), device="meta")


@pytest.mark.skipif(GPU, reason="checks the message on a machine without a CUDA device")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        DeviceProgram(gw_mlp(16), torch.zeros(2, 16), device="cuda")


def test_cuda_without_nvcc_says_so(monkeypatch):
    monkeypatch.setattr(device_program, "find_nvcc", lambda: None)
    with pytest.raises(ToolchainError, match="needs nvcc"):
        DeviceProgram(gw_mlp(16), torch.zeros(2, 16), device="cuda")


def test_nvcc_builds_a_shared_library(tmp_path, monkeypatch):
    """build_library hands nvcc its host options through -Xcompiler (nvcc rejects -fPIC)."""
    found = find_nvcc()
    if found is None:
        pytest.skip("nvcc not found: set ROOTCLAD_NVCC or put nvcc on PATH")
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path))
    src = 'extern "C" __global__ void k(float* p) { p[threadIdx.x] = 1; }\n'
    path, built = build_library(src, name="nvcc_probe", cxx=found[0], flags=["-O2"], suffix=".cu")
    assert built and path.is_file()


@pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU (none here)")
@pytest.mark.parametrize("dtype, tol", [(F64, {"rtol": 1e-10, "atol": 1e-12}),
                                        (F32, {"rtol": 1e-4, "atol": 1e-5})])  # fmt: skip
@pytest.mark.parametrize("make, shape", [(lambda: gw_mlp(2048), (2048,)),
                                         (lambda: gw_cnn(2048), (1, 2048))])  # fmt: skip
def test_gpu_program_trains_like_torch_for_200_steps(make, shape, dtype, tol):
    torch.manual_seed(0)
    _train_like_torch(make().to(dtype), shape, "cuda", dtype, 200, tol)


def test_the_gpu_benchmark_script_runs_on_the_cpu(tmp_path):
    """benchmarks/cuda/bench_train_step.py, with --device cpu, writes its JSON and table (to a
    scratch place); the GPU run itself needs a GPU machine."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "cuda" / "bench_train_step.py"
    out = tmp_path / "cuda.json"
    res = subprocess.run([sys.executable, str(script), "--device", "cpu", "--quick", "--out",
                          str(out)], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["models"]) == {"gw-mlp", "gw-cnn"}
    entry = report["models"]["gw-cnn"]["4"]
    assert set(entry["median_ms"]) == {"rootclad", "torch eager", "torch.compile"}
    assert (tmp_path / "cuda.md").read_text().startswith("# GW models' train step on a GPU")
