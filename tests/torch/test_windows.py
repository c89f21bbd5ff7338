"""torchvision's Swin Transformer beyond the zoo's small one (tests/fixtures/zoo.py): what is
refused, naming the ATen op and the module, a relative position index of another order and the
attention block against torch (float32, the device kernels). The op cases
(fixtures/op_cases.py) check the shifted-window attention alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.core import (
    assert_close_rel,
    assert_grads_close,
    check_against_torch,
    perturbed,
    torch_vjp,
)
from fixtures.zoo import vision

import rootclad
from rootclad.compiler import compile_device
from rootclad.ir.graph import IRError

F64 = torch.float64


def _small(**kw):
    tv, _ = vision()
    torch.manual_seed(0)
    args = dict(patch_size=[4, 4], embed_dim=16, depths=[2], num_heads=[2], window_size=[4, 4],
                num_classes=3)  # fmt: skip
    return tv.SwinTransformer(**{**args, **kw}).double().eval()


def test_maps_that_need_padding_match_torch():
    """36 x 44 pixels: 9 x 11 tokens in windows of 4, which torchvision pads with zeros to
    12 x 12 (the zero tokens take part in the attention), shifts and masks on the padded map,
    then crops; the patch merging pads 9 x 11 to 10 x 12, and the second stage's 5 x 6 tokens
    pad to 8 x 8. Output, input and every parameter's gradient against torch, float64."""
    net = perturbed(_small(depths=[2, 2], num_heads=[2, 2]))
    check_against_torch(net, torch.randn(2, 3, 36, 44, dtype=F64), torch.float64,
                        engine="pullback", rtol=1e-9, loss="cross_entropy")  # fmt: skip


def test_swin_v2_matches_torch():
    """V2's attention zeroes the keys' part of a copy of the qkv bias (a slice_scatter), and
    scales cosine attention by a clamped, exponentiated parameter."""
    tv, _ = vision()
    net = tv.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2], num_heads=[2],
                             window_size=[4, 4], num_classes=3,
                             stochastic_depth_prob=0.0,  # (in training: torch's draws, not ours)
                             block=tv.swin_transformer.SwinTransformerBlockV2,
                             downsample_layer=tv.swin_transformer.PatchMergingV2).double()  # fmt: skip
    x = torch.randn(2, 3, 32, 32, dtype=F64)
    check_against_torch(perturbed(net), x, F64, rtol=1e-9, loss="cross_entropy")


def test_another_relative_position_index_matches_torch():
    """The bias table read at an index buffer other than torchvision's (reversed): the index
    is read as it is, output, input and parameter gradients against torch."""
    net = perturbed(_small())
    attn = net.features[1][0].attn
    attn.relative_position_index.copy_(attn.relative_position_index.flip(0))
    x = torch.randn(2, 3, 32, 32, dtype=F64)
    check_against_torch(net, x, torch.float64, rtol=1e-9, loss="cross_entropy")


def test_a_shifted_block_in_float32():
    net = perturbed(_small())
    check_against_torch(net, torch.randn(2, 3, 32, 32, dtype=F64), torch.float32,
                        engine="pullback", rtol=1e-4, loss="cross_entropy")  # fmt: skip


@pytest.mark.parametrize("pixels", [(32, 32), (36, 44)], ids=["whole", "padded"])
def test_a_shifted_block_on_the_device_kernels(pixels):
    """The device program's kernels as host loops (the GPU build is the same source), on a map
    of whole windows and on one that torchvision pads."""
    net = perturbed(_small())
    x = torch.randn(2, 3, *pixels, dtype=F64, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 2])
    dm = compile_device(net, x[:1], "cpu", loss="cross_entropy")
    out_ref, d_out, dx_ref, _ = torch_vjp(net, x)
    assert_close_rel(dm.predict(x), out_ref, 1e-9, "forward")
    assert_close_rel(dm.input_grad(x, d_out=d_out), dx_ref, 1e-9, "d_input")
    loss, grads = dm.loss_and_grad(x, y)
    ref = F.cross_entropy(net(x), y)
    names = [n for n, _ in net.named_parameters()]
    expected = dict(zip(names, torch.autograd.grad(ref, list(net.parameters())), strict=True))
    assert_close_rel(loss, ref, 1e-12, "loss")
    assert_grads_close(grads, expected, 1e-9, "parameters", against_all=True)


@pytest.mark.parametrize(
    "pixels",
    [pytest.param((224, 224), marks=pytest.mark.slow), (64, 80)],
    ids=["224x224", "64x80-padded"],
)
def test_swin_t_itself(pixels):
    """torchvision's swin_t as it is (28M parameters, windows of 7), float32, one sample:
    output and input gradient against torch. At 224 x 224: 56 x 56 tokens, then 28, 14, and 7,
    where the window covers the map and is not shifted. At 64 x 80: 16 x 20 tokens padded to
    21 x 21, then 8 x 10 to 14 x 14, 4 x 5 and 2 x 3 to 7 x 7 (unshifted)."""
    tv, _ = vision()
    torch.manual_seed(0)
    net = tv.swin_t(num_classes=3).eval()
    x = torch.randn(1, 3, *pixels, generator=torch.Generator().manual_seed(1))
    cm = rootclad.compile(net, x, loss="cross_entropy", engine="pullback")
    out_ref, d_out, dx_ref, _ = torch_vjp(net, x)
    assert_close_rel(cm.predict(x), out_ref, 1e-4, "forward")
    assert_close_rel(cm.input_grad(x, d_out=d_out), dx_ref, 1e-4, "d_input")


def test_a_roll_without_dims_is_refused():
    class Roll(torch.nn.Module):
        def forward(self, x):
            return torch.roll(x, 1)

    # torch rolls the flattened batch by an index over all its values (an arange of B * 4)
    words = r"aten\.arange\.start_step \(node 'arange' in module '0' \(Roll\)\): not supported"
    with pytest.raises(IRError, match=words):
        rootclad.compile(
            torch.nn.Sequential(Roll()), torch.randn(2, 4, dtype=F64), engine="pullback"
        )
