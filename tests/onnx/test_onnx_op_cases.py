"""Every one-op case (tests/fixtures/op_cases.py) through ONNX: the case's module written by
torch's exporter (opset 18, float32, eval mode), imported by rootclad; its output against
onnxruntime's run of the same file, its input gradient against torch autograd of the module.
A case whose file the importer does not take is listed below with the reason, and checked to be
refused by name (so that an op whose ONNX form goes missing fails here)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fixtures.core import assert_close_rel, torch_vjp
from fixtures.op_cases import CASES, sample_input

import rootclad
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from fixtures.onnx import export, run_ort  # noqa: E402

OPSET = 18  # Mish is an ONNX op from opset 18 on
# case -> the words rootclad's refusal of torch's file for it says
NOT_IMPORTED = {
    "identity": "the graph computes nothing: its output 'y' is its input",
    # random draws are not imported from ONNX files (the export front-end takes torch's)
    "randn-like-times-zero": r"\(RandomNormalLike, opset 18\): rootclad's ONNX table has no",
    # the legacy exporter writes index_copy as a ScatterElements at indices it expands to the
    # batch size from a Shape, and y[:, 0] = v as a ScatterND at coordinates of every sample
    # made from a Range over the batch (torch's own graph of the case compiles)
    "writes-in-place": r"\(ScatterElements, opset 18\): a tensor of sizes that depend on the",
}
# case -> why torch's exporter writes no file for it
NOT_EXPORTED = {"batchnorm1d-untracked": "torch's exporter cannot write a BatchNorm without "
                                         "running statistics in eval mode"}  # fmt: skip
NOT_EXPORTED.update(dict.fromkeys(
    ["adaptive-avgpool2d-3x4", "adaptive-maxpool2d-up-none", "adaptive-avgpool1d-up",
     "adaptive-maxpool1d-functional", "adaptive-avgpool2d-vgg"],
    "torch's exporter writes no ONNX for adaptive pooling to sizes that do not divide the "
    "input's"))  # fmt: skip
NOT_EXPORTED["prod-cumprod"] = "torch's exporter (the legacy one, at opset 18) has no cumprod"
NOT_EXPORTED["hyperbolic"] = (
    "torch's exporter (the legacy one, at opset 18) has no sinh, cosh, asinh, acosh or atanh; "
    "ONNX's own node cases check those ops (tests/onnx/test_onnx_node_cases.py)"
)
NOT_EXPORTED["scatter-reduce-sum-without-self"] = (
    "torch's exporter has no scatter_reduce with include_self=False"
)
# case -> why the file computes another function than the module (the gradient is then
# compared with the file's, not the module's): the forward is still checked against
# onnxruntime
FILE_DIFFERS = {"softplus-beta2-threshold1": "torch's exporter writes Softplus(beta x) / beta "
                                             "without the threshold"}  # fmt: skip
# torch writes cdist as differences, a Pow by p, a sum and a Pow by 1 / p, whose gradient at a
# zero distance (a point and itself) is NaN, as torch autograd of those nodes gives; cdist's is 0
FILE_DIFFERS["cdist-self-and-other"] = "a Pow by 1 / p of the distances"
RTOL = 1e-4  # float32 against float32 (onnxruntime) and float64 (torch autograd)


@pytest.mark.parametrize("build, shape", [pytest.param(c[1], c[2], id=c[0]) for c in CASES])
def test_op_case_through_onnx_matches_onnxruntime_and_torch(request, build, shape):
    name = request.node.callspec.id
    torch.manual_seed(0)
    net = build().eval()
    x = sample_input(shape)
    if name in NOT_EXPORTED:
        pytest.skip(NOT_EXPORTED[name])
    model = export(copy.deepcopy(net).float(), x.float(), opset=OPSET)
    if name in NOT_IMPORTED:
        with pytest.raises(IRError, match=NOT_IMPORTED[name]):
            rootclad.onnx.load(model, loss="mse", engine="pullback")
        return
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    got = cm.predict(x.float())
    want = torch.from_numpy(run_ort(model, x.float().numpy()))
    assert_close_rel(got, want, RTOL, "forward against onnxruntime")
    if name in FILE_DIFFERS:
        return
    _, d_out, dx_ref, _ = torch_vjp(net.double(), x.double())
    dx = cm.input_grad(x.float(), d_out=d_out.float())
    assert_close_rel(dx, dx_ref, RTOL, "input gradient against torch autograd")
    assert np.isfinite(got.numpy()).all()


class _ZeroPosition(torch.nn.Module):
    """A position embedding initialised to zeros (before training) added to the input: a
    parameter, not a mask, however its values look."""

    def __init__(self, shape):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.zeros(shape))
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x + self.pos)


@pytest.mark.parametrize("shape", [(1, 4, 8), (4, 8)])
def test_a_zero_constant_added_to_a_value_stays_a_parameter(shape):
    x = torch.randn(3, 4, 8)
    model = export(_ZeroPosition(shape).eval(), x, opset=OPSET)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert "pos" in dict(cm.named_parameters())
    _, grads = cm.loss_and_grad(x, torch.randn(3, 4, 2))
    assert float(grads["pos"].abs().max()) > 0
