"""Attention in the torch front-end (rootclad/frontends/fx_attention.py): what compiles beyond
the op cases (tests/fixtures/op_cases.py: products, scaled dot-product attention,
MultiheadAttention, the encoder layers), and what is refused, naming the call."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import check_against_torch
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.ir.graph import Graph, IRError, Node

F64 = torch.float64


class Fn(nn.Module):
    def __init__(self, fn, *layers):
        super().__init__()
        self.fn, self.layers = fn, nn.ModuleList(layers)
        self.double()

    def forward(self, x):
        return self.fn(x, *self.layers)


def _x(*shape, B=3):
    return torch.randn(B, *shape, dtype=F64, generator=torch.Generator().manual_seed(0))


def _mha(**kw):
    return nn.MultiheadAttention(8, 2, batch_first=kw.pop("batch_first", True), **kw)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: _mha().double(), id="MultiheadAttention"),
        pytest.param(
            lambda: nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True).double(),
            id="TransformerEncoderLayer",
        ),  # fmt: skip
        pytest.param(
            lambda: nn.TransformerEncoderLayer(
                8, 2, 16, 0.0, activation=nn.SiLU(), batch_first=True, norm_first=True
            ).double(),
            id="TransformerEncoderLayer-module-activation",
        ),  # fmt: skip
    ],
)
def test_an_attention_block_compiles_on_its_own(build):
    """A bare block is the model (MultiheadAttention: self-attention of its one input)."""
    torch.manual_seed(0)
    net = build().eval()
    cm = check_against_torch(Fn(lambda x, m: m(x, x, x, need_weights=False)[0], net)
                             if isinstance(net, nn.MultiheadAttention) else net,
                             _x(5, 8), F64, engine="pullback")  # fmt: skip
    alone = rootclad.compile(net, _x(5, 8), engine="pullback")
    x = _x(5, 8, B=2)
    want = net(x, x, x)[0] if isinstance(net, nn.MultiheadAttention) else net(x)
    torch.testing.assert_close(alone(x), want, rtol=1e-12, atol=1e-12)
    assert [n for n, _ in alone.named_parameters()] == [n for n, _ in net.named_parameters()]
    assert cm.engine == "pullback"


class Fn2(nn.Module):
    """Attention given a mask: a second input of the model (k), or a parameter (p)."""

    def __init__(self, fn, layer):
        super().__init__()
        self.fn, self.layer = fn, layer.double()
        self.p = nn.Parameter(torch.zeros(5, 5, dtype=F64))

    def forward(self, x, mask):
        return self.fn(x, mask, self.p, self.layer)


@pytest.mark.parametrize(
    "fn, layer, words",
    [
        (lambda x, k, p, m: m(x, x, x, attn_mask=p)[0], _mha(), "attn_mask is not supported"),
        (
            lambda x, k, p, m: m(x, src_mask=p),
            nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
            "src_mask is not supported",
        ),  # fmt: skip
        (
            lambda x, k, p, m: F.scaled_dot_product_attention(x, x, x, attn_mask=p),
            _mha(),
            "attn_mask is not a value with the batch axis",
        ),  # fmt: skip
    ],
)
def test_attention_masks_are_refused_naming_them(fn, layer, words):
    """Masks that are not inputs (a parameter here) are refused; padding masks and
    scaled_dot_product_attention's attn_mask given as inputs compile (tests/torch/test_masks.py)."""
    net = Fn2(fn, layer).eval()
    with pytest.raises(IRError, match=words):
        rootclad.compile(net, (_x(5, 8), _x(5, 5)), engine="pullback")


@pytest.mark.parametrize(
    "fn, layer, words",
    [
        (lambda x, m: m(x, x, x)[1], _mha(), "weights are not"),
        (lambda x, m: m(x, x, x)[0], _mha(batch_first=False), "batch_first=False"),
        (lambda x, m: m(x, x[..., :4], x[..., :4])[0], _mha(kdim=4, vdim=4), "kdim"),
        (lambda x, m: m(x, x, x)[0], _mha(add_bias_kv=True), "add_bias_kv"),
        # a permute moving the batch axis whose result is used whole
        (lambda x, m: x.reshape(3, 5, 2, 4).permute(2, 0, 1, 3).flatten(2), None, "batch axis"),
    ],
)
def test_attention_forms_not_supported_are_refused_naming_them(fn, layer, words):
    net = Fn(fn, layer if layer is not None else nn.Identity()).eval()
    with pytest.raises(IRError, match=words):
        rootclad.compile(net, _x(5, 8), engine="pullback")


def test_a_product_whose_leading_axes_differ_is_refused_naming_the_node():
    g = Graph(["a", "b"], [(2, 3, 4), (3, 4, 5)], [Node("mm", "matmul", ["a", "b"])], "mm",
              [], "float64")  # fmt: skip
    with pytest.raises(IRError, match=r"mm \(matmul\).*leading axes"):
        g.validate()
    g = Graph(["a", "b"], [(2, 3, 4), (1, 5, 6)], [Node("mm", "matmul", ["a", "b"])], "mm",
              [], "float64")  # fmt: skip
    with pytest.raises(IRError, match=r"mm \(matmul\).*do not multiply"):
        g.validate()


class _Defaults(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2).double()

    def forward(self, x, mask=None, scale=2.0, is_causal=False):
        if mask is not None or is_causal:
            x = x * 0
        return self.fc(x) * scale


def test_forward_arguments_with_defaults_are_fixed_at_them():
    """timm's forward(x, attn_mask=None): the compiled model takes the input alone."""
    net = _Defaults()
    check_against_torch(net, _x(4), F64, engine="pullback")


def test_an_input_with_an_empty_axis_is_refused():
    with pytest.raises(IRError, match="empty axis"):
        rootclad.compile(nn.Linear(4, 2).double(), torch.zeros(2, 0, 4, dtype=F64))


class _Two(nn.Module):
    """A product of two inputs, or of an input and a parameter p."""

    def __init__(self, fn, p=None):
        super().__init__()
        self.fn = fn
        if p is not None:
            self.p = nn.Parameter(p)
        self.double()

    def forward(self, x, y):
        return self.fn(self, x, y)


def _t(*shape):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(len(shape)))


@pytest.mark.parametrize(
    "fn, xs, p",
    [
        pytest.param(lambda s, x, y: x @ s.p + y, ((2, 5), (2, 3)), (5, 3), id="vector-by-matrix"),
        pytest.param(lambda s, x, y: x @ s.p + y, ((2, 4, 5), (2, 4)), (5,), id="matrix-by-vector"),
        pytest.param(
            lambda s, x, y: s.p @ x + y, ((2, 5, 3), (2, 3)), (5,), id="vector-on-the-left"
        ),
        pytest.param(
            lambda s, x, y: x @ s.p + y, ((2, 4, 1), (2, 4, 3)), (1, 3), id="outer-by-1xN"
        ),
        pytest.param(
            lambda s, x, y: x @ s.p + y,
            ((2, 2, 4, 5), (2, 2, 4, 3)),
            (2, 5, 3),
            id="per-head-parameter",
        ),  # fmt: skip
        pytest.param(
            lambda s, x, y: x @ s.p + y,
            ((2, 2, 4), (2, 2, 5)),
            (1, 4, 5),
            id="leading-1-meets-the-batch",
        ),  # fmt: skip
        pytest.param(
            lambda s, x, y: s.p @ x + y,
            ((2, 2, 4), (2, 3, 4)),
            (1, 3, 2),
            id="leading-1-on-the-left",
        ),  # fmt: skip
        pytest.param(
            lambda s, x, y: (x @ s.p)[:, None] * y, ((2, 4), (2, 3)), (4,), id="dot-per-sample"
        ),  # fmt: skip
        pytest.param(
            lambda s, x, y: F.scaled_dot_product_attention(x, y, y, scale=0.0),
            ((2, 4, 5), (2, 3, 5)),
            None,
            id="sdpa-scale-0",
        ),  # fmt: skip
    ],
)
def test_products_with_parameters_and_vectors_match_torch(fn, xs, p):
    net = _Two(fn, None if p is None else _t(*p))
    x, y = (_t(*s).requires_grad_(True) for s in xs)
    cm = rootclad.compile(net, (x.detach(), y.detach()), engine="pullback")
    out, ref = cm(x, y), net(x, y)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    d = torch.randn_like(ref)
    got = torch.autograd.grad(out, [x, y, *cm.parameters()], d)
    want = torch.autograd.grad(ref, [x, y, *net.parameters()], d)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "fn, xs, p, words",
    [
        # torch lines whole shapes up from the right: the batch axis would meet a head axis
        (lambda s, x, y: x @ y, ((2, 4, 5), (2, 2, 5, 3)), None, "the same rank"),
        (lambda s, x, y: x @ y, ((2, 2, 4, 5), (2, 5, 3)), None, "the same rank"),
        (lambda s, x, y: x @ y, ((1, 5), (1, 2, 5, 3)), None, "the same rank"),
        (lambda s, x, y: x @ y + x, ((4, 4), (4, 4)), None, "the same rank, at least"),
        # a vector value is a matrix whose rows are the samples
        (lambda s, x, y: s.p @ x + y, ((4, 4), (4, 4)), (4,), "along the batch axis"),
        (
            lambda s, x, y: (x @ s.p).flatten(1) + y,
            ((2, 5), (2, 6)),
            (2, 5, 3),
            "along the batch axis",
        ),  # fmt: skip
        (
            lambda s, x, y: F.scaled_dot_product_attention(x, y, y),
            ((2, 2, 4, 5), (2, 3, 5)),
            None,
            "the same rank",
        ),  # fmt: skip
    ],
)
def test_products_torch_would_take_across_the_batch_are_refused(fn, xs, p, words):
    """Each of these agrees with torch's shapes at some batch size and mixes samples."""
    net = _Two(fn, None if p is None else _t(*p))
    with pytest.raises(IRError, match=words):
        rootclad.compile(net, tuple(_t(*s) for s in xs), engine="pullback")


def test_a_layer_with_a_forward_of_its_own_inside_an_encoder_is_refused():
    class Doubled(nn.TransformerEncoderLayer):
        def forward(self, src, *args, **kwargs):
            return super().forward(src, *args, **kwargs) * 2.0

    enc = nn.TransformerEncoder(Doubled(8, 2, 16, 0.0, batch_first=True), 1,
                                enable_nested_tensor=False)  # fmt: skip
    net = Fn(lambda x, m: m(x), enc).eval()
    with pytest.raises(IRError, match="forward of its own"):
        rootclad.compile(net, _x(5, 8), engine="pullback")


def test_bare_multihead_attention_takes_query_key_and_value():
    torch.manual_seed(0)
    mha = _mha().double().eval()
    q, kv = _x(5, 8), _x(3, 8)
    cm = rootclad.compile(mha, (q, kv, 2 * kv), engine="pullback")
    torch.testing.assert_close(cm(q, kv, 2 * kv), mha(q, kv, 2 * kv)[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(IRError) as err:  # named as the user's layer, not rootclad's wrapper
        rootclad.compile(_mha(batch_first=False).double(), q, engine="pullback")
    assert "batch_first=False" in str(err.value) and "block" not in str(err.value)
