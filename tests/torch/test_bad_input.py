"""Bad input fails loudly and says what was expected; odd-but-valid input gives right answers.

Models rootclad cannot compile, inputs of the wrong shape, dtype or device, bad targets,
missing compilers, broken generated code, concurrent builds and the library cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from fixtures.core import assert_close_rel, check_against_torch, compiled_vjp, torch_vjp
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.ir import IRError
from rootclad.toolchain import CompileError, ToolchainError, build_library, find_cxx

F64, F32 = torch.float64, torch.float32
REPO = Path(__file__).resolve().parents[2]


def _small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 8, 2)
    ).double()


def _x(B=3, shape=(2, 8), seed=0):
    return torch.randn((B, *shape), generator=torch.Generator().manual_seed(seed), dtype=F64)


# -- models rootclad refuses, before any C++ is written ----------------------------------
def _features_net(layer):
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            features=nn.Sequential(nn.Conv1d(1, 4, 3), nn.ReLU(), layer),
            head=nn.Sequential(nn.Flatten(), nn.Linear(4 * 14, 1)),
        )
    )


def test_unsupported_layer_names_path_type_op_and_the_supported_ops(monkeypatch, tmp_path):
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(IRError) as err:  # RReLU: an ATen op the export front-end does not lower
        rootclad.compile(_features_net(nn.RReLU()), torch.randn(2, 1, 16), engine="pullback")
    msg = str(err.value)
    assert "'features.2' (RReLU)" in msg, msg
    assert "aten.rrelu_with_noise" in msg and "not supported" in msg, msg
    assert "rootclad.frontends.aten.table.LOWERINGS" in msg, msg  # where the supported ops are
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize(
    "layer, words",
    [
        (nn.Conv1d(2, 4, 3, padding=1, padding_mode="circular"), ["padding_mode", "circular"]),
        (nn.Conv1d(2, 4, 3, padding=1, padding_mode="reflect"), ["padding_mode", "reflect"]),
        (nn.Conv1d(2, 4, 3, padding="same"), ["aten.convolution.default", "not supported"]),
        (nn.AvgPool2d(2, divisor_override=3), ["divisor_override"]),
        (nn.AdaptiveMaxPool1d(2, return_indices=True), ["return_indices"]),
        (nn.MaxPool1d(2, dilation=2), ["dilation"]),
        (nn.MaxPool1d(2, return_indices=True), ["aten.max_pool2d_with_indices", "not supported"]),
        (nn.GRU(8, 4), ["GRU", "batch_first=False"]),
        (nn.BatchNorm1d(2, momentum=None), ["momentum=None"]),
        (nn.AdaptiveAvgPool1d(0), ["aten.adaptive_avg_pool1d", "an empty result"]),
    ],
)
def test_unsupported_layer_options_are_refused_with_the_module_path(layer, words):
    net = nn.Sequential(nn.Identity(), layer)
    with pytest.raises(IRError) as err:
        rootclad.compile(net, example_input=torch.randn(2, 2, 8), engine="pullback")
    msg = str(err.value)
    assert "'1'" in msg, msg
    for word in words:
        assert word in msg, msg


def test_a_layer_of_unsupported_options_that_forward_never_calls_is_not_refused():
    class Spare(nn.Module):  # (layers kept for another mode of the model, say)
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 3)
            self.conv = nn.Conv1d(2, 4, 3, padding=1, padding_mode="circular")
            self.bn, self.drop = nn.BatchNorm1d(2, momentum=None), nn.Dropout(1.0)

        def forward(self, x):
            return self.fc(x)

    net, x = Spare().double(), _x()
    cm = rootclad.compile(net, example_input=x, loss="mse", engine="pullback")
    assert_close_rel(cm(x), net(x), 1e-14, "forward")


def test_layers_the_fx_front_end_refused_match_torch():
    """LocalResponseNorm, Softmin and Flatten(start_dim=2) (a view of what stays 3-d)."""
    check_against_torch(
        _features_net(nn.LocalResponseNorm(2)).double(), _x(shape=(1, 16)), loss="mse"
    )
    net = nn.Sequential(nn.Identity(), nn.Softmin(dim=1), nn.Flatten(start_dim=2)).double()
    check_against_torch(net, _x(), loss="mse")


class _Residual(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc = nn.Linear(4, width)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(x + self.fc(x))


class _Concat(nn.Module):
    def forward(self, x):
        return torch.cat([x, x.unsqueeze(1)], dim=1)


class _TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x, z):
        return self.fc(x * z)


class _Branch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


class _Nonzero(nn.Module):  # a data-dependent shape (1 / x, refused here before, compiles now)
    def forward(self, x):
        return torch.nonzero(x).float()


class _FixedBatch(nn.Module):
    def forward(self, x):
        return x.view(2, -1)


class _Tuple(nn.Module):  # a tuple of tensors compiles (tests/torch/test_outputs.py)
    def forward(self, x):
        return x.relu(), (x.tanh(), x)


@pytest.mark.parametrize(
    "module, words",
    [
        (_Residual(width=3), ["_Residual", "test_bad_input.py:", "must match the size"]),
        (_Concat(), ["_Concat", "test_bad_input.py:", "Number of dimensions"]),
        (_Branch(), ["could not capture _Branch", "data-dependent", "if x.sum() > 0:"]),
        (_Nonzero(), ["aten.nonzero", "shape depends on the values"]),
        (_FixedBatch(), ["could not capture _FixedBatch", "fixes the batch size"]),
        (_Tuple(), ["returns TreeSpec(tuple", "(not nested)"]),
        (_TwoInputs(), ["could not capture _TwoInputs", "missing a required argument: 'z'"]),
    ],
)
def test_graphs_rootclad_cannot_compile_are_refused_naming_the_node(module, words):
    with pytest.raises(IRError) as err:
        rootclad.compile(module, example_input=torch.randn(2, 4), engine="pullback")
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_two_input_model_called_with_one_input_says_how_many_it_takes():
    x, z = torch.randn(2, 4, dtype=F64), torch.randn(2, 4, dtype=F64)
    cm = rootclad.compile(_TwoInputs().double(), example_input=(x, z), engine="pullback")
    for call in (lambda: cm(x), lambda: cm.predict(x), lambda: cm.loss_and_grad(x, z[:, :1])):
        with pytest.raises(TypeError, match=r"takes 2 inputs, got 1"):
            call()
    with pytest.raises(ValueError, match=r"input 1 shape is \(2, 5\)"):
        cm(x, torch.randn(2, 5, dtype=F64))
    with pytest.raises(ValueError, match=r"different batch sizes \[2, 3\]"):
        cm(x, torch.randn(3, 4, dtype=F64))


def test_layer_shape_mismatch_names_the_node():
    net = nn.Sequential(nn.Flatten(), nn.Linear(5, 3))
    with pytest.raises(IRError) as err:
        rootclad.compile(net, example_input=torch.randn(2, 4), engine="pullback")
    msg = str(err.value)
    assert "module '1' (Linear)" in msg and "[5, 3]" in msg, msg
    with pytest.raises(IRError, match=r"could not capture Conv1d .*Kernel size can't be greater"):
        rootclad.compile(nn.Conv1d(1, 1, 9), example_input=torch.randn(2, 1, 8))


def test_bad_compile_arguments():
    net = nn.Sequential(nn.Linear(4, 1))
    x = torch.randn(2, 4)
    with pytest.raises(IRError) as err:
        rootclad.compile(net, example_input=x, loss="hinge", engine="pullback")
    assert "hinge" in str(err.value) and "bce_with_logits" in str(err.value)
    with pytest.raises(ValueError, match="engine must be"):
        rootclad.compile(net, example_input=x, engine="tape")
    with pytest.raises(ValueError, match="pullbacks=False needs engine='clad'"):
        rootclad.compile(net, example_input=x, engine="pullback", pullbacks=False)
    with pytest.raises(TypeError, match="float16"):
        rootclad.compile(net, example_input=x.half())
    with pytest.raises(IRError, match="batch axis"):
        rootclad.compile(net, example_input=torch.randn(4))
    with pytest.raises(IRError, match="cross_entropy needs logits"):
        rootclad.compile(
            nn.Sequential(nn.Conv1d(2, 3, 1)),
            example_input=torch.randn(2, 2, 4),
            loss="cross_entropy",
            engine="pullback",
        )


# -- bad inputs to a compiled model ------------------------------------------------------
@pytest.fixture(scope="module")
def cnn():
    return _small_cnn(), rootclad.compile(
        _small_cnn(), example_input=_x(), loss="bce_with_logits", engine="pullback"
    )


def _entry_points(cm, x):
    y = torch.ones(x.shape[0], 2, dtype=F64)
    return {
        "call": lambda: cm(x),
        "predict": lambda: cm.predict(x),
        "loss_and_grad": lambda: cm.loss_and_grad(x, y),
        "train_step": lambda: cm.train_step(x, y, rootclad.optim.SGD(cm, lr=0.0)),
    }


@pytest.mark.parametrize("entry", ["call", "predict", "loss_and_grad", "train_step"])
def test_wrong_input_shape_says_expected_and_got(cnn, entry):
    _, cm = cnn
    for bad in (_x(shape=(2, 9)), _x(shape=(3, 8)), _x(shape=(16,)), torch.randn(2, 8, dtype=F64)):
        with pytest.raises(ValueError) as err:
            _entry_points(cm, bad)[entry]()
        msg = str(err.value)
        assert "expected (B, 2, 8)" in msg and str(tuple(bad.shape)) in msg, msg


@pytest.mark.parametrize("entry", ["call", "predict", "loss_and_grad", "train_step"])
def test_wrong_input_dtype_and_device_say_expected_and_got(cnn, entry):
    _, cm = cnn
    with pytest.raises(TypeError) as err:
        _entry_points(cm, _x().float())[entry]()
    assert "torch.float32" in str(err.value) and "torch.float64" in str(err.value)
    with pytest.raises(ValueError) as err:
        _entry_points(cm, _x().to("meta"))[entry]()
    assert "meta" in str(err.value) and "CPU" in str(err.value)
    with pytest.raises(TypeError, match="torch.Tensor"):
        _entry_points(cm, _x().numpy())[entry]()
    with pytest.raises(ValueError, match="empty"):
        _entry_points(cm, _x(B=0))[entry]()


def test_wrong_target_shapes(cnn):
    _, cm = cnn
    x = _x()
    with pytest.raises(ValueError) as err:
        cm.loss_and_grad(x, torch.ones(3, 1, dtype=F64))
    assert "(3, 1)" in str(err.value) and "expected (3, 2)" in str(err.value)


@pytest.mark.parametrize("loss", ["bce_with_logits", "mse"])
@pytest.mark.parametrize("outputs", [1, 2])
def test_targets_of_the_right_count_but_not_the_output_shape_are_refused(loss, outputs):
    """Checked by shape as torch's losses check it, not by element count: a transposed
    (outputs, B) or flattened target is refused where torch refuses it; a single-output model
    also takes (B,) targets, which the data readers give."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, outputs)).double()
    x = torch.randn(3, 4, dtype=F64)
    cm = rootclad.compile(net, example_input=x, loss=loss, engine="pullback")
    fn = {"bce_with_logits": F.binary_cross_entropy_with_logits, "mse": F.mse_loss}[loss]
    y = torch.rand(3, outputs, dtype=F64)
    bad = [y.t().contiguous(), y.reshape(1, -1), y.reshape(-1, 1, 1)]
    if outputs > 1:
        bad.append(y.reshape(-1))
    for wrong in bad:
        if loss == "bce_with_logits":  # torch's own verdict on the same shapes
            with pytest.raises(ValueError):
                fn(net(x), wrong)
        with pytest.raises(ValueError, match="targets have shape"):
            cm.loss_and_grad(x, wrong)
        with pytest.raises(ValueError, match="targets have shape"):
            cm.train_step(x, wrong, rootclad.optim.SGD(cm, lr=0.1))
    value, _ = cm.loss_and_grad(x, y)
    assert_close_rel(value, fn(net(x), y), 1e-10)
    if outputs == 1:
        assert torch.equal(cm.loss_and_grad(x, y.reshape(3))[0], value)


def test_cross_entropy_targets_out_of_range_or_not_indices():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 3)).double()  # the library of the loss tests
    x = torch.randn(2, 6, dtype=F64)
    cm = rootclad.compile(net, example_input=x, loss="cross_entropy", engine="pullback")
    opt = rootclad.optim.SGD(cm, lr=0.1)
    before = cm.state_dict()["0.weight"].clone()
    for y in (torch.tensor([0, 3]), torch.tensor([-1, 1])):
        with pytest.raises(ValueError) as err:
            cm.loss_and_grad(x, y)
        assert "[0, 3)" in str(err.value), str(err.value)
        with pytest.raises(ValueError, match=r"\[0, 3\)"):
            cm.train_step(x, y, opt)
    with pytest.raises(ValueError, match="integer class indices"):
        cm.loss_and_grad(x, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="2 integer class indices"):
        cm.loss_and_grad(x, torch.tensor([0, 1, 2]))
    assert torch.equal(cm.state_dict()["0.weight"], before)  # refused steps changed nothing
    assert opt.step_count == 0


def test_state_dict_and_optimizer_misuse(cnn):
    net, cm = cnn
    sd = net.state_dict()
    with pytest.raises(KeyError, match="missing keys"):
        cm.load_state_dict({k: v for k, v in sd.items() if k != "3.bias"})
    with pytest.raises(KeyError, match="unexpected keys"):
        cm.load_state_dict({**sd, "extra": torch.zeros(1)})
    with pytest.raises(ValueError) as err:
        cm.load_state_dict({**sd, "3.bias": torch.zeros(3)})
    assert "'3.bias'" in str(err.value) and "(3,)" in str(err.value) and "(2,)" in str(err.value)
    with pytest.raises(TypeError, match="CompiledModel"):
        rootclad.optim.Adam(net)
    other = rootclad.compile(_small_cnn(), example_input=_x(), engine="pullback")
    with pytest.raises(ValueError, match="created for another model"):
        cm.train_step(_x(), torch.ones(3, 2, dtype=F64), rootclad.optim.SGD(other))
    with pytest.raises(ValueError, match="Nesterov"):
        rootclad.optim.SGD(cm, momentum=0.0, nesterov=True)
    with pytest.raises(ValueError, match="learning rate"):
        rootclad.optim.Adam(cm, lr=-1.0)


# -- non-contiguous inputs ---------------------------------------------------------------
def _non_contiguous_inputs():
    base = _x(B=6, shape=(8, 2), seed=4)
    wide = _x(B=3, shape=(2, 16), seed=5)
    tall = _x(B=6, shape=(2, 8), seed=6)
    return {
        "transposed": base.transpose(1, 2)[:3],
        "strided-slice": wide[:, :, ::2],
        "every-other-sample": tall[::2],
        "expanded": _x(B=1, seed=7).expand(3, 2, 8),
    }


@pytest.mark.parametrize("kind", list(_non_contiguous_inputs()))
def test_non_contiguous_input_equals_its_contiguous_copy(cnn, kind):
    net, cm = cnn
    x = _non_contiguous_inputs()[kind]
    assert not x.is_contiguous()
    xc = x.contiguous()
    y = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
    assert torch.equal(cm.predict(x), cm.predict(xc))
    # the autograd Function, against torch on the contiguous copy
    out_ref, d_out, dx_ref, _ = torch_vjp(net, xc)
    xg = x.clone() if kind == "expanded" else x.detach().requires_grad_(True)
    xg.requires_grad_(True)
    out = cm(xg)
    (dx,) = torch.autograd.grad(out, xg, d_out)
    assert_close_rel(out.detach(), out_ref, 1e-10)
    assert_close_rel(dx, dx_ref, 1e-10)
    # the fused paths, with non-contiguous targets too
    l1, g1 = cm.loss_and_grad(x, y.t().contiguous().t())
    l2, g2 = cm.loss_and_grad(xc, y)
    assert torch.equal(l1, l2)
    for k in g1:
        assert torch.equal(g1[k], g2[k])


def test_non_contiguous_input_in_train_step():
    x = _non_contiguous_inputs()["transposed"]
    y = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
    a = rootclad.compile(_small_cnn(), example_input=_x(), engine="pullback")
    b = rootclad.compile(_small_cnn(), example_input=_x(), engine="pullback")
    opt_a, opt_b = rootclad.optim.Adam(a, lr=0.01), rootclad.optim.Adam(b, lr=0.01)
    for _ in range(3):
        assert a.train_step(x, y, opt_a) == b.train_step(x.contiguous(), y, opt_b)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])


# -- the toolchain -----------------------------------------------------------------------
def test_no_cxx_compiler_says_what_to_install(toolchain_env, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    toolchain_env.delenv("ROOTCLAD_CXX", raising=False)
    toolchain_env.delenv("CXX", raising=False)
    toolchain_env.setenv("PATH", str(empty))
    with pytest.raises(ToolchainError) as err:
        rootclad.compile(nn.Sequential(nn.Linear(4, 1)), torch.randn(2, 4), engine="pullback")
    msg = str(err.value)
    assert "g++" in msg and "install" in msg.lower() and "ROOTCLAD_CXX" in msg, msg
    assert rootclad.engines_available()["pullback"].startswith("unavailable")


@pytest.mark.parametrize("var", ["ROOTCLAD_CXX", "CXX"])
def test_a_compiler_variable_that_names_nothing_is_an_error(toolchain_env, var):
    """Before, ROOTCLAD_CXX=/nonexistent/g++ silently built with the g++ on PATH."""
    toolchain_env.delenv("ROOTCLAD_CXX", raising=False)
    toolchain_env.setenv(var, "/nonexistent/g++")
    with pytest.raises(ToolchainError, match=f"{var}=/nonexistent/g\\+\\+"):
        rootclad.compile(nn.Sequential(nn.Linear(4, 1)), torch.randn(2, 4), engine="pullback")


def _fake_clad(root: Path) -> tuple[Path, Path]:
    """A directory laid out like an installed Clad: lib/clad.so and the header (empty files;
    only the finder looks at them)."""
    (root / "lib").mkdir(parents=True)
    (root / "include" / "clad" / "Differentiator").mkdir(parents=True)
    (root / "lib" / "clad.so").write_bytes(b"")
    (root / "include" / "clad" / "Differentiator" / "Differentiator.h").write_text("")
    return root / "lib" / "clad.so", root / "include"


@pytest.mark.parametrize(
    "var", ["ROOTCLAD_CLAD_PLUGIN", "ROOTCLAD_CLAD_INCLUDE", "CLAD_PREFIX", "ROOTCLAD_NVCC"]
)
def test_a_clad_or_nvcc_variable_that_points_nowhere_is_an_error(toolchain_env, tmp_path, var):
    from rootclad.toolchain import find_clad, find_nvcc

    find_nvcc.cache_clear()
    for v in ("ROOTCLAD_CLAD_PLUGIN", "ROOTCLAD_CLAD_INCLUDE", "CLAD_PREFIX", "ROOTCLAD_NVCC"):
        toolchain_env.delenv(v, raising=False)
    toolchain_env.setenv(var, str(tmp_path / "nowhere"))
    finder = find_nvcc if var == "ROOTCLAD_NVCC" else find_clad
    with pytest.raises(ToolchainError, match=var):
        finder()
    find_nvcc.cache_clear()
    if var != "ROOTCLAD_NVCC":  # engine="auto" must not quietly fall back to the pullbacks
        with pytest.raises(ToolchainError, match=var):
            rootclad.compile(nn.Sequential(nn.Linear(4, 1)), torch.randn(2, 4))
        assert var in rootclad.engines_available()["clad"]


def test_clad_include_alone_still_finds_the_plugin_beside_it(toolchain_env, tmp_path):
    """Setting only ROOTCLAD_CLAD_INCLUDE used to turn discovery off and then complain about
    the plugin; the plugin of the same installation is found next to it."""
    from rootclad.toolchain import find_clad

    plugin, include = _fake_clad(tmp_path / "clad")
    for v in ("ROOTCLAD_CLAD_PLUGIN", "CLAD_PREFIX"):
        toolchain_env.delenv(v, raising=False)
    toolchain_env.setenv("ROOTCLAD_CLAD_INCLUDE", str(include))
    install, why = find_clad()
    if install is None:  # only a missing clang++ may stop it now
        assert "clang++" in why, why
    else:
        assert (install.plugin, install.include) == (str(plugin), str(include))


def test_num_threads_outside_1_to_256_is_an_error_naming_it(monkeypatch):
    from rootclad.compiler import num_threads

    net = nn.Sequential(nn.Linear(4, 1))
    for bad in ("100000", "0", "-2", "many", "2.5"):
        monkeypatch.setenv("ROOTCLAD_NUM_THREADS", bad)
        with pytest.raises(ValueError, match=f"ROOTCLAD_NUM_THREADS='{re.escape(bad)}'"):
            rootclad.compile(net, torch.randn(2, 4), engine="pullback")
    monkeypatch.setenv("ROOTCLAD_NUM_THREADS", "3")
    assert num_threads() == 3


def test_a_huge_thread_count_does_not_abort_a_host_that_skips_the_check(runtime_cache):
    """A C++ host (a macro, LibTorch) reads ROOTCLAD_NUM_THREADS without Python's check: the
    pool caps it (it used to abort the process trying to start 100000 threads)."""
    code = (
        "import torch, rootclad\n"
        "from rootclad.compiler import num_threads\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 1)).double()\n"
        "x = torch.randn(300, 4, dtype=torch.float64)\n"
        "import os; os.environ['ROOTCLAD_NUM_THREADS'] = '3'\n"
        "cm = rootclad.compile(net, example_input=x, engine='pullback')\n"
        "os.environ['ROOTCLAD_NUM_THREADS'] = '100000'  # after the check, before the pool\n"
        "err = (cm.predict(x) - net(x)).abs().max().item()\n"
        "print('ok', err)\n"
    )
    env = {**os.environ, "ROOTCLAD_CACHE_DIR": str(runtime_cache)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok") and float(proc.stdout.split()[1]) < 1e-12


def test_compile_error_keeps_the_log_and_leaves_no_library(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(cache))
    cxx, _ = find_cxx()
    broken = "int f() { return undeclared_name + ; }\n"
    for _ in range(2):  # a failure is not cached: the second try compiles (and fails) again
        with pytest.raises(CompileError) as err:
            build_library(broken, name="rc_broken", cxx=cxx, flags=["-std=c++17"])
        log = Path(err.value.log_path)
        assert log.is_file() and log.parent == cache
        assert str(log) in str(err.value)
        assert "undeclared_name" in log.read_text()
        assert "error" in str(err.value)
        assert list(cache.glob("*.so")) == []
        assert [p for p in cache.iterdir() if p.is_dir()] == []  # no half-built work dirs
    lib, built = build_library("int f() { return 1; }\n", name="rc_fixed", cxx=cxx, flags=[])
    assert built and lib.is_file() and lib.parent == cache


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_a_damaged_cached_library_is_rebuilt_not_loaded(tmp_path, runtime_cache, damage):
    """A truncated library crashed every later compile of the model with SIGBUS (in the
    dynamic loader); a 0-byte or garbage one failed forever. Each is verified against the
    size and hash recorded at build, and rebuilt. Run in child processes: a regression kills
    the interpreter that loads the library."""
    cache = runtime_cache
    env = {**os.environ, "ROOTCLAD_CACHE_DIR": str(cache)}
    code = (
        "import json, torch, rootclad\n"
        "torch.manual_seed(0)\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), "
        "torch.nn.Linear(3, 1)).double()\n"
        "x = torch.randn(5, 4, dtype=torch.float64)\n"
        "cm = rootclad.compile(net, example_input=x, engine='pullback')\n"
        "err = (cm.predict(x) - net(x)).abs().max().item()\n"
        "print(json.dumps({'lib': str(cm.library_path), 'built': cm.built_now, 'err': err}))\n"
    )

    def run():
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = run()
    lib = Path(first["lib"])
    size = lib.stat().st_size
    if damage == "truncated":
        os.truncate(lib, size // 2)
    elif damage == "empty":
        os.truncate(lib, 0)
    else:
        lib.write_bytes(os.urandom(size))  # same size, other bytes
    second = run()
    assert second["lib"] == first["lib"] and second["built"] and second["err"] < 1e-12
    assert lib.stat().st_size == size
    assert not run()["built"]  # and the rebuilt one is trusted again


def test_a_killed_build_leaves_no_work_directory_behind(tmp_path, monkeypatch):
    """A compile killed mid-way left its temporary directory in the cache for good; the next
    build of the same key removes it (the lock proves its builder is gone)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(cache))
    cxx, _ = find_cxx()
    src = "int f() { return 7; }\n"
    code = (
        "from rootclad.toolchain import build_library, find_cxx\n"
        "import rootclad.toolchain.build as b\n"
        "def hang(cmd, **kw):\n"
        "    print('compiling', flush=True)\n"
        "    import time; time.sleep(600)\n"
        "b.run_tool = hang  # the compiler's run (its --version runs through find.py's)\n"
        f"build_library({src!r}, name='rc_killed', cxx=find_cxx()[0], flags=[])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "ROOTCLAD_CACHE_DIR": str(cache)})  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "compiling"
        assert len([p for p in cache.iterdir() if p.is_dir()]) == 1
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    lib, built = build_library(src, name="rc_killed", cxx=cxx, flags=[])
    assert built and lib.is_file()
    assert [p for p in cache.iterdir() if p.is_dir()] == []


def test_warm_cache_recompiles_nothing(monkeypatch, runtime_cache):
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(runtime_cache))
    (runtime,) = runtime_cache.glob("librootclad_rt-*.so")
    built = (runtime.stat().st_ino, runtime.stat().st_mtime_ns)
    x = _x()
    first = rootclad.compile(_small_cnn(), example_input=x, engine="pullback")
    assert first.built_now
    import rootclad.toolchain.build as build

    def no_compiler(*args, **kwargs):
        raise AssertionError("the compiler ran for a model already in the cache")

    monkeypatch.setattr(build, "_compile", no_compiler)
    net = _small_cnn()
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(2.0)  # parameter values are data, not code
    second = rootclad.compile(net, example_input=_x(B=7), engine="pullback")
    assert not second.built_now
    assert second.library_path == first.library_path
    assert_close_rel(second.predict(x), net(x).detach(), 1e-10)
    monkeypatch.undo()
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(runtime_cache))
    other = rootclad.compile(_small_cnn().float(), example_input=x.float(), engine="pullback")
    assert other.built_now and other.library_path != first.library_path
    # two model libraries, and one runtime library (float and double) that both link
    assert len(list(runtime_cache.glob("rc_*.so"))) == 2
    assert len(list(runtime_cache.glob("librootclad_rt-*.so"))) == 1
    assert (runtime.stat().st_ino, runtime.stat().st_mtime_ns) == built  # never built again


_CHILD = """
import json, pathlib, sys, time
import torch
from torch import nn
import rootclad
from rootclad.toolchain import blas_flags, find_cxx

torch.manual_seed(0)
net = nn.Sequential(nn.Conv1d(1, 3, 5), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 28, 1)).double()
x = torch.randn(2, 1, 32, dtype=torch.float64)
find_cxx(); blas_flags()
pathlib.Path(sys.argv[2]).touch()
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.002)
cm = rootclad.compile(net, example_input=x, engine="pullback")
err = (cm(x) - net(x)).abs().max().item()
print(json.dumps({"built_now": cm.built_now, "lib": str(cm.library_path), "err": err}))
"""


@pytest.mark.slow
def test_cache_shared_between_cpus_keeps_one_library_per_cpu(monkeypatch):
    """-march=native code is keyed by the CPU it was built on (a home directory shared by
    batch nodes must not hand AVX-512 code to a CPU without it); other flags are not."""
    import rootclad.toolchain.build as build

    native = ["-O3", "-march=native"]
    here = build.source_key("int f();", "g++", native, [])
    assert build.source_key("int f();", "g++", native, []) == here
    plain = build.source_key("int f();", "g++", ["-O3"], [])
    monkeypatch.setattr(build, "_cpu_tag", lambda: "model name : other\nflags : sse2")
    assert build.source_key("int f();", "g++", native, []) != here
    assert build.source_key("int f();", "g++", ["-O3"], []) == plain


def test_two_processes_compiling_one_model_at_once(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "ROOTCLAD_CACHE_DIR": str(cache)}
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(go), str(r)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in ready
    ]
    try:
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "children did not start"
            time.sleep(0.01)
        go.touch()  # both start compiling now
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, errtext) in zip(procs, outs, strict=True):
        assert p.returncode == 0, errtext
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert results[0]["lib"] == results[1]["lib"]
    assert sorted(r["built_now"] for r in results) == [False, True]
    assert all(r["err"] < 1e-12 for r in results)
    assert [p.name for p in cache.glob("rc_*.so")] == [Path(results[0]["lib"]).name]
    assert len(list(cache.glob("librootclad_rt-*.so"))) == 1  # the runtime, built once too
    assert [p for p in cache.iterdir() if p.is_dir()] == []


def test_batch_too_large_for_int_counts_is_refused():
    """The kernels count a layer's elements in an int; a batch past that must fail loudly."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 2**20))
    cm = rootclad.compile(net, torch.randn(2, 4), "mse", engine="pullback")
    with pytest.raises(ValueError, match=r"batch of 4096 is too large.*at most 2047"):
        cm.predict(torch.randn(4096, 4))
    assert cm.predict(torch.randn(2, 4)).shape == (2, 2**20)  # a normal batch still runs


class _RankMismatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Linear(3, 3)
        self.fc = nn.Linear(12, 3)

    def forward(self, x):  # torch would align (B, 4, 3) with (B, 3) from the right
        return self.g(x) + self.fc(x.flatten(1))


class _InplaceReLU(nn.Module):
    def forward(self, x):
        h = x.tanh()
        return torch.nn.functional.relu(h, inplace=True) + h


class _OverwrittenAlias(nn.Module):
    def forward(self, x):
        y = x.tanh()
        h = y
        y += 1  # fx records an out-of-place add: h would keep tanh(x), in torch it changes too
        return h * y


class _DiscardedInPlace(nn.Module):
    def forward(self, x):
        h = x.tanh()
        h.mul_(2)  # its result unused: fx drops it as dead code, torch changed h
        return h.sigmoid()


class _AliasThroughALayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.id, self.act = nn.Linear(4, 4), nn.Identity(), nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.fc(x)
        return self.act(self.id(h)) + h  # Identity returns h itself: the ReLU overwrites h


class _ClampUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.fc(x)
        h.clamp_(-5, 5)  # in place, its result unused
        return self.out(h)


class _HalfTheBatch(nn.Module):
    def forward(self, x):  # at batch 4, 4 // 2 == 5 // 2: only the taint can see it
        return x * (x.size(0) // 2)


class _BatchSizeAsNumber(nn.Module):
    def forward(self, x):
        return x / x.size(0)


class _PermuteKeyword(nn.Module):
    def forward(self, x):
        return x.permute(dims=(0, 2, 1))


@pytest.mark.parametrize(
    "module, shape, words",
    [
        (_RankMismatch(), (4, 3), ["fixes the batch size"]),
        (_BatchSizeAsNumber(), (4,), ["x.size(0), the batch size) as a number"]),
        (_HalfTheBatch(), (4,), ["the batch size) as a number"]),
    ],
)
def test_forms_that_would_compute_something_else_than_torch_are_refused(module, shape, words):
    # batch 4: torch itself runs the rank mismatch then (it aligns B with the 4)
    with pytest.raises(IRError) as err:
        rootclad.compile(module, example_input=torch.randn(4, *shape), engine="pullback")
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "module, shape",
    [(_AliasThroughALayer(), (4,)), (_ClampUnused(), (4,)), (_PermuteKeyword(), (4, 3))],
)
def test_in_place_writes_through_an_alias_and_keyword_permutes_match_torch(module, shape):
    check_against_torch(module.double(), 10 * _x(shape=shape), loss="mse")  # 10: past the clamp


@pytest.mark.parametrize(
    "module, written_out",
    [
        (_InplaceReLU(), lambda x: 2 * x.tanh().relu()),
        (_OverwrittenAlias(), lambda x: (x.tanh() + 1) ** 2),
        (_DiscardedInPlace(), lambda x: (2 * x.tanh()).sigmoid()),
    ],
)
def test_values_overwritten_in_place_match_torch(module, written_out):
    """torch's autograd refuses these (tanh's saved result is overwritten): the reference is
    torch's forward written out of place, and its gradient."""
    x = _x(shape=(4,))
    torch.testing.assert_close(module(x), written_out(x))  # the reference is torch's forward
    cm = rootclad.compile(module, example_input=x, loss="mse", engine="pullback")
    leaf = x.clone().requires_grad_(True)
    ref = written_out(leaf)
    d_out = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    (dx_ref,) = torch.autograd.grad(ref, leaf, d_out)
    out, dx, _ = compiled_vjp(cm, x, d_out)
    assert_close_rel(out, ref.detach(), 1e-12, "forward")
    assert_close_rel(dx, dx_ref, 1e-12, "d_input")


def test_reversed_subtraction_and_a_bare_log_softmax_match_torch():
    class RSub(nn.Module):
        def forward(self, x):
            return torch.Tensor.__rsub__(x.tanh(), x)  # x - tanh(x)

    x = torch.randn(4, 3, dtype=F64)
    for module, loss in ((RSub(), "mse"), (nn.LogSoftmax(dim=1), "nll")):
        cm = rootclad.compile(module.double(), example_input=x, loss=loss, engine="pullback")
        torch.testing.assert_close(cm(x), module(x), rtol=1e-12, atol=1e-12)


def test_batchnorm_models_in_eval_mode_refuse_train_step_and_round_trip_state_dicts():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 4)
            self.bn = nn.BatchNorm1d(4)
            self.again = self.bn  # one BatchNorm under two names
            self.spare = nn.BatchNorm1d(4)  # never called

        def forward(self, x):
            return self.again(self.fc(x))

    net = Net().double()
    cm = rootclad.compile(net, example_input=torch.randn(5, 3, dtype=F64), loss="mse",
                          engine="pullback")  # fmt: skip
    cm.load_state_dict(net.state_dict())  # aliases and the unused layer's buffers accepted
    cm.eval()
    opt = rootclad.optim.SGD(cm, lr=0.1)
    with pytest.raises(ValueError, match="eval mode: call cm.train"):
        cm.train_step(torch.randn(5, 3, dtype=F64), torch.randn(5, 4, dtype=F64), opt)
