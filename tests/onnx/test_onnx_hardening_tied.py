"""One ONNX initializer is one parameter, however many nodes read it (issue 25, 11a).

A torch layer used twice is exported as one initializer read by two nodes; torch's default
(dynamo) exporter also merges initializers of equal value, so a no-affine LayerNorm's scale of
ones becomes the same initializer as a fresh affine LayerNorm's weight. Imported, each must be
one parameter whose gradient sums over its uses, and ``train_step`` must keep the uses tied.
The references are torch models that compute what the file says, trained by torch autograd.
"""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
from torch import nn

import rootclad

onnx = pytest.importorskip("onnx")


class _TiedLinear(nn.Module):
    """One Linear applied twice."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(torch.tanh(self.fc(x)))))


class _TwoLayerNorms(nn.Module):
    """A fresh affine LayerNorm (weight all ones) beside a no-affine one of the same shape.
    ``tie_scale``: the second multiplies by the first's weight (what a file that merged the
    two initializers of ones computes)."""

    def __init__(self, tie_scale: bool = False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.ln1 = nn.LayerNorm(4)
        self.ln2 = nn.LayerNorm(4, elementwise_affine=False)
        self.out = nn.Linear(4, 1)
        self.tie_scale = tie_scale

    def forward(self, x):
        h = 2 * torch.tanh(self.ln1(self.fc(x)))
        scale = self.ln1.weight if self.tie_scale else None
        return self.out(nn.functional.layer_norm(h, (4,), scale, None, self.ln2.eps))


def _export(net: nn.Module, x: torch.Tensor, dynamo: bool) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dim = torch.export.Dim("B")
            torch.onnx.export(net, (x,), f, dynamo=True, input_names=["x"],
                              output_names=["y"], dynamic_shapes=({0: dim},))  # fmt: skip
        else:
            torch.onnx.export(net, (x,), f, dynamo=False, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "B"}, "y": {0: "B"}},
                              opset_version=17)  # fmt: skip
    return onnx.load_from_string(f.getvalue())


EXPORTERS = [
    pytest.param(False, id="torchscript-exporter"),
    pytest.param(True, id="dynamo-exporter"),
]


def _needs(dynamo: bool) -> None:
    if dynamo:  # torch's default exporter is written with onnxscript (an optional dependency)
        pytest.importorskip("onnxscript", reason="torch's default ONNX exporter needs onnxscript")


def _imported(build, dynamo: bool):
    """(the torch model, the file, its compiled import)."""
    _needs(dynamo)
    torch.manual_seed(0)
    net = build()
    model = _export(net, torch.randn(3, 4), dynamo)
    cm = rootclad.onnx.load(model, "mse", engine="pullback", dtype=torch.float64)
    return net.double(), model, cm


def _reference(net: nn.Module, model) -> nn.Module:
    """The torch model computing what the file says: for two LayerNorms, whether the file
    reads the first one's weight in the second one too."""
    if not isinstance(net, _TwoLayerNorms):
        return net
    norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    ref = _TwoLayerNorms(tie_scale=norms[1].input[1] == "ln1.weight").double()
    ref.load_state_dict(net.state_dict())
    return ref


def _batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    return x, torch.randn(8, 1, generator=g, dtype=torch.float64)


def _assert_grads(grads: dict, ref: nn.Module, what: str) -> None:
    want = {n: p.grad for n, p in ref.named_parameters()}
    assert sorted(grads) == sorted(want), what
    for n, g in want.items():
        assert torch.allclose(grads[n], g, rtol=1e-9, atol=1e-12), (
            f"{what}: gradient of {n}: {grads[n]} vs torch {g}"
        )


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("build", [_TiedLinear, _TwoLayerNorms], ids=["tied-linear", "two-ln"])
def test_a_shared_initializer_is_one_parameter_with_the_summed_gradient(build, dynamo):
    net, model, cm = _imported(build, dynamo)
    ref = _reference(net, model)
    x, y = _batch()
    loss, grads = cm.loss_and_grad(x, y)
    want = nn.functional.mse_loss(ref(x), y)
    want.backward()
    assert abs(float(loss) - want.item()) <= 1e-12 * abs(want.item())
    _assert_grads(grads, ref, "loss_and_grad")


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("build", [_TiedLinear, _TwoLayerNorms], ids=["tied-linear", "two-ln"])
def test_train_step_keeps_a_shared_initializer_tied(build, dynamo):
    net, model, cm = _imported(build, dynamo)
    ref = _reference(net, model)
    x, y = _batch()
    opt = rootclad.optim.Adam(cm, lr=5e-2)
    topt = torch.optim.Adam(ref.parameters(), lr=5e-2)
    for _ in range(10):
        loss = cm.train_step(x, y, opt)
        topt.zero_grad()
        want = nn.functional.mse_loss(ref(x), y)
        want.backward()
        topt.step()
        assert abs(float(loss) - want.item()) <= 1e-9 * abs(want.item())
    # the trained ones are torch's (a no-affine LayerNorm's Constant scale is frozen)
    params = {n: p for n, p in cm.named_parameters() if p.requires_grad}
    assert sorted(params) == sorted(n for n, _ in ref.named_parameters())
    for n, p in ref.named_parameters():
        assert torch.allclose(params[n], p, rtol=1e-8, atol=1e-10), n
    # both uses still read the trained values: the outputs agree after the steps
    with torch.no_grad():
        assert torch.allclose(cm(x), ref(x), rtol=1e-8, atol=1e-10)


class _TwoLayersOneWeight(_TiedLinear):
    """Two Linear layers holding one weight Parameter (their biases are their own)."""

    def __init__(self):
        super().__init__()
        self.fc2 = nn.Linear(4, 4)
        self.fc2.weight = self.fc.weight

    def forward(self, x):
        return self.out(torch.tanh(self.fc2(torch.tanh(self.fc(x)))))


def test_a_tied_torch_parameter_in_two_layers_compiles_as_one():
    """The same defect in the torch front-end: rootclad.compile raised KeyError('fc2.weight')."""
    torch.manual_seed(0)
    net = _TwoLayersOneWeight().double()
    x, y = _batch()
    cm = rootclad.compile(net, x, "mse", engine="pullback")
    _, grads = cm.loss_and_grad(x, y)
    nn.functional.mse_loss(net(x), y).backward()
    _assert_grads(grads, net, "two layers, one weight")


def test_the_gradient_check_fails_on_one_use_only():
    """_assert_grads is not vacuous: the gradient of one use of the tied Linear differs."""
    net, _, cm = _imported(_TiedLinear, False)
    x, y = _batch()
    _, grads = cm.loss_and_grad(x, y)
    first = nn.functional.mse_loss(net.out(torch.tanh(net.fc(torch.tanh(net.fc(x).detach())))), y)
    first.backward()
    with pytest.raises(AssertionError):
        _assert_grads(grads, net, "one use only")


class _EqualCopies(nn.Module):
    """Two layers that hold equal weights (a deep copy: nn.TransformerEncoder's layers at
    initialisation): torch's TorchScript exporter writes the second's as Identity nodes of
    the first's initializers."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = copy.deepcopy(self.fc1)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def test_an_identity_of_an_initializer_is_a_parameter_of_its_own():
    """torch names the Identity's output as the second parameter (``fc2.weight``): that is a
    parameter of its own, starting at the first one's value, as in torch (it was imported
    frozen: the layer never trained)."""
    torch.manual_seed(0)
    net = _EqualCopies()
    model = _export(net, torch.randn(3, 4), dynamo=False)
    assert any(n.op_type == "Identity" for n in model.graph.node)
    cm = rootclad.onnx.load(model, "mse", engine="pullback", dtype=torch.float64)
    assert all(p.requires_grad for p in cm.parameters())
    ref = net.double()
    x, y = _batch()
    _, grads = cm.loss_and_grad(x, y)
    nn.functional.mse_loss(ref(x), y).backward()
    _assert_grads(grads, ref, "loss_and_grad")
    opt = rootclad.optim.Adam(cm, lr=5e-2)
    topt = torch.optim.Adam(ref.parameters(), lr=5e-2)
    for _ in range(5):
        cm.train_step(x, y, opt)
        topt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        topt.step()
    for n, p in cm.named_parameters():
        q = dict(ref.named_parameters())[n]
        assert torch.allclose(p.detach(), q.detach(), rtol=1e-9, atol=1e-12), n
