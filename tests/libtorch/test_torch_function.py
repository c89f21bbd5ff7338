"""rootclad/torch_function.h: a compiled model trained from a LibTorch C++ program.

The C++ program (tests/cpp/test_torch_function.cpp) loads the library with
``rootclad::load_model``, checks gradients through ``torch::autograd::grad`` against the
library's own ``loss_and_grad``, then trains a few steps with ``torch::optim`` through
``rootclad::CompiledFunction`` and with the fused ``train_step``. Python runs the same steps
with ``cm(x)`` + ``torch.optim`` and with ``cm.train_step`` and the results must agree.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import rootclad
from rootclad.toolchain import find_clad

pytestmark = pytest.mark.slow

SOURCE = Path(__file__).resolve().parents[1] / "cpp" / "test_torch_function.cpp"
B, STEPS, SEED = 6, 5, 7
TOL = {torch.float64: 1e-5, torch.float32: 1e-4}


@pytest.fixture(scope="session")
def program() -> Path:
    from rootclad.torch.libtorch import build_program

    exe, _ = build_program(SOURCE, "test_torch_function")
    return exe


def make_net(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv1d(2, 4, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 14, 8),
        torch.nn.Tanh(),
        torch.nn.Dropout(0.25),
        torch.nn.Linear(8, 1),
    ).to(dtype)


def make_data(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, B, 2, 16, generator=g, dtype=dtype)
    y = (torch.rand(STEPS, B, 1, generator=g) > 0.5).to(dtype)
    return x, y


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def read(path: Path, dtype: torch.dtype) -> torch.Tensor:
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    return torch.from_numpy(np.fromfile(path, dtype=np_dtype))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    """Elementwise |a - e| <= tol * (1 + |e|), with a message naming the worst element."""
    actual = actual.detach().reshape(-1)
    expected = expected.detach().reshape(-1).to(actual.dtype)
    assert actual.shape == expected.shape, f"{what}: {actual.shape} vs {expected.shape}"
    err = (actual - expected).abs() / (1 + expected.abs())
    worst = int(err.argmax()) if err.numel() else 0
    assert err.numel() == 0 or float(err[worst]) <= tol, (
        f"{what}: element {worst} is {float(actual[worst])!r}, expected "
        f"{float(expected[worst])!r} (relative error {float(err[worst]):.3g} > {tol})"
    )


def test_assert_close_fails_on_a_wrong_answer():
    ref = torch.linspace(-1, 1, 11, dtype=torch.float64)
    assert_close(ref + 1e-9, ref, 1e-5, "near")
    wrong = ref.clone()
    wrong[3] += 1e-3
    with pytest.raises(AssertionError, match="element 3"):
        assert_close(wrong, ref, 1e-5, "wrong")


def torch_optim_training(engine, dtype, optimizer, lr, x, y, w=None):
    """cm(x), torch autograd and torch.optim; with w, the loss is torch's reduction="none"
    loss weighted per sample and averaged. (losses, final parameters)."""
    cm = rootclad.compile(make_net(dtype), x[0], engine=engine, seed=SEED)
    opt = (
        torch.optim.SGD(cm.parameters(), lr=lr, momentum=0.9)
        if optimizer == "sgd"
        else torch.optim.Adam(cm.parameters(), lr=lr)
    )
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        per = torch.nn.functional.binary_cross_entropy_with_logits(cm(x[s]), y[s],
                                                                   reduction="none")  # fmt: skip
        loss = per.mean() if w is None else (w[:, None] * per).mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), flat(cm.parameters())


def python_training(engine, dtype, optimizer, lr, x, y):
    """The steps the C++ program runs, in Python: (losses, params) for each path."""
    results = {"torch_optim": torch_optim_training(engine, dtype, optimizer, lr, x, y)}
    cm = rootclad.compile(make_net(dtype), x[0], engine=engine, seed=SEED)
    fused = (
        rootclad.optim.SGD(cm, lr=lr, momentum=0.9)
        if optimizer == "sgd"
        else rootclad.optim.Adam(cm, lr=lr)
    )
    losses = [cm.train_step(x[s], y[s], fused) for s in range(STEPS)]
    results["fused"] = (torch.tensor(losses, dtype=dtype), flat(cm.parameters()))
    # the C++ program's event weights: 0.5 + (sample index mod 3)
    w = 0.5 + torch.arange(B, dtype=dtype) % 3
    results["weighted"] = torch_optim_training(engine, dtype, optimizer, lr, x, y, w)
    return results


CASES = [
    pytest.param("pullback", torch.float64, "sgd", id="pullback-float64-sgd"),
    pytest.param("pullback", torch.float32, "adam", id="pullback-float32-adam"),
    pytest.param("clad", torch.float64, "sgd", id="clad-float64-sgd", marks=pytest.mark.clad),
    pytest.param("clad", torch.float32, "adam", id="clad-float32-adam", marks=pytest.mark.clad),
]


@pytest.mark.parametrize(("engine", "dtype", "optimizer"), CASES)
def test_libtorch_training_matches_python(program, tmp_path, engine, dtype, optimizer):
    if engine == "clad":
        clad, why = find_clad()
        if clad is None:
            pytest.skip(f"Clad not found: {why}")
    lr = 0.1 if optimizer == "sgd" else 0.01
    tol = TOL[dtype]
    net = make_net(dtype)
    x, y = make_data(dtype)
    cm = rootclad.compile(net, x[0], engine=engine, seed=SEED)
    init = flat(cm.parameters())
    init.numpy().tofile(tmp_path / "params.bin")
    torch.save(dict(cm.state_dict()), tmp_path / "state_dict.pt")
    torch.save(cm.state_dict(), tmp_path / "ordered_dict.pt")  # C++ must refuse it, clearly
    x.numpy().tofile(tmp_path / "x.bin")
    y.numpy().tofile(tmp_path / "y.bin")
    (tmp_path / "config.txt").write_text(f"{B} {STEPS} {optimizer} {lr!r}\n")
    proc = subprocess.run(
        [program, cm.library_path, cm._em.prefix, tmp_path, str(SEED)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"C++ program failed:\n{proc.stdout}\n{proc.stderr}"
    assert "PASSED" in proc.stdout

    # Gradients at the initial parameters, eval mode: C++ autograd through CompiledFunction,
    # the library's loss_and_grad, and Python autograd through cm(x) and through torch.
    cm.eval()
    x0 = x[0].clone().requires_grad_()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(cm(x0), y[0])
    *g_params, g_x = torch.autograd.grad(loss, [*cm.parameters(), x0])
    net.eval()
    x0_ref = x[0].clone().requires_grad_()
    loss_ref = torch.nn.functional.binary_cross_entropy_with_logits(net(x0_ref), y[0])
    *g_ref, gx_ref = torch.autograd.grad(loss_ref, [*net.parameters(), x0_ref])

    grad_cpp = read(tmp_path / "grad_autograd.bin", dtype)
    assert float(grad_cpp.abs().max()) > 1e-3, "the C++ gradient is trivially zero"
    assert_close(grad_cpp, flat(g_params), tol, "C++ autograd vs Python cm(x) gradient")
    assert_close(grad_cpp, flat(g_ref), tol, "C++ autograd vs torch reference gradient")
    assert_close(read(tmp_path / "grad_library.bin", dtype), grad_cpp, tol, "loss_and_grad")
    assert_close(read(tmp_path / "dx_autograd.bin", dtype), gx_ref, tol, "input gradient")
    assert_close(read(tmp_path / "loss_autograd.bin", dtype), loss_ref, tol, "loss")
    assert_close(read(tmp_path / "loss_library.bin", dtype), loss_ref, tol, "library loss")
    assert_close(read(tmp_path / "out_eval.bin", dtype), net(x[0]), tol, "predict")

    # Training: C++ (torch::optim + CompiledFunction, and fused) vs Python, same dropout seeds.
    for path, (losses, params) in python_training(engine, dtype, optimizer, lr, x, y).items():
        cpp_params = read(tmp_path / f"params_{path}.bin", dtype)
        assert float((cpp_params - init).abs().max()) > 1e-3, f"{path}: parameters unchanged"
        assert_close(read(tmp_path / f"losses_{path}.bin", dtype), losses, tol, f"{path} losses")
        assert_close(cpp_params, params, tol, f"{path} final parameters")
