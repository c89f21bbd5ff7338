"""Attention's masks, taken as inputs of the model (fixtures/op_cases.py MASK_CASES): a
torch.bool mask (0s and 1s inside), or a float one torch adds to the scores. Each case against
torch autograd: the output, the values' gradient, a float mask's gradient and every
parameter's, on the pullback and clad engines and the device kernels (host loops); rows that
a mask empties give NaN where torch's do; what stays unsupported is refused naming the call."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, perturbed
from fixtures.op_cases import MASK_CASES, Fn, MaskedFill, PaddedAttention, mask_input
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.compiler import compile_device
from rootclad.ir.graph import IRError

F64 = torch.float64
CASES = [pytest.param(build, shapes, kind, id=name) for name, build, shapes, kind in MASK_CASES]


def _vjp(fn, params, xs, d_out):
    """fn's output and the gradients of the float inputs and of ``params`` for ``d_out``."""
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
    out = fn(*xs)
    wrt = [x for x in xs if x.requires_grad] + list(params)
    grads = torch.autograd.grad(out, wrt, d_out.to(out.dtype), allow_unused=True)
    n = sum(x.requires_grad for x in xs)
    return out.detach(), grads[:n], grads[n:]


def _check(cm, net, xs, dtype, rtol):
    ref = copy.deepcopy(net).to(dtype).double()
    xs64 = [x.double() if x.is_floating_point() else x for x in xs]
    out_ref = ref(*xs64)
    d_out = torch.randn(out_ref.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    out_ref, dx_ref, dp_ref = _vjp(ref, list(ref.parameters()), xs64, d_out)
    out, dx, dp = _vjp(cm, list(cm.parameters()), xs, d_out)
    assert out.dtype == dtype
    assert_close_rel(out, out_ref, rtol, "forward")
    for i, (a, e) in enumerate(zip(dx, dx_ref, strict=True)):
        assert_close_rel(a, e, rtol, f"d_input {i}")
    names = [n for n, _ in ref.named_parameters()]
    if names:
        actual, expected = (dict(zip(names, g, strict=True)) for g in (dp, dp_ref))
        assert_grads_close(actual, expected, rtol, "parameters", against_all=True)


@pytest.mark.parametrize("build, shapes, kind", CASES)
def test_mask_case_matches_torch(build, shapes, kind):
    torch.manual_seed(0)
    net = build()
    xs = mask_input(shapes, kind)
    cm = rootclad.compile(copy.deepcopy(net), example_input=xs, loss="mse", engine="pullback")
    _check(cm, net, xs, F64, 1e-9)
    if kind != "add":  # the same model at another batch size, float32 values
        xs = mask_input(shapes, kind, B=5, seed=2)
        xs32 = (xs[0].float(), xs[1])
        cm = rootclad.compile(copy.deepcopy(net).float(), example_input=xs32, loss="mse")
        _check(cm, net, xs32, torch.float32, 1e-4)


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", [True, False])
@pytest.mark.parametrize("build, shapes, kind", CASES)
def test_mask_case_on_the_clad_engine_matches_torch(clad, build, shapes, kind, pullbacks):
    torch.manual_seed(0)
    net = build()
    xs = mask_input(shapes, kind)
    cm = rootclad.compile(copy.deepcopy(net), example_input=xs, loss="mse", engine="clad",
                          pullbacks=pullbacks)  # fmt: skip
    assert cm.engine == "clad"
    _check(cm, net, xs, F64, 1e-9)


@pytest.mark.parametrize("build, shapes, kind", CASES)
def test_mask_case_on_the_device_kernels_matches_torch(build, shapes, kind):
    """The device program's kernels, run as host loops (tests/cuda runs them on a GPU)."""
    torch.manual_seed(0)
    net = build()
    xs = mask_input(shapes, kind)
    dm = compile_device(copy.deepcopy(net), xs, device="cpu", loss="mse")
    assert_close_rel(dm.predict(*xs), net(*xs), 1e-10, "forward")
    y = torch.randn(net(*xs).shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    loss, grads = dm.loss_and_grad(xs, y)
    loss_ref = F.mse_loss(net(*xs), y)
    assert_close_rel(loss, loss_ref.detach(), 1e-10, "loss")
    if list(net.parameters()):
        names = [n for n, _ in net.named_parameters()]
        grads_ref = torch.autograd.grad(loss_ref, list(net.parameters()))
        assert_grads_close(grads, dict(zip(names, grads_ref, strict=True)), 1e-9, "mse",
                           against_all=True)  # fmt: skip
    d_x = dm.input_grad(*xs, d_out=y)[0]
    x = xs[0].detach().clone().requires_grad_(True)
    (d_ref,) = torch.autograd.grad(net(x, xs[1]), [x], y)
    assert_close_rel(d_x, d_ref, 1e-10, "d_input")


class _Emptied(nn.Module):
    """Attention in which the second sample's third query (or every query) has no key."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.mha = nn.MultiheadAttention(4, 2, batch_first=True)
        layer = nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, x, mask):  # mask (B, 4, 4), True: a query-key pair that attends
        pad = ~mask[:, 0]  # the first query's keys: (B, 4), True masks a key
        if self.how == "sdpa":
            return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
        if self.how == "explicit":
            scores = (x @ x.transpose(1, 2)).masked_fill(~mask, float("-inf"))
            return torch.softmax(scores, -1)
        if self.how == "mha-weights":
            return self.mha(x, x, x, key_padding_mask=pad)[0]
        if self.how == "mha":
            return self.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        return self.encoder(x, src_key_padding_mask=pad)


@pytest.mark.parametrize("how", ["sdpa", "explicit", "mha-weights", "mha", "encoder"])
def test_queries_a_mask_leaves_no_key_match_torch(how):
    """torch's scaled_dot_product_attention (and MultiheadAttention with need_weights=False,
    and the encoders, which run through it) gives 0s to a query whose keys are all masked
    (its safe softmax, from torch 2.5); a softmax of masked_fill written out, and
    MultiheadAttention asked for its weights, give NaN. rootclad follows each: the NaN
    pattern equal, the rest close, on the CPU and the device kernels (host loops)."""
    torch.manual_seed(0)
    net = _Emptied(how).double().eval()
    x = torch.randn(3, 4, 4, dtype=F64)
    mask = torch.rand(3, 4, 4) > 0.4
    mask[..., 0] = True
    mask[1, 2] = False  # the second sample's third query: no key
    mask[2, 0] = False  # the third sample's first query, whose keys give the padding: none
    ref = net(x, mask)
    assert torch.isnan(ref).any() == (how in ("explicit", "mha-weights"))
    cm = rootclad.compile(copy.deepcopy(net), example_input=(x, mask), loss="mse")
    dm = compile_device(copy.deepcopy(net), (x, mask), device="cpu", loss="mse")
    for out in (cm(x, mask), dm(x, mask)):
        assert torch.equal(torch.isnan(out), torch.isnan(ref))
        keep = ~torch.isnan(ref)
        assert_close_rel(out[keep], ref[keep], 1e-12, how)
    if how in ("sdpa", "mha", "encoder"):  # finite: the gradients too, against torch's
        xs = x.clone().requires_grad_(True)
        d_out = torch.randn(ref.shape, dtype=F64)
        (want,) = torch.autograd.grad(net(xs, mask), [xs], d_out)
        for model in (cm, dm):
            got = model.input_grad(x, mask, d_out=d_out)
            assert got[1] is None  # a torch.bool mask has no gradient
            assert_close_rel(got[0], want, 1e-10, f"{how} d_input")


def test_a_row_of_masked_fill_all_masked_gives_torchs_gradient_on_the_device_kernels():
    """A NaN row (softmax of all -inf) sends NaN back to the masked positions, where
    masked_fill stops it: 0 there in torch, and on the CPU and the device kernels."""
    net = MaskedFill()
    x, mask = mask_input(((4, 6), (4, 6)), "fill")
    mask[1, 2] = True
    d_out = torch.randn(3, 4, 6, dtype=F64)
    xs = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(net(xs, mask), [xs], d_out)
    cm = rootclad.compile(net, example_input=(x, mask), loss="mse", engine="pullback")
    dm = compile_device(net, (x, mask), device="cpu", loss="mse")
    for model in (cm, dm):
        got = model.input_grad(x, mask, d_out=d_out)[0]
        assert torch.equal(torch.isnan(got), torch.isnan(want)), type(model).__name__
        keep = ~torch.isnan(want)
        assert_close_rel(got[keep], want[keep], 1e-12, type(model).__name__)


def test_masks_under_autograd_on_the_device_kernels():
    """DeviceModel(x, mask) under torch autograd (the mask converted once, where it is used)."""
    net = MaskedFill()
    x, mask = mask_input(((4, 6), (4, 6)), "fill")
    dm = compile_device(net, (x, mask), device="cpu", loss="mse")
    xs = x.clone().requires_grad_(True)
    out = dm(xs, mask)
    assert_close_rel(out, net(x, mask), 1e-12, "forward")
    d_out = torch.randn(out.shape, dtype=F64)
    (got,) = torch.autograd.grad(out, [xs], d_out)
    x2 = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(net(x2, mask), [x2], d_out)
    assert_close_rel(got, want, 1e-12, "d_input")


def test_a_mask_is_given_as_torch_bool():
    x, mask = mask_input(((4, 6), (4, 6)), "fill")
    cm = rootclad.compile(MaskedFill(), example_input=(x, mask), loss="mse", engine="pullback")
    with pytest.raises(TypeError, match=r"input 1 is a mask: .*torch.bool.*got torch.float64"):
        cm(x, mask.double())
    assert_close_rel(cm.predict(x, mask), MaskedFill()(x, mask), 1e-12)


class _ConstantMask(nn.Module):
    def forward(self, x):
        mask = torch.ones(4, 4, dtype=torch.bool).tril()
        return x.masked_fill(mask, float("-inf"))


class _MhaAttnMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x, mask):
        return self.a(x, x, x, attn_mask=mask, need_weights=False)[0]


class _FillValue(nn.Module):
    def forward(self, x, mask):
        return x.masked_fill(mask, -1e9)


class _OrMasks(nn.Module):
    def forward(self, x, mask):  # torch's bool + bool: or
        return x * (mask + mask).float()


class _LowRankMask(nn.Module):
    def forward(self, x, mask):  # (B, L, S) scores, a (B, S) mask: torch meets B with L
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)


@pytest.mark.parametrize(
    "net, inputs, words",
    [
        (_MhaAttnMask(), lambda x, m: (x, m[0, :4, :4]), ["fixes the batch size"]),
        (_LowRankMask(), lambda x, m: (x, m[:, 0, :4]), ["fixes the batch size"]),
    ],
)
def test_unsupported_masks_are_refused_naming_the_call(net, inputs, words):
    x = torch.randn(4, 4, 4, dtype=F64)  # a batch of 4: torch meets it with 4 queries
    m = torch.rand(4, 4, 6) > 0.5
    with pytest.raises(IRError) as err:
        rootclad.compile(net.double(), example_input=inputs(x, m), engine="pullback")
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "net, inputs",
    [
        (_ConstantMask(), lambda x, m: (x,)),
        (_FillValue(), lambda x, m: (x, m)),
        (_OrMasks(), lambda x, m: (x, m)),
    ],
    ids=["constant-mask", "fill-value", "bool-plus-bool"],
)
def test_a_constant_mask_a_finite_fill_value_and_masks_added_match_torch(net, inputs):
    """The values (-inf where the constant mask fills; 1 where either mask added is, torch's
    or) and their gradient, exactly as torch's."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, 4, dtype=F64, generator=gen)
    xs = inputs(x, torch.rand(4, 4, 4, generator=gen) > 0.5)
    cm = rootclad.compile(net.double(), example_input=xs, loss="mse", engine="pullback")
    d_out = torch.randn(4, 4, 4, dtype=F64, generator=gen)
    (out, (dx,), _), (out_ref, (dx_ref,), _) = (_vjp(m, [], xs, d_out) for m in (cm, net))
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-12, atol=0)


def test_the_padding_mask_reaches_every_layer_of_an_encoder():
    """A padded key changes nothing of the others' outputs in any layer: the same model on the
    unpadded tokens alone agrees (torch's reference, and rootclad's against it)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    net = PaddedAttention(nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)).double()
    x = torch.randn(2, 5, 8, dtype=F64)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[:, 3:] = True
    cm = rootclad.compile(net.eval(), example_input=(x, pad), loss="mse", engine="pullback")
    short = net(x[:, :3], pad[:, :3])
    assert_close_rel(cm(x, pad)[:, :3], short, 1e-12, "the unpadded tokens")


class _TokenMask(nn.Module):
    """Token ids with a padding id: the key padding mask and the mean's weights are ids == 0
    and ids != 0, computed in forward."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8, padding_idx=0)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, ids):
        h = self.enc(self.emb(ids), src_key_padding_mask=ids == 0)
        keep = (ids != 0).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


class _ZeroPadding(nn.Module):
    """Padded particles found as those whose features are all zero (a loader's padding)."""

    def __init__(self):
        super().__init__()
        self.phi = nn.Linear(3, 4)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x):
        h = self.phi(x)
        return self.attn(h, h, h, key_padding_mask=x.abs().sum(-1) == 0, need_weights=False)[0]


def test_masks_computed_from_token_ids_match_torch():
    torch.manual_seed(0)
    ids = torch.randint(1, 10, (4, 6), generator=torch.Generator().manual_seed(1))
    ids[0, 4:] = ids[2, 5] = 0
    net = perturbed(_TokenMask().double()).eval()
    cm = rootclad.compile(copy.deepcopy(net), ids, loss="mse", engine="pullback")
    assert_close_rel(cm.predict(ids), net(ids), 1e-12, "forward")
    d_out = torch.randn(4, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    _, grads = cm.loss_and_grad(ids, d_out)
    ref = torch.autograd.grad(F.mse_loss(net(ids), d_out), list(net.parameters()))
    names = [n for n, _ in net.named_parameters()]
    assert_grads_close(grads, dict(zip(names, ref, strict=True)), 1e-9, "parameters",
                       against_all=True)  # fmt: skip


def test_a_padding_mask_computed_from_zero_features_matches_torch():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    x[0, 3:] = 0
    net = perturbed(_ZeroPadding().double()).eval()
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="pullback")
    xr = x.clone().requires_grad_(True)
    out = net(xr)
    d_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (want,) = torch.autograd.grad(out, [xr], d_out)
    assert_close_rel(cm.predict(x), out.detach(), 1e-12, "forward")
    assert_close_rel(cm.input_grad(x, d_out=d_out), want, 1e-12, "d_x")


def test_a_comparison_with_nan_is_refused_naming_the_node():
    with pytest.raises(IRError, match="comparison with NaN"):
        rootclad.compile(Fn(lambda x: x * (x == float("nan")).float()), torch.randn(2, 4),
                         loss="mse", engine="pullback")  # fmt: skip
