"""Whole models: loss and every parameter gradient against torch autograd, the autograd
Function inside ordinary torch code, and the parameter arena (state_dict, views, torch.optim).
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from fixtures.core import (
    RTOL,
    assert_close_rel,
    assert_grads_close,
    check_against_torch,
    max_rel_err,
    mixed_batch,
    mixed_model,
    rounded_reference,
    torch_loss,
    torch_loss_and_grad,
)
from torch import nn

import rootclad

F64, F32 = torch.float64, torch.float32


def _compare_loss_and_grad(net, x, y, loss, dtype):
    net_c = copy.deepcopy(net).to(dtype)
    cm = rootclad.compile(net_c, example_input=x.to(dtype), loss=loss, engine="pullback")
    value, grads = cm.loss_and_grad(x.to(dtype), y)
    ref = rounded_reference(net, dtype)
    ref_value, ref_grads = torch_loss_and_grad(ref, x.to(dtype).to(F64), y, loss)
    assert_close_rel(value, ref_value, RTOL[dtype], "loss")
    assert_grads_close(grads, ref_grads, RTOL[dtype], type(net).__name__)
    return cm


def _mlp():
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)
    ).double()


def _gw_cnn(L):
    net = nn.Sequential(
        nn.Conv1d(1, 16, 16), nn.ReLU(), nn.MaxPool1d(4), nn.Flatten(), nn.LazyLinear(1)
    ).double()
    net(torch.zeros(1, 1, L, dtype=F64))  # materialise LazyLinear
    return net


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
def test_mlp_loss_and_gradients_match_torch(dtype):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (32, 1), generator=gen).to(F64)
    _compare_loss_and_grad(_mlp(), x, y, "bce_with_logits", dtype)


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
def test_gw_cnn_on_2048_samples_matches_torch(dtype):
    """The GW classifier: Conv1d(1,16,16) -> ReLU -> MaxPool1d(4) -> Flatten -> LazyLinear(1)."""
    torch.manual_seed(0)
    L = 2048
    net = _gw_cnn(L)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1, L, generator=gen, dtype=F64)
    y = torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.0], [0.0]], dtype=F64)
    cm = _compare_loss_and_grad(net, x, y, "bce_with_logits", dtype)
    assert cm.output_shape == (1,)
    assert dict(cm.named_parameters())["4.weight"].shape == (1, 16 * ((L - 15) // 4))
    check_against_torch(net, x[:3], dtype)  # the VJP path of the same model


def test_gw_cnn_head_runs_in_micro_batches_with_a_remainder():
    """The ops before the first Linear run MICRO samples at a time (codegen/cpu.py): a
    batch of 2 * MICRO + 1 samples takes three passes, the last of one sample."""
    torch.manual_seed(0)
    net = _gw_cnn(2048)
    probe = rootclad.compile(net, torch.randn(1, 1, 2048, dtype=F64), engine="pullback")
    micro = int(re.search(r"constexpr int MICRO = (\d+);", probe._em.source).group(1))
    assert 1 < micro < 8  # ~800 KB of activations and gradients per sample in float64
    B = 2 * micro + 1
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(B, 1, 2048, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (B, 1), generator=gen).to(F64)
    _compare_loss_and_grad(net, x, y, "bce_with_logits", F64)
    check_against_torch(net, x, F64)  # the VJP, with the input's gradient


def test_wide_mlp_in_one_chunk_shares_its_gemms_between_threads():
    """Batch 16 of this MLP runs in one chunk, and its large products are split by rows or
    columns over rootclad's threads (blas.h): loss, gradients and the VJP match torch."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 1024), nn.Tanh(), nn.Linear(1024, 1)
    ).double()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(16, 1024, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (16, 1), generator=gen).to(F64)
    for dtype in (F64, F32):
        _compare_loss_and_grad(net, x, y, "bce_with_logits", dtype)
    check_against_torch(net, x, F64)


def test_gw_cnn_lazy_model_compiles_without_a_forward_pass_first():
    """compile() materialises LazyLinear from the example input itself."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv1d(1, 16, 16), nn.ReLU(), nn.MaxPool1d(4), nn.Flatten(), nn.LazyLinear(1)
    ).double()
    x = torch.randn(3, 1, 2048, dtype=F64)
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    assert isinstance(net[4], nn.Linear)  # materialised by compile()
    assert_close_rel(cm(x).detach(), net(x).detach(), 1e-10)


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
def test_mixed_model_of_every_op_matches_torch(dtype):
    torch.manual_seed(0)
    net = mixed_model().eval()  # eval: dropout is the identity in torch and here
    x, y = mixed_batch()
    cm = _compare_loss_and_grad(net, x, y, "cross_entropy", dtype)
    assert not cm.training
    check_against_torch(net, x, dtype, loss="cross_entropy")


class _Custom(nn.Module):
    """Not a Sequential: functional calls and methods between modules."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 5, padding=2)
        self.pool = nn.MaxPool1d(2)
        self.fc1 = nn.Linear(4 * 8, 10)
        self.fc2 = nn.Linear(10, 2)

    def forward(self, x):
        x = F.relu(self.conv(x))
        x = torch.relu(self.pool(x))
        x = torch.flatten(x, 1)
        x = torch.tanh(self.fc1(x))
        x = F.leaky_relu(x, 0.05)
        x = F.gelu(x, approximate="tanh")
        x = x.sigmoid().relu()
        return self.fc2(x).flatten(1)


def test_a_custom_module_matches_torch():
    torch.manual_seed(0)
    net = _Custom().double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 1, 16, generator=gen, dtype=F64)
    y = torch.randn(5, 2, generator=gen, dtype=F64)
    cm = _compare_loss_and_grad(net, x, y, "mse", F64)
    assert [n for n, _ in cm.named_parameters()] == [n for n, _ in net.named_parameters()]
    ops = [node.op for node in cm.graph.nodes]
    # conv1d -> relu -> maxpool1d is compiled as conv1d -> maxpool1d -> relu (ir/optimize.py)
    assert ops == [
        "conv1d", "maxpool1d", "relu", "relu", "reshape", "linear", "tanh", "leaky_relu",
        "gelu", "sigmoid", "relu", "linear", "identity",
    ]  # fmt: skip
    check_against_torch(net, x, F64)


class _Identities(nn.Module):
    """nn.Identity and .contiguous() inside the graph, and an nn.Identity giving its output."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 5), nn.Linear(5, 2)
        self.mid, self.last = nn.Identity(), nn.Identity()

    def forward(self, x):
        h = torch.relu(self.mid(self.fc1(x)))
        return self.last(self.fc2(h.contiguous() + h))


def test_identities_inside_the_graph_are_dropped():
    """The Identities and .contiguous() inside the graph and at its end leave no node (their
    readers read the input); values and gradients stay torch's."""
    torch.manual_seed(0)
    net = _Identities().double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, generator=gen, dtype=F64)
    y = torch.randn(5, 2, generator=gen, dtype=F64)
    cm = _compare_loss_and_grad(net, x, y, "mse", F64)
    nodes = cm.graph.nodes
    assert [node.op for node in nodes] == ["linear", "relu", "add", "linear"]
    assert nodes[1].inputs == [nodes[0].output]
    assert nodes[2].inputs == [nodes[1].output] * 2
    assert cm.graph.output == nodes[-1].output
    check_against_torch(net, x, F64)


def test_a_bare_layer_is_a_model():
    """``rootclad.compile(nn.Linear(...))``: the root module itself is the one layer."""
    torch.manual_seed(0)
    x = torch.randn(4, 5, dtype=F64)
    cm = check_against_torch(nn.Linear(5, 2).double(), x)
    assert [n for n, _ in cm.named_parameters()] == ["weight", "bias"]
    check_against_torch(nn.Tanh(), x)


def test_several_forward_calls_then_one_backward():
    """Each call keeps its own activations: (cm(a) + 2 cm(b)).sum() backpropagates both."""
    torch.manual_seed(0)
    net = mixed_model().eval()
    cm = rootclad.compile(net, mixed_batch()[0], loss="cross_entropy", engine="pullback").eval()
    a, _ = mixed_batch(3, seed=1)
    b, _ = mixed_batch(2, seed=2)
    a_c, b_c = a.clone().requires_grad_(), b.clone().requires_grad_()
    w = torch.randn(3, dtype=F64)
    (cm(a_c) @ w).sum().backward()  # a first backward
    (cm(a_c).sum() + 2 * (cm(b_c) * cm(b_c)).sum()).backward()  # accumulates into .grad
    a_r, b_r = a.clone().requires_grad_(), b.clone().requires_grad_()
    (net(a_r) @ w).sum().backward()
    (net(a_r).sum() + 2 * (net(b_r) * net(b_r)).sum()).backward()
    assert_close_rel(a_c.grad, a_r.grad, 1e-10, "d_a")
    assert_close_rel(b_c.grad, b_r.grad, 1e-10, "d_b")
    for (name, p), q in zip(cm.named_parameters(), net.parameters(), strict=True):
        assert_close_rel(p.grad, q.grad, 1e-10, f"{name}.grad")


def test_non_contiguous_upstream_gradient():
    torch.manual_seed(0)
    net = _mlp()
    x = torch.randn(4, 8, dtype=F64)
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    w = torch.randn(1, 1, dtype=F64).expand(4, 1)  # stride-0 upstream gradient
    x_c, x_r = x.clone().requires_grad_(), x.clone().requires_grad_()
    (dx,) = torch.autograd.grad(cm(x_c), x_c, w)
    (dx_ref,) = torch.autograd.grad(net(x_r), x_r, w)
    assert_close_rel(dx, dx_ref, 1e-10)


# -- the parameter arena -----------------------------------------------------------------
def test_state_dict_round_trips_both_ways():
    torch.manual_seed(0)
    net = mixed_model().eval()
    x, _ = mixed_batch()
    cm = rootclad.compile(net, example_input=x, loss="cross_entropy", engine="pullback").eval()
    other = mixed_model().eval()  # different random weights
    cm.load_state_dict(other.state_dict())
    assert_close_rel(cm.predict(x), other(x).detach(), 1e-10, "after cm.load_state_dict")
    with torch.no_grad():
        for p in cm.parameters():
            p.mul_(0.5)
    net.load_state_dict(cm.state_dict())
    for (k, v), (k2, v2) in zip(net.state_dict().items(), other.state_dict().items(), strict=True):
        assert k == k2
        assert torch.equal(v, 0.5 * v2)
    assert_close_rel(net(x).detach(), cm.predict(x), 1e-10, "after net.load_state_dict")
    # float32 values go in converted to the compiled dtype
    cm.load_state_dict({k: v.float() for k, v in other.state_dict().items()})
    assert_close_rel(cm.predict(x), rounded_reference(other, F32)(x).detach(), 1e-10)


def test_named_parameters_are_views_into_the_arena():
    torch.manual_seed(0)
    net = _mlp()
    x = torch.randn(4, 8, dtype=F64)
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    views = dict(cm.named_parameters())
    assert list(views) == [n for n, _ in net.named_parameters()]
    before = cm.predict(x)
    with torch.no_grad():
        views["2.weight"][3, 5] += 0.25
        views["4.bias"].fill_(-1.0)
        net[2].weight[3, 5] += 0.25
        net[4].bias.fill_(-1.0)
    after = cm.predict(x)
    assert not torch.allclose(after, before)
    assert_close_rel(after, net(x).detach(), 1e-10)
    # and the other way: what C++ writes (train_step) shows in the views at once
    w_before = views["0.weight"].detach().clone()
    cm.train_step(x, torch.ones(4, 1, dtype=F64), rootclad.optim.SGD(cm, lr=0.1))
    assert not torch.equal(views["0.weight"], w_before)
    assert torch.equal(cm.state_dict()["0.weight"], views["0.weight"])


@pytest.mark.parametrize("make_opt", ["sgd", "adam"])
def test_torch_optimizers_train_the_compiled_parameters(make_opt):
    torch.manual_seed(0)
    net = _mlp()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 8, generator=gen, dtype=F64)
    y = torch.randint(0, 2, (16, 1), generator=gen).to(F64)
    cm = rootclad.compile(net, example_input=x, engine="pullback")

    def opt_for(params):
        if make_opt == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9)
        return torch.optim.Adam(params, lr=1e-2)

    opt_c, opt_r = opt_for(cm.parameters()), opt_for(net.parameters())
    for _ in range(20):
        for model, opt in ((cm, opt_c), (net, opt_r)):
            opt.zero_grad()
            torch_loss("bce_with_logits", model(x), y).backward()
            opt.step()
    for (name, p), q in zip(cm.named_parameters(), net.parameters(), strict=True):
        assert_close_rel(p, q, 1e-9, name)
    assert not torch.equal(dict(cm.named_parameters())["0.weight"], _mlp_initial_weight())


def _mlp_initial_weight():
    torch.manual_seed(0)
    return _mlp()[0].weight.detach()


def test_predict_output_is_not_part_of_an_autograd_graph():
    """predict() bypasses autograd; its output must not carry a (wrong, zero) gradient path."""
    torch.manual_seed(0)
    net = _mlp()
    x = torch.randn(4, 8, dtype=F64, requires_grad=True)
    cm = rootclad.compile(net, example_input=x.detach(), engine="pullback")
    out = cm.predict(x)
    assert not out.requires_grad
    assert_close_rel(out, net(x).detach(), 1e-10)
    # and the fused loss path returns a plain value too
    value, _ = cm.loss_and_grad(x, torch.ones(4, 1, dtype=F64))
    assert not value.requires_grad
    assert not cm.predict(x.detach()).requires_grad


def test_double_backward_fails_loudly_instead_of_dropping_terms():
    """A gradient penalty needs d(dx)/dparams; the C++ VJP cannot give it, so it must raise
    rather than silently leave this model's second-order terms out."""
    torch.manual_seed(0)
    net = _mlp()
    x = torch.randn(4, 8, dtype=F64, requires_grad=True)
    cm = rootclad.compile(net, example_input=x.detach(), engine="pullback")
    out = cm(x)
    with pytest.raises(RuntimeError, match="first-order"):
        torch.autograd.grad(out.sum(), x, create_graph=True)
    (dx,) = torch.autograd.grad(cm(x).sum(), x)  # first order is fine
    (dx_ref,) = torch.autograd.grad(net(x).sum(), x)
    assert_close_rel(dx, dx_ref, 1e-10)


def test_frozen_parameters_get_no_gradient():
    torch.manual_seed(0)
    net = _mlp()
    x = torch.randn(4, 8, dtype=F64)
    cm = rootclad.compile(net, example_input=x, engine="pullback")
    for model in (cm, net):
        for name, p in model.named_parameters():
            p.requires_grad_(not name.startswith("0."))
        torch_loss("mse", model(x), torch.zeros(4, 1, dtype=F64)).backward()
    for (name, p), q in zip(cm.named_parameters(), net.parameters(), strict=True):
        if name.startswith("0."):
            assert p.grad is None and q.grad is None
        else:
            assert_close_rel(p.grad, q.grad, 1e-10, name)


def test_a_layer_used_twice_shares_its_parameters():
    """Sequential(l, Tanh, l): one set of parameters, both uses' gradients summed."""
    torch.manual_seed(0)
    shared = nn.Linear(4, 4)
    net = nn.Sequential(shared, nn.Tanh(), shared).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, generator=gen, dtype=F64)
    y = torch.randn(5, 4, generator=gen, dtype=F64)
    cm = _compare_loss_and_grad(net, x, y, "mse", F64)
    assert [n for n, _ in cm.named_parameters()] == ["0.weight", "0.bias"]
    check_against_torch(net, x)
    # the module's state_dict names the layer twice ("0." and "2."); either name loads it
    state = net.state_dict()
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    cm.load_state_dict({k: torch.zeros_like(v) for k, v in state.items()})
    assert all(float(p.abs().max()) == 0 for p in cm.state_dict().values())
    cm.load_state_dict({"2.weight": state["2.weight"], "2.bias": state["2.bias"]})
    assert_close_rel(cm.state_dict()["0.weight"], shared.weight.detach(), 0.0)
    cm.load_state_dict(state)
    with pytest.raises(KeyError, match=r"unexpected keys \['3.weight'\]"):
        cm.load_state_dict({**state, "3.weight": state["0.weight"]})


def test_maxpool_ties_send_the_gradient_where_torch_does():
    """Equal values in a window (e.g. quantised inputs): the first maximum gets the gradient."""
    net = nn.Sequential(nn.MaxPool1d(3, stride=2, padding=1)).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (3, 2, 11), generator=gen).to(F64)
    check_against_torch(net, x)


def test_dtype_argument_overrides_the_example_dtype():
    torch.manual_seed(0)
    net = _mlp().float()
    x = torch.randn(4, 8)
    cm = rootclad.compile(net, example_input=x, engine="pullback", dtype=F64)
    assert cm.dtype == F64 and dict(cm.named_parameters())["0.weight"].dtype == F64
    with pytest.raises(TypeError, match="float64"):
        cm(x)
    assert_close_rel(cm.predict(x.double()), net.double()(x.double()).detach(), 1e-10)


def test_large_uneven_batches_match_torch():
    """37 samples: big enough to be split into per-thread chunks, uneven for any count."""
    torch.manual_seed(0)
    net = mixed_model().eval()
    x, y = mixed_batch(37, seed=5)
    _compare_loss_and_grad(net, x, y, "cross_entropy", F64)
    check_against_torch(net, x, loss="cross_entropy")


_THREADS_CHILD = """
import sys
import torch
sys.path.insert(0, sys.argv[2])
from fixtures.core import mixed_batch, mixed_model
import rootclad

torch.manual_seed(0)
x, y = mixed_batch(37, seed=6)
cm = rootclad.compile(mixed_model(), x, loss="cross_entropy", engine="pullback", seed=11)
res = {}
res["loss"], res["grads"] = cm.loss_and_grad(x, y)
xg = x.clone().requires_grad_()
out = cm(xg)
res["out"] = out.detach()
res["dx"] = torch.autograd.grad(out, xg, torch.ones_like(out))[0]
opt = rootclad.optim.Adam(cm, lr=1e-2)
res["losses"] = torch.tensor([cm.train_step(x, y, opt) for _ in range(5)], dtype=torch.float64)
res["params"] = dict(cm.state_dict())
res["out_eval"] = cm.eval().predict(x)
torch.save(res, sys.argv[1])
"""


@pytest.mark.slow
def test_results_do_not_depend_on_the_thread_count(tmp_path):
    """ROOTCLAD_NUM_THREADS=1 and =3 (training mode, dropout on): the same masks, losses,
    gradients and training run, up to the order of the per-chunk gradient sums."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]  # tests/, where fixtures/ is
    torch.manual_seed(0)
    x, _ = mixed_batch(37, seed=6)
    rootclad.compile(mixed_model(), x, loss="cross_entropy", engine="pullback")  # warm cache
    procs = {}
    for n in (1, 3):
        env = {**os.environ, "ROOTCLAD_NUM_THREADS": str(n), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-c", _THREADS_CHILD, str(tmp_path / f"{n}.pt"), str(here)]
        procs[n] = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    errors = {n: p.communicate(timeout=300)[1] for n, p in procs.items()}
    for n, p in procs.items():
        assert p.returncode == 0, errors[n]
    one, three = (torch.load(tmp_path / f"{n}.pt") for n in (1, 3))
    assert max_rel_err(one["out"], one["out_eval"]) > 1e-3  # dropout was on
    for key in ("loss", "out", "dx", "losses", "out_eval"):  # equal outputs: equal masks
        assert_close_rel(three[key], one[key], 1e-12, key)
    assert_grads_close(three["grads"], one["grads"], 1e-12, "grads")
    assert_grads_close(three["params"], one["params"], 1e-12, "params")
