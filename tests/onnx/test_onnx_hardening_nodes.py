"""Attributes, declared shapes, broadcasting and names of imported ONNX nodes (issue 25,
11b, 11c, 18), each against onnxruntime: an attribute rootclad does not implement is refused
by name, a node whose output differs from the shape the file declares is refused, a constant
operand of a higher rank broadcasts as numpy does (or is refused), and names do not matter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rootclad
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, x_dims, y_dims, initializers=(), opset=19, x="x", y="y"):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, y_dims)],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def _ort(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _check_against_ort(model, x):
    cm = rootclad.onnx.load(model, "mse", engine="pullback")
    got = cm(torch.from_numpy(x)).detach().numpy()
    want = _ort(model, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- 11b: attributes ------------------------------------------------------------------------
def test_average_pool_dilations_are_refused_by_name():
    """onnxruntime gives (2, 1, 4, 4); rootclad gave the undilated (2, 1, 5, 5) silently."""
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[2, 2],
                            dilations=[2, 2])  # fmt: skip
    model = _model([node], ["B", 1, 6, 6], ["B", 1, None, None])
    assert _ort(model, np.ones((2, 1, 6, 6), np.float32)).shape == (2, 1, 4, 4)
    with pytest.raises(IRError, match=r"'pool' \(AveragePool, opset 19\): dilated average pooling"):
        rootclad.onnx.load(model, "mse", engine="pullback")


def test_average_pool_unit_dilations_are_the_plain_pool():
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[1, 1])
    model = _model([node], ["B", 1, 6, 6], ["B", 1, 5, 5])
    _check_against_ort(model, np.random.default_rng(0).standard_normal((2, 1, 6, 6), np.float32))


@pytest.mark.parametrize("op, attrs, x_dims, words", [
    ("LayerNormalization", {"stash_type": 0}, [4], "stash_type"),
    ("Conv", {"kernel_shape": [2]}, [1, 6], "kernel_shape"),
])  # fmt: skip
def test_attributes_rootclad_does_not_implement_are_refused_by_name(op, attrs, x_dims, words):
    inits, inputs = [], ["x"]
    if op == "LayerNormalization":
        inits, inputs = [numpy_helper.from_array(np.ones(4, np.float32), "s")], ["x", "s"]
    if op == "Conv":  # a kernel of 3 that the node says is 2
        inits = [numpy_helper.from_array(np.ones((1, 1, 3), np.float32), "w")]
        inputs = ["x", "w"]
    node = helper.make_node(op, inputs, ["y"], name="n1", **attrs)
    model = _model([node], ["B", *x_dims], ["B", *x_dims], inits)
    with pytest.raises(IRError, match=rf"'n1' \({op}, opset 19\).*{words}"):
        rootclad.onnx.load(model, "mse", engine="pullback")


def test_an_attribute_the_table_lacks_is_refused_by_name():
    """Constant's value_string: a form of the attribute the importer does not read."""
    nodes = [helper.make_node("Constant", [], ["c"], name="k", value_string="two"),
             helper.make_node("Add", ["x", "c"], ["y"])]  # fmt: skip
    model = _model(nodes, ["B", 3], ["B", 3])
    with pytest.raises(IRError, match=r"'k' \(Constant, opset 19\).*value_string"):
        rootclad.onnx.load(model, "mse", engine="pullback")


def test_a_node_whose_shape_differs_from_the_declared_one_is_refused():
    """The file declares y as (B, 5); rootclad's Relu gives (B, 4): both shapes named."""
    node = helper.make_node("Relu", ["x"], ["y"], name="act")
    model = _model([node], ["B", 4], ["B", 5])
    with pytest.raises(IRError, match=r"'act' \(Relu.*\(B, 4\), the file declares \(B, 5\)"):
        rootclad.onnx.load(model, "mse", engine="pullback")


def test_a_value_info_shape_is_checked_too():
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="a1"),
             helper.make_node("Tanh", ["h"], ["y"], name="a2")]  # fmt: skip
    model = _model(nodes, ["B", 4], ["B", 4])
    model.graph.value_info.append(
        helper.make_tensor_value_info("h", TensorProto.FLOAT, ["B", 2, 2])
    )
    with pytest.raises(IRError, match=r"'a1' \(Relu.*\(B, 4\), the file declares \(B, 2, 2\)"):
        rootclad.onnx.load(model, "mse", engine="pullback")


def test_a_folded_concat_keeps_its_axis():
    """A MatMul weight (2, 4) built by Concat of two (2, 2) along axis 1: rootclad folded it
    along axis 0 and refused the (4, 2) weight."""
    g = np.random.default_rng(1)
    inits = [numpy_helper.from_array(g.standard_normal((2, 2)).astype(np.float32), n)
             for n in ("w1", "w2")]  # fmt: skip
    nodes = [helper.make_node("Concat", ["w1", "w2"], ["w"], axis=1),
             helper.make_node("MatMul", ["x", "w"], ["y"])]  # fmt: skip
    _check_against_ort(
        _model(nodes, ["B", 2], ["B", 4], inits), g.standard_normal((3, 2), np.float32)
    )


@pytest.mark.parametrize("op, c_shape, axes", [("Unsqueeze", (1,), [0, 1]),
                                               ("Squeeze", (1, 1, 1, 1), [0])])  # fmt: skip
def test_folded_unsqueeze_and_squeeze_keep_their_axes(op, c_shape, axes):
    """A one-element constant reshaped to (1, 1, 1) and added to x (B, 4): onnxruntime gives
    (1, B, 4), which rootclad refuses; it ignored the axes and gave (B, 4)."""
    inits = [numpy_helper.from_array(np.full(c_shape, 0.5, np.float32), "c"),
             numpy_helper.from_array(np.array(axes, np.int64), "axes")]  # fmt: skip
    nodes = [helper.make_node(op, ["c", "axes"], ["c3"]),
             helper.make_node("Add", ["x", "c3"], ["y"], name="add")]  # fmt: skip
    model = _model(nodes, ["B", 4], [1, "B", 4], inits)
    assert _ort(model, np.ones((2, 4), np.float32)).shape == (1, 2, 4)
    with pytest.raises(IRError, match=r"'add' \(Add.*batch"):
        rootclad.onnx.load(model, "mse", engine="pullback")


def test_a_folded_cast_converts():
    """Cast of a constant 2.7 to int64 and back is 2, as onnxruntime gives; it stayed 2.7."""
    inits = [numpy_helper.from_array(np.array(2.7, np.float32), "c")]
    nodes = [helper.make_node("Cast", ["c"], ["ci"], to=TensorProto.INT64),
             helper.make_node("Cast", ["ci"], ["cf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "cf"], ["y"])]  # fmt: skip
    _check_against_ort(_model(nodes, ["B", 4], ["B", 4], inits), np.ones((2, 4), np.float32))


# -- 11c: broadcasting a constant of higher rank ---------------------------------------------
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
@pytest.mark.parametrize("c_rank", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("first", [True, False], ids=["tensor-first", "constant-first"])
def test_a_one_element_constant_broadcasts_as_onnxruntime(op, c_rank, first):
    """x (B, 4) with a one-element constant of rank c_rank: the output rank is the larger one,
    as in numpy; a rank above x's would put axes before the batch, which rootclad refuses."""
    c = numpy_helper.from_array(np.full((1,) * c_rank, 1.5, np.float32), "c")
    inputs = ["x", "c"] if first else ["c", "x"]
    node = helper.make_node(op, inputs, ["y"], name="bin")
    x = np.random.default_rng(2).uniform(0.5, 2.0, (2, 4)).astype(np.float32)
    want = _ort(_model([node], ["B", 4], None, [c]), x)
    model = _model([node], ["B", 4], list(want.shape), [c])
    if op == "Pow" and (not first or c_rank > 2):  # 1.5 ** x: not imported, refused by name
        with pytest.raises(IRError, match=rf"'bin' \({op}, opset 19\)"):
            rootclad.onnx.load(model, "mse", engine="pullback")
    elif c_rank <= 2:
        _check_against_ort(model, x)
    else:
        assert want.shape == (1,) * (c_rank - 2) + (2, 4)
        with pytest.raises(IRError, match=rf"'bin' \({op}.*batch"):
            rootclad.onnx.load(model, "mse", engine="pullback")


def test_the_ort_check_fails_on_a_wrong_shape():
    """_check_against_ort is not vacuous: a model whose output differs in shape fails it."""
    node = helper.make_node("Relu", ["x"], ["y"])
    model = _model([node], ["B", 4], ["B", 4])
    cm = rootclad.onnx.load(model, "mse", engine="pullback")
    x = np.ones((2, 4), np.float32)
    with pytest.raises(AssertionError):
        assert cm(torch.from_numpy(x)).detach().numpy().shape == _ort(model, x)[None].shape


# -- 18: names ------------------------------------------------------------------------------
NAMES = ["class", "def", "1x", "a-b", "größe", "", "training", "run", "forward", "_steps", "x.y"]


@pytest.mark.parametrize("name", NAMES, ids=[repr(n) for n in NAMES])
def test_names_do_not_matter(name):
    """Node, value and initializer names like Python keywords, digits first, punctuation,
    unicode, empty (a node's name may be) or a torch.nn.Module attribute, against onnxruntime."""
    value = name or "v"  # a value's name may not be empty (that means 'absent')
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((3, 4), np.float32),
                                f"{value}.weight")  # fmt: skip
    b = numpy_helper.from_array(np.zeros(3, np.float32), f"{value}.bias")
    nodes = [
        helper.make_node("Gemm", [value, w.name, b.name], [f"{value}/out"], name=name, transB=1),
        helper.make_node("Relu", [f"{value}/out"], [f"{value}:y"], name=name and f"{name} 2"),
    ]
    model = _model(nodes, ["B", 4], ["B", 3], [w, b], x=value, y=f"{value}:y")
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    _check_against_ort(model, x)
