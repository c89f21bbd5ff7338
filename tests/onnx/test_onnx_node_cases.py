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
    "HardSigmoid", "HardSwish", "Clip", "Mish", "Selu", "PRelu", "Neg", "Slice", "Split",
    "Constant", "Shape", "Gather", "Cast", "ReduceSum", "ReduceMean", "Sqrt", "InstanceNormalization", "Resize",
    "ConvTranspose", "Expand", "Tile", "TopK", "GatherElements", "Pow", "ConstantOfShape",
    "Equal", "Where", "LSTM", "GRU", "Einsum", "Trilu", "Not", "Abs", "ReduceMax", "ReduceMin",
    "Pad", "Mod", "Exp", "Log", "Sign", "Reciprocal", "Erf",
}  # fmt: skip
# trigonometric and hyperbolic functions and their inverses
OPS |= {"Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"}
# sums of several operands, reductions, arg-extremes, normalizations (frontends/onnx/ops_math.py)
OPS |= {"Sum", "Mean", "Max", "Min", "ReduceL1", "ReduceLogSum", "ReduceLogSumExp", "ArgMax"}
OPS |= {"ArgMin", "Hardmax", "LpNormalization", "ThresholdedRelu", "SpaceToDepth", "CumSum"}
OPS |= {"ReduceProd", "CumProd", "ScatterElements"}


@functools.cache
def _all_cases() -> list:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return [c for c in collect_testcases("") if c.data_sets]


def _cases() -> dict:
    """The cases made only of ops rootclad imports, with float inputs (several outputs: a
    model returning a dict by their names)."""
    out = {}
    for c in _all_cases():
        inputs, outputs = c.data_sets[0]
        first = inputs[0] if inputs else None
        if (
            {n.op_type for n in c.model.graph.node} <= OPS
            and isinstance(first, np.ndarray)
            and first.dtype in (np.float32, np.float64)
            and first.ndim >= 1
        ):
            out[c.name] = c
    return out


def _is_data(graph, name: str, value, batch: int) -> bool:
    """A graph input the model reads as data (a batch of its own), not as a weight: the first
    operand of a node, any operand of arithmetic (of several operands too) and Concat, or an
    Attention's keys, values and past ones, with the batch's length."""
    if not (isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == batch):
        return False
    arithmetic = ("Add", "Sub", "Mul", "Div", "Concat", "Sum", "Mean", "Max", "Min")
    return any(
        name in n.input
        and (
            n.input[0] == name
            or n.op_type in arithmetic
            or n.op_type == "Attention"
            and name in [n.input[i] for i in (1, 2, 4, 5) if i < len(n.input)]
        )
        for n in graph.node
    )


def _split(case):
    """The case's model with its weight inputs turned into initializers, and its data inputs."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs, _ = case.data_sets[0]
    g = model.graph
    batch = np.asarray(inputs[0]).shape[0]
    data, keep = [], []
    for i, (inp, value) in enumerate(zip(g.input, inputs, strict=False)):
        if i == 0 or _is_data(g, inp.name, value, batch):
            keep.append(inp)
            data.append(torch.from_numpy(np.asarray(value)))
        else:
            g.initializer.append(numpy_helper.from_array(np.asarray(value), inp.name))
    del g.input[:]
    g.input.extend(keep)
    return model, data


# cases where onnxruntime (and torch) compute another answer than onnx's reference, and
# rootclad follows onnxruntime: aligned corners by scales that give a fractional size (the
# reference aligns to the unrounded size, onnxruntime and torch to the rounded one)
FOLLOWS_ONNXRUNTIME = {"test_resize_downsample_scales_linear_align_corners"}
RESULTS: dict[str, str] = {}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_cases()))
def test_onnx_node_case(name):
    case = _cases()[name]
    _, outputs = case.data_sets[0]
    model, data = _split(case)
    try:
        cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    except IRError as exc:
        # a node refused names itself, its op and the opset; an input, its shape; a whole graph
        # refused says why
        ops = {n.op_type for n in model.graph.node}
        msg = str(exc)
        named = "opset" in msg and any(op in msg for op in ops)
        named = named or any(f"input {i.name!r} has shape" in msg for i in model.graph.input)
        assert named or "computes nothing" in msg or "ONNX opset" in msg, msg
        RESULTS[name] = "refused"
        return
    got = cm(*data)
    got = list(got.values()) if isinstance(got, dict) else [got]
    assert len(got) == len(outputs)
    for out, expected in zip(got, outputs, strict=True):
        out, expected = out.detach().numpy(), np.asarray(expected)
        if name in FOLLOWS_ONNXRUNTIME:  # (the case's expected output is onnx's reference's)
            from fixtures.onnx import run_ort

            expected = run_ort(model, *(d.numpy() for d in data))
        assert out.shape == expected.shape, (out.shape, expected.shape)
        # onnx's backend tests compare with the case's rtol and atol (1e-3 and 1e-7 by default)
        np.testing.assert_allclose(out, expected, rtol=case.rtol, atol=case.atol)
    RESULTS[name] = "passed"


@pytest.mark.slow
def test_onnx_node_cases_are_not_all_refused():
    """The cases above are not vacuous: most of them compute."""
    names = sorted(_cases())
    passed = [n for n in names if RESULTS.get(n) == "passed"]
    if len(RESULTS) < len(names):
        pytest.skip("runs after the node cases (run the whole module)")
    print(f"ONNX node cases of supported ops: {len(passed)} passed of {len(names)} attempted, "
          f"{len(names) - len(passed)} refused")  # fmt: skip
    assert len(passed) >= 360, f"only {len(passed)} of {len(names)} cases passed"  # 367


@pytest.mark.slow
def test_every_other_onnx_node_case_is_refused_cleanly_or_runs():
    """Every node case of an op outside the list above (or with non-float data) is refused
    with an IRError naming what it refuses, or its nodes run through the table on the case's
    data (benchmarks/onnx/onnx_node_cases.py lowers and compiles every case, against onnx's
    expected outputs): none crashes."""
    others = [c for c in _all_cases() if c.name not in _cases()]
    bad, ran = [], 0
    for c in others:
        with warnings.catch_warnings():  # (torch's of a read-only numpy array)
            warnings.simplefilter("ignore", UserWarning)
            try:  # (data torch holds no tensor of, bfloat16, strings, or no batch: the file)
                model, data = _split(c)
            except (IndexError, TypeError, ValueError, NotImplementedError):
                model, data = c.model, None
        try:
            module, _, _ = rootclad.onnx.to_module(model)
            if data is not None:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    module(*data)
                ran += 1
        except IRError:
            continue
        except Exception as exc:  # noqa: BLE001 - the point is that nothing else escapes
            bad.append(f"{c.name}: {type(exc).__name__}: {exc}")
    print(
        f"ONNX node cases: {len(others) - len(bad) - ran} of {len(others)} refused "
        f"cleanly, {ran} run"
    )
    assert len(others) > 1000 and not bad, "\n".join(bad[:20])
