"""rootclad::Model in a compiled C++ program (g++ against ROOT, no Python, no torch): its
predictions and a training step equal the compiled model's in Python.

References: cm.predict and cm.train_step with rootclad.optim.Adam (themselves checked against
torch in tests/core).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="the program links ROOT")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402

PROGRAM = r"""
#include "rootclad/model.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

// program STEM X.bin B OUT.bin TRAINED.root: predictions of B rows of X, then one Adam step
// on them with every target 1, saved to TRAINED.root.
int main(int argc, char** argv) {
  if (argc != 6)
    return 2;
  try {
    rootclad::Model m(argv[1]);
    const int B = std::atoi(argv[3]);
    std::vector<float> x((size_t)B * m.input_size()), out((size_t)B * m.output_size());
    std::ifstream(argv[2], std::ios::binary).read((char*)x.data(), x.size() * sizeof(float));
    m.predict(x.data(), out.data(), B);
    std::ofstream(argv[4], std::ios::binary).write((char*)out.data(), out.size() * sizeof(float));
    std::vector<float> y((size_t)B * m.output_size(), 1.f);
    rootclad::Adam opt(m, 1e-2);
    std::printf("loss %.9g\n", m.train_step(x.data(), y.data(), B, opt));
    m.save(argv[5], &opt);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "program: %s\n", e.what());
    return 1;
  }
}
"""


@pytest.mark.slow
def test_compiled_program_predicts_and_trains_like_python(tmp_path):
    src = tmp_path / "program.cpp"
    src.write_text(PROGRAM)
    exe = tmp_path / "program"
    cxx = os.environ.get("CXX", "g++")
    flags = subprocess.run([sys.executable, "-m", "rootclad.root.flags"], capture_output=True,
                           text=True, check=True).stdout.split()  # fmt: skip
    build = subprocess.run([cxx, "-O2", str(src), "-o", str(exe), *flags], capture_output=True,
                           text=True)  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]

    torch.manual_seed(2)
    net = nn.Sequential(nn.Conv1d(1, 3, 5), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 28, 1))
    cm = rootclad.compile(net, example_input=torch.zeros(1, 1, 32), engine="pullback")
    cm.export(tmp_path / "net")
    x = torch.randn(10, 1, 32, generator=torch.Generator().manual_seed(4))
    x.numpy().tofile(tmp_path / "x.bin")
    run = subprocess.run([str(exe), str(tmp_path / "net"), str(tmp_path / "x.bin"), "10",
                          str(tmp_path / "out.bin"), str(tmp_path / "trained.root")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(10, 1)
    np.testing.assert_allclose(out, cm.predict(x).numpy(), rtol=1e-6, atol=1e-7)

    loss = cm.train_step(x, torch.ones(10, 1), rootclad.optim.Adam(cm, lr=1e-2))
    assert abs(float(run.stdout.split()[-1]) - loss) <= 1e-6 * abs(loss)
    with uproot.open(tmp_path / "trained.root") as f:
        for name, p in cm.state_dict().items():
            np.testing.assert_allclose(f[name]["values"].array(library="np")[0],
                                       p.reshape(-1).double().numpy(), rtol=1e-6, atol=1e-8)  # fmt: skip
    bad = subprocess.run([str(exe), str(tmp_path / "nope"), str(tmp_path / "x.bin"), "10",
                          str(tmp_path / "o.bin"), str(tmp_path / "t.root")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 1 and "nope.root" in bad.stderr, bad.stderr
