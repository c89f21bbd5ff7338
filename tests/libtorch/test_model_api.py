"""rootclad/model_api.h: a compiled model run from plain C++ (no LibTorch, no Python).

tests/cpp/test_model_api.cpp loads the library with ``rootclad::load_model`` (dlopen) and,
for a float64 model, also links it and fills the same API with ``ROOTCLAD_LINKED_MODEL``.
The layout it reads must be the emitter's, and its forward output the torch module's.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import rootclad
from rootclad import get_include
from rootclad.toolchain import find_cxx

SOURCE = Path(__file__).resolve().parents[1] / "cpp" / "test_model_api.cpp"
B = 5


def compiled(dtype, loss="mse"):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv1d(2, 3, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(3 * 6, 2),
    ).to(dtype)
    x = torch.randn(B, 2, 8, dtype=dtype)
    return net, x, rootclad.compile(net, x, loss=loss, engine="pullback")


def build(tmp_path: Path, cm=None) -> Path:
    """The test program; with ``cm``, the model's library is linked in as well."""
    cxx, _ = find_cxx()
    exe = tmp_path / ("linked" if cm else "dlopen")
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{get_include()}"]
    cmd += ["-o", str(exe), str(SOURCE)]
    if cm is not None:
        lib = cm.library_path
        cmd += [f"-DLINKED_PREFIX={cm._em.prefix}", str(lib), f"-Wl,-rpath,{lib.parent}"]
    proc = subprocess.run([*cmd, "-ldl"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return exe


def run(exe: Path, cm, x: torch.Tensor, tmp_path: Path, env=None) -> tuple[dict, str]:
    x.numpy().tofile(tmp_path / "x.bin")
    params = torch.cat([p.detach().reshape(-1) for p in cm.parameters()])
    params.numpy().tofile(tmp_path / "params.bin")
    out = tmp_path / "out.bin"
    args = [cm.library_path, cm._em.prefix, str(B), tmp_path / "x.bin", tmp_path / "params.bin"]
    proc = subprocess.run([exe, *args, out], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    layout = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "param":
            layout.setdefault("params", []).append(value)
        else:
            layout[key] = value
    return layout, proc.stdout


def expected_layout(cm) -> dict:
    em = cm._em

    def dims(shape):
        return "[" + ",".join(map(str, shape)) + "]"

    params = [f"{n} {off} {int(np.prod(s))} {dims(s)}" for n, (off, s) in em.param_offsets.items()]
    inp, out = em.input_region, em.output_region
    return {
        "dtype": str(cm.dtype).removeprefix("torch."),
        "engine": "pullback",
        "loss": cm.loss,
        "n_params": str(em.n_params),
        "input": f"{inp.offset} {inp.size} {dims(cm.input_shape)}",
        "output": f"{out.offset} {out.size} {dims(cm.output_shape)}",
        "params": params,
    }


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dlopen_layout_and_forward(tmp_path, dtype):
    net, x, cm = compiled(dtype)
    lone = tmp_path / "lone" / "model.so"  # copied without the runtime library it links
    lone.parent.mkdir()
    shutil.copyfile(cm.library_path, lone)
    env = {**os.environ, "LONE_LIBRARY": str(lone)}
    layout, stdout = run(build(tmp_path), cm, x, tmp_path, env)
    for key, value in expected_layout(cm).items():
        assert layout[key] == value, f"{key}: C++ read {layout[key]!r}, emitter wrote {value!r}"
    out = np.fromfile(tmp_path / "out.bin", dtype=x.numpy().dtype)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(out.reshape(B, -1), net(x).detach().numpy(), rtol=tol, atol=tol)
    other = "float" if dtype == torch.float64 else "double"
    assert f"wrong-type call: rootclad model {cm._em.prefix}" in stdout
    assert f"called with {other}" in stdout
    # a wrong prefix names the missing symbol; a missing file names the file
    assert f"has no symbol {cm._em.prefix}_nope_n_params (is the prefix right?" in stdout
    assert f"cannot load model library {cm.library_path}.missing.so" in stdout
    assert f"lone load: rootclad: cannot load model library {lone}: librootclad_rt" in stdout
    assert "CompiledModel.self_contained_library()" in stdout


def test_linked_model_matches_dlopen(tmp_path):
    net, x, cm = compiled(torch.float64)
    layout, stdout = run(build(tmp_path, cm), cm, x, tmp_path)
    assert f"linked source linked:{cm._em.prefix}" in stdout
    assert layout["linked"] == "layout same"
    a = np.fromfile(tmp_path / "out.bin")
    b = np.fromfile(tmp_path / "out.bin.linked")
    assert a.size == B * 2 and np.array_equal(a, b)


def test_layout_of_a_parameterless_model():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Tanh())
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    lib = ctypes.CDLL(str(cm.library_path))
    count = getattr(lib, f"{cm._em.prefix}_param_count")
    name = getattr(lib, f"{cm._em.prefix}_param_name")
    name.restype = ctypes.c_char_p
    assert count() == 0 and name(0) is None


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x, z):
        return self.fc(x + z)


def _refused(tmp_path, cm, host_says: str, export_says: str) -> None:
    """The C++ test program (model_api.h) fails naming the library and the reason; cm.export
    raises before writing anything."""
    proc = subprocess.run(
        [build(tmp_path), cm.library_path, cm._em.prefix, str(B), "x", "p", "o"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"{cm.library_path} {host_says}" in proc.stderr + proc.stdout
    with pytest.raises(ValueError, match=export_says):
        cm.export(tmp_path / "refused")
    assert not list(tmp_path.glob("refused*"))


def test_cpp_hosts_refuse_a_model_with_two_inputs(tmp_path):
    """model_api.h reads n_inputs and refuses what its single-input hosts cannot feed."""
    x = torch.randn(B, 3, dtype=torch.float64)
    cm = rootclad.compile(_TwoInputs().double(), (x, x), loss="mse", engine="pullback")
    _refused(tmp_path, cm, "is a model with 2 inputs", "takes 2 inputs")


def test_cpp_hosts_refuse_a_model_with_running_statistics(tmp_path):
    """BatchNorm's running statistics live beside the parameters; the C++ hosts and the ROOT
    artifact do not store them yet, and say so instead of running without them."""
    x = torch.randn(B, 3, dtype=torch.float64)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).double()
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    _refused(tmp_path, cm, "keeps running statistics (BatchNorm)", "running statistics")
