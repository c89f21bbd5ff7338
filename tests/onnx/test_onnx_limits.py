"""What an imported file may ask for is bounded before anything is allocated: an input of 1e9
values per sample, a constant of 1e12, initializers declared far larger than their file, a
chain of layers whose values outgrow the memory; each refused naming the sizes and the
variable that raises the limit, through rootclad.onnx.load and rootclad emit alike."""

from __future__ import annotations

import numpy as np
import pytest

import rootclad
from rootclad.compiler import emit_file
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
from fixtures.onnx import file_graph  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, x_dims, y_dims, initializers=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)],
        initializer=list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _relu(x_dims):
    return _model([helper.make_node("Relu", ["x"], ["y"], "r")], x_dims, x_dims)


def test_an_input_of_a_billion_values_per_sample_is_refused(tmp_path):
    path = tmp_path / "huge.onnx"
    onnx.save(_relu(["B", 1_000_000_000]), path)
    assert path.stat().st_size < 400
    words = r"input 'x' of per-sample shape \(1000000000,\) asks for 1,000,000,000 elements"
    with pytest.raises(IRError, match=words + ".*ROOTCLAD_MAX_SAMPLE_ELEMENTS"):
        rootclad.onnx.load(path, "mse", engine="pullback")
    with pytest.raises(IRError, match="ROOTCLAD_MAX_SAMPLE_ELEMENTS"):
        emit_file(path, tmp_path / "net.hxx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.onnx"]


def test_a_constant_of_any_shape_is_refused_before_it_is_made():
    shape = numpy_helper.from_array(np.array([1_000_000, 1_000_000], np.int64), "shape")
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["c"], "zeros"),
        helper.make_node("Add", ["x", "c"], ["y"], "add"),
    ]
    words = r"node 'zeros' \(ConstantOfShape\)'s output of per-sample shape \(1000000, 1000000\)"
    with pytest.raises(IRError, match=words):
        file_graph(_model(nodes, ["B", 4], ["B", 4], [shape]))
    # two small constants whose broadcast is huge
    a = numpy_helper.from_array(np.zeros((100_000, 1), np.float32), "a")
    b = numpy_helper.from_array(np.zeros((1, 100_000), np.float32), "b")
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["c"], "outer"),
        helper.make_node("Add", ["x", "c"], ["y"], "add"),
    ]
    with pytest.raises(IRError, match=r"node 'outer' \(Mul\)'s output .* \(100000, 100000\)"):
        file_graph(_model(nodes, ["B", 4], ["B", 4], [a, b]))


def test_initializers_are_counted_from_their_declared_size(tmp_path):
    """An initializer whose data would come from an external file: its declared 4e10 bytes are
    refused before the file is looked for."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[100_000, 100_000])
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="weights.bin")
    mm = helper.make_node("MatMul", ["x", "w"], ["y"], "mm")
    model = _model([mm], ["B", 100_000], ["B", 100_000], [w])
    path = tmp_path / "external.onnx"
    path.write_bytes(model.SerializeToString())
    words = r"initializers and constants together asks for 40,000,000,000 bytes"
    with pytest.raises(IRError, match=words + ".*ROOTCLAD_MAX_PARAMETER_BYTES"):
        file_graph(path)


def test_the_values_of_a_graph_are_bounded_together(monkeypatch):
    """Each value fits, the chain does not."""
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], f"r{i}") for i in range(9)]
    nodes[0].input[0], nodes[-1].output[0] = "x", "y"
    model = _model(nodes, ["B", 1000], ["B", 1000])
    file_graph(model)
    # 2 samples x 1000 x 4 bytes a value: the input and 5 layers fit in 48,000 bytes
    monkeypatch.setenv("ROOTCLAD_MAX_ACTIVATION_BYTES", "48000")
    with pytest.raises(IRError, match=r"with node 'r6' \(Relu\)'s output.* asks for 56,000 bytes"):
        file_graph(model)
    monkeypatch.setenv("ROOTCLAD_MAX_ACTIVATION_BYTES", "0")  # no limit
    file_graph(model)


@pytest.mark.parametrize("value", ["-1", "lots", "1e9"])
def test_a_bad_limit_is_named(monkeypatch, value):
    monkeypatch.setenv("ROOTCLAD_MAX_SAMPLE_ELEMENTS", value)
    with pytest.raises(ValueError, match=f"ROOTCLAD_MAX_SAMPLE_ELEMENTS='{value}'"):
        file_graph(_relu(["B", 4]))


def test_constants_made_in_the_graph_are_bounded_one_by_one_and_together(monkeypatch):
    """A Concat of allowed constants is checked before it is made; every constant counts
    with the graph's values."""
    monkeypatch.setenv("ROOTCLAD_MAX_SAMPLE_ELEMENTS", "1000")
    shape = numpy_helper.from_array(np.array([600], np.int64), "shape")
    zeros = [helper.make_node("ConstantOfShape", ["shape"], [f"z{i}"], f"z{i}") for i in range(2)]
    cat = helper.make_node("Concat", ["z0", "z1"], ["c"], "cat", axis=0)
    add = helper.make_node("Add", ["x", "c"], ["y"], "add")
    with pytest.raises(
        IRError, match=r"node 'cat' \(Concat\)'s output of per-sample shape \(1200,\)"
    ):
        file_graph(_model([*zeros, cat, add], ["B", 1], ["B", 1200], [shape]))
    monkeypatch.setenv("ROOTCLAD_MAX_SAMPLE_ELEMENTS", "0")
    # z0, z1: 600 float32 values each, at the example batch of 2: 4,800 bytes each
    monkeypatch.setenv("ROOTCLAD_MAX_ACTIVATION_BYTES", "8000")
    add = helper.make_node("Add", ["x", "z1"], ["y"], "add")
    with pytest.raises(IRError, match=r"with node 'z1' \(ConstantOfShape\).* 9,600 bytes"):
        file_graph(_model([*zeros, add], ["B", 1], ["B", 600], [shape]))


def _external(tmp_path, dims, data: bytes, **entries):
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims)
    w.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "w.bin", **entries}.items():
        w.external_data.add(key=key, value=str(value))
    (tmp_path / "w.bin").write_bytes(data)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"], "mm")], ["B", 2], ["B", 2], [w])
    path = tmp_path / "net.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize(
    "dims, size, entries, words",
    [
        ([2, 2], 10_000_000, {}, None),  # reads its 16 bytes only
        ([2, 2], 16, {"length": 4000}, "declared as 4000 bytes"),
        ([2, 2], 8, {}, "does not hold 16 bytes"),
        ([2, 2], 16, {"location": "../w.bin"}, "not in the model's directory"),
        ([-1000, 2], 16, {}, r"dims \[-1000, 2\]"),
    ],
)
def test_external_data_is_read_as_declared_or_refused(tmp_path, dims, size, entries, words):
    path = _external(
        tmp_path, dims, np.eye(2, dtype=np.float32).tobytes().ljust(size, b"\0")[:size], **entries
    )
    if words is None:
        module, _, _ = rootclad.onnx.to_module(path)
        (w,) = [p for p in module.parameters()]
        assert (
            w.numel() == 4 and w.detach().numpy().tobytes() == np.eye(2, dtype=np.float32).tobytes()
        )
    else:
        with pytest.raises(IRError, match=f"initializer 'w'.*{words}|tensor 'w'.*{words}"):
            file_graph(path)


def test_a_tensor_of_no_onnx_type_is_named():
    w = TensorProto(name="w", data_type=99, dims=[2, 2])
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"], "mm")], ["B", 2], ["B", 2], [w])
    with pytest.raises(IRError, match="tensor 'w' has data type 99"):
        file_graph(model)
