"""torchvision's Swin Transformer beyond the zoo's small one (tests/fixtures/zoo.py): what is
refused, naming the node, and the attention block against torch in float32 and on the device
kernels. The op cases (fixtures/op_cases.py) check the shifted-window attention alone."""

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


def test_a_map_that_needs_padding_is_refused_naming_the_node():
    """36 x 36 pixels: 9 x 9 tokens in windows of 4 would need torchvision's zero padding."""
    with pytest.raises(IRError, match=r"shifted_window_attention\): a feature map of 9x9 tokens "
                       r"in windows of 4x4; .*no padding"):  # fmt: skip
        rootclad.compile(_small(), torch.randn(2, 3, 36, 36, dtype=F64), engine="pullback")


def test_swin_v2_is_refused_naming_the_node():
    tv, _ = vision()
    net = tv.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2], num_heads=[2],
                             window_size=[4, 4], num_classes=3,
                             block=tv.swin_transformer.SwinTransformerBlockV2,
                             downsample_layer=tv.swin_transformer.PatchMergingV2).double()  # fmt: skip
    with pytest.raises(IRError, match=r"cpb_mlp.*computed from parameters alone"):
        rootclad.compile(net, torch.randn(2, 3, 32, 32, dtype=F64), engine="pullback")


def test_another_relative_position_index_is_refused():
    net = _small()
    attn = net.features[1][0].attn
    attn.relative_position_index.copy_(attn.relative_position_index.flip(0))
    with pytest.raises(IRError, match="relative position index is not torchvision's"):
        rootclad.compile(net, torch.randn(2, 3, 32, 32, dtype=F64), engine="pullback")


def test_a_shifted_block_in_float32():
    net = perturbed(_small())
    check_against_torch(net, torch.randn(2, 3, 32, 32, dtype=F64), torch.float32,
                        engine="pullback", rtol=1e-4, loss="cross_entropy")  # fmt: skip


def test_a_shifted_block_on_the_device_kernels():
    """The device program's kernels as host loops (the GPU build is the same source)."""
    net = perturbed(_small())
    x = torch.randn(2, 3, 32, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
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


@pytest.mark.slow
def test_swin_t_itself_at_224_pixels():
    """torchvision's swin_t as it is (28M parameters, windows of 7: 56 x 56 tokens, then 28,
    14, and 7, where the window covers the map and is not shifted), float32, one sample:
    output and input gradient against torch."""
    tv, _ = vision()
    torch.manual_seed(0)
    net = tv.swin_t(num_classes=3).eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    cm = rootclad.compile(net, x, loss="cross_entropy", engine="pullback")
    out_ref, d_out, dx_ref, _ = torch_vjp(net, x)
    assert_close_rel(cm.predict(x), out_ref, 1e-4, "forward")
    assert_close_rel(cm.input_grad(x, d_out=d_out), dx_ref, 1e-4, "d_input")


def test_a_roll_without_dims_is_refused():
    class Roll(torch.nn.Module):
        def forward(self, x):
            return torch.roll(x, 1)

    with pytest.raises(IRError, match=r"a roll without dims rolls the samples of the batch"):
        rootclad.compile(Roll(), torch.randn(2, 4, dtype=F64), engine="pullback")
