"""nn.LSTM and nn.GRU (issue 27), unrolled over the compiled sequence (torch's decomposition,
rootclad/frontends/aten/capture.py, its dropout between layers kept): the
output, the input's and every parameter's gradient against torch autograd (full
backpropagation through time), on the pullback and clad engines, float64 and float32 and the
device kernels (host loops); several layers, bidirectional, batch_first both ways, without
biases, initial states given; 20 Adam steps against torch.optim; what stays unsupported is
refused naming the node or module."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, perturbed
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.ir.graph import IRError

F64 = torch.float64


class Tagger(nn.Module):
    """A recurrent layer on (B, T, F) and a head reading the whole output sequence and the
    last layer's final state (and, for an LSTM, the cell state)."""

    def __init__(self, kind, batch_first=True, state=False, **kw):
        super().__init__()
        self.rnn = kind(3, 5, batch_first=batch_first, **kw)
        self.batch_first, self.state = batch_first, state
        width = 5 * (2 if kw.get("bidirectional") else 1)
        self.head = nn.Linear(width, 2)
        layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
        self.init = nn.ModuleList(nn.Linear(3, 5) for _ in range(layers)) if state else None

    def forward(self, x):
        seq = x if self.batch_first else x.transpose(0, 1)
        lstm = isinstance(self.rnn, nn.LSTM)
        hx = None
        if self.state:  # an initial state per layer and direction, computed from the input
            h0 = torch.stack([torch.tanh(f(x[:, 0])) for f in self.init])
            hx = (h0, torch.stack([f(x[:, 1]) for f in self.init])) if lstm else h0
        out, final = self.rnn(seq, hx)
        h_n = final[0] if lstm else final
        if not self.batch_first:
            out = out.transpose(0, 1)
        y = self.head(out).mean(1) + h_n[-1].sum(1, keepdim=True)
        return y + final[1][0].mean(1, keepdim=True) if lstm else y


CONFIGS = {
    "one-layer": {},
    "two-layers-bidirectional": {"num_layers": 2, "bidirectional": True},
    "time-first": {"batch_first": False, "num_layers": 2},
    "no-bias": {"bias": False},
    "initial-state": {"state": True, "num_layers": 2, "bidirectional": True},
}
CASES = [pytest.param(kind, cfg, id=f"{kind.__name__}-{name}")
         for kind in (nn.LSTM, nn.GRU) for name, cfg in CONFIGS.items()]  # fmt: skip


def _net(kind, cfg):
    torch.manual_seed(0)
    return perturbed(Tagger(kind, **cfg).double()).eval()


def _x(B=3, T=4, seed=1):
    return torch.randn(B, T, 3, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _check(cm, net, x, dtype, rtol):
    ref = copy.deepcopy(net).to(dtype).double()  # the parameters rounded as rootclad's
    xr = x.double().requires_grad_(True)
    out_ref = ref(xr)
    d_out = torch.randn(out_ref.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    dx_ref, *dp_ref = torch.autograd.grad(out_ref, [xr, *ref.parameters()], d_out)
    xc = x.to(dtype).requires_grad_(True)
    out = cm(xc)
    assert out.dtype == dtype
    dx, *dp = torch.autograd.grad(out, [xc, *cm.parameters()], d_out.to(dtype))
    assert_close_rel(out, out_ref, rtol, "forward")
    assert_close_rel(dx, dx_ref, rtol, "d_input")
    names = [n for n, _ in ref.named_parameters()]
    assert_grads_close(dict(zip(names, dp, strict=True)), dict(zip(names, dp_ref, strict=True)),
                       rtol, "parameters", against_all=True)  # fmt: skip


@pytest.mark.parametrize("kind, cfg", CASES)
def test_recurrent_layer_matches_torch(kind, cfg):
    net = _net(kind, cfg)
    x = _x()
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="pullback")
    _check(cm, net, x, F64, 1e-9)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_recurrent_layer_in_float32_matches_torch(kind):
    net = _net(kind, CONFIGS["two-layers-bidirectional"])
    x = _x(B=5, seed=2).float()
    cm = rootclad.compile(copy.deepcopy(net).float(), x, loss="mse", engine="pullback")
    _check(cm, net, x, torch.float32, 1e-4)


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", [True, False])
@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_recurrent_layer_on_the_clad_engine_matches_torch(clad, kind, pullbacks):
    net = _net(kind, CONFIGS["initial-state"])
    x = _x()
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="clad", pullbacks=pullbacks)
    assert cm.engine == "clad"
    _check(cm, net, x, F64, 1e-9)


def test_backpropagation_reaches_the_first_step():
    """Full backpropagation through time: the loss on the last step's state has a gradient
    on the first step's input as torch's (a truncated sweep gives zeros there)."""

    class Last(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(3, 5, batch_first=True)

        def forward(self, x):
            return self.rnn(x)[1][0][-1]

    torch.manual_seed(0)
    net = Last().double()
    x = _x(T=12)
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="pullback")
    xr = x.clone().requires_grad_(True)
    (d_ref,) = torch.autograd.grad(net(xr).sum(), [xr])
    xc = x.clone().requires_grad_(True)
    (d,) = torch.autograd.grad(cm(xc).sum(), [xc])
    assert float(d_ref[:, 0].abs().max()) > 1e-6  # the first step does matter
    assert_close_rel(d[:, 0], d_ref[:, 0], 1e-9, "d_input of step 0")


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_recurrent_training_tracks_torch_optim(kind):
    torch.manual_seed(0)
    net = Tagger(kind, num_layers=2, bidirectional=True).double().train()
    x = _x(B=24, seed=3)
    y = torch.randn(24, 2, dtype=F64, generator=torch.Generator().manual_seed(6))
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    ref = copy.deepcopy(net)
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses, ref_losses = [], []
    for step in range(20):
        idx = torch.arange(step % 3 * 8, step % 3 * 8 + 8)
        losses.append(cm.train_step(x[idx], y[idx], opt))
        opt_ref.zero_grad()
        value = F.mse_loss(ref(x[idx]), y[idx])
        value.backward()
        opt_ref.step()
        ref_losses.append(value.item())
    assert_close_rel(torch.tensor(losses), torch.tensor(ref_losses), 1e-9, "losses")
    assert losses[-1] < losses[1]
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        assert_close_rel(p, q, 1e-8, k)


def test_dropout_between_layers_follows_the_training_mode():
    """torch drops between layers (not after the last) in training mode only."""
    torch.manual_seed(0)
    net = Tagger(nn.GRU, num_layers=3, dropout=0.5).double()
    x = _x()
    cm = rootclad.compile(copy.deepcopy(net).train(), x, loss="mse", engine="pullback")
    assert [n.attrs["p"] for n in cm.graph.nodes if n.op == "dropout"] == [0.5, 0.5]
    cm.train()
    assert float((cm(x) - cm(x)).detach().abs().max()) > 0  # a mask drawn per call
    cm.eval()
    assert_close_rel(cm(x), net.eval()(x), 1e-12, "eval: no dropout")


def test_a_longer_sequence_than_compiled_is_refused():
    net = _net(nn.LSTM, {})
    cm = rootclad.compile(copy.deepcopy(net), _x(T=4), loss="mse", engine="pullback")
    with pytest.raises((ValueError, RuntimeError), match="shape"):
        cm(_x(T=6))


class _Use(nn.Module):
    def __init__(self, how, **kw):
        super().__init__()
        self.rnn = nn.LSTM(3, 5, **kw)
        self.how = how

    def forward(self, x):
        if self.how == "time-first-input":  # a batch-first input to a time-first layer
            return self.rnn(x)[0].sum(1)
        out, (h, c) = self.rnn(x)
        if self.how == "sum-of-states":
            return h.sum(0)
        return self.rnn(x, (h, c))[0][:, -1]  # the last states as the next run's first


def test_a_time_first_layer_given_a_batch_first_input_is_refused_naming_it():
    with pytest.raises(IRError) as info:
        rootclad.compile(_Use("time-first-input").double(), _x(), loss="mse", engine="pullback")
    for w in ["'rnn' (LSTM) has batch_first=False", "transpose(0, 1)"]:
        assert w in str(info.value), str(info.value)


class _Zeros(nn.Module):
    """The tutorials' zero initial state, written out."""

    def __init__(self, kind, use=False):
        super().__init__()
        self.rnn = kind(3, 5, num_layers=2, batch_first=True)
        self.use = use

    def forward(self, x):
        h0 = torch.zeros(2, x.size(0), 5, dtype=x.dtype).to(x.device)
        if self.use:
            return self.rnn(x)[0][:, -1] + h0[0]
        hx = (h0, torch.zeros_like(h0)) if isinstance(self.rnn, nn.LSTM) else h0
        return self.rnn(x, hx)[0][:, -1]


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_zeros_as_the_initial_state_is_no_state(kind):
    torch.manual_seed(0)
    net = perturbed(_Zeros(kind).double())
    x = _x()
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="pullback")
    _check(cm, net, x, F64, 1e-9)


class _Squeezed(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.rnn = nn.GRU(3, 5, batch_first=True)
        self.fc = nn.Linear(5, 1)
        self.dim = dim

    def forward(self, x):
        return self.fc(self.rnn(x)[1].squeeze(dim=self.dim))


def test_squeeze_of_h_n_follows_its_dim_at_batch_size_1():
    """h_n (1, B, H).squeeze(dim=0) is (B, H); squeeze(dim=1) drops the batch axis at B = 1
    only, and is refused (an example of one sample must not decide)."""
    torch.manual_seed(0)
    net = _Squeezed(0).double()
    cm = rootclad.compile(copy.deepcopy(net), _x(B=1), loss="mse", engine="pullback")
    assert_close_rel(cm(_x(B=3)), net(_x(B=3)), 1e-12, "squeeze(dim=0)")
    with pytest.raises(IRError, match="a squeeze of the batch axis"):
        rootclad.compile(_Squeezed(1).double(), _x(B=1), loss="mse", engine="pullback")


class _TimeFirst(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.rnn = nn.LSTM(3, 5, batch_first=True)
        self.how = how

    def forward(self, x):
        if self.how == "last-step":  # x.transpose(0, 1)[-1]: the last step of every sample
            return self.rnn(x)[0].transpose(0, 1)[-1]
        return self.rnn(x.transpose(0, 1))[0][:, -1]  # "time-first-to-batch-first"


def test_a_time_first_view_taken_by_index_matches_torch():
    torch.manual_seed(0)
    net = _TimeFirst("last-step").double()
    cm = rootclad.compile(copy.deepcopy(net), _x(), loss="mse", engine="pullback")
    assert_close_rel(cm(_x(seed=3)), net(_x(seed=3)), 1e-12, "transpose(0, 1)[-1]")


def test_a_time_first_input_to_a_batch_first_layer_is_refused():
    with pytest.raises(IRError, match="fixes the batch size"):
        net = _TimeFirst("time-first-to-batch-first").double()
        rootclad.compile(net, _x(), loss="mse", engine="pullback")


@pytest.mark.parametrize(
    "make",
    [
        lambda: _Use("sum-of-states", batch_first=True),  # h_n summed over the layers
        lambda: _Use("state-from-another", batch_first=True, proj_size=2),  # projections
        lambda: _Zeros(nn.GRU, use=True),  # zeros beside the layer, not as its state
    ],
    ids=["sum-of-states", "proj-size-and-state-given", "zeros-beside"],
)
def test_uses_beyond_a_layer_on_the_input_match_torch(make):
    torch.manual_seed(0)
    net = perturbed(make().double())
    x = _x()
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="pullback")
    _check(cm, net, x, F64, 1e-9)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_a_bare_recurrent_layer_gives_its_output_sequence(kind):
    torch.manual_seed(0)
    net = kind(3, 5, num_layers=2, batch_first=True).double()
    cm = rootclad.compile(copy.deepcopy(net), _x(), loss="mse", engine="pullback")
    assert_close_rel(cm(_x(seed=2)), net(_x(seed=2))[0], 1e-12, "output sequence")


class _StateFromInput(nn.Module):
    """One layer's initial state computed from the input: z.unsqueeze(dim=0)."""

    def __init__(self):
        super().__init__()
        self.init = nn.Linear(3, 5)
        self.rnn = nn.GRU(3, 5, batch_first=True)

    def forward(self, x):
        h0 = torch.tanh(self.init(x[:, 0])).unsqueeze(dim=0)
        return self.rnn(x, h0)[0][:, -1]


def test_an_initial_state_by_unsqueeze_with_a_keyword_matches_torch():
    torch.manual_seed(0)
    net = perturbed(_StateFromInput().double())
    x = _x()
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="pullback")
    _check(cm, net, x, F64, 1e-9)
