"""``rootclad emit``: the standalone header and weights, compiled by g++ alone (no rootclad
include path, no BLAS), against torch; and, where Clad is installed, a user's function that
calls the network differentiated by Clad, against torch autograd of the same function."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from rootclad.gw.models import gw_cnn
from rootclad.toolchain import find_clad

pytest.importorskip("onnx")

MAIN = r"""
#include "gwnet.hxx"
#include <cstdio>
#include <fstream>
template <typename T> std::vector<T> load(const char* p, size_t n) {
  std::vector<T> v(n);
  std::ifstream(p, std::ios::binary).read((char*)v.data(), n * sizeof(T));
  return v;
}
template <typename T> void save(const char* p, const T* v, size_t n) {
  std::ofstream(p, std::ios::binary).write((const char*)v, n * sizeof(T));
}
int main() {
  const int B = 3;
  gwnet::Session s("gwnet.dat");  // grows to B on first use
  auto x = load<float>("x.bin", B * gwnet::INPUT_SIZE);
  std::vector<float> out(B * gwnet::OUTPUT_SIZE), dx(x.size(), 0.f), ones(out.size(), 1.f);
  s.infer(x.data(), out.data(), B);
  s.infer_pullback(x.data(), ones.data(), dx.data(), B);
  save("out.bin", out.data(), out.size());
  save("dx.bin", dx.data(), dx.size());
  save("grad.bin", s.grad(), gwnet::Session::n_params());
  try {
    gwnet::Session other("other.dat");
  } catch (const std::exception& e) {
    std::printf("refused: %s\n", e.what());
  }
}
"""


def _export(net, x, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, x, str(path), dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "B"}})  # fmt: skip


def _emit(tmp_path, onnx_file, header):
    command = [sys.executable, "-m", "rootclad", "emit", str(onnx_file), "-o"]
    command += [str(tmp_path / header)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_header_compiles_with_gxx_alone_and_matches_torch(tmp_path):
    torch.manual_seed(0)
    net = gw_cnn(256).eval()
    _export(net, torch.zeros(2, 1, 256), tmp_path / "gwnet.onnx")
    _emit(tmp_path, tmp_path / "gwnet.onnx", "gwnet.hxx")
    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
    _export(other, torch.zeros(2, 4), tmp_path / "other.onnx")
    _emit(tmp_path, tmp_path / "other.onnx", "other.hxx")  # another model's weights
    (tmp_path / "main.cpp").write_text(MAIN)
    build = subprocess.run(["g++", "-std=c++17", "-O2", "main.cpp", "-o", "main"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    x = torch.randn(3, 1, 256)
    x.numpy().tofile(tmp_path / "x.bin")
    run = subprocess.run(["./main"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "refused: gwnet:" in run.stdout and "another model" in run.stdout, run.stdout
    xr = x.clone().requires_grad_(True)
    out = net(xr)
    grads = torch.autograd.grad(out.sum(), [xr, *net.parameters()])
    got = np.fromfile(tmp_path / "out.bin", dtype=np.float32)
    np.testing.assert_allclose(got, out.detach().numpy().ravel(), rtol=1e-5, atol=1e-6)
    dx = np.fromfile(tmp_path / "dx.bin", dtype=np.float32)
    ref = grads[0].numpy().ravel()
    assert np.max(np.abs(dx - ref)) <= 1e-4 * np.max(np.abs(ref))
    grad = np.fromfile(tmp_path / "grad.bin", dtype=np.float32)
    ref = torch.cat([g.reshape(-1) for g in grads[1:]]).numpy()
    assert grad.shape == ref.shape
    assert np.max(np.abs(grad - ref)) <= 1e-4 * np.max(np.abs(ref))


USER = r"""
#include "gw64.hxx"
#include "clad/Differentiator/Differentiator.h"
#include <cmath>
#include <cstdio>
// a user's function of two parameters that calls the network
double chi2(gw64::Net net, const double* theta) {
  double x[256], out[1];
  for (int i = 0; i < 256; ++i)
    x[i] = theta[0] * std::sin(0.1 * i) + theta[1] * std::cos(0.05 * i);
  gw64::infer(net, x, out, 1);
  return out[0] * out[0];
}
int main() {
  gw64::Session session("gw64.dat");
  gw64::Net net{&session};
  double theta[2] = {0.7, -0.3}, g[2] = {0, 0};
  auto grad = clad::gradient(chi2, "theta");
  grad.execute(net, theta, g);
  std::printf("%.15g %.15g\n", g[0], g[1]);
}
"""


@pytest.mark.clad
def test_clad_differentiates_user_code_that_calls_the_network(tmp_path):
    clad, why = find_clad()
    if clad is None:
        pytest.skip(f"needs Clad: {why}")
    torch.manual_seed(0)
    net = gw_cnn(256).double().eval()
    _export(net, torch.zeros(2, 1, 256, dtype=torch.float64), tmp_path / "gw64.onnx")
    _emit(tmp_path, tmp_path / "gw64.onnx", "gw64.hxx")
    (tmp_path / "user.cpp").write_text(USER)
    build = subprocess.run([str(clad.cxx), "-std=c++17", "-O1", *clad.flags(), "user.cpp", "-o",
                            "user"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run(["./user"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = torch.tensor([float(v) for v in run.stdout.split()], dtype=torch.float64)
    # the same function in torch, differentiated by autograd
    theta = torch.tensor([0.7, -0.3], dtype=torch.float64, requires_grad=True)
    i = torch.arange(256, dtype=torch.float64)
    x = theta[0] * torch.sin(0.1 * i) + theta[1] * torch.cos(0.05 * i)
    (want,) = torch.autograd.grad(net(x.view(1, 1, 256))[0, 0] ** 2, theta)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-14), (got, want)


MACRO = r"""
#include "gwnet.hxx"
void run_gwnet() {
  gwnet::Session s("gwnet.dat");
  std::vector<float> x(256, 0.1f), out(1);
  s.infer(x.data(), out.data(), 1);
  printf("score %.7f\n", out[0]);
}
"""


@pytest.mark.root
@pytest.mark.skipif(shutil.which("root") is None, reason="root.exe not on PATH")
def test_header_runs_in_a_root_macro(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    _export(gw_cnn(256).eval(), torch.zeros(2, 1, 256), tmp_path / "gwnet.onnx")
    _emit(tmp_path, tmp_path / "gwnet.onnx", "gwnet.hxx")
    (tmp_path / "run_gwnet.C").write_text(MACRO)
    run = subprocess.run(["root", "-l", "-b", "-q", "run_gwnet.C"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    score = float(run.stdout.split("score ")[1].split()[0])
    sess = ort.InferenceSession(str(tmp_path / "gwnet.onnx"))
    ref = sess.run(None, {"x": np.full((1, 1, 256), 0.1, np.float32)})[0].item()
    assert abs(score - ref) <= 1e-5 * max(abs(ref), 1e-3), (score, ref)
