"""ONNX Reshape with allowzero=1, which torch's default (dynamo) exporter writes on every view:
the attribute changes only what a 0 in the shape means (an empty axis, not the input's size), so
a shape without a 0 reshapes as without it; with a 0 the node is refused, naming it. Checked
against onnxruntime on files written as that exporter writes them (the shape computed from
Shape, Gather and Concat, or a constant)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rootclad
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _model(reshape_nodes, inits, opset=18):
    """x (B, 2, 6) reshaped to (B, 3, 4) by ``reshape_nodes`` (ending in "r"), then times a
    (4, 2) weight: y (B, 3, 2)."""
    w = np.random.default_rng(1).standard_normal((4, 2)).astype(np.float32)
    graph = helper.make_graph(
        [*reshape_nodes, helper.make_node("MatMul", ["r", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3, 2])],
        [numpy_helper.from_array(w, "w"), *inits],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# the dynamo exporter's form: the batch read from the input's shape, the rest constants
COMPUTED = (
    [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Concat", ["b1", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"], allowzero=1),
    ],
    [_ints("zero", 0), _ints("axes", [0]), _ints("rest", [3, 4])],
)
CONSTANT = (
    [helper.make_node("Reshape", ["x", "shape"], ["r"], allowzero=1)],
    [_ints("shape", [-1, 3, 4])],
)


@pytest.mark.parametrize("form", [COMPUTED, CONSTANT], ids=["computed-shape", "constant-shape"])
def test_a_reshape_with_allowzero_and_no_zero_matches_onnxruntime(form):
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import run_ort

    model = _model(*form)
    x = np.random.default_rng(0).standard_normal((5, 2, 6)).astype(np.float32)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    want = run_ort(model, x)
    assert want.shape == (5, 3, 2)
    np.testing.assert_allclose(cm.predict(torch.from_numpy(x)).numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_reshape_with_allowzero_and_a_zero_is_refused_naming_the_node():
    """(B, 2, 6) to (B, 0, 12) with allowzero=1 asks for an empty axis (onnxruntime would
    refuse the element count anyway); without allowzero the 0 keeps the input's size."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], allowzero=1, name="view_3")]
    model = _model(nodes, [_ints("shape", [-1, 0, 12])])
    with pytest.raises(IRError) as err:
        rootclad.onnx.load(model, loss="mse", engine="pullback")
    for word in ("view_3", "Reshape"):
        assert word in str(err.value), str(err.value)
