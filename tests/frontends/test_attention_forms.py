"""Attention forms through rootclad.compile (torch.export's core ATen ops, rootclad/frontends/
aten/): what compiles beyond the op cases (tests/fixtures/op_cases.py: products, scaled
dot-product attention, MultiheadAttention, the encoder layers) and matches torch, and what is
refused, naming the ATen op and why."""

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


class Masked(nn.Module):
    """Attention given a mask (5, 5) held as a parameter p: the model's own, not an input."""

    def __init__(self, fn, layer=None):
        super().__init__()
        self.fn, self.layer = fn, nn.Identity() if layer is None else layer
        self.p = nn.Parameter(torch.randn(5, 5, generator=torch.Generator().manual_seed(1)))
        self.double()

    def forward(self, x):
        return self.fn(x, self.p, self.layer)


@pytest.mark.parametrize(
    "fn, layer",
    [
        pytest.param(lambda x, p, m: m(x, x, x, attn_mask=p)[0], _mha(), id="MultiheadAttention"),
        pytest.param(
            lambda x, p, m: m(x, src_mask=p),
            nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
            id="TransformerEncoderLayer",
        ),
        pytest.param(
            lambda x, p, m: F.scaled_dot_product_attention(x, x, x, attn_mask=p),
            None,
            id="scaled_dot_product_attention",
        ),
    ],
)
def test_attention_masks_held_as_parameters_match_torch(fn, layer):
    """A float mask held as a parameter is added to the scores, and has its gradient; padding
    masks and scaled_dot_product_attention's attn_mask given as inputs: tests/torch/test_masks.py."""
    check_against_torch(Masked(fn, layer).eval(), _x(5, 8), F64, engine="pullback", loss="mse")


@pytest.mark.parametrize(
    "fn, layer",
    [
        pytest.param(lambda x, m: m(x, x, x)[1], _mha(), id="weights"),
        pytest.param(
            lambda x, m: m(x, x[..., :4], x[..., :4])[0], _mha(kdim=4, vdim=4), id="kdim-vdim"
        ),
    ],
)
def test_attention_weights_and_keys_of_other_widths_match_torch(fn, layer):
    """MultiheadAttention's weights (averaged over the heads: no gradient reaches out_proj),
    and keys and values of widths kdim, vdim other than the query's."""
    net = Fn(fn, layer).eval()
    check_against_torch(net, _x(5, 8), F64, engine="pullback", loss="mse", against_all=True)


@pytest.mark.parametrize(
    "fn, layer, words",
    [
        # batch_first=False: torch's batch axis would be the second, the samples mixed
        (
            lambda x, m: m(x, x, x)[0],
            _mha(batch_first=False),
            r"aten\.bmm\.default .*\(MultiheadAttention\)\): operands whose batch axes differ",
        ),
        # the bias row of the keys repeated along torch's batch axis, the second
        (
            lambda x, m: m(x, x, x)[0],
            _mha(add_bias_kv=True),
            r"aten\.repeat\.default .*\(MultiheadAttention\)\): a repeat along the batch axis",
        ),
        # a permute moving the batch axis whose result is used whole
        (
            lambda x, m: x.reshape(-1, 5, 2, 4).permute(2, 0, 1, 3).flatten(2),
            None,
            "has its batch axis at axis 1, not first",
        ),
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
    with pytest.raises(IRError, match=r"aten\.linear\.default .*: an empty result"):
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


# torch.export fixes the batch size where it meets another axis: refused naming the line
FIXED = r"fixes the batch size \(at test_\w+\.py:\d+, '"


@pytest.mark.parametrize(
    "fn, xs, p, words",
    [
        # torch lines whole shapes up from the right: the batch axis would meet a head axis
        (lambda s, x, y: x @ y, ((2, 4, 5), (2, 2, 5, 3)), None, FIXED),
        (lambda s, x, y: x @ y, ((2, 2, 4, 5), (2, 5, 3)), None, FIXED),
        (
            lambda s, x, y: x @ y,
            ((1, 5), (1, 2, 5, 3)),
            None,
            r"aten\.expand\.default .*an op over the batch axis mixes the samples",
        ),
        (lambda s, x, y: x @ y + x, ((4, 4), (4, 4)), None, FIXED),
        # a vector value is a matrix whose rows are the samples
        (lambda s, x, y: s.p @ x + y, ((4, 4), (4, 4)), (4,), FIXED),
        (
            lambda s, x, y: (x @ s.p).flatten(1) + y,
            ((2, 5), (2, 6)),
            (2, 5, 3),
            FIXED,
        ),  # fmt: skip
        (
            lambda s, x, y: F.scaled_dot_product_attention(x, y, y),
            ((2, 2, 4, 5), (2, 3, 5)),
            None,
            FIXED,
        ),  # fmt: skip
    ],
)
def test_products_torch_would_take_across_the_batch_are_refused(fn, xs, p, words):
    """Each of these agrees with torch's shapes at some batch size and mixes samples."""
    net = _Two(fn, None if p is None else _t(*p))
    with pytest.raises(IRError, match=words):
        rootclad.compile(net, tuple(_t(*s) for s in xs), engine="pullback")


def test_a_layer_with_a_forward_of_its_own_inside_an_encoder_matches_torch():
    """The encoder runs its layer's own forward (a subclass's), as torch does."""

    class Doubled(nn.TransformerEncoderLayer):
        def forward(self, src, *args, **kwargs):
            return super().forward(src, *args, **kwargs) * 2.0

    enc = nn.TransformerEncoder(Doubled(8, 2, 16, 0.0, batch_first=True), 1,
                                enable_nested_tensor=False)  # fmt: skip
    net = Fn(lambda x, m: m(x), enc).eval()
    check_against_torch(net, _x(5, 8), F64, engine="pullback", loss="mse")


def test_bare_multihead_attention_takes_query_key_and_value():
    torch.manual_seed(0)
    mha = _mha().double().eval()
    q, kv = _x(5, 8), _x(3, 8)
    cm = rootclad.compile(mha, (q, kv, 2 * kv), engine="pullback")
    # what torch's forward gives: the output and the weights averaged over the heads
    torch.testing.assert_close(cm(q, kv, 2 * kv), mha(q, kv, 2 * kv), rtol=1e-12, atol=1e-12)
    with pytest.raises(IRError) as err:  # torch's batch axis the second: the samples mixed
        rootclad.compile(_mha(batch_first=False).double(), (q, q, q), engine="pullback")
    assert "aten.bmm.default" in str(err.value) and "batch axes differ" in str(err.value)
    assert "block" not in str(err.value)  # no wrapper of rootclad's named
