"""ONNX's own node test cases (onnx.backend.test.case.node), for every case made only of ops
rootclad imports: either rootclad refuses the case at load time, naming the node, its op and
opset (an attribute or layout it does not handle), or its output equals ONNX's expected output.

A node case's graph inputs after the first are its weights (a Conv's W, a Gemm's B and C): they
become initializers with the case's values. The first input's first axis is the batch, which
rootclad never mixes, so an op that would mix it must be refused, never computed wrongly.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

import rootclad
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

OPS = {
    "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Elu", "Sigmoid", "Tanh",
    "Softplus", "Gelu", "Softmax", "LogSoftmax", "Conv", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "LayerNormalization", "Flatten",
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Dropout", "Identity",
}  # fmt: skip


@functools.cache
def _cases() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases("")
    out = {}
    for c in cases:
        ops = {n.op_type for n in c.model.graph.node}
        if ops <= OPS and c.data_sets and c.data_sets[0][0]:
            inputs, outputs = c.data_sets[0]
            first = inputs[0]
            if len(outputs) == 1 and isinstance(first, np.ndarray) and first.dtype in (
                np.float32, np.float64) and first.ndim >= 2:  # fmt: skip
                out[c.name] = c
    return out


def _with_weights(case) -> onnx.ModelProto:
    """The case's model with its graph inputs after the first turned into initializers."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs, _ = case.data_sets[0]
    g = model.graph
    for inp, value in list(zip(g.input, inputs, strict=False))[1:]:
        g.initializer.append(numpy_helper.from_array(np.asarray(value), inp.name))
    keep = [i for i in g.input if i.name == g.input[0].name]
    del g.input[:]
    g.input.extend(keep)
    return model


RESULTS: dict[str, str] = {}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_cases()))
def test_onnx_node_case(name):
    case = _cases()[name]
    inputs, outputs = case.data_sets[0]
    model = _with_weights(case)
    try:
        cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    except IRError as exc:
        # a node refused names itself, its op and the opset; a whole graph refused says why
        ops = {n.op_type for n in model.graph.node}
        msg = str(exc)
        named = "opset" in msg and any(op in msg for op in ops)
        assert named or "computes nothing" in msg or "ONNX opset" in msg, msg
        RESULTS[name] = "refused"
        return
    out = cm(torch.from_numpy(np.asarray(inputs[0]))).detach().numpy()
    expected = np.asarray(outputs[0])
    assert out.shape == expected.shape, (out.shape, expected.shape)
    tol = 1e-4 if out.dtype == np.float32 else 1e-10
    np.testing.assert_allclose(out, expected, rtol=max(case.rtol, tol), atol=max(case.atol, tol))
    RESULTS[name] = "computed"


@pytest.mark.slow
def test_onnx_node_cases_are_not_all_refused():
    """The cases above are not vacuous: most of them compute."""
    names = sorted(_cases())
    computed = [n for n in names if RESULTS.get(n) == "computed"]
    if len(RESULTS) < len(names):
        pytest.skip("runs after the node cases (run the whole module)")
    assert len(computed) >= 60, f"only {len(computed)} of {len(names)} cases computed"
