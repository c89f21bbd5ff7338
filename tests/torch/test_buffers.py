"""Buffers read directly (a sinusoidal position encoding registered with register_buffer,
``x + self.pe[:, :x.size(1)]``) and contiguous blocks of parameters (``self.pos[:, :L]``):
the same value for every sample, a buffer without gradient, a block's gradient into its rows
of the tensor; against torch autograd, on the device kernels, and for 10 Adam steps."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from fixtures.core import assert_close_rel, check_against_torch
from torch import nn

import rootclad
from rootclad.compiler import compile_device
from rootclad.ir.graph import IRError

F64 = torch.float64


class Encoded(nn.Module):
    def __init__(self, d=8, max_len=50, block=lambda t, n: t[:, :n]):
        super().__init__()
        pe = torch.zeros(max_len, d)
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe.unsqueeze(0))
        self.pos = nn.Parameter(torch.randn(1, max_len, d) * 0.1)
        self.lin = nn.Linear(d, 3)
        self.block = block

    def forward(self, x):  # (B, L, d)
        x = x + self.block(self.pe, x.size(1)) + self.block(self.pos, x.size(1))
        return self.lin(torch.tanh(x))


def _x(B=3, seed=1):
    return torch.randn(B, 7, 8, dtype=F64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_a_position_encoding_buffer_and_a_parameter_block_match_torch(dtype):
    torch.manual_seed(0)
    cm = check_against_torch(Encoded().double(), _x(), dtype, loss="mse")
    assert [n for n, _ in cm.named_buffers()] == ["pe"]
    assert "pe" in cm.state_dict() and "pe" not in dict(cm.named_parameters())


def test_on_the_device_kernels():
    torch.manual_seed(0)
    net = Encoded().double()
    x = _x()
    dm = compile_device(net, x, "cpu", loss="mse")
    assert_close_rel(dm.predict(x), net(x), 1e-12, "forward")
    y = torch.randn(3, 7, 3, dtype=F64)
    _, grads = dm.loss_and_grad(x, y)
    ref = nn.functional.mse_loss(net(x), y)
    want = dict(zip([n for n, _ in net.named_parameters()],
                    torch.autograd.grad(ref, list(net.parameters())), strict=True))  # fmt: skip
    assert_close_rel(grads["pos"], want["pos"], 1e-10, "the block's gradient")
    assert float(grads["pos"][:, 7:].abs().max()) == 0  # rows the block does not read


def test_training_moves_the_block_and_leaves_the_buffer():
    torch.manual_seed(0)
    net = Encoded().double()
    ref = copy.deepcopy(net)
    cm = rootclad.compile(net, _x(), loss="mse", engine="pullback")
    opt, opt_ref = rootclad.optim.Adam(cm, lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(10):
        x, y = _x(8, seed=step), torch.randn(8, 7, 3, dtype=F64)
        loss = cm.train_step(x, y, opt)
        opt_ref.zero_grad()
        value = nn.functional.mse_loss(ref(x), y)
        value.backward()
        opt_ref.step()
        assert abs(loss - value.item()) <= 1e-10 * value.item()
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        assert_close_rel(p, q, 1e-9, k)
    assert torch.equal(dict(cm.named_buffers())["pe"], ref.pe.squeeze(0).view_as(
        dict(cm.named_buffers())["pe"]))  # fmt: skip


class _Strided(nn.Module):
    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 50, 8))

    def forward(self, x):
        return x + self.pos[:, 1:50:7]


@pytest.mark.parametrize(
    "build",
    [
        lambda: Encoded(block=lambda t, n: t[:, ::2][:, :n]),
        lambda: Encoded(block=lambda t, n: t[:, :n, :4].repeat(1, 1, 2)),
        _Strided,
    ],
    ids=["strided", "columns", "parameter-stride"],
)
def test_blocks_that_are_not_contiguous_match_torch(build):
    """Every other row, or repeated columns, of the buffer and the parameter (the fx front-end
    refused them): the values, and the gradient into the rows the block reads."""
    torch.manual_seed(0)
    check_against_torch(build().double(), _x(), F64, loss="mse")


def test_a_non_persistent_buffer_stays_out_of_the_state_dict_as_in_torch():
    net = Encoded().double()
    pe = net.pe
    del net._buffers["pe"]
    net.register_buffer("pe", pe, persistent=False)
    cm = rootclad.compile(net, _x(), engine="pullback")
    assert "pe" not in cm.state_dict() and "pe" in dict(cm.named_buffers())
    net.load_state_dict(cm.state_dict())  # torch's module takes it back, and the other way
    cm.load_state_dict(net.state_dict())
    assert_close_rel(cm(_x()), net(_x()), 1e-12, "forward")


class _Counts(nn.Module):
    def __init__(self, assign):
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("initialized", torch.tensor(True))
        self.lin = nn.Linear(8, 3)
        self.assign = assign

    def forward(self, x):
        if self.assign:
            self.steps += 1  # traced as a value: forward would store a trace's value in it
        elif self.initialized:  # a buffer as a Python bool: a branch on a value
            x = x * 2
        return self.lin(x)


def test_buffers_used_as_python_values_and_assigned_ones_are_refused():
    with pytest.raises(IRError, match=r"could not capture _Counts .*test_buffers\.py:\d+"):
        rootclad.compile(_Counts(assign=False).double(), _x(), engine="pullback")
    net = _Counts(assign=True).double()
    with pytest.raises(IRError, match=r"writes 'steps' in forward \(buffer_mutation\)"):
        rootclad.compile(net, _x(), engine="pullback")
    assert isinstance(net.steps, torch.Tensor) and float(net.steps) == 0  # left as it was


IDIOMS = {  # how position-encoding code found in the wild reads its buffer and parameter
    "detach": lambda t, n, x: t[:, :n].detach(),
    "clone": lambda t, n, x: t[:, :n].clone(),
    "to-device": lambda t, n, x: t[:, :n].to(x.device),
    "type-as": lambda t, n, x: t[:, :n].type_as(x),
    "to-dtype": lambda t, n, x: t[:, :n].to(x.dtype),
    "requires-grad": lambda t, n, x: t[:, :n].requires_grad_(False),
    "whole-contiguous": lambda t, n, x: t.contiguous()[:, :n],
}


class Idiom(Encoded):
    def __init__(self, how, **kw):
        super().__init__(**kw)
        self.how = how

    def forward(self, x):
        pe = IDIOMS[self.how](self.pe, x.size(1), x)
        pos = self.pos[:, : x.size(1)]
        if self.how not in ("detach", "requires-grad"):  # these stop a parameter's gradient
            pos = IDIOMS[self.how](self.pos, x.size(1), x)
        return self.lin(torch.tanh(x + pe + pos))


@pytest.mark.parametrize("how", IDIOMS)
def test_calls_that_keep_a_buffer_or_block_as_it_is_compile(how):
    """detach(), clone(), .to(x.device), .type_as(x), .to(x.dtype), .requires_grad_(False),
    .contiguous() between the buffer (or the parameter's block) and the addition: the value
    itself (fx_params.drop_kept_values)."""
    torch.manual_seed(0)
    check_against_torch(Idiom(how).double(), _x(), F64, loss="mse")


def test_a_float32_buffer_cast_to_the_models_float64_compiles_and_rounding_casts_are_refused():
    torch.manual_seed(0)
    net = Idiom("to-dtype").double()
    net.pe = net.pe.float()  # the cast to float64 is exact: the value itself
    x = _x()
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    assert net.pe.dtype == torch.float32  # (check_against_torch would make it float64)
    assert_close_rel(cm.predict(x), net(x), 1e-12, "forward")

    class Rounded(Encoded):
        def forward(self, x):  # float64 buffer rounded to float32 and back: not the value
            return self.lin(x + self.pe[:, : x.size(1)].float().double())

    with pytest.raises(IRError, match="torch.float64 rounded to torch.float32"):
        rootclad.compile(Rounded().double(), _x(), engine="pullback")


def test_a_parameters_detach_is_not_dropped():
    """detach() of a parameter stops its gradient: it stays, and is refused naming it."""

    class Detached(Encoded):
        def forward(self, x):
            return self.lin(x + self.pos[:, : x.size(1)].detach())

    with pytest.raises(IRError, match="detach"):
        rootclad.compile(Detached().double(), _x(), engine="pullback")
