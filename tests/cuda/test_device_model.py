"""DeviceModel (rootclad/torch/device_model.py): a model's device program behind the compiled
model's API. On the CPU everywhere (the kernels as loops, device="cpu"); on a GPU where there
is one, against torch (the GPU tests skip, saying why, without one)."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import rootclad
from rootclad import compiler
from rootclad.compiler import compile_device
from rootclad.gw.models import gw_cnn, gw_mlp, gw_resnet
from rootclad.toolchain import ToolchainError, build_library, find_nvcc, recipes
from rootclad.torch import DeviceModel

F64, F32 = torch.float64, torch.float32
GPU = torch.cuda.is_available()
NO_GPU = "needs an NVIDIA GPU (none here)"
# (make, per-sample shape, a small size for the CPU)
MODELS = {"gw-mlp": (gw_mlp, lambda n: (n,), 96), "gw-cnn": (gw_cnn, lambda n: (1, n), 512)}
OPTIMIZERS = {
    "adam": (
        lambda m: rootclad.optim.Adam(m, lr=1e-3),
        lambda p: torch.optim.Adam(p, lr=1e-3),
    ),  # fmt: skip
    "adamw": (
        lambda m: rootclad.optim.AdamW(m, lr=1e-3, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
    ),  # fmt: skip
    "sgd-nesterov": (
        lambda m: rootclad.optim.SGD(m, lr=1e-2, momentum=0.9, nesterov=True),
        lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True),
    ),  # fmt: skip
}


def _batch(step, B, shape, dtype, device="cpu"):
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(B, *shape, generator=gen, dtype=dtype)
    y = torch.randint(0, 2, (B,), generator=gen).to(dtype)
    return x.to(device), y.to(device)


def _train_like_torch(net, shape, device, dtype, steps, tol, optimizer="adam", model=None):
    model = model or compile_device(net, torch.zeros(2, *shape, dtype=dtype), device)
    ours, theirs = OPTIMIZERS[optimizer]
    opt, ref_opt = ours(model), theirs(net.parameters())
    for step in range(1, steps + 1):
        x, y = _batch(step, 4, shape, dtype)
        loss = model.train_step(*_batch(step, 4, shape, dtype, device), opt)
        ref_opt.zero_grad()
        ref = F.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
        ref.backward()
        ref_opt.step()
        assert loss.device == model.device  # not read back by the step
        torch.testing.assert_close(loss.cpu(), ref.detach(), **tol)
    for name, p in net.named_parameters():
        torch.testing.assert_close(model.state_dict()[name].cpu(), p.detach(), **tol)
    x, _ = _batch(0, 3, shape, dtype)
    torch.testing.assert_close(model.predict(x.to(device)).cpu(), net(x).detach(), **tol)
    return model


def _step_like_torch(model, opt, net, ref_opt, x, y):
    """One train_step of the device model and one of torch on (x, y), float64: the losses
    agree."""
    loss = model.train_step(x, y, opt)
    ref_opt.zero_grad()
    ref = F.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
    ref.backward()
    ref_opt.step()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model", MODELS)
def test_cpu_device_model_trains_like_torch(model):
    make, shape, n = MODELS[model]
    torch.manual_seed(0)
    _train_like_torch(make(n).double(), shape(n), "cpu", F64, 20,
                      {"rtol": 1e-9, "atol": 1e-12})  # fmt: skip


@pytest.mark.parametrize("optimizer", ["adamw", "sgd-nesterov"])
def test_device_optimizers_follow_torch_optim(optimizer):
    torch.manual_seed(0)
    _train_like_torch(gw_mlp(48).double(), (48,), "cpu", F64, 10, {"rtol": 1e-9, "atol": 1e-12},
                      optimizer)  # fmt: skip


@pytest.mark.parametrize("model", MODELS)
def test_gradients_match_autograd(model):
    """loss_and_grad's parameter gradients, input_grad and model(x) under torch autograd."""
    make, shape, n = MODELS[model]
    torch.manual_seed(0)
    net = make(n).double()
    dm = compile_device(net, torch.zeros(1, *shape(n), dtype=F64), "cpu")
    x, y = _batch(1, 5, shape(n), F64)
    loss, grads = dm.loss_and_grad(x, y[:, None])
    ref = F.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
    ref.backward()
    tol = {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(loss, ref.detach(), **tol)
    assert list(grads) == [n for n, _ in net.named_parameters()]
    for name, p in net.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **tol)
    xr = x.clone().requires_grad_(True)
    d_out = torch.randn(5, 1, dtype=F64)
    (want,) = torch.autograd.grad(net(xr), xr, d_out)
    torch.testing.assert_close(dm.input_grad(x, d_out=d_out), want, **tol)
    xd = x.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(dm(xd), xd, d_out)
    torch.testing.assert_close(got, want, **tol)
    (ones,) = torch.autograd.grad(net(xr).sum(), xr)
    torch.testing.assert_close(dm.input_grad(x), ones, **tol)


def _digit_cnn(classes=10):
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 8, (3, 2), stride=(2, 1), dilation=(1, 2), groups=2),
                         nn.Tanh(), nn.AvgPool2d(2, padding=1, count_include_pad=False),
                         nn.Flatten(), nn.Linear(8 * 2 * 3, classes))  # fmt: skip


def _grouped_1d():
    nn = torch.nn
    return nn.Sequential(nn.Conv1d(2, 4, 3, padding=2, dilation=2, groups=2), nn.ReLU(),
                         nn.AvgPool1d(3, stride=2, padding=1), nn.Flatten(),
                         nn.Linear(4 * 10, 3))  # fmt: skip


LOSS_CASES = {  # model, per-sample input, loss, targets for a batch of B
    "2-d cnn, cross-entropy": (
        _digit_cnn,
        (1, 12, 12),
        "cross_entropy",
        lambda B: torch.arange(B) % 10,
    ),  # fmt: skip
    "2-d cnn, nll": (_digit_cnn, (1, 12, 12), "nll", lambda B: (torch.arange(B) * 3) % 10),
    "grouped 1-d, mse": (_grouped_1d, (2, 20), "mse", lambda B: torch.randn(B, 3, dtype=F64)),
    "grouped 1-d, huber": (
        _grouped_1d,
        (2, 20),
        "huber",
        lambda B: 3 * torch.randn(B, 3, dtype=F64),
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", LOSS_CASES)
def test_2d_grouped_and_pooling_ops_and_every_loss_match_autograd(case):
    """Conv2d (padding, stride, dilation, groups), 2-D max and average pooling, grouped and
    dilated Conv1d, AvgPool1d and each device loss: the loss, every parameter's gradient and
    the input gradient against torch autograd (float64)."""
    make, shape, loss, targets = LOSS_CASES[case]
    torch.manual_seed(0)
    net = make().double()
    dm = compile_device(net, torch.zeros(1, *shape, dtype=F64), "cpu", loss=loss)
    x, y = torch.randn(5, *shape, dtype=F64), targets(5)
    got_loss, grads = dm.loss_and_grad(x, y)
    ref = {"cross_entropy": F.cross_entropy, "nll": F.nll_loss, "mse": F.mse_loss,
           "huber": F.huber_loss}[loss](net(x), y)  # fmt: skip
    ref.backward()
    tol = {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(got_loss, ref.detach(), **tol)
    for name, p in net.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, **tol)
    xr = x.clone().requires_grad_(True)
    d_out = torch.randn(5, *dm.output_shape, dtype=F64)
    torch.testing.assert_close(dm.input_grad(x, d_out=d_out),
                               torch.autograd.grad(net(xr), xr, d_out)[0], **tol)  # fmt: skip


def test_the_graph_ir_digits_cnn_trains_like_torch():
    """The graph-IR tests' 2-D CNN (rootclad.nets.digits_cnn), 5 Adam steps with
    cross-entropy against torch.optim (float64)."""
    from rootclad.nets import digits_cnn

    torch.manual_seed(0)
    net = digits_cnn().double()
    dm = compile_device(net, torch.zeros(1, 1, 28, 28, dtype=F64), "cpu",
                                 loss="cross_entropy")  # fmt: skip
    opt, ref_opt = rootclad.optim.Adam(dm, lr=1e-3), torch.optim.Adam(net.parameters(), lr=1e-3)
    for step in range(5):
        x = torch.randn(3, 1, 28, 28, dtype=F64, generator=torch.Generator().manual_seed(step))
        y = torch.tensor([step % 10, 3, 7])
        loss = dm.train_step(x, y, opt)
        ref_opt.zero_grad()
        ref = F.cross_entropy(net(x), y)
        ref.backward()
        ref_opt.step()
        torch.testing.assert_close(loss, ref.detach(), rtol=1e-10, atol=1e-12)
    for name, p in net.named_parameters():
        torch.testing.assert_close(dm.state_dict()[name], p.detach(), rtol=1e-9, atol=1e-12)


def _bn_2d():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(2, 4, 3, bias=False), nn.BatchNorm2d(4, affine=False),
                         nn.ReLU(), nn.Conv2d(4, 3, 3, bias=False), nn.BatchNorm2d(3, momentum=0.3),
                         nn.Flatten(), nn.Linear(3 * 3 * 3, 1))  # fmt: skip


@pytest.mark.parametrize("make, shape", [(lambda: gw_resnet(96, channels=4, batch_norm=True),
                                          (1, 96)), (_bn_2d, (2, 7, 7))],
                         ids=["gw-resnet-batchnorm", "batchnorm2d"])  # fmt: skip
def test_batchnorm_trains_like_torch_and_keeps_running_statistics(make, shape):
    """BatchNorm1d/2d (with and without affine parameters; a bias right before one has no
    gradient but rounding, which Adam scales up, so the 2-D model has none): 5 Adam
    steps in training mode against torch.optim (the loss, every parameter, the running
    statistics and batch count), then eval mode's output and input gradient, and training
    mode's input gradient (through the batch's statistics), all against torch (float64)."""
    torch.manual_seed(0)
    net = make().double()
    dm = compile_device(net, torch.zeros(1, *shape, dtype=F64), "cpu")
    opt, ref_opt = rootclad.optim.Adam(dm, lr=1e-2), torch.optim.Adam(net.parameters(), lr=1e-2)
    tol = {"rtol": 1e-10, "atol": 1e-12}
    for step in range(5):
        x, y = _batch(step, 6, shape, F64)
        loss = dm.train_step(x, y, opt)
        ref_opt.zero_grad()
        ref = F.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
        ref.backward()
        ref_opt.step()
        torch.testing.assert_close(loss, ref.detach(), **tol)
    state = dm.state_dict()
    assert any(k.endswith("running_var") for k in state)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(state[name], value, **tol)
    x, _ = _batch(9, 5, shape, F64)
    for mode in (False, True):
        net.train(mode), dm.train(mode)
        xr = x.clone().requires_grad_(True)
        out = net(xr)
        torch.testing.assert_close(dm.predict(x), out.detach(), **tol)
        d_out = torch.randn(5, 1, dtype=F64)
        torch.testing.assert_close(dm.input_grad(x, d_out=d_out),
                                   torch.autograd.grad(out, xr, d_out)[0], **tol)  # fmt: skip


def test_autograd_updates_running_statistics_once():
    """model(x) then backward: the backward runs the forward again, which leaves BatchNorm's
    running statistics as the first pass left them (as torch's one forward does)."""
    torch.manual_seed(0)
    net = gw_resnet(64, channels=4, batch_norm=True).double()
    dm = compile_device(net, torch.zeros(2, 1, 64, dtype=F64), "cpu")
    x = torch.randn(5, 1, 64, dtype=F64)
    xg, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (dx,) = torch.autograd.grad(dm(xg).sum(), xg)
    (want,) = torch.autograd.grad(net(xr).sum(), xr)
    torch.testing.assert_close(dx, want, rtol=1e-10, atol=1e-12)
    for name, b in net.named_buffers():
        torch.testing.assert_close(dm.state_dict()[name].to(F64), b.to(F64), rtol=1e-12,
                                   atol=1e-12)  # fmt: skip


def test_class_index_targets_are_checked():
    dm = compile_device(_digit_cnn().double(), torch.zeros(1, 1, 12, 12, dtype=F64),
                                 "cpu", loss="cross_entropy")  # fmt: skip
    x = torch.zeros(2, 1, 12, 12, dtype=F64)
    with pytest.raises(ValueError, match=r"must lie in \[0, 10\), got \[0, 10\]"):
        dm.loss_and_grad(x, torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="integer class indices"):
        dm.loss_and_grad(x, torch.zeros(2, dtype=F64))


def test_moving_between_models_keeps_weights_and_optimizer_state():
    """Two Adam steps on the CPU CompiledModel, two on a device model, two on a CompiledModel
    again, the weights and the optimizer's state carried over each time (as ``to`` and a
    checkpoint carry them): as six steps of torch.optim."""
    from rootclad.compiler import compile_graph, device_program

    torch.manual_seed(0)
    net = gw_mlp(32).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 32, dtype=F64), engine="pullback")
    assert cm.to("cpu") is cm
    ref_opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    model, opt = cm, rootclad.optim.Adam(cm, lr=1e-3)
    for step in range(1, 7):
        if step in (3, 5):
            nxt = device_program(cm.graph, cm.loss, "cpu") if step == 3 else compile_graph(cm.graph)
            nxt.load_state_dict(model.state_dict())
            state = opt.state_dict()
            model, opt = nxt, rootclad.optim.Adam(nxt, lr=1e-3)
            opt.load_state_dict(state)
        x, y = _batch(step, 4, (32,), F64)
        loss = model.train_step(x, y[:, None], opt)
        ref_opt.zero_grad()
        ref = F.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
        ref.backward()
        ref_opt.step()
        torch.testing.assert_close(torch.as_tensor(float(loss), dtype=F64), ref.detach(),
                                   rtol=1e-10, atol=1e-12)  # fmt: skip
    assert isinstance(model, rootclad.torch.CompiledModel)
    x, _ = _batch(0, 3, (32,), F64)
    torch.testing.assert_close(model.predict(x), net(x).detach(), rtol=1e-10, atol=1e-12)


class _Concat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 1)

    def forward(self, x, theta):
        return self.fc(torch.cat([x, theta], dim=1))


def _two_inputs():
    examples = (torch.zeros(2, 3, dtype=F64), torch.zeros(2, 2, dtype=F64))
    return compile_device(_Concat().double(), examples, "cpu")


def test_two_inputs_under_autograd_in_order_or_as_a_tuple():
    torch.manual_seed(0)
    dm = _two_inputs()
    x, t = torch.randn(4, 3, dtype=F64), torch.randn(4, 2, dtype=F64)
    net = _Concat().double()
    net.load_state_dict(dict(dm.named_parameters()))
    xr, tr = x.clone().requires_grad_(True), t.clone().requires_grad_(True)
    want = torch.autograd.grad(net(xr, tr).sum(), (xr, tr))
    for call in (lambda a, b: dm(a, b), lambda a, b: dm((a, b))):
        xg, tg = x.clone().requires_grad_(True), t.clone().requires_grad_(True)
        got = torch.autograd.grad(call(xg, tg).sum(), (xg, tg))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_a_gpu_older_than_pascal_is_refused():
    with pytest.raises(ToolchainError, match=r"compute capability 6.0 \(Pascal\) or newer; this one "
                                             r"is sm_52"):  # fmt: skip
        recipes.cuda_device_program("", "old_gpu", "sm_52")()


def test_cublas_known_only_by_name_is_linked_by_name(monkeypatch):
    """A system package's cuBLAS (find_cublas gives the loader's name, no path)."""
    monkeypatch.setattr(recipes, "find_cublas", lambda: "libcublas.so.13")
    assert recipes._cublas_link() == ["-l:libcublas.so.13"] and recipes._cublas_include() == []


def test_frozen_parameters_are_skipped_like_torch_optim():
    """A frozen tensor keeps its values and optimizer state, and counts no steps (as
    torch.optim skips a parameter without a gradient): frozen for 3 steps, then trained."""
    torch.manual_seed(0)
    net = gw_mlp(24).double()
    net[0].weight.requires_grad_(False)
    net[-1].bias.requires_grad_(False)
    dm = compile_device(net, torch.zeros(2, 24, dtype=F64), "cpu")
    assert not dm._views["0.weight"].requires_grad
    opt, ref_opt = rootclad.optim.Adam(dm, lr=1e-2), torch.optim.Adam(net.parameters(), lr=1e-2)
    frozen_before = net[0].weight.detach().clone()
    for step in range(1, 7):
        if step == 4:  # unfrozen: its first Adam step now (bias correction from step 1)
            net[0].weight.requires_grad_(True)
            dm._views["0.weight"].requires_grad_(True)
        _step_like_torch(dm, opt, net, ref_opt, *_batch(step, 4, (24,), F64))
        if step == 3:
            assert torch.equal(dm.state_dict()["0.weight"], frozen_before)
    for name, p in net.named_parameters():
        torch.testing.assert_close(dm.state_dict()[name], p.detach(), rtol=1e-9, atol=1e-12)
    _, grads = dm.loss_and_grad(*_batch(9, 4, (24,), F64))
    assert "0.weight" in grads and "4.bias" not in grads  # no gradient for a frozen one


def test_bad_inputs_are_refused_naming_what_was_expected():
    torch.manual_seed(0)
    dm = compile_device(gw_mlp(16).double(), torch.zeros(2, 16, dtype=F64), "cpu")
    opt = rootclad.optim.Adam(dm)
    with pytest.raises(ValueError, match="input is on meta; this model runs on cpu"):
        dm.predict(torch.empty(2, 16, dtype=F64, device="meta"))
    with pytest.raises(TypeError, match="dtype is torch.float32, expected torch.float64"):
        dm.predict(torch.zeros(2, 16))
    with pytest.raises(ValueError, match=r"shape is \(2, 15\), expected \(B, 16\)"):
        dm.predict(torch.zeros(2, 15, dtype=F64))
    with pytest.raises(ValueError, match=r"targets have shape \(3,\), expected \(2, 1\) or \(2,\)"):
        dm.train_step(torch.zeros(2, 16, dtype=F64), torch.zeros(3, dtype=F64), opt)
    other = compile_device(gw_mlp(16).double(), torch.zeros(2, 16, dtype=F64), "cpu")
    with pytest.raises(ValueError, match="optimizer was created for another model"):
        other.train_step(torch.zeros(2, 16, dtype=F64), torch.zeros(2, dtype=F64), opt)
    with pytest.raises(ValueError, match="runs on 'cuda' or 'cpu'"):
        compile_device(gw_mlp(16), torch.zeros(2, 16), device="meta")
    with pytest.raises(ValueError, match=r"the inputs have different batch sizes \[2, 3\]"):
        _two_inputs().predict(torch.zeros(2, 3, dtype=F64), torch.zeros(3, 2, dtype=F64))
    with pytest.raises(TypeError, match=r"takes 2 inputs, got 1"):
        _two_inputs().predict(torch.zeros(2, 3, dtype=F64))
    with pytest.raises(TypeError, match=r"expected a torch.Tensor input 1, got list"):
        _two_inputs().predict(torch.zeros(2, 3, dtype=F64), [[0.0, 0.0], [0.0, 0.0]])
    cm = rootclad.compile(gw_mlp(16), example_input=torch.zeros(1, 16), engine="pullback")
    with pytest.raises(ValueError, match=r"input is on meta; this compiled model runs on the CPU "
                                         r"\(cm.to\('meta'\)"):  # fmt: skip
        cm.predict(torch.empty(2, 16, device="meta"))
    with pytest.raises(ValueError, match="loss 'kl_div' has no device kernel"):
        compile_device(gw_mlp(16), torch.zeros(2, 16), device="cpu", loss="kl_div")


def test_clad_on_cuda_says_why_not():
    with pytest.raises(ToolchainError, match="engine='clad' is not available on CUDA yet"):
        rootclad.compile(gw_mlp(16), example_input=torch.zeros(1, 16), device="cuda",
                         engine="clad")  # fmt: skip


@pytest.mark.skipif(GPU, reason="checks the message on a machine without a CUDA device")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        rootclad.compile(gw_mlp(16), example_input=torch.zeros(1, 16), device="cuda")
    cm = rootclad.compile(gw_mlp(16), example_input=torch.zeros(1, 16), engine="pullback")
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        cm.to("cuda")


def test_cuda_without_cublas_says_so(monkeypatch):
    if find_nvcc() is None:
        pytest.skip("nvcc not found: set ROOTCLAD_NVCC or put nvcc on PATH")
    monkeypatch.setattr(recipes, "find_cublas", lambda: None)
    with pytest.raises(ToolchainError, match=r"multiplies matrices with cuBLAS and found none.*"
                                             r"pip install nvidia-cublas"):  # fmt: skip
        recipes.cuda_device_program("", "no_cublas", "sm_90")()


def test_cuda_without_nvcc_says_so(monkeypatch):
    monkeypatch.setattr(compiler, "find_nvcc", lambda: None)
    with pytest.raises(ToolchainError, match="needs nvcc"):
        compile_device(gw_mlp(16), torch.zeros(2, 16), device="cuda")


def test_an_nvcc_older_than_the_gpu_is_named(tmp_path, monkeypatch):
    """nvcc 13 knows no sm_999: what a toolkit older than the GPU says, named as such."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found: set ROOTCLAD_NVCC or put nvcc on PATH")
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path))
    # (nvcc stops at the architecture before it would link cuBLAS)
    monkeypatch.setattr(recipes, "find_cublas", lambda: str(tmp_path / "libcublas.so.13"))
    src = 'extern "C" __global__ void k(float* p) { p[threadIdx.x] = 1; }\n'
    with pytest.raises(ToolchainError, match=r"nvcc .* cannot compile for this GPU's "
                                             r"architecture sm_999: it is older than the GPU"):  # fmt: skip
        recipes.cuda_device_program(src, "nvcc_old", "sm_999")()


def test_out_of_device_memory_says_what_failed():
    dm = compile_device(gw_mlp(16).double(), torch.zeros(2, 16, dtype=F64), "cpu")
    huge = torch.zeros(1, 16, dtype=F64).expand(2**30, 16)  # no memory of its own
    overcommit = Path("/proc/sys/vm/overcommit_memory")
    if not overcommit.is_file() or overcommit.read_text().strip() == "1":
        pytest.skip("this kernel grants any allocation (vm.overcommit_memory=1)")
    with pytest.raises(MemoryError, match=r"a batch of 1073741824 needs \d+ MiB on cpu for the "
                                          r"activations and scratch \(\d+ values\) and their "
                                          r"adjoints"):  # fmt: skip
        dm.predict(huge)


def test_kernel_errors_say_what_failed():
    dm = compile_device(gw_mlp(16).double(), torch.zeros(2, 16, dtype=F64), "cpu")
    dm._fn["forward"] = lambda *args: 209  # what a launch on a GPU it has no code for returns
    with pytest.raises(RuntimeError, match=r"CUDA error 209 in the device program's forward: "
                                           r".*holds no code for this GPU"):  # fmt: skip
        dm.predict(torch.zeros(2, 16, dtype=F64))


def test_a_failed_training_step_is_not_counted_by_the_optimizer():
    """A step whose launches failed leaves the optimizer's count (and so Adam's bias
    correction at the next step, and its state_dict) as it was."""
    dm = compile_device(gw_mlp(16).double(), torch.zeros(2, 16, dtype=F64), "cpu")
    opt = rootclad.optim.Adam(dm, lr=1e-3)
    x, y = _batch(0, 2, (16,), F64)
    dm.train_step(x, y, opt)
    working = dm._fn["loss_and_grad"]
    dm._fn["loss_and_grad"] = lambda *args: 2  # cudaErrorMemoryAllocation
    with pytest.raises(RuntimeError, match=r"CUDA error 2 in the device program's loss_and_grad"):
        dm.train_step(x, y, opt)
    assert opt.step_count == 1
    dm._fn["loss_and_grad"] = working
    dm.train_step(x, y, opt)
    assert opt.step_count == 2


def test_nvcc_builds_a_shared_library(tmp_path, monkeypatch):
    """build_library hands nvcc its host options through -Xcompiler (nvcc rejects -fPIC)."""
    found = find_nvcc()
    if found is None:
        pytest.skip("nvcc not found: set ROOTCLAD_NVCC or put nvcc on PATH")
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path))
    src = 'extern "C" __global__ void k(float* p) { p[threadIdx.x] = 1; }\n'
    path, built = build_library(src, name="nvcc_probe", cxx=found[0], flags=["-O2"], suffix=".cu")
    assert built and path.is_file()


def _train_within_torchs_float32_rounding(net, shape, model, steps, lr=1e-3, factor=4.0):
    """Float32 training against torch's float64 run of the same model from the same weights:
    after the first steps Adam amplifies rounding (it divides gradients by their own size), so
    no two float32 runs agree to a fixed tolerance for long. Each loss of ``model`` (trained at
    ``lr``) stays within ``factor`` times the farthest that torch's float32 run has strayed from
    float64 so far (plus float32 rounding), and so do the final parameters."""
    nets = {"f32": net, "f64": copy.deepcopy(net).double()}
    opts = {k: torch.optim.Adam(n.parameters(), lr=1e-3) for k, n in nets.items()}
    opt = rootclad.optim.Adam(model, lr=lr)
    strayed = 0.0
    for step in range(1, steps + 1):
        ref = {}
        x32, y32 = _batch(step, 4, shape, F32)  # float32's draws, for both
        for k, n in nets.items():
            x, y = (t.to(next(n.parameters()).dtype) for t in (x32, y32))
            opts[k].zero_grad()
            loss = F.binary_cross_entropy_with_logits(n(x).squeeze(1), y)
            loss.backward()
            opts[k].step()
            ref[k] = loss.item()
        ours = model.train_step(x32.to(model.device), y32.to(model.device), opt).item()
        strayed = max(strayed, abs(ref["f32"] - ref["f64"]))
        bound = factor * strayed + 1e-6 * abs(ref["f64"])
        assert abs(ours - ref["f64"]) <= bound, (
            f"step {step}: loss {ours} vs float64 {ref['f64']} (torch float32 {ref['f32']}, "
            f"bound {bound:.3g})"
        )
    state = model.state_dict()
    for (name, p32), p64 in zip(nets["f32"].named_parameters(), nets["f64"].parameters(),
                                strict=True):  # fmt: skip
        theirs = (p32.detach().double() - p64.detach()).norm().item()
        mine = (state[name].cpu().double() - p64.detach()).norm().item()
        assert mine <= factor * theirs + 1e-6 * p64.norm().item(), (name, mine, theirs)


def test_float32_training_follows_torchs_rounding():
    """100 float32 Adam steps of the GW MLP on the CPU (the device program's loops) stay within
    torch's own float32 rounding of its float64 run; with Adam's constants rounded in float
    (1 - 0.999f) the loss was 2e-3 away by then, torch's 1e-7. The same check fails a model
    trained at a learning rate 1% off."""
    torch.manual_seed(0)
    net = gw_mlp(2048)
    for lr, ok in ((1e-3, True), (1.01e-3, False)):
        model = compile_device(net, torch.zeros(2, 2048), "cpu")
        with contextlib.nullcontext() if ok else pytest.raises(AssertionError):
            _train_within_torchs_float32_rounding(copy.deepcopy(net), (2048,), model, 100, lr)


@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("model", MODELS)
def test_gpu_model_trains_like_torch_for_200_steps(model, dtype):
    """rootclad.compile on a CUDA example: 200 Adam steps against torch.optim on the CPU, in
    float64 to 1e-10; in float32 within torch's own float32 rounding of its float64 run (the
    CNN for 100 steps)."""
    make, shape, _ = MODELS[model]
    torch.manual_seed(0)
    net = make(2048).to(dtype)
    dm = rootclad.compile(net, example_input=torch.zeros(1, *shape(2048), dtype=dtype).cuda())
    assert isinstance(dm, DeviceModel) and dm.device.type == "cuda"
    if dtype == F64:
        _train_like_torch(net, shape(2048), "cuda", dtype, 200, {"rtol": 1e-10, "atol": 1e-12},
                          model=dm)  # fmt: skip
    else:  # the CNN's float32 training turns chaotic near step 100 in torch itself: torch's
        # float32 run parts from its float64 one from 1e-8 (step 75) to 2e-4 (step 150), and
        # two float32 runs summing in different orders part as fast (on an H200 ours left
        # 4x torch's distance at step 145): past that, no run is a reference for another
        steps = 200 if model == "gw-mlp" else 100
        _train_within_torchs_float32_rounding(net, shape(2048), dm, steps)


@pytest.mark.skipif(not GPU, reason=NO_GPU)
def test_gpu_model_matches_the_cpu_kernels_and_refuses_cpu_tensors():
    torch.manual_seed(0)
    net = gw_cnn(512).double()
    example = torch.zeros(1, 1, 512, dtype=F64)
    gpu = rootclad.compile(net, example_input=example).to("cuda")
    cpu = compile_device(net, example, "cpu")
    x, y = _batch(3, 8, (1, 512), F64)
    tol = {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(gpu.predict(x.cuda()).cpu(), cpu.predict(x), **tol)
    torch.testing.assert_close(gpu.input_grad(x.cuda()).cpu(), cpu.input_grad(x), **tol)
    g_loss, g_grads = gpu.loss_and_grad(x.cuda(), y.cuda())
    c_loss, c_grads = cpu.loss_and_grad(x, y)
    torch.testing.assert_close(g_loss.cpu(), c_loss, **tol)
    for k in c_grads:
        torch.testing.assert_close(g_grads[k].cpu(), c_grads[k], **tol)
    with pytest.raises(ValueError, match="input is on cpu; this model runs on cuda"):
        gpu.predict(x)
    with pytest.raises(
        ValueError, match=r"input is on cuda:0; this compiled model runs on the CPU"
    ):
        gpu.to("cpu").predict(x.cuda())


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
    timed = {"rootclad", "rootclad, CUDA graph", "torch eager", "torch.compile"}
    assert set(report["models"]["gw-mlp"]["4"]["median_ms"]) == timed
    # the CNN's convolutions also all as direct kernels
    assert set(report["models"]["gw-cnn"]["4"]["median_ms"]) == timed | {
        "rootclad, direct convolutions"
    }
    memory = [report["models"]["gw-cnn"][B]["memory_mib"] for B in ("1", "4")]
    assert 0 < memory[0]["rootclad stores"] < memory[1]["rootclad stores"]
    assert memory[1]["torch eager step"] is None  # torch.cuda's peak: on a GPU only
    table = (tmp_path / "cuda.md").read_text()
    assert table.startswith("# GW models' train step on a GPU")
    assert "| gw-cnn | 4 | " in table.split("| rootclad stores |")[1]
    assert "| gw-cnn | 4 |" in table.split("| direct convolutions |")[1]


def test_the_gpu_attention_benchmark_runs_on_the_cpu(tmp_path):
    """benchmarks/cuda/bench_attention.py, with --device cpu, writes its JSON and table (to a
    scratch place, not the kept ones); the GPU run itself needs a GPU machine."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "cuda" / "bench_attention.py"
    out = tmp_path / "attention.json"
    res = subprocess.run([sys.executable, str(script), "--device", "cpu", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    entry = json.loads(out.read_text())["models"]["small"]["2"]
    assert set(entry["median_ms"]) == {"rootclad", "torch eager"}
    first = entry["first_loss"]  # checked by the script too: it stops where they differ
    assert abs(first["rootclad"] - first["torch eager"]) <= 1e-4 * max(1, abs(first["torch eager"]))
    assert all(v > 0 for v in entry["median_ms"].values())
    assert "| small (32 x 64, 4) | 2 |" in (tmp_path / "attention.md").read_text()


def _bn_net():
    """A convolution without bias before BatchNorm, as real models have it: a bias there has a
    gradient that is zero in exact arithmetic, and Adam turns its rounding noise (which differs
    between two runs on a GPU, its atomics' order) into full-size steps."""
    nn = torch.nn
    return nn.Sequential(nn.Conv1d(2, 4, 3, bias=False), nn.BatchNorm1d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6, 1)).double()  # fmt: skip


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not GPU, reason=NO_GPU))]
)
def test_train_step_through_step_graphs_equals_plain_launches(device):
    """cuda_graphs: steps through StepGraph (on the CPU its in-memory step without a graph, on a
    GPU the captured graph) equal plain launches. 9 Adam steps at batches of 6 and 3 (a graph
    each; the other's steps advance the count that a graph then picks up) with the learning
    rate halved after the 4th (the configuration uploaded again), on a model with BatchNorm
    (its running statistics updated in the graph): every loss, then the parameters, the
    running statistics and the optimizer's state."""
    torch.manual_seed(0)
    net = _bn_net()
    example = torch.zeros(2, 2, 8, dtype=F64)
    plain = compile_device(net, example, device)
    graphed = compile_device(net, example, device)
    graphed.cuda_graphs = True
    opts = [rootclad.optim.Adam(m, lr=1e-2) for m in (plain, graphed)]
    exact = device == "cpu"  # on a GPU the atomics' order may differ in the last bits
    for i, B in enumerate([6, 6, 6, 3, 6, 6, 3, 3, 6]):
        if i == 4:
            for opt in opts:
                opt.lr = 5e-3
        x, y = _batch(i, B, (2, 8), F64, device)
        losses = [m.train_step(x, y, opt) for m, opt in zip((plain, graphed), opts, strict=True)]
        torch.testing.assert_close(losses[1], losses[0], rtol=0 if exact else 1e-12, atol=0)
    graphs = [g for g in graphed._step_graphs.values() if g]
    assert len(graphs) == 2 and sorted(g.B for g in graphs) == [3, 6]
    assert all((g.graph is not None) == (device == "cuda") for g in graphs)
    assert [int(g.step) for g in sorted(graphs, key=lambda g: g.B)] == [9, 10]
    for name, value in plain.state_dict().items():
        tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-12, "atol": 1e-14}
        torch.testing.assert_close(graphed.state_dict()[name], value, **tol, msg=name)
    torch.testing.assert_close(opts[1].state_dict()["state"], opts[0].state_dict()["state"],
                               rtol=0 if exact else 1e-12, atol=0 if exact else 1e-14)  # fmt: skip


def test_batch_sizes_share_one_store_that_grows():
    """act and d_act are views of one store each, grown to the largest batch seen: a smaller
    batch after a larger one allocates nothing, a larger one reallocates and drops the other
    batch sizes' views and step graphs (which hold the old addresses). The GW CNN's workspace
    appears at 41 samples (a convolution as products). Every step and prediction follows
    torch."""
    torch.manual_seed(0)
    net, shape = gw_cnn(512).double(), (1, 512)
    dm = compile_device(net, torch.zeros(2, *shape, dtype=F64), "cpu")
    dm.cuda_graphs = True  # on the CPU the graphs' in-memory step, kept per batch size
    opt, ref_opt = rootclad.optim.Adam(dm, lr=1e-3), torch.optim.Adam(net.parameters(), lr=1e-3)
    # each step: the batch size, then the batch sizes with views, and those with a graph
    # (the first step at a batch size runs plain, the second makes the graph)
    steps = [(8, [8], []), (8, [8], [8]), (3, [3, 8], [8]), (3, [3, 8], [3, 8]),
             (41, [41], []), (41, [41], [41]), (8, [8, 41], [41])]  # fmt: skip
    stores = []
    for i, (B, views, graphs) in enumerate(steps):
        _step_like_torch(dm, opt, net, ref_opt, *_batch(i, B, shape, F64))
        stores.append((dm._act_store.data_ptr(), dm._d_act_store.data_ptr()))
        largest = max(b for b, _, _ in steps[: i + 1])
        assert dm._act_store.numel() == dm._fn["act_size"](largest)
        assert dm._d_act_store.numel() == dm._fn["d_act_size"](largest)
        assert sorted(dm._work) == views
        assert sorted(k[0] for k, g in dm._step_graphs.items() if g) == graphs
    assert stores[0] == stores[2] and stores[4] == stores[6]  # smaller batches: no allocation
    assert dm._fn["act_size"](41) > dm._fn["act_size"](8) + 33 * dm._fn["d_act_size"](1)
    x, _ = _batch(0, 5, shape, F64)
    torch.testing.assert_close(dm.predict(x), net(x).detach(), rtol=1e-10, atol=1e-12)


def test_step_graphs_stand_aside_for_dropout_and_frozen_parameters():
    """A model with dropout (its seed changes every step) and a step with a frozen parameter
    (the optimizer's runs change) run as plain launches: no StepGraph is made."""
    nn = torch.nn
    dropout = compile_device(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5),
                                                    nn.Linear(8, 1)).double(),
                                      torch.zeros(2, 4, dtype=F64), "cpu")  # fmt: skip
    frozen = compile_device(_bn_net(), torch.zeros(2, 2, 8, dtype=F64), "cpu")
    frozen.state_dict()  # the views exist
    next(iter(frozen.parameters())).requires_grad_(False)
    for model, shape in ((dropout, (4,)), (frozen, (2, 8))):
        model.cuda_graphs = True
        opt = rootclad.optim.Adam(model, lr=1e-2)
        for i in range(3):
            model.train_step(*_batch(i, 4, shape, F64), opt)
        assert not any(model._step_graphs.values())


@pytest.mark.parametrize("where", ["input", "target", "state"])
def test_a_non_finite_step_is_refused_as_on_the_cpu(where):
    """A NaN in the batch made every parameter NaN (CompiledModel refused it, DeviceModel did
    not); a state poisoned by a step taken without the check is refused too."""
    dm = compile_device(gw_mlp(16).double(), torch.zeros(2, 16, dtype=F64), "cpu")
    opt = rootclad.optim.Adam(dm, lr=1e-3)
    x, y = _batch(0, 4, (16,), F64)
    dm.train_step(x, y, opt)
    bad_x, bad_y = x.clone(), y.clone()
    (bad_x if where != "target" else bad_y)[2, ...] = float("nan")
    if where == "state":  # poisoned by a step that skipped the check
        dm.train_step(bad_x, y, opt, check_finite=False)
        bad_x = x
    before = [p.detach().clone() for p in dm.parameters()], opt.state_dict()
    message = {
        "input": r"non-finite input \(nan\) in sample 2",
        "target": r"non-finite target \(nan\) in sample 2",
        "state": "the state holds a non-finite",
    }
    with pytest.raises(ValueError, match=message[where]):
        dm.train_step(bad_x, bad_y, opt)
    if where != "state":
        for p, q in zip(dm.parameters(), before[0], strict=True):
            assert torch.equal(p.detach(), q)
        assert opt.state_dict()["step_count"] == before[1]["step_count"]
        assert torch.equal(opt.state_dict()["state"], before[1]["state"])


@pytest.mark.parametrize("loss", ["bce_with_logits", "mse", "huber", "cross_entropy", "nll"])
def test_event_weights_on_the_device_as_torch(loss):
    """Per-sample loss weights (HEP event weights), as CompiledModel's: the loss is the mean
    over elements of weight[b] * loss element (DeviceModel had none)."""
    torch.manual_seed(0)
    classes = loss in ("cross_entropy", "nll")
    width = 3 if classes else 2
    layers = [torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, width)]
    if loss == "nll":
        layers.append(torch.nn.LogSoftmax(dim=1))
    net = torch.nn.Sequential(*layers).double()
    dm = compile_device(net, torch.zeros(2, 6, dtype=F64), "cpu", loss=loss)
    x = torch.randn(7, 6, dtype=F64)
    y = torch.randint(0, 3, (7,)) if classes else torch.rand(7, width, dtype=F64)
    w = torch.rand(7, dtype=F64) * 2
    got, grads = dm.loss_and_grad(x, y, weight=w)
    fn = {"bce_with_logits": F.binary_cross_entropy_with_logits, "mse": F.mse_loss,
          "huber": F.huber_loss, "cross_entropy": F.cross_entropy, "nll": F.nll_loss}[loss]  # fmt: skip
    per = fn(net(x), y, reduction="none")
    ref = (per * (w if classes else w[:, None])).mean()
    torch.testing.assert_close(got, ref.detach(), rtol=1e-12, atol=1e-14)
    want = torch.autograd.grad(ref, list(net.parameters()))
    for g, r in zip(grads.values(), want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-13)
    opt = rootclad.optim.SGD(dm, lr=0.1)
    before = [p.detach().clone() for p in dm.parameters()]
    dm.train_step(x, y, opt, weight=w)
    for p, b, r in zip(dm.parameters(), before, want, strict=True):
        torch.testing.assert_close(p.detach(), b - 0.1 * r, rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match=r"weight: non-finite value \(nan\) in sample 1"):
        dm.loss_and_grad(x, y, weight=torch.tensor([1.0, float("nan")] + [1.0] * 5))
