"""Attention in ONNX files from torch's exporter (issue 27; frontends/onnx/attention.py):
``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` written over the sequence-first
layout with the batch axis merged into the heads', imported as one layer each. Compared with
onnxruntime (forward), torch autograd of the exported module (input and every parameter's
gradient), and refused naming the node where the block is not what it looks like."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, perturbed
from torch import nn

import rootclad
from rootclad.frontends.onnx import to_module
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from fixtures.onnx import export, run_ort  # noqa: E402

F64 = torch.float64


class SelfAttention(nn.Module):
    """nn.MultiheadAttention on its input, with a boolean padding mask (True: a particle) or
    none, a residual and a linear head per token."""

    def __init__(self, bias=True, masked=True, heads=2, need_weights=False):
        super().__init__()
        self.masked, self.need_weights = masked, need_weights
        self.embed = nn.Linear(3, 8)
        self.attn = nn.MultiheadAttention(8, heads, bias=bias, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x, mask=None):
        h = self.embed(x)
        pad = ~mask if self.masked else None
        a = self.attn(h, h, h, key_padding_mask=pad, need_weights=self.need_weights)[0]
        return self.head(h + a)


class Encoder(nn.Module):
    """Two post-norm encoder layers (ReLU), no mask, the mean over tokens."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 4, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


class SeqFirst(nn.Module):
    """nn.MultiheadAttention over (L, B, E), the batch axis moved there and back."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2)

    def forward(self, x):
        h = x.transpose(0, 1)
        return self.attn(h, h, h, need_weights=False)[0].transpose(0, 1)


class Cross(nn.Module):
    """Class attention (the Particle Transformer's): a learned token attends to the
    particles, nn.MultiheadAttention(q, kv, kv) with their padding mask."""

    def __init__(self, masked=True):
        super().__init__()
        self.masked = masked
        self.embed = nn.Linear(3, 8)
        self.query = nn.Linear(3, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x, mask=None):
        h = self.embed(x)
        q = self.query(x[:, :2])  # two queries per sample, from the first two particles
        pad = ~mask if self.masked else None
        return self.head(self.attn(q, h, h, key_padding_mask=pad, need_weights=False)[0])


def _inputs(name, B=3):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, 5, 8 if name in ("encoder", "sequence-first") else 3, generator=gen)
    if name in ("encoder", "unmasked", "sequence-first", "cross-unmasked"):
        return (x,)
    mask = torch.ones(B, 5, dtype=torch.bool)
    mask[0, 3:], mask[2, 1:] = False, False  # padding; each sample keeps one token at least
    return x, mask


MODELS = {
    "masked": lambda: SelfAttention(),
    "unmasked": lambda: SelfAttention(masked=False, heads=4),
    "no-bias": lambda: SelfAttention(bias=False),
    # need_weights=True (the module's default) with a mask: torch computes the scores with
    # baddbmm, which the exporter writes as Mul by 1 on both sides of the Add
    "default-call": lambda: SelfAttention(need_weights=True),
    "encoder": lambda: Encoder(),
    "sequence-first": lambda: SeqFirst(),  # batch_first=False between two transposes
    "cross": lambda: Cross(),
    "cross-unmasked": lambda: Cross(masked=False),
}


@pytest.mark.parametrize("name", MODELS)
def test_attention_file_matches_onnxruntime_and_torch(name):
    torch.manual_seed(0)
    # fresh: the encoder's layers are copies and its biases zeros, which torch's exporter
    # writes as Identity nodes of one initializer; each is still a parameter of its own
    net = (
        MODELS[name]() if name in ("encoder", "default-call") else perturbed(MODELS[name]())
    ).eval()
    xs = _inputs(name)
    model = export(copy.deepcopy(net), xs, opset=18)
    module, _, _ = to_module(model)  # read as torch's layer, not node by node
    assert any(isinstance(m, nn.MultiheadAttention) for m in module.modules())
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    want = torch.from_numpy(run_ort(model, *(x.numpy() for x in xs)))
    assert_close_rel(cm.predict(*xs), want, 1e-5, f"{name} forward against onnxruntime")
    ref = copy.deepcopy(net).double()
    x64 = xs[0].double().requires_grad_(True)
    out = ref(x64, *xs[1:])
    d_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (dx_ref,) = torch.autograd.grad(out, [x64], d_out)
    dx = cm.input_grad(*xs, d_out=d_out.float())
    dx = dx[0] if isinstance(dx, (tuple, list)) else dx
    assert_close_rel(dx, dx_ref, 1e-4, f"{name} d_x")
    # every parameter: the attention layer's keep torch's names (the exporter's weights are
    # read as the layer's in_proj_weight, out_proj.weight, ...)
    _, grads = cm.loss_and_grad(xs if len(xs) > 1 else xs[0], d_out.float())
    loss = torch.nn.functional.mse_loss(ref(xs[0].double(), *xs[1:]), d_out)
    by_ref = dict(zip([k for k, _ in ref.named_parameters()],
                      torch.autograd.grad(loss, list(ref.parameters())), strict=True))  # fmt: skip
    attn = {k: g for k, g in by_ref.items() if "attn" in k}
    # one parameter for each of torch's (none tied, none frozen); those the file names (the
    # attention's, the norms', the biases of Gemms) by torch's name, value and gradient
    assert len(grads) == len(by_ref), f"{sorted(by_ref)} against {sorted(grads)}"
    named = {k: g for k, g in by_ref.items() if k in grads}
    assert attn and set(attn) <= set(named), f"{sorted(attn)} not among {sorted(grads)}"
    assert_grads_close({k: grads[k] for k in named}, named, 1e-4, name, against_all=True)
    for k, p in cm.named_parameters():
        if k in named:
            assert torch.equal(p.detach().double(), dict(ref.named_parameters())[k].detach()), k


def test_attention_file_trains_as_torch():
    """10 Adam steps of the imported masked block track torch's on the exported module."""
    torch.manual_seed(0)
    net = SelfAttention().eval()
    x, mask = _inputs("masked", B=4)
    model = export(copy.deepcopy(net), (x, mask), opset=18)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    ref = copy.deepcopy(net)
    y = torch.randn(4, 5, 2, generator=torch.Generator().manual_seed(3))
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses, ref_losses = [], []
    for _ in range(10):
        losses.append(cm.train_step((x, mask), y, opt))
        opt_ref.zero_grad()
        value = torch.nn.functional.mse_loss(ref(x, mask), y)
        value.backward()
        opt_ref.step()
        ref_losses.append(value.item())
    assert ref_losses[-1] < ref_losses[0]
    assert_close_rel(torch.tensor(losses), torch.tensor(ref_losses), 1e-4, "losses")


def _scale_constants(model):
    """The Constant nodes of the attention's scaling (torch writes sqrt(1/sqrt(d)) twice)."""
    return [n for n in model.graph.node if n.op_type == "Constant" and "attn" in n.name
            and any(r.op_type == "Div" and n.output[0] == r.input[0]
                    for r in model.graph.node)]  # fmt: skip


def _blocks(model):
    from rootclad.frontends.onnx import attention
    from rootclad.frontends.onnx.builder import Builder

    b = Builder(model, "test")
    for node in b.nodes:  # what build() does before it looks for blocks
        if node.op_type == "Constant":
            b.op_Constant(
                node, {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            )
    return attention.find(b, model)


def test_a_block_that_is_not_torchs_attention_is_not_read_as_one():
    """The same nodes with the scores' scale changed by 1%: the evaluation finds that they do
    not compute nn.MultiheadAttention (the check fails on a wrong answer), the block is left
    to the node-by-node import, which refuses it naming a node."""
    torch.manual_seed(0)
    xs = _inputs("masked")
    model = export(SelfAttention().eval(), xs, opset=18)
    assert len(_blocks(model)) == 1
    (const,) = _scale_constants(model)  # 1 / sqrt(d): the numerator of a Div
    value = onnx.numpy_helper.to_array(const.attribute[0].t)
    const.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(value * 1.01))
    assert _blocks(model) == []
    with pytest.raises(IRError, match=r"node '[^']+' \(\w+, opset 18\)"):
        rootclad.onnx.load(model, loss="mse", engine="pullback")


class Temperature(nn.Module):
    """Attention per sample, written out (heads as an axis after the batch), with a learned
    temperature per head (ones, as at initialisation): not torch's layer, though at these
    values it computes the same."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(4, 4) for _ in range(4))
        self.temp = nn.Parameter(torch.ones(2, 1, 1))

    def forward(self, x):  # (B, L, 4), 2 heads of 2
        B = x.shape[0]
        q, k, v = (f(x).reshape(B, -1, 2, 2).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = torch.softmax(q @ k.transpose(-2, -1) * self.temp, -1)
        return self.o((a @ v).transpose(1, 2).reshape(B, -1, 4))


def test_a_learned_temperature_inside_attention_stays_a_parameter():
    """The temperature is a weight of the file: the block is not read as torch's layer (which
    would lose it), and the file imports node by node with it, its gradient torch's."""
    torch.manual_seed(0)
    net = Temperature().double().eval()
    x = torch.randn(2, 5, 4, dtype=F64)
    model = export(copy.deepcopy(net), x, opset=18)
    assert _blocks(model) == []
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    y = torch.randn(2, 5, 4, dtype=F64)
    _, grads = cm.loss_and_grad(x, y)
    torch.nn.functional.mse_loss(net(x), y).backward()
    assert "temp" in grads
    assert_close_rel(grads["temp"], net.temp.grad, 1e-9, "d temp")


def test_the_check_draws_the_weights_so_that_a_bias_of_zeros_hides_no_wiring():
    """A fresh layer's biases are zeros: a file that adds its in_proj_bias reversed computes
    the same at these values. The check's pass with random weights finds it; the block is
    left to the node-by-node import, which refuses it."""
    from onnx import helper

    torch.manual_seed(0)
    model = export(SelfAttention(masked=False).eval(), _inputs("unmasked"), opset=18)
    assert len(_blocks(model)) == 1
    add = next(n for n in model.graph.node if n.op_type == "Add" and "attn.in_proj_bias" in n.input)
    rev = [helper.make_tensor(f"rev_{k}", onnx.TensorProto.INT64, (1,), [v])
           for k, v in (("start", -1), ("end", -(2**62)), ("axis", 0), ("step", -1))]  # fmt: skip
    model.graph.initializer.extend(rev)
    idx = list(model.graph.node).index(add)
    model.graph.node.insert(idx, helper.make_node(
        "Slice", ["attn.in_proj_bias", *(t.name for t in rev)], ["reversed_bias"]))  # fmt: skip
    add.input[list(add.input).index("attn.in_proj_bias")] = "reversed_bias"
    onnx.checker.check_model(model)
    assert _blocks(model) == []
    with pytest.raises(IRError, match=r"node '[^']+' \(\w+, opset 18\)"):
        rootclad.onnx.load(model, loss="mse", engine="pullback")


class KeyValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, q, k, v):
        return self.attn(q, k, v, need_weights=False)[0]


def test_keys_and_values_from_different_inputs_are_refused_naming_a_node():
    """nn.MultiheadAttention(q, k, v) with three inputs: left to the node-by-node import,
    which refuses it naming the first node it cannot take."""
    xs = (torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4))
    model = export(KeyValue().eval(), xs, opset=18)
    assert _blocks(model) == []
    with pytest.raises(IRError, match=r"node '[^']+' \(\w+, opset 18\)"):
        rootclad.onnx.load(model, loss="mse", engine="pullback")


def test_the_found_blocks_name_their_layers_as_torch_does():
    torch.manual_seed(0)
    model = export(Encoder().eval(), _inputs("encoder"), opset=18)
    module, shapes, dtype = to_module(model)
    names = {k for k, m in module.named_modules() if isinstance(m, nn.MultiheadAttention)}
    assert names == {"encoder.layers.0.self_attn", "encoder.layers.1.self_attn"}
    assert shapes == [(5, 8)]
    assert np.isfinite(module(torch.randn(2, 5, 8, dtype=dtype)).detach().numpy()).all()
