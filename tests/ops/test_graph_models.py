"""Models that are graphs, not chains: two inputs, concatenation, residual additions, fan-out.

Each model's loss, parameter gradients and input gradients are compared with torch autograd
(float64 to 1e-10, float32 to 1e-4); gradcheck compares the compiled VJP with numerical
differences of the compiled forward; 200 training steps with Adam track torch.optim to
1e-8 in float64 (small batches take train_step's fused path); the Clad engine equals the
pullback engine (skipped without Clad, saying why).
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import (
    assert_close_rel,
    assert_grads_close,
    max_rel_err,
    torch_loss,
)
from fixtures.graph_models import MODELS, param_data, randn

import rootclad
from rootclad.gw.models import gw_resnet

F64, F32 = torch.float64, torch.float32
RTOL = {F64: 1e-10, F32: 1e-4}


def _build(name, dtype=F64, engine="pullback", **kw):
    build, data, loss = MODELS[name]
    torch.manual_seed(0)
    net = build().double()
    xs, _ = data(4)
    cm = rootclad.compile(
        copy.deepcopy(net).to(dtype),
        example_input=tuple(x.to(dtype) for x in xs),
        loss=loss,
        engine=engine,
        **kw,
    )
    return net, cm


def _rounded(net, dtype):
    return copy.deepcopy(net).to(dtype).to(F64)


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(MODELS))
def test_graph_model_loss_and_gradients_match_torch(name, dtype):
    net, cm = _build(name, dtype)
    _, data, loss = MODELS[name]
    xs, y = data(9, seed=2)
    xs_c = tuple(x.to(dtype) for x in xs)
    ref = _rounded(net, dtype)
    # the loss and every parameter gradient
    value, grads = cm.loss_and_grad(xs_c, y.to(dtype) if y.is_floating_point() else y)
    xs_ref = tuple(x.to(F64).requires_grad_(True) for x in xs_c)
    ref_loss = torch_loss(loss, ref(*xs_ref), y)
    ref_grads = torch.autograd.grad(ref_loss, [*ref.parameters(), *xs_ref])
    names = [n for n, _ in ref.named_parameters()]
    assert_close_rel(value, ref_loss.detach(), RTOL[dtype], f"{name} loss")
    assert_grads_close(grads, dict(zip(names, ref_grads, strict=False)), RTOL[dtype], name)
    # the forward and the VJP of the autograd function, inputs included
    xs_cm = tuple(x.clone().requires_grad_(True) for x in xs_c)
    out = cm(*xs_cm)
    d_out = randn(*out.shape, seed=7)
    got = torch.autograd.grad(out, [*xs_cm, *cm.parameters()], d_out.to(dtype))
    xs_ref = tuple(x.to(F64).requires_grad_(True) for x in xs_c)
    out_ref = ref(*xs_ref)
    want = torch.autograd.grad(out_ref, [*xs_ref, *ref.parameters()], d_out)
    assert_close_rel(out, out_ref, RTOL[dtype], f"{name} forward")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close_rel(g, w, RTOL[dtype], f"{name} vjp #{i}")


def test_two_input_residual_model_passes_gradcheck():
    """Numerical Jacobians of the compiled forward w.r.t. both inputs and every parameter."""
    _, cm = _build("param-net")
    (x, theta), _ = param_data(3, seed=4)
    x.requires_grad_(True)
    theta.requires_grad_(True)

    def f(x, theta, *params):
        return cm(x, theta)

    assert torch.autograd.gradcheck(f, (x, theta, *cm.parameters()), eps=1e-6, atol=1e-7)


def test_input_grad_equals_autograd_for_each_input():
    """cm.input_grad: the compiled VJP with respect to the inputs, no autograd graph."""
    _, cm = _build("param-net")
    (x, theta), _ = param_data(4, seed=5)
    d_out = torch.randn(4, *cm.output_shape, dtype=F64)
    got = cm.input_grad(x, theta, d_out=d_out)
    xs = (x.clone().requires_grad_(True), theta.clone().requires_grad_(True))
    want = torch.autograd.grad(cm(*xs), xs, d_out)
    assert len(got) == 2
    for g, w in zip(got, want, strict=True):
        assert_close_rel(g, w, 1e-12, "input_grad")
    with pytest.raises(ValueError, match="d_out has shape"):
        cm.input_grad(x, theta, d_out=d_out[:2])


def _train(cm, net, data, loss, batch_sizes, steps=200, seed=11):
    """``steps`` Adam steps in rootclad and in torch.optim on the same batches."""
    cm.load_state_dict(net.state_dict())
    net = copy.deepcopy(net)
    opt = rootclad.optim.Adam(cm, lr=3e-3)
    opt_ref = torch.optim.Adam(net.parameters(), lr=3e-3)
    xs, y = data(64, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    losses, ref_losses = [], []
    for _ in range(steps):
        B = int(torch.randint(batch_sizes[0], batch_sizes[1] + 1, (1,), generator=gen))
        idx = torch.randperm(64, generator=gen)[:B]
        batch = tuple(x[idx] for x in xs)
        losses.append(cm.train_step(batch, y[idx], opt))
        opt_ref.zero_grad()
        value = torch_loss(loss, net(*batch), y[idx])
        value.backward()
        opt_ref.step()
        ref_losses.append(value.item())
    return torch.tensor(losses, dtype=F64), torch.tensor(ref_losses, dtype=F64), net


ENGINES = ["pullback", pytest.param("clad", marks=pytest.mark.clad)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("batches", [(1, 8), (9, 24)], ids=["fused", "whole"])
@pytest.mark.parametrize("name", list(MODELS))
def test_graph_model_training_tracks_torch_optim(name, batches, engine, request):
    if engine == "clad":
        request.getfixturevalue("clad")  # skips, saying why, without Clad
    net0, cm = _build(name, engine=engine)
    assert cm.engine == engine
    _, data, loss = MODELS[name]
    losses, ref_losses, net = _train(cm, net0, data, loss, batches)
    assert_close_rel(losses, ref_losses, 1e-8, f"{name} loss history")
    for (k, p), q in zip(cm.named_parameters(), net.parameters(), strict=True):
        assert_close_rel(p, q, 1e-8, f"{name} {k}")
        assert max_rel_err(p, net0.state_dict()[k]) > 1e-4, f"{name}: {k} did not move"
    ours = cm.state_dict()
    for k, b in net.named_buffers():  # BatchNorm's running statistics and batch count
        assert_close_rel(ours[k].to(F64), b.to(F64), 1e-8, f"{name} {k}")
    # and the trained model in eval mode (running statistics) gives torch's outputs
    xs, _ = data(5, seed=99)
    cm.eval()
    net.eval()
    assert_close_rel(cm.predict(*xs), net(*xs).detach(), 1e-8, f"{name} eval output")
    assert losses[-20:].mean() < losses[:20].mean()


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", [True, False], ids=["pullbacks", "no-pullbacks"])
@pytest.mark.parametrize("name", list(MODELS))
def test_clad_engine_equals_the_pullback_engine_on_graph_models(clad, name, pullbacks):
    if "batchnorm" in name and not pullbacks:
        with pytest.raises(rootclad.ir.IRError, match="BatchNorm needs pullbacks=True"):
            _build(name, engine="clad", pullbacks=False)
        return
    _, pb = _build(name)
    _, cl = _build(name, engine="clad", pullbacks=pullbacks)
    assert cl.engine == "clad"
    _, data, _ = MODELS[name]
    xs, y = data(7, seed=3)
    v1, g1 = pb.loss_and_grad(xs, y)
    v2, g2 = cl.loss_and_grad(xs, y)
    assert_close_rel(v2, v1, 1e-10, f"{name} loss")
    assert_grads_close(g2, g1, 1e-10, f"{name} clad vs pullback")
    xs1 = tuple(x.clone().requires_grad_(True) for x in xs)
    xs2 = tuple(x.clone().requires_grad_(True) for x in xs)
    out = pb(*xs1)
    w = randn(*out.shape, seed=8)  # not all ones: a softmax output sums to 1
    d1 = torch.autograd.grad(out, xs1, w)
    d2 = torch.autograd.grad(cl(*xs2), xs2, w)
    for a, b in zip(d2, d1, strict=True):
        assert_close_rel(a, b, 1e-10, f"{name} input gradient")


@pytest.mark.parametrize("engine", ENGINES)
def test_batchnorm_over_a_batch_split_between_threads_matches_torch(engine, request, monkeypatch):
    """At batch 64 the GW ResNet's batch is split into one chunk per thread (its activations
    outweigh its parameters); BatchNorm's statistics are then summed over the chunks
    (parallel.h: ChunkSync), so outputs, gradients and running statistics are the whole
    batch's, as in torch."""
    if engine == "clad":
        request.getfixturevalue("clad")
    # two threads where this process's pool (one per runtime library, made on first use) is
    # made here; CI's machines have two cores, so the batch is split there in any case
    monkeypatch.setenv("ROOTCLAD_NUM_THREADS", "2")
    torch.manual_seed(0)
    net = gw_resnet(n=256, channels=4, batch_norm=True).double()
    x = randn(64, 1, 256, seed=4)
    y = (x[:, 0, :128].sum(1) > 0).to(F64).unsqueeze(1)
    cm = rootclad.compile(copy.deepcopy(net), example_input=x, engine=engine)
    value, grads = cm.loss_and_grad(x, y)
    ref_value = torch_loss("bce_with_logits", net(x), y)
    ref_grads = torch.autograd.grad(ref_value, list(net.parameters()))
    names = [n for n, _ in net.named_parameters()]
    assert_close_rel(value, ref_value.detach(), 1e-10, "loss")
    assert_grads_close(grads, dict(zip(names, ref_grads, strict=True)), 1e-10, "batch 64")
    ours = cm.state_dict()
    for k, b in net.named_buffers():  # one update each, counted once
        assert_close_rel(ours[k].to(F64), b.to(F64), 1e-10, k)
