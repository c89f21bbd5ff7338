"""Attention in ONNX files from torch's exporter: ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` written over the sequence-first layout with the batch axis
merged into the heads', run node by node through the table. Compared with onnxruntime
(forward) and torch autograd of the exported module (input and every parameter's gradient,
each of the file's weights found among torch's by its value); blocks that are not torch's
layer (another scale, a bias reversed, keys and values from different inputs, a learned
temperature) compute as the file says."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, perturbed
from torch import nn

import rootclad

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from fixtures.onnx import export, run_ort, torch_named  # noqa: E402

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
    net = perturbed(MODELS[name]()).eval()  # (each weight's value its own: found by it below)
    xs = _inputs(name)
    model = export(copy.deepcopy(net), xs, opset=18)
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
    # every parameter of torch's: the file's weights, each found by its value (torch's
    # exporter writes the projections as MatMuls of transposed blocks of in_proj_weight)
    _, grads = cm.loss_and_grad(xs if len(xs) > 1 else xs[0], d_out.float())
    loss = torch.nn.functional.mse_loss(ref(xs[0].double(), *xs[1:]), d_out)
    by_ref = dict(zip([k for k, _ in ref.named_parameters()],
                      torch.autograd.grad(loss, list(ref.parameters())), strict=True))  # fmt: skip
    got = torch_named(cm, grads, ref)
    assert_grads_close(got, by_ref, 1e-4, name, against_all=True)


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


def _matches_onnxruntime(model, xs) -> None:
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    want = torch.from_numpy(run_ort(model, *(x.numpy() for x in xs)))
    assert_close_rel(cm.predict(*xs), want, 1e-5, "forward against onnxruntime")


def test_a_block_with_another_scale_computes_as_the_file_says():
    """The same nodes with the scores' scale changed by 1%: not torch's layer, computed as
    the file's nodes say."""
    torch.manual_seed(0)
    xs = _inputs("masked")
    model = export(SelfAttention().eval(), xs, opset=18)
    (const,) = _scale_constants(model)  # 1 / sqrt(d): the numerator of a Div
    value = onnx.numpy_helper.to_array(const.attribute[0].t)
    const.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(value * 1.01))
    _matches_onnxruntime(model, xs)


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
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    y = torch.randn(2, 5, 4, dtype=F64)
    _, grads = cm.loss_and_grad(x, y)
    torch.nn.functional.mse_loss(net(x), y).backward()
    assert "temp" in grads
    assert_close_rel(grads["temp"], net.temp.grad, 1e-9, "d temp")


def test_a_bias_added_reversed_computes_as_the_file_says():
    """A file that adds its in_proj_bias reversed (a Slice of step -1): computed as written."""
    from onnx import helper

    torch.manual_seed(0)
    xs = _inputs("unmasked")
    model = export(perturbed(SelfAttention(masked=False)).eval(), xs, opset=18)
    add = next(n for n in model.graph.node if n.op_type == "Add" and "attn.in_proj_bias" in n.input)
    rev = [helper.make_tensor(f"rev_{k}", onnx.TensorProto.INT64, (1,), [v])
           for k, v in (("start", -1), ("end", -(2**62)), ("axis", 0), ("step", -1))]  # fmt: skip
    model.graph.initializer.extend(rev)
    idx = list(model.graph.node).index(add)
    model.graph.node.insert(idx, helper.make_node(
        "Slice", ["attn.in_proj_bias", *(t.name for t in rev)], ["reversed_bias"]))  # fmt: skip
    add.input[list(add.input).index("attn.in_proj_bias")] = "reversed_bias"
    onnx.checker.check_model(model)
    _matches_onnxruntime(model, xs)


class KeyValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, q, k, v):
        return self.attn(q, k, v, need_weights=False)[0]


def test_keys_and_values_from_different_inputs_compute():
    """nn.MultiheadAttention(q, k, v) with three inputs, against onnxruntime."""
    xs = (torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4))
    model = export(perturbed(KeyValue()).eval(), xs, opset=18)
    _matches_onnxruntime(model, xs)


def test_the_match_by_value_fails_on_a_weight_torch_does_not_hold():
    """torch_named is not vacuous: a torch model one weight of which differs from the file's
    leaves a file's parameter unmatched."""
    torch.manual_seed(0)
    net = perturbed(SelfAttention()).eval()
    cm = rootclad.onnx.load(
        export(copy.deepcopy(net), _inputs("masked"), opset=18), "mse", engine="pullback"
    )
    grads = {k: torch.zeros_like(p) for k, p in cm.named_parameters()}
    assert set(torch_named(cm, grads, net)) == {k for k, _ in net.named_parameters()}
    with torch.no_grad():
        net.attn.in_proj_weight[0, 0] += 1e-3
    with pytest.raises(AssertionError, match="of torch's parameters hold its value"):
        torch_named(cm, grads, net)
