"""ONNX Slice, Split and Gather of tensors (rootclad/frontends/onnx/folding.py): files that
onnxruntime refuses, or computes otherwise than torch's layers would, are refused by name.
Files that compute are checked against onnxruntime by tests/onnx/test_onnx_op_cases.py."""

from __future__ import annotations

import numpy as np
import pytest

import rootclad
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, inits, out_shape, opset=13, in_shape=(None, 7)):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(np.asarray(v, dtype=np.int64), k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(
    "model, words",
    [
        (_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], {"i": 7}, [None]),
         ["Gather", "index 7 is out of range"]),
        (_model([helper.make_node("Split", ["x"], ["y", "z", "w"], axis=1)], {}, [None, 3]),
         ["Split", "does not split evenly"]),
        (_model([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])],
                {"s": [0], "e": [2], "a": [3]}, [None, 2]),
         ["Slice", "out of range"]),
        (_model([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])],
                {"s": [0, 1], "e": [2], "a": [1]}, [None, 2]),
         ["Slice", "differ in length"]),
        (_model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[1], strides=[3],
                                  auto_pad="SAME_UPPER")], {}, [None, 1, 2], in_shape=(None, 1, 6)),
         ["AveragePool", "larger than the kernel"]),
    ],
)  # fmt: skip
def test_slicing_nodes_onnxruntime_would_refuse_or_compute_otherwise_are_refused(model, words):
    with pytest.raises(IRError) as err:
        rootclad.onnx.to_module(model)
    for word in words:
        assert word in str(err.value), str(err.value)
