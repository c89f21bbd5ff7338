"""Every op of the registry on the device kernels, run on the CPU (DeviceModel, device="cpu":
the kernels as loops), against torch autograd in float64:

- each one-op case of tests/fixtures/op_cases.py (the CPU kernels' cases too): the output, the
  input's gradient for a random upstream gradient, and the MSE loss and every parameter's
  gradient;
- the graph-IR tests' models (tests/fixtures/graph_models.py: two inputs and cat, LayerNorm and
  softmax, permute and LogSoftmax with NLL, a 2-D CNN, ResNets): 5 Adam steps like torch.optim;
- dropout draws the CPU model's masks (the same seed gives the same output and gradients);
- those models build for the GPU (skipped without nvcc).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from fixtures.core import (  # noqa: E402
    RTOL,
    assert_close_rel,
    assert_grads_close,
    mixed_batch,
    mixed_model,
    perturbed,
    rounded_reference,
    torch_loss,
    torch_loss_and_grad,
    torch_vjp,
)
from fixtures.graph_models import MODELS as GRAPH_MODELS  # noqa: E402
from fixtures.op_cases import (  # noqa: E402
    CASES,
    MASK_CASES,
    Neighbours,
    Tokens,
    dtype_params,
    index_input,
    mask_input,
)
from fixtures.op_cases import sample_input as _input  # noqa: E402

import rootclad
from rootclad.codegen.cuda import emit_device, fused_activations
from rootclad.codegen.cuda_ops import BN_CHUNKS, device_ops
from rootclad.compiler import compile_device
from rootclad.frontends.aten import graph_from_export
from rootclad.ir.ops import OPS
from rootclad.torch import DeviceModel

F64, F32 = torch.float64, torch.float32
# each test on the host loops, and on the GPU where there is one (these skip, saying why)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs an NVIDIA GPU (none here)"))]  # fmt: skip


def _cpu(value):
    """A result (a tensor, a tuple or a dict of them) on the CPU, to compare with torch's."""
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_cpu(v) for v in value)
    return value.cpu()


PARAMS = dtype_params()


def test_every_registered_op_has_device_kernels():
    """With tests/ops' check that every op has a case in fixtures/op_cases.py, this makes every op's
    device kernels run against torch below."""
    assert device_ops() == list(OPS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build, shape, dtype, rtol", PARAMS)
def test_op_device_kernels_match_torch(build, shape, dtype, rtol, device):
    torch.manual_seed(0)
    net = build()
    x = _input(shape).to(dtype)
    dm = compile_device(copy.deepcopy(net).to(dtype), x, device=device, loss="mse")
    ref, rtol = rounded_reference(net, dtype), rtol or RTOL[dtype]
    out_ref, d_out, dx_ref, _ = torch_vjp(ref, x.to(F64))
    xd = x.to(device)
    assert_close_rel(_cpu(dm.predict(xd)), out_ref, rtol, "forward")
    dx = dm.input_grad(xd, d_out=d_out.to(device, dtype))
    assert_close_rel(_cpu(dx), dx_ref, rtol, "d_input")
    y = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    loss, dp = _cpu(dm.loss_and_grad(xd, y.to(device, dtype)))
    if list(ref.parameters()):
        loss_ref, dp_ref = torch_loss_and_grad(ref, x.to(F64), y, "mse")
        assert_grads_close(dp, dp_ref, rtol, "mse loss")
    else:
        loss_ref = torch_loss("mse", ref(x.to(F64)), y)
    assert_close_rel(loss, loss_ref, rtol, "mse loss")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", GRAPH_MODELS)
def test_graph_ir_model_trains_like_torch_on_the_device_kernels(name, device):
    build, data, loss = GRAPH_MODELS[name]
    torch.manual_seed(0)
    net = build().double()
    xs, _ = data(4)
    dm = compile_device(net, xs if len(xs) > 1 else xs[0], device=device, loss=loss)
    opt, ref_opt = rootclad.optim.Adam(dm, lr=1e-2), torch.optim.Adam(net.parameters(), lr=1e-2)
    for step in range(1, 6):
        xs, y = data(4, seed=step)
        on = tuple(x.to(device) for x in xs)
        value = dm.train_step(on if len(on) > 1 else on[0], y.to(device), opt).cpu()
        ref_opt.zero_grad()
        ref = torch_loss(loss, net(*xs), y)
        ref.backward()
        ref_opt.step()
        assert_close_rel(value, ref.detach(), 1e-10, f"step {step} loss")
    state = _cpu(dm.state_dict())
    for p_name, p in net.named_parameters():
        assert_close_rel(state[p_name], p.detach(), 1e-9, p_name)
    for b_name, b in net.named_buffers():  # BatchNorm's running statistics
        assert_close_rel(state[b_name].to(F64), b.to(F64), 1e-9, b_name, nonzero=False)
    # the inputs' gradients, each its own tensor
    xs, _ = data(3, seed=9)
    d_out = torch.randn(net(*xs).shape, generator=torch.Generator().manual_seed(2), dtype=F64)
    grads = dm.input_grad(*(x.to(device) for x in xs), d_out=d_out.to(device))
    grads = _cpu(grads if isinstance(grads, tuple) else (grads,))
    xs = [x.clone().requires_grad_(True) for x in xs]
    want = torch.autograd.grad(net(*xs), xs, d_out)
    assert len(grads) == len(want)
    for i, (g, w) in enumerate(zip(grads, want, strict=True)):
        assert_close_rel(g, w, 1e-10, f"d input {i}")


def test_dropout_draws_the_cpu_models_masks():
    """Every layer of the CPU tests' mixed model (Dropout(0.3) among them) in training mode:
    the device model and the compiled CPU model, both seeded 7, drop the same elements in
    predict, loss_and_grad and input_grad (the seeds follow the same sequence)."""
    torch.manual_seed(0)
    net = mixed_model()
    x, y = mixed_batch(6)
    cm = rootclad.compile(net, x, loss="cross_entropy", engine="pullback", seed=7)
    dm = compile_device(net, x, device="cpu", loss="cross_entropy", seed=7)
    out = dm.predict(x)
    assert_close_rel(out, cm.predict(x), 1e-12, "forward")
    assert (out - net.eval()(x)).abs().max() > 1e-6  # dropout was on (agreement: 1e-12)
    loss, grads = dm.loss_and_grad(x, y)
    cm_loss, cm_grads = cm.loss_and_grad(x, y)
    assert_close_rel(loss, cm_loss, 1e-12, "loss")
    assert_grads_close(grads, cm_grads, 1e-11, "loss")
    assert_close_rel(dm.input_grad(x), cm.input_grad(x), 1e-11, "d_input")
    # another call, another mask
    assert (dm.predict(x) - out).abs().max() > 1e-6


def test_graph_ir_models_build_for_the_gpu(gpu_build):
    """The graph-IR tests' models and the mixed model (every CPU layer, dropout among them),
    float32, as one program (a namespace each) built for the GPU: the host compiler against
    nvcc's device runtime."""
    models = {name: (build, data(2)[0], loss) for name, (build, data, loss) in GRAPH_MODELS.items()}
    models["mixed"] = (mixed_model, (mixed_batch(2)[0],), "cross_entropy")
    sources = []
    for i, (build, xs, loss) in enumerate(models.values()):
        xs = tuple(x.float() for x in xs)
        graph = graph_from_export(build().float(), xs if len(xs) > 1 else xs[0], "float32")
        graph.validate()
        sources.append(emit_device(graph, f"net{i}", loss))
    lib = gpu_build.program("\n".join(sources), "nets")
    assert all(getattr(lib, f"net{i}_n_params")() > 0 for i in range(len(sources)))


GEMM_CASES = [
    pytest.param(build, shape, id=name)
    for name, build, shape, _ in CASES
    if name in ("linear", "linear-nobias", "linear-3d", "flatten-linear", "cat-features")
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build, shape", GEMM_CASES)
def test_linear_through_gemm_matches_torch(build, shape, device):
    """At 40 rows (GEMM_MIN_ROWS: 32) a Linear's products go through gemm, the column-major
    call cuBLAS gets on the GPU: the forward, input gradient and parameter gradients."""
    torch.manual_seed(0)
    net = build()
    x = _input(shape, B=40)
    dm = compile_device(copy.deepcopy(net), x, device=device, loss="mse")
    out_ref, d_out, dx_ref, _ = torch_vjp(net, x)
    xd = x.to(device)
    assert_close_rel(_cpu(dm.predict(xd)), out_ref, 1e-12, "forward")
    assert_close_rel(_cpu(dm.input_grad(xd, d_out=d_out.to(device))), dx_ref, 1e-10, "d_input")
    y = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    _, dp_ref = torch_loss_and_grad(net, x, y, "mse")
    assert_grads_close(_cpu(dm.loss_and_grad(xd, y.to(device))[1]), dp_ref, 1e-10, "mse loss")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act", [torch.nn.ReLU, torch.nn.Tanh, torch.nn.Sigmoid])
def test_fused_activation_through_gemm_trains_like_torch(act, device):
    """Linear + a fused activation at 40 rows: the adjoint turned in place for the products
    (as_matrix); 5 Adam steps like torch.optim, then the input gradient."""
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Linear(12, 30), act(), nn.Linear(30, 20), act(), nn.Linear(20, 1))
    _two_fused_layers_train_like_torch(net.double(), (12,), 1e-2, device)


def _two_fused_layers_train_like_torch(net, shape, lr, device):
    """``net`` with two fused activations, on batches of 40 of per-sample ``shape``: 5 Adam
    steps under BCE like torch.optim (the loss, then the parameters), then the input
    gradient."""
    dm = compile_device(net, torch.zeros(2, *shape, dtype=F64), device=device)
    assert len(fused_activations(dm.graph)) == 2
    opt, ref_opt = rootclad.optim.Adam(dm, lr=lr), torch.optim.Adam(net.parameters(), lr=lr)
    for step in range(1, 6):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(40, *shape, generator=gen, dtype=F64)
        y = torch.randint(0, 2, (40,), generator=gen).to(F64)
        loss = dm.train_step(x.to(device), y.to(device), opt).cpu()
        ref_opt.zero_grad()
        ref = torch.nn.functional.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
        ref.backward()
        ref_opt.step()
        assert_close_rel(loss, ref.detach(), 1e-10, f"step {step} loss")
    for name, p in net.named_parameters():
        assert_close_rel(_cpu(dm.state_dict()[name]), p.detach(), 1e-9, name)
    xg = x.clone().requires_grad_(True)
    dx = _cpu(dm.input_grad(x.to(device)))
    assert_close_rel(dx, torch.autograd.grad(net(xg).sum(), xg)[0], 1e-10, "dx")


@pytest.mark.parametrize("device", DEVICES)
def test_convolutions_as_products_train_like_torch(device):
    """Two one-group Conv1d layers of 36 and 40 taps (strided and padded; padded and dilated)
    with fused ReLU and Tanh, at 40 samples of 256: 5120 and 4960 output positions, so both
    run as im2col and gemm (the calls cuBLAS gets on the GPU); 5 Adam steps like torch.optim,
    then the input gradient (the first layer's columns summed back: col2im)."""
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Conv1d(4, 8, 9, stride=2, padding=4), nn.ReLU(),
                        nn.Conv1d(8, 8, 5, padding=2, dilation=2), nn.Tanh(), nn.Flatten(),
                        nn.Linear(8 * 124, 1)).double()  # fmt: skip
    _two_fused_layers_train_like_torch(net, (4, 256), 1e-3, device)


class _GatedSum(torch.nn.Module):
    """tanh(a(x) * g(x)) with g's one column broadcast, and relu(a(x) - b(x)): activations
    fused into a broadcasting and a same-shape binary op."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.a, self.b, self.g, self.out = (nn.Linear(12, 8), nn.Linear(12, 8), nn.Linear(12, 1),
                                            nn.Linear(8, 1))  # fmt: skip

    def forward(self, x):
        h = self.a(x)
        return self.out(torch.tanh(h * self.g(x)) + torch.relu(h - self.b(x)))


@pytest.mark.parametrize("device", DEVICES)
def test_activations_fused_into_binary_ops_train_like_torch(device):
    """A Tanh fused into a broadcasting product and a ReLU into a same-shape difference: 5
    Adam steps like torch.optim, then the input gradient."""
    torch.manual_seed(0)
    net = _GatedSum().double()
    graph = compile_device(net, torch.zeros(2, 12, dtype=F64), device="cpu").graph
    producers = {n.output: n.op for n in graph.nodes}
    assert sorted(producers[v] for v in fused_activations(graph)) == ["mul", "sub"]
    _two_fused_layers_train_like_torch(net, (12,), 1e-2, device)


def _bce_gradients_match_torch(net, x, y, device) -> DeviceModel:
    """The device model of ``net``: its BCE loss and every gradient on (x, y) against torch."""
    dm = compile_device(net, x, device=device)
    loss, grads = _cpu(dm.loss_and_grad(x.to(device), y.to(device)))
    ref_loss, ref_grads = torch_loss_and_grad(net, x, y.unsqueeze(1), "bce_with_logits")
    assert_close_rel(loss, ref_loss, 1e-12, "loss")
    assert_grads_close(grads, ref_grads, 1e-10, "bce")
    return dm


@pytest.mark.parametrize("device", DEVICES)
def test_batch_sums_split_into_chunks_match_torch(device):
    """The GW CNN (256 long) at 40 samples: its convolutions, direct at so few output
    positions, sum their weight gradients (256, 4096 and 16384 values) over the batch in 40,
    16 (uneven: 2 or 3 samples) and 4 chunks (batch_chunks: 2^16 indices), its Linear goes
    through gemm; every parameter's gradient against torch."""
    from rootclad.gw.models import gw_cnn

    torch.manual_seed(0)
    net = gw_cnn(256).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 1, 256, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (40,), generator=gen).to(F64)
    _bce_gradients_match_torch(net, x, y, device)


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm_statistics_over_uneven_chunks_match_torch(device):
    """BatchNorm at 70 samples: 64 chunks of 1 or 2 samples, combined per channel (Chan's
    parallel variance); the loss, every gradient and the running statistics against torch,
    and BN_CHUNKS the same in codegen/cuda_ops.py and device/norm.h."""
    header = (Path(rootclad.get_include()) / "rootclad" / "device" / "norm.h").read_text()
    assert f"constexpr int BN_CHUNKS = {BN_CHUNKS};" in header
    torch.manual_seed(0)
    net = perturbed(torch.nn.Sequential(torch.nn.Conv1d(2, 3, 3, bias=False), torch.nn.BatchNorm1d(3),
                                        torch.nn.Flatten(), torch.nn.Linear(15, 1))).double()  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    x = 3 + torch.randn(70, 2, 7, generator=gen, dtype=F64)  # a mean far from 0
    y = torch.randint(0, 2, (70,), generator=gen).to(F64)
    dm = _bce_gradients_match_torch(net, x, y, device)
    for name in ("1.running_mean", "1.running_var"):
        assert_close_rel(_cpu(dm.state_dict()[name]), net.state_dict()[name], 1e-12, name)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_weight_sums_over_uneven_chunks_match_torch(device):
    """LayerNorm of width 300 over 2 x 250 rows: its weight and bias gradients sum the 500 rows
    in 218 chunks of 2 or 3 rows (batch_chunks: 2^16 indices), meeting through add_to; every
    gradient against torch."""
    torch.manual_seed(0)
    net = perturbed(torch.nn.Sequential(torch.nn.LayerNorm(300), torch.nn.Flatten(),
                                        torch.nn.Linear(250 * 300, 1))).double()  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 250, 300, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (2,), generator=gen).to(F64)
    _bce_gradients_match_torch(net, x, y, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, build, shapes, kind", MASK_CASES, ids=[c[0] for c in MASK_CASES])
def test_mask_cases_match_torch_on_the_device(name, build, shapes, kind, device):
    """Attention's masks (fixtures/op_cases.py MASK_CASES; tests/torch/test_masks.py runs them
    on the CPU engines): forward, the values' gradient and the parameters' against torch."""
    torch.manual_seed(0)
    net = build()
    x, mask = mask_input(shapes, kind)
    dm = compile_device(copy.deepcopy(net), (x, mask), device=device, loss="mse")
    xd, md = x.to(device), mask.to(device)
    assert_close_rel(_cpu(dm.predict(xd, md)), net(x, mask), 1e-10, f"{name} forward")
    d_out = torch.randn(net(x, mask).shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    xs = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(net(xs, mask), [xs], d_out)
    got = dm.input_grad(xd, md, d_out=d_out.to(device))
    assert_close_rel(_cpu(got[0]), want, 1e-10, f"{name} d_input")
    if list(net.parameters()):
        loss, grads = _cpu(dm.loss_and_grad((xd, md), d_out.to(device)))
        ref_loss = torch.nn.functional.mse_loss(net(x, mask), d_out)
        ref_grads = torch.autograd.grad(ref_loss, list(net.parameters()))
        assert_close_rel(loss, ref_loss.detach(), 1e-10, f"{name} loss")
        names = [n for n, _ in net.named_parameters()]
        assert_grads_close(grads, dict(zip(names, ref_grads, strict=True)), 1e-9, name,
                           against_all=True)  # fmt: skip


class _Recurrent(torch.nn.Module):
    """A 2-layer bidirectional LSTM and a GRU after it, each read at its last state."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = torch.nn.GRU(8, 5, batch_first=True)

    def forward(self, x):
        out, (h, _) = self.lstm(x)
        return self.gru(out)[1][0] + h[-1].sum(1, keepdim=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("what", ["embedding", "recurrent", "neighbours"])
def test_embedding_and_recurrent_layers_match_torch_on_the_device(what, device):
    """nn.Embedding (integer inputs; tests/torch/test_embedding.py), nn.LSTM / nn.GRU
    unrolled (tests/torch/test_recurrent.py) and an EdgeConv (topk, gather, expand and repeat;
    tests/torch/test_neighbours.py) in a device program: forward, the float input's gradient
    and every parameter's against torch (no gradient at the padding row)."""
    torch.manual_seed(0)
    if what == "embedding":
        net, xs = perturbed(Tokens().double()), index_input()
    elif what == "neighbours":
        net = perturbed(Neighbours().double())
        xs = (torch.randn(3, 3, 8, dtype=F64, generator=torch.Generator().manual_seed(1)),)
    else:
        net = perturbed(_Recurrent().double())
        xs = (torch.randn(3, 4, 3, dtype=F64, generator=torch.Generator().manual_seed(1)),)
    dm = compile_device(copy.deepcopy(net), xs if len(xs) > 1 else xs[0], device=device,
                        loss="mse")  # fmt: skip
    xd = tuple(t.to(device) for t in xs)
    assert_close_rel(_cpu(dm.predict(*xd)), net(*xs), 1e-10, f"{what} forward")
    d_out = torch.randn(net(*xs).shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    x = xs[-1].clone().requires_grad_(True)
    (want,) = torch.autograd.grad(net(*xs[:-1], x), [x], d_out)
    got = dm.input_grad(*xd, d_out=d_out.to(device))
    got = got[-1] if isinstance(got, (tuple, list)) else got
    assert_close_rel(_cpu(got), want, 1e-10, f"{what} d_input")
    loss, grads = _cpu(dm.loss_and_grad(xd if len(xd) > 1 else xd[0], d_out.to(device)))
    ref_loss = torch.nn.functional.mse_loss(net(*xs), d_out)
    ref_grads = torch.autograd.grad(ref_loss, list(net.parameters()))
    assert_close_rel(loss, ref_loss.detach(), 1e-10, f"{what} loss")
    names = [n for n, _ in net.named_parameters()]
    assert_grads_close(grads, dict(zip(names, ref_grads, strict=True)), 1e-9, what,
                       against_all=True)  # fmt: skip
    if what == "embedding":
        assert float(grads["tok.weight"][0].abs().max()) == 0
