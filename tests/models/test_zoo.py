"""The model zoo: third-party classifiers (torchvision, timm) compile and compute what torch
computes. Random weights (perturbed: fresh BatchNorm/LayerNorm and zero-initialised heads
would hide mistakes), float64, inputs (B, 3, 32, 32).

Each model: the output, the input's gradient and every parameter's gradient against torch
autograd (each parameter's against the largest of all gradients, 1e-9), and through ONNX. 20
Adam steps in train mode (BatchNorm on the batch's statistics, stochastic depth, dropout)
against torch.optim: one model for each way a model computes otherwise in training (the
others' layers are the same ops; each compile in train mode is a second capture and build,
half a minute for densenet121). The architectures still refused are in docs/models.md."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_close_rel, check_against_torch, perturbed, torch_loss
from fixtures.zoo import RTOL, SLOW, TRAIN_RTOL, ZOO, vision
from torch import nn

import rootclad
from rootclad.ir.graph import IRError

F64 = torch.float64
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ZOO]
# trained: BatchNorm (resnet18; timm's with ceil-mode average pools), stochastic depth and
# squeeze-and-excitation (efficientnet_b0), shifted windows with stochastic depth
# (swin-small), attention with dropout (vit-small, timm's vit), dropout without BatchNorm
# (squeezenet1_1)
TRAINED = [
    "resnet18",
    "timm-resnet10t",
    "efficientnet_b0",
    "swin-small",
    "vit-small",
    "timm-vit_tiny",
    "squeezenet1_1",
]


def _build(name, perturb=True):
    tv, timm = vision()
    torch.manual_seed(0)
    net = ZOO[name](tv, timm).double()
    for m in net.modules():  # torch's dropout masks are not rootclad's: compare without
        if isinstance(m, nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return perturbed(net) if perturb else net


@pytest.mark.parametrize("engine", ["pullback", pytest.param("clad", marks=pytest.mark.clad)])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_forward_and_gradients_match_torch(name, engine, request):
    if engine == "clad":
        request.getfixturevalue("clad")  # skips, saying why, without Clad
    net = _build(name).eval()
    x = torch.randn(2, 3, 32, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
    cm = check_against_torch(net, x, F64, engine=engine, rtol=RTOL.get(name, 1e-9),
                             loss="cross_entropy", against_all=True)  # fmt: skip
    assert cm.engine == engine


@pytest.mark.parametrize("name", TRAINED)
def test_zoo_model_training_tracks_torch_optim(name):
    """torch's own initialisation and a small learning rate: these deep BatchNorm networks
    are chaotic under Adam at 1e-3 (regnet_y_400mf in torch against itself, its weights
    changed by 1e-15, parts by 0.2 in the loss after 20 steps; at 1e-5 by 4e-12:
    benchmarks/models/check_adam_chaos.py).
    Parameters are compared against how far the parameters moved: some get a gradient that
    is zero in exact arithmetic (a BatchNorm bias feeding another BatchNorm), and Adam turns
    its rounding noise into moves of 1e-11 that are not errors."""
    net = _build(name, perturb=False).train()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(24, 3, 32, 32, dtype=F64, generator=gen)
    y = torch.randint(0, 3, (24,), generator=gen)
    cm = rootclad.compile(net, x[:2], loss="cross_entropy", engine="pullback")
    ref = copy.deepcopy(net)
    opt = rootclad.optim.Adam(cm, lr=1e-5)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-5)
    losses, ref_losses = [], []
    for step in range(20):
        idx = torch.arange(step % 3 * 8, step % 3 * 8 + 8)
        losses.append(cm.train_step(x[idx], y[idx], opt))
        opt_ref.zero_grad()
        value = torch_loss("cross_entropy", ref(x[idx]), y[idx])
        value.backward()
        opt_ref.step()
        ref_losses.append(value.item())
    rtol = RTOL.get(name, 1e-9) * 1e3
    assert_close_rel(torch.tensor(losses), torch.tensor(ref_losses), rtol, f"{name} losses")
    rtol = TRAIN_RTOL.get(name, rtol)
    start = {k: v.detach() for k, v in net.named_parameters()}
    moved = max(float((q.detach() - start[k]).abs().max()) for k, q in ref.named_parameters())
    assert moved > 1e-4, f"{name}: the parameters did not move"
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        err = float((p.detach() - q.detach()).abs().max()) / moved
        assert err <= rtol, f"{name} {k}: off by {err:.3e} of the largest move > {rtol:.1e}"


# exported by torch's (TorchScript) exporter and imported; model -> the words of its refusal
NOT_IMPORTED: dict[str, str] = {}


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_through_onnx_matches_torch_and_onnxruntime(name):
    """The float64 file (perturbed weights) against torch autograd: output and input
    gradient; the float32 file (torch's initialisation, its zero-initialised heads drawn at
    random) against onnxruntime, which has no float64 convolutions. The perturbed models are
    too ill-conditioned for float32: torch's own float32 run parts visibly from its float64
    one (efficientnet_b0)."""
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import export, run_ort

    net = _build(name).eval()
    x = torch.randn(2, 3, 32, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
    model = export(copy.deepcopy(net), x, opset=18)
    if name in NOT_IMPORTED:
        with pytest.raises(IRError, match=NOT_IMPORTED[name]):
            rootclad.onnx.load(model, loss="mse", engine="pullback")
        return
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    xr = x.clone().requires_grad_(True)
    out = net(xr)
    rtol = RTOL.get(name, 1e-9)
    assert_close_rel(cm.predict(x), out, rtol, f"{name} float64 forward against torch")
    d_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (dx,) = torch.autograd.grad(out, [xr], d_out)
    assert_close_rel(cm.input_grad(x, d_out=d_out), dx, rtol, f"{name} d_x against torch")

    net = _build(name, perturb=False).float().eval()
    with torch.no_grad():
        for p in net.parameters():
            if not p.any():  # a zero-initialised head: every output would be 0
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))
    x = x.float()
    model = export(net, x, opset=18)
    want = torch.from_numpy(run_ort(model, x.numpy()))
    assert float(want.std()) > 0
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert_close_rel(cm.predict(x), want, 1e-4, f"{name} float32 forward against onnxruntime")
