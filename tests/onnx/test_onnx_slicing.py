"""ONNX Slice, Split, Pad and Gather of tensors (rootclad/frontends/onnx/ops_shapes.py): files
that onnxruntime refuses, or computes otherwise than torch would, are refused by name. Files
that compute are checked against onnxruntime here and by tests/onnx/test_onnx_op_cases.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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
         ["Gather", "index 7 is out of range for an axis of 7"]),
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
         ["AveragePool", "auto_pad=SAME_UPPER"]),
        (_model([helper.make_node("Pad", ["x", "p"], ["y"], mode="wrap")], {"p": [0, 1, 0, 1]},
                [None, 9], opset=19), ["Pad", "mode 'wrap'"]),
        (_model([helper.make_node("Pad", ["x", "p"], ["y"])], {"p": [1, 0, 0, 0]}, [None, 7]),
         ["Pad", "batch axis"]),
        (_model([helper.make_node("Pad", ["x", "p"], ["y"])], {"p": [0, 1, 0]}, [None, 7]),
         ["Pad", "two counts per axis"]),
        (_model([helper.make_node("Pad", ["x", "p"], ["y"])], {"p": [0, -4, 0, -3]}, [None, 0]),
         ["Pad", "an empty result"]),
    ],
)  # fmt: skip
def test_slicing_nodes_onnxruntime_would_refuse_or_compute_otherwise_are_refused(model, words):
    with pytest.raises(IRError) as err:
        rootclad.onnx.load(model, loss="mse", engine="pullback")
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_pad_by_the_file_matches_onnxruntime():
    """Constant padding of a (B, 2, 5) input with a value, one count negative (a crop), given
    for the last axis only (opset 18's axes input): against onnxruntime."""
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import run_ort

    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "p", "v", "a"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2, 6])],
        [numpy_helper.from_array(np.asarray([3, -2], dtype=np.int64), "p"),
         numpy_helper.from_array(np.asarray(1.5, dtype=np.float32), "v"),
         numpy_helper.from_array(np.asarray([-1], dtype=np.int64), "a")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(0).standard_normal((3, 2, 5)).astype(np.float32)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    np.testing.assert_array_equal(cm.predict(torch.from_numpy(x)).numpy(), run_ort(model, x))


# backwards from the end, by 2 and 3, from past the end, and from before the start (ONNX
# clamps a backward start to the first element, onnxruntime too; numpy's slice takes nothing)
@pytest.mark.parametrize(
    "starts, ends, step",
    [(-1, -(2**62), -1), (5, 0, -2), (6, -8, -3), (10, 2, -1), (-10, -100, -1)],
)
def test_a_slice_backwards_matches_onnxruntime(starts, ends, step):
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import run_ort

    inits = {"s": [starts], "e": [ends], "a": [1], "t": [step]}
    model = _model(
        [helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], inits, [None, None]
    )
    x = np.random.default_rng(1).standard_normal((3, 7)).astype(np.float32)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    np.testing.assert_array_equal(cm.predict(torch.from_numpy(x)).numpy(), run_ort(model, x))


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_a_reflected_or_repeated_edge_matches_onnxruntime(mode):
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import run_ort

    model = _model(
        [helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)], {"p": [0, 2, 0, 3]}, [None, 12]
    )
    x = np.random.default_rng(1).standard_normal((3, 7)).astype(np.float32)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    np.testing.assert_array_equal(cm.predict(torch.from_numpy(x)).numpy(), run_ort(model, x))


@pytest.mark.parametrize("op", ["Transpose", "Slice"])
def test_a_float_weight_transposed_or_sliced_trains_as_the_files_parameter(op):
    """Only integer constants (shape arithmetic, F.pad's counts) are numbers: a float
    initializer transposed or sliced before use stays the file's parameter, its gradient the
    output's gradient moved back (summed over the batch)."""
    w = numpy_helper.from_array(np.ones((3, 3), dtype=np.float32), "w")
    ints = [numpy_helper.from_array(np.asarray(v, dtype=np.int64), k)
            for k, v in (("s", [0]), ("e", [3]))]  # fmt: skip
    inner = (helper.make_node("Transpose", ["w"], ["t"], perm=[1, 0]) if op == "Transpose"
             else helper.make_node("Slice", ["w", "s", "e"], ["t"]))  # fmt: skip
    graph = helper.make_graph(
        [inner, helper.make_node("Add", ["x", "t"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3, 3])], [w, *ints],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback", dtype=torch.float64)
    x, d_out = torch.randn(4, 3, 3, dtype=torch.float64), torch.randn(4, 3, 3, dtype=torch.float64)
    _, grads = cm.loss_and_grad(x, x + d_out)  # mse: the gradient of y is 2 (y - target) / n
    d_y = 2 * (x + 1 - (x + d_out)) / d_out.numel()
    want = d_y.sum(0).T if op == "Transpose" else d_y.sum(0)
    torch.testing.assert_close(grads["w"], want, rtol=1e-12, atol=1e-14)
