"""Whole models on the device kernels (rootclad/codegen/cuda.py): the GW MLP and CNN's
device program, run on the CPU (g++, dev::Host), against torch: the forward pass, the loss
and every parameter's gradient, and 20 Adam steps against torch.optim (float64); and the
same source at full size built for the GPU (skipped without nvcc)."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch
from torch.nn import functional as F

from rootclad.codegen import cuda_ops
from rootclad.codegen.cuda import emit_device, fused_activations
from rootclad.codegen.cuda_ops import device_ops
from rootclad.compiler import compile_device
from rootclad.frontends.aten import graph_from_export
from rootclad.gw.models import gw_cnn, gw_mlp, gw_resnet
from rootclad.ir.graph import IRError
from rootclad.nets import digits_cnn
from rootclad.toolchain.recipes import host_device_program

F64 = torch.float64
MODELS = {
    "gw-mlp": (lambda: gw_mlp(96), (96,)),
    "gw-cnn": (lambda: gw_cnn(512), (1, 512)),
    # residual additions (a value read twice), strided and padded convolutions, global pooling
    "gw-resnet": (lambda: gw_resnet(256), (1, 256)),
}


def _program(net, shape, dtype="float64"):
    example = torch.zeros(2, *shape, dtype=getattr(torch, dtype))
    g = graph_from_export(net.to(example.dtype), example, dtype)
    g.validate()
    return g, emit_device(g, "net")


def _build(tmp_path, source, *flags, defines=()):
    """The program ``net`` as DeviceModel builds it for the host loops (the host device runtime
    with the kernels' ``defines``; ``flags``: the program's own)."""
    path, _ = host_device_program(source, "net", defines=defines, flags=flags)()
    return ctypes.CDLL(str(path))


def _p(t):
    return ctypes.c_void_p(t.data_ptr())


def _loss_and_grad(lib, params, act, y, loss, d_params, d_act, B):
    """The program's C API call in training (seed 1: the API takes one, dropout or not)."""
    p, a, t, out, dp, da = (_p(v) for v in (params, act, y, loss, d_params, d_act))
    lib.net_loss_and_grad(None, p, None, a, t, None, out, dp, da, B, 1, ctypes.c_ulonglong(1))


def _one_step(lib, net, x, y):
    """The program's loss_and_grad on (x, y): its output values and parameter gradient."""
    lib.net_act_size.restype = lib.net_output_offset.restype = ctypes.c_long
    B = x.shape[0]
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).contiguous()
    n = lib.net_act_size(B)
    act, d_act = torch.zeros(n, dtype=F64), torch.zeros(n, dtype=F64)
    d_params, loss = torch.zeros_like(params), torch.zeros(1, dtype=F64)
    act[: x.numel()] = x.reshape(-1)
    _loss_and_grad(lib, params, act, y, loss, d_params, d_act, B)
    at = lib.net_output_offset(B)
    return act[at : at + B], d_params


def _torch_grads(net, x, y):
    out = net(x)
    F.binary_cross_entropy_with_logits(out.squeeze(1), y).backward()
    return out.detach().reshape(-1), torch.cat([p.grad.reshape(-1) for p in net.parameters()])


@pytest.mark.parametrize("model", MODELS)
def test_device_program_trains_like_torch(model, tmp_path):
    torch.manual_seed(0)
    make, shape = MODELS[model]
    net = make().double()
    graph, source = _program(net, shape)
    lib = _build(tmp_path, source)
    assert lib.net_n_params() == sum(p.numel() for p in net.parameters())
    B = 5
    lib.net_act_size.restype = lib.net_output_offset.restype = ctypes.c_long
    n_act = lib.net_act_size(B)
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).contiguous()
    state = torch.zeros(2 * params.numel(), dtype=F64)
    adam = (ctypes.c_double * 9)(1, 1e-3, 0, 0, 0, 0, 0.9, 0.999, 1e-8)  # OptimConfig
    act, d_act = torch.zeros(n_act, dtype=F64), torch.zeros(n_act, dtype=F64)
    d_params, loss = torch.zeros_like(params), torch.zeros(1, dtype=F64)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    out_at = lib.net_output_offset(B)
    for step in range(1, 21):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(B, *shape, generator=gen, dtype=F64)
        y = torch.randint(0, 2, (B,), generator=gen).to(F64)
        act[: x.numel()] = x.reshape(-1)
        _loss_and_grad(lib, params, act, y, loss, d_params, d_act, B)
        opt.zero_grad()
        out = net(x)
        ref = F.binary_cross_entropy_with_logits(out.squeeze(1), y)
        ref.backward()
        if step == 1:  # the forward pass itself, and every parameter's gradient
            torch.testing.assert_close(act[out_at : out_at + B], out.detach().reshape(-1),
                                       rtol=1e-12, atol=1e-12)  # fmt: skip
            grads = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
            torch.testing.assert_close(d_params, grads, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(loss[0], ref.detach(), rtol=1e-10, atol=1e-12)
        opt.step()
        lib.net_optim_step(
            None,
            _p(params),
            _p(d_params),
            _p(state),
            adam,
            ctypes.c_long(step),
            ctypes.c_long(0),
            ctypes.c_long(params.numel()),
        )
    want = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    torch.testing.assert_close(params, want, rtol=1e-9, atol=1e-12)


def test_an_op_without_device_kernels_is_refused_by_name(monkeypatch):
    """(Every op has device kernels now: one is taken away for this test.)"""
    monkeypatch.delitem(cuda_ops.DEVICE_OPS, "layer_norm")
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 1))
    with pytest.raises(IRError, match=r"\(layer_norm\).*no device kernel yet.*linear"):
        _program(net, (4,))
    assert "layer_norm" not in device_ops()


FULL_SIZE = {  # (make, per-sample shape, loss)
    "gw-mlp": (lambda: gw_mlp(2048), (2048,), "bce_with_logits"),
    "gw-cnn": (lambda: gw_cnn(2048), (1, 2048), "bce_with_logits"),
    "gw-resnet": (lambda: gw_resnet(2048), (1, 2048), "bce_with_logits"),
    "gw-resnet-batchnorm": (
        lambda: gw_resnet(2048, batch_norm=True),
        (1, 2048),
        "bce_with_logits",
    ),  # fmt: skip
    "digits-cnn": (digits_cnn, (1, 28, 28), "cross_entropy"),  # the graph-IR tests'
}


@pytest.mark.parametrize("model", FULL_SIZE)
def test_model_programs_build_for_the_gpu(model, gpu_build):
    """The GW models at full size (2048 samples), with and without BatchNorm, and the 2-D
    digits CNN, float32, built for the GPU (the host compiler against nvcc's device runtime)
    and loaded."""
    make, shape, loss = FULL_SIZE[model]
    net = make()
    graph = graph_from_export(net, torch.zeros(2, *shape), "float32")
    graph.validate()
    lib = gpu_build.program(emit_device(graph, "net", loss), "net")
    assert lib.net_n_params() == sum(p.numel() for p in net.parameters())


ACTIVATIONS = {
    "tanh": torch.nn.Tanh(),
    "sigmoid": torch.nn.Sigmoid(),
    "silu": torch.nn.SiLU(),
    "leaky_relu": torch.nn.LeakyReLU(0.07),
    "elu": torch.nn.ELU(0.6),
    "softplus": torch.nn.Softplus(beta=2.0, threshold=1.5),
    "gelu": torch.nn.GELU(),
    "gelu-tanh": torch.nn.GELU(approximate="tanh"),
}


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_activation_device_kernels_match_torch(act, tmp_path):
    """Each elementwise op's device kernels, in a program Linear-act-Linear: the output and
    every parameter's gradient against torch autograd (float64)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 40), ACTIVATIONS[act], torch.nn.Linear(40, 1))
    net = net.double()
    with torch.no_grad():
        net[0].weight.mul_(3)  # pre-activations across softplus's threshold, the kinks at 0
    _, source = _program(net, (6,))
    x, y = torch.randn(7, 6, dtype=F64), (torch.arange(7) % 2).to(F64)
    out, d_params = _one_step(_build(tmp_path, source), net, x, y)
    want_out, want_grads = _torch_grads(net, x, y)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d_params, want_grads, rtol=1e-10, atol=1e-12)


class _Difference(torch.nn.Module):
    """head(relu(a(x)) - b(x)): a subtraction whose operands both need gradients."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = (torch.nn.Linear(5, 8), torch.nn.Linear(5, 8),
                                     torch.nn.Linear(8, 1))  # fmt: skip

    def forward(self, x):
        return self.head(torch.relu(self.a(x)) - self.b(x))


def test_subtraction_device_kernels_match_torch(tmp_path):
    torch.manual_seed(0)
    net = _Difference().double()
    _, source = _program(net, (5,))
    x, y = torch.randn(4, 5, dtype=F64), (torch.arange(4) % 2).to(F64)
    _, d_params = _one_step(_build(tmp_path, source), net, x, y)
    torch.testing.assert_close(d_params, _torch_grads(net, x, y)[1], rtol=1e-10, atol=1e-12)


class _FusionNet(torch.nn.Module):
    """Every kind of fusing producer with each fusible activation, and a value read twice
    (not fused); the output itself is a producer's (not fused either)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.c1, self.c2 = nn.Conv2d(1, 3, 3, padding=1), nn.Conv2d(3, 4, 3)
        self.pool, self.mpool = nn.AvgPool2d(2), nn.MaxPool1d(2)
        self.c3, self.c4 = nn.Conv1d(4, 2, 3, padding=1), nn.Conv1d(2, 2, 1)
        self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 1)

    def forward(self, x):  # x: (B, 1, 8, 8)
        h = torch.tanh(self.pool(torch.sigmoid(self.c1(x))))  # conv2d+sigmoid, avgpool+tanh
        h = self.c2(h)  # (B, 4, 2, 2), read twice: not fused
        h = (torch.relu(h) + h).flatten(2)  # (B, 4, 4)
        # optimize.py swaps a ReLU before a MaxPool1d behind it: maxpool+relu
        h = self.mpool(torch.relu(self.c3(h)))  # (B, 2, 2)
        h = torch.sigmoid(self.c4(h))  # conv1d+sigmoid
        return self.fc2(torch.tanh(self.fc1(h.flatten(1))))  # linear+tanh; the output linear


def test_fused_activations_match_torch(tmp_path):
    """The fused program (every producer kind, each fusible activation) against torch, and
    the pairs fused_activations picks: the GW MLP's and CNN's ReLUs, not a value read twice."""
    torch.manual_seed(0)
    net = _FusionNet().double()
    graph, source = _program(net, (1, 8, 8))
    fused = {v: a.op for v, a in fused_activations(graph).items()}
    assert sorted(fused.values()) == ["relu", "sigmoid", "sigmoid", "tanh", "tanh"], fused
    assert source.count(", fused") == 3 * 5  # forward, backward, backward_input
    x, y = torch.randn(6, 1, 8, 8, dtype=F64), (torch.arange(6) % 2).to(F64)
    out, d_params = _one_step(_build(tmp_path, source), net, x, y)
    want_out, want_grads = _torch_grads(net, x, y)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d_params, want_grads, rtol=1e-10, atol=1e-12)
    dm = compile_device(net, x, device="cpu")
    xg = x.clone().requires_grad_(True)
    torch.testing.assert_close(dm.input_grad(x), torch.autograd.grad(net(xg).sum(), xg)[0],
                               rtol=1e-10, atol=1e-12)  # fmt: skip
    # the ResNet's ReLUs after its residual additions, after its two max-pools (optimize.py
    # moves a ReLU behind a pool) and after the first convolution of each of its three blocks
    # (optimize.py drops the Identity that stands for BatchNorm there)
    for make, shape, n in ((gw_mlp, (96,), 2), (gw_cnn, (1, 512), 4), (gw_resnet, (1, 256), 7)):
        g = graph_from_export(make(shape[-1]), torch.zeros(2, *shape), "float32")
        assert sorted(a.op for a in fused_activations(g).values()) == ["relu"] * n
    producers = {n.output: n.op for n in g.nodes}
    assert sorted(producers[v] for v in fused_activations(g)) == (
        ["add"] * 2 + ["conv1d"] * 3 + ["maxpool1d"] * 2
    )


def _step_like_torch(lib, net, B, act, d_act):
    """One loss_and_grad of a program of ``net`` (input (B, 1, 512)) on data seeded by B, in the
    given act and d_act: its output and parameter gradient against torch."""
    gen = torch.Generator().manual_seed(B)
    x = torch.randn(B, 1, 512, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (B,), generator=gen).to(F64)
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).contiguous()
    d_params, loss = torch.zeros_like(params), torch.zeros(1, dtype=F64)
    act[: x.numel()] = x.reshape(-1)
    lib.net_loss_and_grad(None, _p(params), None, _p(act), _p(y), None, _p(loss), _p(d_params),
                          _p(d_act), B, 1, ctypes.c_ulonglong(1))  # fmt: skip
    net.zero_grad()
    out, grads = _torch_grads(net, x, y)
    at = lib.net_output_offset(B)
    torch.testing.assert_close(act[at : at + B], out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d_params, grads, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk", [None, 2])
def test_gw_cnn_convolutions_choose_products_by_batch(tmp_path, chunk):
    """The GW CNN (512 long): its second and third convolutions (128 and 256 taps; the first
    has 16, too few for im2col) share a workspace, act's last region. At 41 samples the second
    (41 x 117 output positions) runs as products and writes it, the third (41 x 22) directly;
    at 5 both run directly and there is none. The workspace holds one chunk of samples: all
    41, or (a build with chunks of 2 samples) 2, so 21 chunks, the last one short. All match
    torch, with act starting as NaN: nothing is read before it is written."""
    torch.manual_seed(0)
    net = gw_cnn(512).double()
    _, source = _program(net, (1, 512))
    assert source.count(", work);") == 3 * 2  # forward, backward, backward_input
    per_sample = int(re.search(r"ACT_PER_SAMPLE = (\d+), SCRATCH = 0;", source)[1])
    defines = (f"-DROOTCLAD_CONV_GEMM_MAX_COLUMNS={chunk * 117}",) if chunk else ()
    lib = _build(tmp_path, source, defines=defines)  # the kernels built with it too
    for fn in (lib.net_act_size, lib.net_d_act_size, lib.net_output_offset, lib.net_workspace_size):
        fn.restype = ctypes.c_long
    for B, as_products in ((41, True), (5, False)):
        workspace = (16 * 8 + 32) * 117 * min(B, chunk or B) if as_products else 0
        assert lib.net_workspace_size(B) == workspace  # the columns, then the output by channel
        act = torch.full((lib.net_act_size(B) + 1,), float("nan"), dtype=F64)
        act[-1] = 7.0  # one value past the end
        d_act = torch.zeros(lib.net_d_act_size(B) + 1, dtype=F64)
        d_act[-1] = 7.0
        _step_like_torch(lib, net, B, act, d_act)
        values = B * per_sample  # no per-sample or shared scratch: act holds the values
        assert act[:values].isnan().sum() == 0  # then padding to 32 values, then the workspace
        work = act[-1 - workspace : -1]
        assert lib.net_act_size(B) == (values + 31) // 32 * 32 + workspace
        assert d_act[-1] == 7.0 and act[-1] == 7.0  # nothing written past either
        assert not work.isnan().any()  # all of it used (by the first chunk, if not the last)


def test_gw_resnet_fused_convolutions_as_products_in_chunks(tmp_path):
    """The GW ResNet (256 long, no BatchNorm): each block's first convolution carries the ReLU
    after it (the Identity between them dropped). At 140 samples its first two blocks (140 x 30
    output positions) run as products, here in chunks of 3 samples (47, the last one short),
    so the backward reads the output adjoint through the fused ReLU chunk by chunk. The output
    and every parameter's gradient match torch."""
    torch.manual_seed(0)
    net = gw_resnet(256).double()
    _, source = _program(net, (1, 256))
    forward = source[source.index("void forward(") : source.index("void backward(")]
    assert forward.count("Relu{}, work);") == 3  # the third block's runs directly at 140
    lib = _build(tmp_path, source, defines=(f"-DROOTCLAD_CONV_GEMM_MAX_COLUMNS={3 * 30}",))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(140, 1, 256, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (140,), generator=gen).to(F64)
    out, d_params = _one_step(lib, net, x, y)
    want_out, want_grads = _torch_grads(net, x, y)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d_params, want_grads, rtol=1e-10, atol=1e-12)


# what the GPU build plans d_act from (device_kernels.h; the host loops plan at any size)
GPU_PLAN = "-DROOTCLAD_D_ACT_PLAN_MIN_VALUES=ROOTCLAD_GPU_D_ACT_PLAN_MIN_VALUES"


def _launches_per_step(tmp_path, source, shape, B=4, plan=GPU_PLAN):
    """Kernel launches of one loss_and_grad + optimizer step, counted on the host (the launches
    a GPU would make: {name}_launches, d_act planned as on the GPU)."""
    lib = _build(tmp_path, source, plan)
    lib.net_act_size.restype = lib.net_launches.restype = ctypes.c_long
    n = lib.net_n_params()
    params, d_params, state = torch.zeros(n), torch.zeros(n), torch.zeros(2 * n)
    act, d_act = torch.zeros(lib.net_act_size(B)), torch.zeros(lib.net_act_size(B))
    y, loss = torch.zeros(B), torch.zeros(1)
    adam = (ctypes.c_double * 9)(1, 1e-3, 0, 0, 0, 0, 0.9, 0.999, 1e-8)
    before = lib.net_launches()
    lib.net_loss_and_grad(None, _p(params), None, _p(act), _p(y), None, _p(loss), _p(d_params),
                          _p(d_act), B, 1, ctypes.c_ulonglong(1))  # fmt: skip
    lib.net_optim_step(None, _p(params), _p(d_params), _p(state), adam, ctypes.c_long(1),
                       ctypes.c_long(0), ctypes.c_long(n))  # fmt: skip
    return lib.net_launches() - before


@pytest.mark.parametrize("model", ["gw-mlp", "gw-cnn", "gw-resnet"])
def test_fusion_saves_two_launches_per_activation(model, tmp_path):
    """Each fused activation saves its forward and its backward launch in a training step
    (at a batch below GEMM_MIN_ROWS: the products as loops, which read the adjoint through
    the activation)."""
    make, shape = MODELS[model]
    graph = graph_from_export(make(), torch.zeros(2, *shape), "float32")
    fused = _launches_per_step(tmp_path, emit_device(graph, "net"), shape)
    plain = _launches_per_step(tmp_path, emit_device(graph, "net", fuse=False), shape)
    assert plain - fused == 2 * len(fused_activations(graph)) > 0
    print(f"{model}: {plain} -> {fused} launches per training step")


def test_a_view_of_the_input_gets_no_adjoint_in_training():
    """Flatten -> Linear: the training backward forms no input adjoint (the flattened input is
    the input); input_grad's backward does."""
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 1)).double()
    _, source = _program(net, (2, 3))
    train = source[source.index("void backward(") : source.index("void backward_input(")]
    dx = source[source.index("void backward_input(") : source.index("void loss_and_grad(")]
    assert "linear_backward(on, (T*)nullptr," in train
    assert "linear_backward(on, (T*)nullptr," not in dx
