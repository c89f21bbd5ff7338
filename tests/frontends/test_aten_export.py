"""The torch.export front-end (issue 44): models lowered from core ATen ops against torch
autograd in float64 (output, input and every parameter gradient; side by side in one model,
one build), a model torch.fx could not trace, and refusals naming the ATen op and the module it
came from."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from fixtures.core import assert_close_rel, check_against_torch
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.frontends.aten import graph_from_export
from rootclad.frontends.aten.table import LOWERINGS
from rootclad.ir.graph import IRError

F64 = torch.float64


class Mixed(nn.Module):
    """Layers kept whole (conv, BatchNorm in training, max pool, LayerNorm, Linear, softmax)
    between decomposed ATen ops: clamp, transpose, cat, mean, exp, neg, arithmetic with
    numbers, sqrt."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4)
        self.ln, self.fc, self.pool = nn.LayerNorm(4), nn.Linear(4, 3), nn.MaxPool1d(2)

    def forward(self, x):
        h = self.pool(torch.relu(self.bn(self.conv(x)))).clamp(-0.5, 2.0)
        h = self.ln(h.transpose(1, 2))
        h = torch.cat([h, torch.exp(-h)], 1).mean(1)
        h = self.fc(h).softmax(-1)
        return (1 - h / 2) * torch.sqrt(h + 1) + 3 / (h + 1)


class WithAux(nn.Module):  # a block returning (value, auxiliary), as recurrent layers do
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.fc(x)), x.sum(-1)


class TupleIdiom(nn.Module):
    """``out = out[0] if isinstance(out, tuple) else out``: torch.fx sees a proxy, not a
    tuple, and fails; torch.export runs the Python."""

    def __init__(self):
        super().__init__()
        self.block, self.head = WithAux(), nn.Linear(8, 2)

    def forward(self, x):
        out = self.block(x)
        out = out[0] if isinstance(out, tuple) else out
        return self.head(F.gelu(out)).log_softmax(-1).flatten(1)


class Layout(nn.Module):
    """Slices, constant padding, a transposed convolution, adaptive max and average pools,
    bilinear upsampling and a sum over two axes, as core ATen ops and kept layers; pools
    called as functions."""

    def __init__(self):
        super().__init__()
        self.up, self.pool = nn.ConvTranspose1d(3, 2, 3, stride=2), nn.AdaptiveMaxPool1d(4)
        self.conv, self.avg = nn.Conv2d(1, 2, 3), nn.AvgPool2d(2, ceil_mode=True)
        self.zoom = nn.Upsample(scale_factor=2, mode="bilinear")

    def forward(self, x):  # (B, 3, 8)
        h = F.pad(x[:, :, 1:7:2], (2, 1), value=0.5)  # (B, 3, 6)
        h = self.pool(F.elu(self.up(h)))  # (B, 2, 4)
        img = self.avg(self.conv(self.zoom(h.reshape(-1, 1, 2, 4))))
        pooled = F.adaptive_avg_pool1d(h, 1).flatten(1) + F.max_pool1d(h, 2, 1, ceil_mode=True).sum(
            -1
        )
        return 1 - img.sum((2, 3)) + h.sum(-1) * pooled


class Held(nn.Module):
    """Parameters and buffers read as values: a scale, a shift buffer, a class token expanded
    to the batch."""

    def __init__(self):
        super().__init__()
        self.scale, self.cls = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(1, 1, 8))
        self.register_buffer("shift", torch.randn(1, 3, 1))
        self.fc = nn.Linear(8, 2)

    def forward(self, x):  # (B, 3, 8)
        h = x * self.scale + self.shift
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], 1)
        return self.fc(h).mean(1)


class Heads(nn.Module):
    """Attention written with the batch axis merged with the heads' (B * H, T, d), as
    hand-written transformers do: views, transposes and bmm of values."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 3)

    def forward(self, x):  # (B, T, 8)
        B, T, _ = x.shape
        y = self.qkv(x)
        q, k, v = (
            y[..., 8 * i : 8 * i + 8].reshape(B, T, 2, 4).transpose(1, 2).reshape(B * 2, T, 4)
            for i in range(3)
        )
        att = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 2.0, -1)
        o = torch.bmm(att, v).view(B, 2, T, 4).transpose(1, 2).reshape(B, T, 8)
        return self.out(o).mean(1)


class TimmAttention(nn.Module):
    """Attention as timm writes it: qkv permuted so that the batch axis moves, then unbound;
    with a class token x[:, 0], chunk, amax and amin besides."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        a, b = x.chunk(2, -1)
        return self.proj(x).amax(1) + x[:, 0] - (a * b).amin(-1).sum(-1, keepdim=True)


class Made(nn.Module):
    """Tensors made in forward (constants: positions from torch.arange read from an
    embedding, a causal mask from torch.triu, zeros of the batch's size) and masks of values:
    comparisons, torch.where, logical ops, roll, max over an axis, and a comparison of two
    values."""

    def __init__(self):
        super().__init__()
        self.pos, self.fc = nn.Embedding(3, 8), nn.Linear(8, 8)

    def forward(self, x):  # (B, 3, 8)
        B, T, _ = x.shape
        h = self.fc(x + self.pos(torch.arange(T).unsqueeze(0).expand(B, -1)))  # as HF writes
        mask = torch.triu(torch.ones(T, T), 1).bool()
        att = (h @ h.transpose(1, 2)).masked_fill(mask, float("-inf")).softmax(-1)
        h = torch.where(h > 0.1, att @ h, 0.5 * h)
        both = (h > 0) & ~(x < -1.0)
        h = torch.cat([torch.zeros(B, 1, 8), h.roll(1, -1), both.float()], 1)
        return h.max(1).values + (x > h[:, 1:4]).float().sum(1)


class OwnForward(nn.Module):
    """Layer ops called with other hyperparameters or tensors of their own: a convolution of
    other padding and dilation, a linear leaving out its bias, F.layer_norm and F.linear of
    weights computed in forward (a product then), attention through nn.MultiheadAttention
    (which moves the batch axis), GroupNorm and InstanceNorm."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv1d(3, 2, 3, padding=1), nn.Linear(8, 3)
        self.w, self.g = nn.Parameter(torch.randn(4, 8)), nn.Parameter(torch.randn(8))
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.gn, self.inorm = nn.GroupNorm(1, 3), nn.InstanceNorm1d(3, affine=True)
        self.register_buffer("proj", torch.randn(3, 8))  # a fixed projection

    def forward(self, x):  # (B, 3, 8)
        c = F.conv1d(x, self.conv.weight, self.conv.bias, 1, 2, 2).mean(-1)
        h = F.layer_norm(x, (8,), self.g, None)
        h = F.linear(h, self.fc.weight) + F.linear(h, 2 * self.w).sum(-1, keepdim=True)
        h = h + F.linear(h.tanh().repeat(1, 1, 3)[..., :8], self.proj)
        g = self.g[:3]
        h = torch.clamp(h, g - 1, g) + torch.clamp(h, g, g - 0.5)  # lo > hi: torch gives hi
        a = self.mha(x, x, x, need_weights=False)[0] + self.gn(x) + self.inorm(x)
        return torch.cat([c, h.mean(1), a.mean(1)], -1)


class Recurrent(nn.Module):
    """A two-layer bidirectional GRU and a time-first LSTM, decomposed by torch into their
    cells: the final states of the layers concatenated along the batch axis, then viewed."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 4, num_layers=2, bidirectional=True, batch_first=True)
        self.lstm = nn.LSTM(8, 3)

    def forward(self, x):  # (B, 3, 8)
        out, h = self.gru(x)
        seq, (h_n, c_n) = self.lstm(x.transpose(0, 1))
        states = h.transpose(0, 1).reshape(x.shape[0], 2, 8).sum(1)
        return torch.cat([out.mean(1) + states, seq[-1] * c_n[0]], -1)


class Everything(nn.Module):
    """The models above side by side on one input (B, 3, 8): one build."""

    def __init__(self):
        super().__init__()
        self.parts = nn.ModuleList(
            [
                Mixed(),
                TupleIdiom(),
                Layout(),
                Held(),
                Heads(),
                TimmAttention(),
                Made(),
                OwnForward(),
                Recurrent(),
            ]
        )

    def forward(self, x):
        return torch.cat([part(x) for part in self.parts], -1)


def test_models_of_core_aten_ops_and_kept_layers_match_torch_autograd():
    """Each part above against torch autograd in float64 (output, input and every parameter
    gradient, against the largest: the convolution's bias before BatchNorm has no gradient
    but torch's rounding). TupleIdiom is a model torch.fx could not trace."""
    torch.manual_seed(0)
    net = Everything().train()
    x = torch.randn(5, 3, 8, dtype=F64)
    cm = check_against_torch(net, x, engine="pullback", loss="mse", against_all=True)
    kept = {
        "conv1d",
        "batch_norm",
        "maxpool1d",
        "layer_norm",
        "linear",
        "softmax",
        "upsample",
        "compare",
        "masked_fill",
        "gather",
        "parameter",
    }
    assert {n.op for n in cm.graph.nodes} >= kept


class Cut(nn.Module):
    def forward(self, x):
        return x[: x.shape[0]] * 2


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def test_a_weight_two_layers_hold_is_each_layers_own():
    graph = graph_from_export(Tied(), torch.randn(1, 4), "float64")
    assert [n.params for n in graph.nodes] == [
        {"weight": "a.weight", "bias": "a.bias"},
        {"weight": "a.weight", "bias": "b.bias"},
    ]


class LogGamma(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.lgamma(self.fc(x))


def test_an_op_without_a_lowering_is_refused_naming_the_aten_op_and_the_module(monkeypatch):
    outer = nn.Sequential(nn.Linear(4, 4), LogGamma())
    with pytest.raises(
        IRError,
        match=r"ATen op aten\.lgamma\.default \(node 'lgamma' in module "
        r"'1' \(LogGamma\)\): not supported \(rootclad lowers \d+ ATen ops",
    ):
        graph_from_export(outer, torch.randn(1, 4), "float64")

    class Noisy(nn.Module):  # one draw for every sample: the IR draws per sample
        def forward(self, x):
            return x + torch.randn(4)

    with pytest.raises(IRError, match=r"ATen op aten\.randn\.default .*same for every"):
        graph_from_export(Noisy(), torch.randn(1, 4), "float64")

    class Counted(nn.Module):  # a buffer written in forward: the compiled model would not
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            return x * 2

    with pytest.raises(IRError, match=r"writes .*calls"):
        graph_from_export(Counted(), torch.randn(1, 4), "float64")

    class Picked(nn.Module):  # indices computed from the values (not topk's): unchecked
        def forward(self, x):
            return torch.gather(x, 1, (x > 0).long()[:, :1])  # (0 or 1: in range)

    with pytest.raises(IRError, match=r"aten\.gather\.default .*computed from the inputs"):
        graph_from_export(Picked(), torch.randn(2, 4), "float64")

    alpha = nn.Sequential(nn.Linear(4, 4), nn.AlphaDropout(0.2, inplace=True))  # not dropout's
    with pytest.raises(IRError, match=r"aten\.bernoulli\.p .*alpha dropout is not supported"):
        graph_from_export(alpha, torch.randn(1, 4), "float64")

    class Counts(nn.Module):  # the batch size made a tensor: no constant, a sum over the batch
        def forward(self, x):
            return x / torch.ones(x.shape[0], 4).sum(0)

    with pytest.raises(IRError, match=r"aten\.sum\.dim_IntList .*batch axis"):
        graph_from_export(Counts(), torch.randn(2, 4), "float64")

    class Mixing(nn.Module):  # a sum over the batch
        def forward(self, x):
            return x - x.sum(0)

    with pytest.raises(IRError, match=r"aten\.sum\.dim_IntList .*batch axis"):
        graph_from_export(Mixing(), torch.randn(2, 4), "float64")

    class Rows(nn.Module):  # an output of B * 3 rows: torch's shape is not (B, ...)
        def forward(self, x):
            return torch.flatten(x, 0, 1).sum(-1)

    with pytest.raises(IRError, match="rows of each sample in axis 0: the batch axis must stay"):
        graph_from_export(Rows(), torch.randn(1, 3, 4), "float64")
    graph_from_export(Cut(), torch.randn(1, 4), "float64")  # x[: x.shape[0]]: the whole batch

    def mistaken(low, node, args, kw):
        raise TypeError("a lowering's own mistake")

    monkeypatch.setitem(LOWERINGS, "aten.mul.Tensor", mistaken)
    with pytest.raises(IRError, match=r"aten\.mul\.Tensor .*not understood \(TypeError"):
        graph_from_export(Cut(), torch.randn(1, 4), "float64")  # an IRError, not a bare one


def test_dropout_is_captured_in_either_mode_and_obeys_the_compiled_models_mode():
    """In eval mode torch.export would drop it: captured as in training, it is the IR's
    dropout, which cm.train() and cm.eval() turn on and off."""
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3))
    for mode in (net.train, net.eval):
        graph = graph_from_export(mode(), torch.randn(1, 4), "float64")
        assert [(n.op, n.attrs) for n in graph.nodes] == [("linear", {}), ("dropout", {"p": 0.3})]
    inplace = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3, inplace=True))
    for mode in (inplace.train, inplace.eval):  # torch draws bernoulli into empty for it
        graph = graph_from_export(mode(), torch.randn(1, 4), "float64")
        assert [n.attrs["p"] for n in graph.nodes if n.op == "dropout"] == [pytest.approx(0.3)]


def test_stochastic_depth_drops_whole_samples_in_training_and_none_in_eval():
    """torchvision's StochasticDepth (p=0.25, per sample), captured as one op of rootclad's own
    (the IR's stochastic_depth): in training each sample is dropped whole or scaled by 1/0.75,
    about a quarter dropped, the backward through the same mask; in eval mode the model is
    torch's; mode='batch' is the same op drawing once for the batch."""
    from fixtures.op_cases import _stochastic_depth

    import rootclad

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), _stochastic_depth(0.25)).double()
    x = torch.randn(400, 4, dtype=F64)
    cm = rootclad.compile(net.train(), x, loss="mse", engine="pullback")
    h = net[0](x).detach()
    xr = x.clone().requires_grad_(True)
    out = cm(xr)
    (dx,) = torch.autograd.grad(out, xr, torch.randn_like(out))  # through the same draw
    out = out.detach()
    dropped = (out == 0).all(1)
    assert torch.allclose(out[~dropped], h[~dropped] / 0.75, rtol=1e-12, atol=0)
    assert 0.15 < float(dropped.double().mean()) < 0.35
    assert bool((dx[dropped] == 0).all()) and bool((dx[~dropped] != 0).all())
    cm.eval()
    assert_close_rel(cm(x).detach(), net.eval()(x).detach(), 1e-12, "eval")
    whole = nn.Sequential(nn.Linear(4, 4), type(net[1])(0.25, "batch")).double()  # one draw
    last = graph_from_export(whole, x[:2], "float64").nodes[-1]
    assert (last.op, last.attrs) == ("stochastic_depth", {"p": 0.25, "whole_batch": 1})


class Tokens(nn.Module):
    """A GPT-style block on token ids (an integer input read by an embedding, positions at
    torch.arange, a causal mask) beside a BERT-style one (a position_ids buffer sliced, an
    attention mask given as integers and made floats)."""

    def __init__(self, vocab=11, T=6, D=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, D, padding_idx=0), nn.Embedding(T, D)
        self.block = nn.TransformerEncoderLayer(D, 2, 16, dropout=0.0, batch_first=True)
        self.register_buffer("position_ids", torch.arange(T).expand((1, -1)))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, 2)

    def forward(self, ids, attention_mask):
        T = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(T))
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        gpt = self.block(x, src_mask=causal, is_causal=True).mean(1)
        y = self.ln(self.tok(ids) + self.pos(self.position_ids[:, :T]))
        ext = (1.0 - attention_mask[:, None, :].to(y.dtype)) * -1e4
        bert = (torch.softmax(y @ y.transpose(1, 2) / 8**0.5 + ext, -1) @ y)[:, 0]
        return self.head(gpt + bert)


def test_token_ids_and_an_integer_mask_are_inputs_and_their_bounds_are_checked():
    """Against torch autograd in float64 (output and every parameter gradient); the ids'
    bounds are the embedding's rows, checked on every call; arithmetic on ids is refused."""
    import rootclad

    torch.manual_seed(0)
    net = Tokens().double()
    ids, mask = torch.randint(0, 11, (3, 6)), (torch.rand(3, 6) > 0.3).long()
    cm = rootclad.compile(net, (ids, mask), loss="mse", engine="pullback")
    assert cm.graph.indices == ((11,) * 6, (-(1 << 53),) * 6)  # the mask: |i| held exactly
    out, ref = cm(ids, mask), net(ids, mask)
    d_out = torch.randn_like(ref)
    got = torch.autograd.grad(out, list(cm.parameters()), d_out)
    want = torch.autograd.grad(ref, list(net.parameters()), d_out)
    assert_close_rel(out.detach(), ref.detach(), 1e-10, "forward")
    for (name, _), g, w in zip(net.named_parameters(), got, want, strict=True):
        assert_close_rel(g, w, 1e-9, name)
    with pytest.raises(ValueError, match="11"):
        cm(torch.full((3, 6), 11), mask)
    cm(ids, -mask)  # an integer only compared may be negative

    class Shifted(nn.Module):  # ids + 1: integers computed, not indices moved
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(12, 4)

        def forward(self, ids):
            return self.tok(ids + 1).sum(1)

    with pytest.raises(IRError, match=r"aten\.add\.Tensor .*computes with integer inputs"):
        graph_from_export(Shifted(), torch.randint(0, 11, (1, 6)), "float64")


class Several(nn.Module):
    """A VAE's encoder as written: (reconstruction, mu, logvar), sampling in training only."""

    def __init__(self):
        super().__init__()
        self.enc, self.mu, self.logvar = nn.Linear(6, 8), nn.Linear(8, 2), nn.Linear(8, 2)
        self.dec = nn.Linear(2, 6)

    def forward(self, x):
        h = torch.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return {"recon": self.dec(z).view(-1, 2, 3), "mu": mu, "logvar": logvar}


def test_a_dict_of_outputs_is_the_compiled_models_and_the_loss_reads_the_one_named():
    import rootclad

    torch.manual_seed(0)
    net, x = Several().double().eval(), torch.randn(3, 6, dtype=F64)
    cm = rootclad.compile(net, x, loss="mse", engine="pullback", loss_output="mu")
    got, want = cm(x), net(x)
    assert list(got) == ["recon", "mu", "logvar"] and got["recon"].shape == (3, 2, 3)
    for key in want:
        assert_close_rel(got[key].detach(), want[key].detach(), 1e-12, key)
    y = torch.randn(3, 2, dtype=F64)
    value, grads = cm.loss_and_grad(x, y)
    assert abs(value - F.mse_loss(want["mu"], y).item()) < 1e-12
    sampled = graph_from_export(Several().train(), torch.randn(1, 6), "float64")
    assert "normal" in [n.op for n in sampled.nodes]  # in training: torch.randn_like


def test_randn_like_draws_standard_normals_again_each_call_in_either_mode():
    """torch.randn_like and torch.randn of the batch's shape (the IR's normal) against torch's
    own generator: a two-sample Kolmogorov-Smirnov distance below its 0.1% critical value;
    the draws differ from call to call and from sample to sample, in eval mode too."""
    import rootclad

    class Noisy(nn.Module):
        def forward(self, x):
            return torch.cat([x * 0 + torch.randn_like(x), torch.randn(x.shape[0], 2)], 1)

    x = torch.randn(4000, 4, dtype=F64)
    cm = rootclad.compile(Noisy(), x, loss="mse", engine="pullback")
    assert [n.op for n in cm.graph.nodes].count("normal") == 2
    first, second = cm(x).detach(), cm.eval()(x).detach()
    assert bool((first != second).all())
    assert len(torch.unique(first[:, 0])) == len(x)
    ours = torch.cat([first.flatten(), second.flatten()])
    theirs = torch.randn(len(ours), dtype=F64, generator=torch.Generator().manual_seed(3))

    def distance(a, b):
        a, b = a.sort().values, b.sort().values
        both = torch.cat([a, b]).sort().values
        ecdf = [torch.searchsorted(v, both, right=True) / len(v) for v in (a, b)]
        return float((ecdf[0] - ecdf[1]).abs().max())

    critical = 1.95 * (2 / len(ours)) ** 0.5
    assert distance(ours, theirs) < critical, distance(ours, theirs)
    assert distance(ours * 1.1, theirs) > critical  # the check tells a wider spread
    # each sample's draws are its own whatever the batch and its split over threads: a
    # model of the same seed, on its first call, draws for ten samples what the first drew
    few = rootclad.compile(Noisy(), x[:10], loss="mse", engine="pullback")
    assert torch.equal(few(x[:10]).detach(), first[:10])


def test_clamp_by_tensor_bounds_takes_infinities_as_torch_does():
    """Bounds of one value (a folded constant) and of many, at -inf, +inf and NaN inputs."""
    import rootclad

    class Bounded(nn.Module):
        def __init__(self):
            super().__init__()
            self.hi = nn.Parameter(torch.tensor([0.5, 1.0, 2.0, 3.0]))

        def forward(self, x):
            return torch.clamp(x, min=torch.tensor(-1.0)) + torch.clamp(x, -self.hi, self.hi)

    x = torch.tensor([[-math.inf, math.inf, 0.3, -5.0], [math.nan, 1.5, -0.7, 2.5]], dtype=F64)
    cm = rootclad.compile(Bounded().double(), x, loss="mse", engine="pullback")
    got, want = cm(x).detach(), Bounded().double()(x).detach()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


class _Larger(nn.Module):
    """torch.maximum and minimum of two layers of equal weights (every element a tie)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(3, 4)
        self.b.load_state_dict(self.a.state_dict())

    def forward(self, x):
        return torch.maximum(self.a(x), self.b(x)) + 3 * torch.minimum(self.b(x), self.a(x))


def test_maximum_and_minimum_split_a_ties_gradient_and_keep_nan_as_torch():
    """At a tie each operand gets half the gradient (given all to one side, the two layers'
    gradients would differ, 1 and 3 times the output's, not 2 each); where an operand is NaN,
    the value is NaN."""
    net, x = _Larger().double(), torch.randn(5, 3, dtype=F64)
    cm = check_against_torch(net, x, loss="mse")  # (a's and b's gradients: torch's, equal)
    x[1, 0] = math.nan
    got, want = cm(x).detach(), net(x).detach()
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


class _Counts(nn.Module):
    """A buffer written in forward: torch.export's program mutates it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.fc(x)


def test_a_program_rootclad_lowers_as_it_stands_is_not_decomposed_again():
    """The capture's second trace (torch's run_decompositions) is skipped where nothing would
    change: a program of kept layers and views, mutating nothing. A program that mutates a
    buffer, or holds an op rootclad lowers only decomposed (softshrink), is decomposed."""
    from rootclad.frontends.aten import capture

    x = torch.randn(2, 3)
    table = torch.export.default_decompositions()
    plain = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2))
    dim = {0: torch.export.Dim("batch", min=1)}
    for net, kept in ((plain, True), (_Counts(), False), (nn.Sequential(nn.Softshrink()), False)):
        with warnings.catch_warnings():  # (torch.export's own deprecation notices)
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.export.export(net, (x,), dynamic_shapes=(dim,), strict=False)
            assert (capture._decomposed(program, table) is program) == kept, net
    with capture._cia_ops_listed_once():  # torch's walk, put back after a capture
        assert torch._export.utils._materialize_cpp_cia_ops.__name__ == "once"
    assert torch._export.utils._materialize_cpp_cia_ops.__name__ == "_materialize_cpp_cia_ops"


class _Products(nn.Module):
    """torch.matmul in the forms rootclad lowers as torch.export keeps them (and, ``vector``,
    one it leaves to torch's decomposition), with a constant made in forward."""

    def __init__(self, vector=False):
        super().__init__()
        self.vector = vector
        self.w = nn.Parameter(torch.randn(8, 6))
        self.h = nn.Parameter(torch.randn(2, 6, 3))
        self.v = nn.Parameter(torch.randn(3))

    def forward(self, x):  # (B, 4, 8)
        q = x.view(x.shape[0], 2, 2, 8)
        a = torch.matmul(q, q.transpose(-1, -2)).softmax(-1) @ q  # sample by sample
        s = x.transpose(0, 1) @ self.w  # rows (sequence first) times a shared matrix
        windows = x.reshape(-1, 2, 8)  # (2B, 2, 8): two rows of the batch per sample
        w = windows @ windows.transpose(1, 2)
        y = s.transpose(0, 1).unsqueeze(1) @ self.h  # a shared matrix per head
        y = y * torch.tensor([1.0, 2.0, 3.0])  # a constant (lift_fresh_copy: folded)
        out = y.sum((1, 2)) + a.sum((1, 2, 3))[:, None] + w.reshape(x.shape[0], -1).sum(1)[:, None]
        return out @ self.v if self.vector else out * self.v


def test_matmul_forms_lower_as_torch_export_keeps_them_and_match_torch():
    """A matmul of per-sample matrices (the batch axis first, or the batch's rows merged with
    another axis), or rows times a shared matrix (the batch anywhere but the last axis), is
    lowered as torch.export keeps it, a program of such products is not decomposed again; a
    vector operand leaves the program to torch's decomposition. Both match torch autograd."""
    from rootclad.frontends.aten import capture
    from rootclad.frontends.aten.layout import _batched_matrices

    x = torch.randn(3, 4, 8, dtype=torch.float64)
    table = torch.export.default_decompositions()
    dim = {0: torch.export.Dim("batch", min=1)}
    for vector in (False, True):
        torch.manual_seed(0)
        net = _Products(vector).double()
        with warnings.catch_warnings():  # (torch.export's own deprecation notices)
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.export.export(net, (x,), dynamic_shapes=(dim,), strict=False)
            products = [
                _batched_matrices(n) for n in program.graph.nodes if "matmul" in str(n.target)
            ]
            assert products == [True] * 5 + [False] * vector
            assert (capture._decomposed(program, table) is program) != vector
        check_against_torch(net, x, loss="mse")


class _Masks(nn.Module):
    def forward(self, x):  # bool + bool is torch's logical or, bool * bool its and
        return ((x > 0) + (x > 1)).double() * x + ((x > 0) * (x < 1)).double()


def _written_twice(s, x):  # torch leaves which of the two writes wins open
    y = x.clone()
    y[:, torch.tensor([1, 1])] = x[:, :2]
    return y


def _pairs(x):
    return torch.tensor([0, 1, 0, 1]).expand(x.shape[0], 4)


def _two_axes_index(s, x):
    y = x.clone()
    y[:, torch.tensor([[0, 1], [2, 3]])] = 1.0
    return y


def _nan_by_mask(s, x):
    y = x * 2
    y[y > 0.5] = float("nan")
    return y


def _floats_into_integers(s, x):
    y = torch.zeros(x.shape, dtype=torch.long)
    y[:, 0] = x[:, 0]
    return y.double() * x


@pytest.mark.parametrize(
    "forward, words",
    [
        (lambda s, x: x * s.w.detach() + s.w, r"'w'\.detach\(\) stops the gradient"),
        (lambda s, x: x.float().double(), "torch.float64 rounded to torch.float32"),
        (lambda s, x: x[x > 0].sum().reshape(1), "shape depends on the values"),
        (lambda s, x: x.nonzero().double(), "shape depends on the values"),
        (lambda s, x: x.repeat(1, 80).cumsum(1), r"torch.cumsum along an axis of 320 \(at most"),
        (lambda s, x: x.cumprod(1, dtype=torch.float32), "torch.cumprod in another dtype"),
        (_written_twice, "a position written twice"),
        (lambda s, x: x.scatter(1, (x > 0).long(), x), r"computed from the inputs' values \(a sc"),
        (lambda s, x: x.scatter_reduce(1, _pairs(x), x, "prod"), "a scatter reducing by 'prod'"),
        (lambda s, x: x.scatter(1, x.topk(1, 1)[1].expand(-1, 3), x), "topk's indices that may"),
        (_two_axes_index, "a write by an index of several axes"),
        (_floats_into_integers, r"torch\.float64 made torch\.int64 \(torch truncates\)"),
        (_nan_by_mask, "a write of NaN by a mask"),
    ],
    ids=["detach", "rounding-cast", "boolean-mask", "nonzero", "long-cumsum", "cumprod-dtype"]
    + ["written-twice", "scatter-by-values", "scatter-product", "scatter-repeated-topk"]
    + ["index-of-two-axes", "floats-into-integers", "nan-by-mask"],
)
def test_what_would_compute_otherwise_than_torch_is_refused_naming_the_op(forward, words):
    """A stopped gradient, a rounding the compiled model would not do, a shape read from the
    values, a running sum too long to write out: refused before any C++ is written, naming the
    op and the model."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, dtype=torch.float64))

        def forward(self, x):
            return forward(self, x)

    with pytest.raises(
        IRError, match=rf"ATen op aten\.\S+ \(node '\w+' in the model \(Net\)\).*{words}"
    ):
        graph_from_export(Net(), torch.randn(3, 4, dtype=torch.float64), "float64")


def test_masks_added_and_multiplied_are_or_and_and_and_match_torch():
    check_against_torch(_Masks(), torch.randn(3, 4, dtype=torch.float64) * 2, loss="mse")


def test_attention_dropout_is_captured_and_follows_the_compiled_models_mode():
    """nn.MultiheadAttention's dropout of its weights, like the encoder layer's nn.Dropouts:
    captured as in training whatever the module's mode, then drawn in cm.train() only."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.25, batch_first=True).double().eval()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    cm = rootclad.compile(layer, x, loss="mse", engine="pullback")
    assert [n.attrs["p"] for n in cm.graph.nodes if n.op == "dropout"] == [0.25] * 4
    assert_close_rel(cm.eval().predict(x), layer(x), 1e-12, "eval: no dropout")
    cm.train()
    assert float((cm(x) - cm(x)).detach().abs().max()) > 0  # a mask drawn per call


class _Reused(nn.Module):
    """A layer listed twice in a Sequential, and a constant written after it is read."""

    def __init__(self):
        super().__init__()
        act, lin = nn.Tanh(), nn.Linear(4, 4)
        self.body = nn.Sequential(lin, act, lin, act)

    def forward(self, x):
        s = torch.ones(4, dtype=x.dtype)
        y = self.body(x) + s  # (a sum: torch's backward keeps no copy of s)
        s.mul_(2)
        return y + x * s


def test_a_layer_listed_twice_and_a_constant_written_after_it_is_read_match_torch():
    check_against_torch(_Reused(), torch.randn(3, 4, dtype=F64), loss="mse")


def test_an_lstm_of_every_option_with_dropout_compiled_in_eval_matches_torch():
    """Two layers, both directions, projections, no biases, dropout between the layers:
    rootclad's decomposition layer by layer (captured as in training, for the dropout), in
    eval mode torch's values and gradients."""
    torch.manual_seed(0)
    options = dict(bias=False, batch_first=True, dropout=0.5, bidirectional=True, proj_size=2)
    lstm = nn.LSTM(3, 5, 2, **options).double().eval()
    from rootclad.frontends.aten.lowering import _Alone

    check_against_torch(_Alone(lstm).eval(), torch.randn(3, 4, 3, dtype=F64), loss="mse")


def test_offsets_into_rows_of_another_arrangement_are_refused():
    """x.permute(1, 0, 2).reshape(N * B, C) holds a sample's rows N apart: torch's
    idx + arange(B) * N reads other samples' rows there."""

    class Mixed(nn.Module):
        def forward(self, x):  # (B, N, C)
            B, N, C = x.shape
            idx = x.topk(2, dim=1).indices.transpose(1, 2)  # (B, C, 2): positions below N
            idx = (idx + torch.arange(0, B).view(-1, 1, 1) * N).reshape(-1)
            return x.permute(1, 0, 2).reshape(N * B, C)[idx].view(B, -1)

    with pytest.raises(IRError, match="does not hold 4 rows of each sample"):
        graph_from_export(Mixed(), torch.randn(3, 4, 4, dtype=F64), "float64")


class _NoGrad(nn.Module):
    """A layer whose forward computes under torch.no_grad(): values (``indices=False``: the
    gradient stops there in torch) or only the indices of the two largest inputs."""

    def __init__(self, indices):
        super().__init__()
        self.fc, self.indices = nn.Linear(4, 4).double(), indices

    def forward(self, x):
        with torch.no_grad():
            picked = x.topk(2, dim=1).indices if self.indices else self.fc(x)
        y = self.fc(x)
        return torch.gather(y, 1, picked) if self.indices else y * picked


def test_a_no_grad_block_of_values_is_refused_naming_its_line_and_one_of_indices_computes():
    x = torch.randn(3, 4, dtype=torch.float64)
    net = nn.Sequential(_NoGrad(indices=False))
    with pytest.raises(
        IRError,
        match=r"Sequential: a torch\.no_grad\(\) block in module '0' \(_NoGrad\), at "
        r"test_aten_export\.py:\d+ 'picked = .*' stops the gradient",
    ):
        graph_from_export(net, x, "float64")
    check_against_torch(nn.Sequential(_NoGrad(indices=True)), x, loss="mse")


class _NoGradOfShapes(nn.Module):
    """A torch.no_grad() block of zeros of the batch's size, a buffer and a comparison's mask:
    no gradient stops there, in torch or compiled."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4).double()
        self.register_buffer("b", torch.ones(4, dtype=torch.float64))

    def forward(self, x):
        with torch.no_grad():
            z = torch.zeros(x.shape[0], 4, dtype=x.dtype) + self.b * 2
            mask = (x > 0).to(x.dtype)
        return self.fc(x) * mask + z


def test_a_no_grad_block_of_shapes_buffers_and_masks_matches_torch():
    check_against_torch(_NoGradOfShapes(), torch.randn(3, 4, dtype=torch.float64), loss="mse")


def test_decompositions_told_only_of_the_composite_ops_they_change_give_torchs_program():
    """capture._run_decompositions names to torch only the composite ops kept whole and the
    recurrent layers decomposed rootclad's way: the program is the one torch's own
    run_decompositions of the whole table makes, and torch's op list is put back after."""
    from torch.export import exported_program

    from rootclad.frontends.aten import capture

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(3, 4, num_layers=2, dropout=0.5, batch_first=True)
            self.bn, self.fc = nn.BatchNorm1d(5), nn.Linear(4, 2)

        def forward(self, x):
            return F.softshrink(self.fc(F.relu_(self.bn(self.rnn(x)[0]))), 0.1).logsumexp(1)

    x, listed = torch.randn(2, 5, 3), exported_program._collect_all_valid_cia_ops
    table = torch.export.default_decompositions()
    table.update(capture._recurrent_decompositions())
    table.pop(torch.ops.aten.linear.default)
    with warnings.catch_warnings():  # (torch.export's own notices: pytree, LSTM weights)
        warnings.simplefilter("ignore")
        dim = {0: torch.export.Dim("batch", min=1)}
        program = torch.export.export(Net(), (x,), dynamic_shapes=(dim,), strict=False)
        theirs = str(program.run_decompositions(dict(table)).graph)
        ours = str(capture._run_decompositions(program, table).graph)
    assert ours == theirs and "aten.linear" in ours and "aten.lstm" not in ours
    assert exported_program._collect_all_valid_cia_ops is listed
