"""Causal attention masks (issue 27): ``is_causal=True``, and constant masks built in
``forward`` or held as buffers (``nn.Transformer.generate_square_subsequent_mask``,
``torch.ones(L, L).triu(1)``, offsets other than 0, key and query lengths that differ),
through scaled_dot_product_attention, nn.MultiheadAttention, the encoders and masked_fill,
each mask held as a constant of the compiled model (rootclad/frontends/aten/constants.py);
against torch autograd on both engines, in float32, on the device kernels, beside a padding
mask, and for 20 Adam steps of a small causal transformer. Constant masks that are not
causal, and other constants, are held as computed too, and match torch."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, check_against_torch, perturbed
from fixtures.op_cases import Fn
from torch import nn
from torch.nn import functional as F

import rootclad
from rootclad.compiler import compile_device

F64 = torch.float64


class Decoder(nn.Module):
    """A causal transformer over a sequence (B, L, F): embedded, two encoder layers under
    generate_square_subsequent_mask (is_causal=True), a head per position."""

    def __init__(self, features=3, width=8, norm_first=False):
        super().__init__()
        self.embed = nn.Linear(features, width)
        layer = nn.TransformerEncoderLayer(width, 2, 16, dropout=0.0, batch_first=True,
                                           norm_first=norm_first)  # fmt: skip
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), dtype=x.dtype)
        return self.head(self.encoder(self.embed(x), mask=mask, is_causal=True))


class MhaBuffer(nn.Module):
    """nn.MultiheadAttention with a boolean causal mask registered as a buffer (True masks)."""

    def __init__(self, L=6, offset=0):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.register_buffer("mask", torch.ones(L, L, dtype=torch.bool).triu(offset + 1))

    def forward(self, x):
        return self.attn(x, x, x, attn_mask=self.mask, need_weights=False)[0]


class Padded(nn.Module):
    """A causal mask and a key padding mask (an input) in one layer."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x, padding):  # both masks boolean: True masks
        mask = torch.ones(6, 6, dtype=torch.bool).triu(1)
        return self.layer(x, src_mask=mask, src_key_padding_mask=padding)


def _cross(x):  # 6 queries, 4 keys: torch's is_causal keeps j <= i (top-left)
    return F.scaled_dot_product_attention(x, x[:, :4] * 2, x[:, :4] + 1, is_causal=True)


def _fill(x):  # scores masked above the second diagonal: offset 1
    s = x @ x.transpose(1, 2)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(2)
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ x


def _sdpa_bool(x):  # a boolean attn_mask: True attends
    keep = torch.ones(6, 6, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(x, x, x, attn_mask=keep)


MODELS = {
    "decoder": lambda: Decoder(),
    "decoder-norm-first": lambda: Decoder(norm_first=True),
    "mha-buffer": lambda: MhaBuffer(),
    "mha-buffer-offset-minus-1": lambda: MhaBuffer(offset=-1),
    "sdpa-cross": lambda: Fn(_cross),
    "masked-fill-offset-1": lambda: Fn(_fill),
    "sdpa-bool-constant": lambda: Fn(_sdpa_bool),
}


def _x(name, B=3, seed=1):
    F_ = 3 if name.startswith("decoder") else 8
    return torch.randn(B, 6, F_, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _check(cm, net, x, rtol, what):
    ref = copy.deepcopy(net).to(x.dtype).double()
    xr = x.double().requires_grad_(True)
    out_ref = ref(xr)
    d_out = torch.randn(out_ref.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    dx_ref, *dp_ref = torch.autograd.grad(out_ref, [xr, *ref.parameters()], d_out)
    xc = x.clone().requires_grad_(True)
    out = cm(xc)
    dx, *dp = torch.autograd.grad(out, [xc, *cm.parameters()], d_out.to(x.dtype))
    assert_close_rel(out, out_ref, rtol, f"{what} forward")
    assert_close_rel(dx, dx_ref, rtol, f"{what} d_x")
    names = [n for n, _ in ref.named_parameters()]
    if names:
        assert_grads_close(dict(zip(names, dp, strict=True)),
                           dict(zip(names, dp_ref, strict=True)), rtol, what, against_all=True)  # fmt: skip


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("engine", ["pullback", pytest.param("clad", marks=pytest.mark.clad)])
@pytest.mark.parametrize("name", MODELS)
def test_causal_attention_matches_torch(name, engine, dtype, request):
    if engine == "clad":
        request.getfixturevalue("clad")
    torch.manual_seed(0)
    net = perturbed(MODELS[name]().double()).eval()
    x = _x(name).to(dtype)
    cm = rootclad.compile(copy.deepcopy(net).to(dtype), x, loss="mse", engine=engine)
    masks = [c for c in cm.graph.constants.values() if tuple(c.shape[-2:]) in ((6, 6), (6, 4))]
    assert masks, "the (L, S) mask, held as a constant"
    _check(cm, net, x, 1e-9 if dtype == F64 else 1e-4, name)


def test_a_future_position_changes_nothing_before_it():
    """The decoder's output at position i does not depend on the inputs after i."""
    torch.manual_seed(0)
    net = Decoder().double().eval()
    x = _x("decoder")
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    y = x.clone()
    y[:, 4:] += 1.0
    a, b = cm.predict(x), cm.predict(y)
    assert torch.equal(a[:, :4], b[:, :4]) and not torch.equal(a[:, 4:], b[:, 4:])


def test_a_causal_mask_beside_a_padding_mask_matches_torch():
    torch.manual_seed(0)
    net = perturbed(Padded().double()).eval()
    x = _x("padded")
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, 4:] = padding[2, 5] = True
    cm = rootclad.compile(copy.deepcopy(net), (x, padding), loss="mse", engine="pullback")
    xr = x.clone().requires_grad_(True)
    out = net(xr, padding)
    d_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (want,) = torch.autograd.grad(out, [xr], d_out)
    assert_close_rel(cm.predict(x, padding), out.detach(), 1e-10, "forward")
    assert_close_rel(cm.input_grad(x, padding, d_out=d_out)[0], want, 1e-10, "d_x")


@pytest.mark.parametrize("name", ["decoder", "mha-buffer-offset-minus-1", "sdpa-cross"])
def test_causal_attention_on_the_device_kernels(name):
    """The device program's masked attention, the mask a constant (its host loops here, a GPU
    where there is one)."""
    torch.manual_seed(0)
    net = perturbed(MODELS[name]().double()).eval()
    x = _x(name)
    dm = compile_device(copy.deepcopy(net), x, device="cpu", loss="mse")
    assert_close_rel(dm.predict(x), net(x), 1e-10, "forward")
    d_out = torch.randn(net(x).shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    xr = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(net(xr), [xr], d_out)
    assert_close_rel(dm.input_grad(x, d_out=d_out), want, 1e-10, "d_x")


def test_causal_transformer_training_tracks_torch_optim():
    torch.manual_seed(0)
    net = Decoder().double().train()
    x = _x("decoder", B=16, seed=3)
    y = torch.randn(16, 6, 1, dtype=F64, generator=torch.Generator().manual_seed(5))
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    ref = copy.deepcopy(net)
    opt, opt_ref = rootclad.optim.Adam(cm, lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(20):
        idx = torch.arange(step % 2 * 8, step % 2 * 8 + 8)
        loss = cm.train_step(x[idx], y[idx], opt)
        opt_ref.zero_grad()
        ref_loss = F.mse_loss(ref(x[idx]), y[idx])
        ref_loss.backward()
        opt_ref.step()
        assert abs(loss - ref_loss.item()) <= 1e-9 * abs(ref_loss.item()), step
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        assert_close_rel(p.detach(), q.detach(), 1e-8, k)


def _sliding(x):  # a band, not a causal mask
    keep = torch.ones(6, 6, dtype=torch.bool).tril() & torch.ones(6, 6, dtype=torch.bool).triu(-2)
    return F.scaled_dot_product_attention(x, x, x, attn_mask=keep)


def _bias(x):  # an additive constant that is not 0 / -inf
    return F.scaled_dot_product_attention(x, x, x, attn_mask=torch.ones(6, 6, dtype=x.dtype))


def _features(x):  # a (1, F) mask over the features, not the keys
    return torch.softmax(x.masked_fill(torch.ones(1, 8, dtype=torch.bool).triu(4), -math.inf), -1)


def _one_axis(x):  # a mask of one axis, on a flattened value
    return torch.softmax(x.flatten(1).masked_fill(torch.arange(48) % 5 == 0, -math.inf), -1)


NOT_CAUSAL = {
    "sliding-window": _sliding,
    "constant-bias": _bias,
    "constant-elsewhere": lambda x: x + torch.ones(6, 8, dtype=x.dtype),
    "mask-over-features": _features,
    "mask-of-one-axis": _one_axis,
}


@pytest.mark.parametrize("name", NOT_CAUSAL)
def test_constants_that_are_not_causal_masks_are_held_and_match_torch(name):
    """Any constant is held as torch computes it (a band, a bias, a mask of another shape)."""
    cm = check_against_torch(Fn(NOT_CAUSAL[name]), _x("x"), F64, loss="mse")
    assert cm.graph.constants, "the constant, held"


@pytest.mark.parametrize("fn", [_cross, _fill], ids=["sdpa-cross", "masked-fill-offset-1"])
def test_causal_masks_through_onnx_match_onnxruntime(fn):
    """torch's exporter writes the mask as constants (Expand, Trilu, Equal, Where) added to
    the scores: computed once, held by the compiled model."""
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import export, run_ort

    x = _x("x").float()
    model = export(Fn(fn), x, opset=18)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert cm.graph.constants, "the mask, held"
    assert_close_rel(cm.predict(x), torch.from_numpy(run_ort(model, x.numpy())), 1e-5, "forward")


def _band_fill(x):  # a band of 3 around the diagonal filled: not causal
    s = x @ x.transpose(1, 2)
    band = torch.ones(6, 6, dtype=torch.bool).triu(-1) & torch.ones(6, 6, dtype=torch.bool).tril(1)
    return torch.softmax(s.masked_fill(band, float("-inf")), -1) @ x


def test_a_constant_mask_that_is_not_causal_computes_through_onnx():
    """Any constant mask in a file is the file's: held as computed, not read as causal."""
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import export, run_ort

    x = _x("x").float()
    model = export(Fn(_band_fill), x, opset=18)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert cm.graph.constants, "the band, held"
    assert_close_rel(cm.predict(x), torch.from_numpy(run_ort(model, x.numpy())), 1e-5, "forward")


@pytest.mark.clad
def test_causal_attention_with_clad_differentiating_the_kernels(clad):
    torch.manual_seed(0)
    net = perturbed(MODELS["decoder"]().double()).eval()
    x = _x("decoder")
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="clad", pullbacks=False)
    assert cm.engine == "clad"
    _check(cm, net, x, 1e-9, "decoder")
