"""nn.Embedding (issue 27): integer inputs of the model as its indices (aten/indexing.py). Against
torch autograd on the pullback and clad engines (Clad with and without pullbacks), float32
and the device kernels (host loops); padding_idx's row gets no gradient; 20 Adam steps track
torch.optim; indices out of an Embedding's range, of a float type, or computed are refused
naming the input or node."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, check_against_torch, perturbed
from fixtures.op_cases import Tokens, index_input
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.ir.graph import IRError

F64 = torch.float64


def _net():
    torch.manual_seed(0)
    return perturbed(Tokens().double())


def _check(cm, net, ids, x, dtype, rtol):
    ref = copy.deepcopy(net).to(dtype).double()
    xr = x.double().requires_grad_(True)
    out_ref = ref(ids, xr)
    d_out = torch.randn(out_ref.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    dx_ref, *dp_ref = torch.autograd.grad(out_ref, [xr, *ref.parameters()], d_out)
    xc = x.to(dtype).requires_grad_(True)
    out = cm(ids, xc)
    assert out.dtype == dtype
    dx, *dp = torch.autograd.grad(out, [xc, *cm.parameters()], d_out.to(dtype))
    assert_close_rel(out, out_ref, rtol, "forward")
    assert_close_rel(dx, dx_ref, rtol, "d_x")
    names = [n for n, _ in ref.named_parameters()]
    assert_grads_close(dict(zip(names, dp, strict=True)), dict(zip(names, dp_ref, strict=True)),
                       rtol, "parameters", against_all=True)  # fmt: skip
    assert float(dp[0][0].abs().max()) == 0  # the padding row
    assert float(dp[0][7].abs().max()) > 0


def test_embedding_matches_torch():
    net = _net()
    ids, x = index_input()
    cm = rootclad.compile(copy.deepcopy(net), (ids, x), loss="mse", engine="pullback")
    _check(cm, net, ids, x, F64, 1e-9)
    assert cm.input_grad(ids, x)[0] is None  # indices have no gradient


def test_embedding_in_float32_matches_torch():
    net = _net()
    ids, x = index_input(B=6, seed=2)
    cm = rootclad.compile(copy.deepcopy(net).float(), (ids, x.float()), loss="mse")
    _check(cm, net, ids, x.float(), torch.float32, 1e-4)


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", [True, False])
def test_embedding_on_the_clad_engine_matches_torch(clad, pullbacks):
    net = _net()
    ids, x = index_input()
    cm = rootclad.compile(copy.deepcopy(net), (ids, x), loss="mse", engine="clad",
                          pullbacks=pullbacks)  # fmt: skip
    assert cm.engine == "clad"
    _check(cm, net, ids, x, F64, 1e-9)


def test_embedding_training_tracks_torch_optim():
    torch.manual_seed(0)
    net = Tokens().double().train()
    ids, x = index_input(B=24, seed=3)
    y = torch.randn(24, 2, dtype=F64, generator=torch.Generator().manual_seed(6))
    cm = rootclad.compile(net, (ids, x), loss="mse", engine="pullback")
    ref = copy.deepcopy(net)
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(20):
        idx = torch.arange(step % 3 * 8, step % 3 * 8 + 8)
        loss = cm.train_step((ids[idx], x[idx]), y[idx], opt)
        opt_ref.zero_grad()
        value = F.mse_loss(ref(ids[idx], x[idx]), y[idx])
        value.backward()
        opt_ref.step()
        assert abs(loss - value.item()) <= 1e-9 * abs(value.item()), step
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        assert_close_rel(p, q, 1e-8, k)


def test_indices_outside_an_embedding_are_refused_naming_the_input():
    net = _net()
    ids, x = index_input()
    cm = rootclad.compile(copy.deepcopy(net), (ids, x), loss="mse", engine="pullback")
    ok = ids.clone()
    ok[:, 1] = 11  # the token embedding has 12 rows: 11 is in range past the first column
    cm(ok, x)
    for column, value, rows in ((0, 3, 3), (2, 12, 12), (3, -1, 12)):
        bad = ids.clone()
        bad[1, column] = value
        with pytest.raises(ValueError, match=rf"input 0\[1, {column}\] = {value}: .* {rows} rows"):
            cm(bad, x)
    with pytest.raises(TypeError, match="integer tensor"):
        cm(ids.double(), x)  # float indices (NaN among them) are refused by their type


class _Bad(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.how = how

    def forward(self, ids):
        if self.how == "arithmetic":
            return self.emb(ids + 1).sum(1)
        if self.how == "by-tensor":  # indices chosen by other indices
            return self.emb(ids[:, ids[0, :2]]).sum(1)
        return self.emb(torch.arange(4)).sum(0) + ids[:, :3] * 0.0


@pytest.mark.parametrize(
    "how, words",
    [
        ("arithmetic", r"aten.add.Tensor \(node 'add'.*\): computes with integer inputs"),
        ("constant", r"aten.mul.Tensor \(node 'mul'.*\): computes with integer inputs"),
    ],  # fmt: skip
)
def test_computed_indices_are_refused_naming_the_node(how, words):
    with pytest.raises(IRError, match=words):
        rootclad.compile(_Bad(how).double(), torch.randint(0, 4, (2, 4)), engine="pullback")


class _ConstantIndices(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)

    def forward(self, x):
        return self.emb(torch.arange(4)).sum(0) + x


def test_an_embedding_of_constant_indices_matches_torch():
    """Indices computed from no input (the fx front-end refused them): the rows they pick, and
    the embedding's gradient on those rows only."""
    torch.manual_seed(0)
    check_against_torch(_ConstantIndices().double(), torch.randn(2, 3, dtype=F64), loss="mse")


def test_embedding_options_without_a_kernel_are_refused():
    """max_norm renormalises the weight in place in forward, which the compiled model would not."""
    net = nn.Sequential(nn.Embedding(5, 3, max_norm=1.0), nn.Flatten())
    with pytest.raises(IRError, match=r"writes '0.weight' in forward \(parameter_mutation\)"):
        rootclad.compile(net, torch.randint(0, 5, (2, 4)), engine="pullback")


def test_a_bare_embedding_takes_indices_as_torch():
    torch.manual_seed(0)
    net = nn.Embedding(10, 3, padding_idx=2).double()
    ids = torch.randint(0, 10, (4, 5), generator=torch.Generator().manual_seed(1))
    cm = rootclad.compile(copy.deepcopy(net), ids, loss="mse", engine="pullback")
    assert cm.dtype == F64  # a model of indices only: its parameters' type
    assert_close_rel(cm(ids), net(ids), 0, "forward")
    d_out = torch.randn(4, 5, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    (dw,) = torch.autograd.grad(cm(ids), list(cm.parameters()), d_out)
    (dw_ref,) = torch.autograd.grad(net(ids), list(net.parameters()), d_out)
    assert_close_rel(dw, dw_ref, 1e-12, "d_weight")
    assert cm.input_grad(ids) is None or cm.input_grad(ids)[0] is None
    with pytest.raises(ValueError, match=r"input\[0, 0\] = 10"):
        cm(torch.full((4, 5), 10))
    with pytest.raises(TypeError, match="integer tensor"):
        cm(ids.double())


class _Flattened(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()  # a module named as a method
        self.emb = nn.Embedding(5, 3)

    def forward(self, ids):
        return self.emb(self.flatten(ids)).sum(1)


def test_a_module_named_as_a_method_on_indices_is_refused_naming_it():
    with pytest.raises(IRError, match=r"module 'flatten' \(Flatten\)\): computes with integer"):
        rootclad.compile(_Flattened().double(), torch.randint(0, 5, (2, 2, 2)), engine="pullback")
