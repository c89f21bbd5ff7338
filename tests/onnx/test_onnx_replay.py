"""ONNX files through one table of ONNX ops and the export front-end
(``rootclad.onnx.load(path)``): a file of either of torch's exporters
(opset 20; the TorchScript one writes the view as Shape, Gather, Unsqueeze, Concat and
Reshape of the batch's size, the default, dynamo one (with onnxscript) a Reshape with
allowzero) against torch autograd in float64 with the file's weights;
recurrent layers against onnx's reference; an op the table lacks, an attribute it does not
read, a name no C++ or Python may take and a file asking for too much, refused or renamed
before anything is built."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close
from torch import nn

import rootclad
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.pool = nn.MaxPool1d(2)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(20, 3)

    def forward(self, x):
        y = self.pool(torch.relu(self.conv(x)))  # (B, 4, 5)
        y = self.norm(y.transpose(1, 2))  # (B, 5, 4)
        return self.head(torch.nn.functional.gelu(y).reshape(x.shape[0], -1))


def _file(net, x, dynamo: bool) -> bytes:
    f = io.BytesIO()
    batch = torch.export.Dim("B", min=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not dynamo:  # views as Shape, Gather, Concat and Reshape of the batch's size
            axes = {"x": {0: "B"}}
            torch.onnx.export(net, (x,), f, dynamo=False, input_names=["x"], dynamic_axes=axes)
            return f.getvalue()
        shapes = ({0: batch},)
        program = torch.onnx.export(
            net, (x,), dynamo=True, input_names=["x"], dynamic_shapes=shapes, verbose=False
        )
        program.save(f)
    return f.getvalue()


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript-exporter", "dynamo-exporter"])
def test_a_file_of_either_exporter_matches_torch_through_the_table(tmp_path, dynamo):
    if dynamo:  # torch's default exporter is written with onnxscript (an optional dependency)
        pytest.importorskip("onnxscript", reason="torch's default ONNX exporter needs onnxscript")
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(3, 2, 10)
    path = tmp_path / "net.onnx"
    path.write_bytes(_file(net, x, dynamo))
    model = onnx.load(str(path))
    assert any(n.op_type == "Reshape" for n in model.graph.node)
    cm = rootclad.onnx.load(path, loss="mse", engine="pullback", dtype=torch.float64)
    # the reference: torch in float64 with the file's (float32) weights
    ref = Net().double().eval()
    ref.load_state_dict(net.state_dict())
    x64 = x.double().requires_grad_(True)
    out_ref = ref(x64)
    d_out = torch.randn(out_ref.shape, dtype=torch.float64)
    dx_ref, *dp_ref = torch.autograd.grad(out_ref, [x64, *ref.parameters()], d_out)
    xc = x.double().requires_grad_(True)
    out = cm(xc)
    dx, *dp = torch.autograd.grad(out, [xc, *cm.parameters()], d_out)
    assert_close_rel(out.detach(), out_ref.detach(), 1e-10, "forward")
    assert_close_rel(dx, dx_ref, 1e-10, "d_input")
    # the file's initializers, by torch's names where they are plain: the same parameters
    mine = dict(zip([n for n, _ in cm.named_parameters()], dp, strict=True))
    theirs = dict(zip([n for n, _ in ref.named_parameters()], dp_ref, strict=True))
    assert set(mine) == set(theirs), (sorted(mine), sorted(theirs))
    assert_grads_close(mine, theirs, 1e-10, "vjp", against_all=True)


def _graph(nodes, inits, out_shape):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", *out_shape])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_running_sums_products_and_norms_match_onnxs_reference():
    """CumSum and CumProd, exclusive and reversed, ReduceProd over two axes without them, a
    product of Shape's sizes (numbers: the Reshape reads them), and LpNormalization of a row
    of zeros (0, as ONNX says, and no NaN in the gradient), in one file, against onnx's
    reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    nodes = [
        helper.make_node("CumSum", ["x", "two"], ["c0"]),
        helper.make_node("CumSum", ["x", "two"], ["c1"], exclusive=1, reverse=1),
        helper.make_node("CumProd", ["x", "last"], ["p1"], exclusive=1),
        helper.make_node("CumProd", ["x", "two"], ["p2"], reverse=1),
        helper.make_node("ReduceProd", ["x", "axes"], ["r"], keepdims=0),
        helper.make_node("Mul", ["x", "rows"], ["xm"]),
        helper.make_node("LpNormalization", ["xm"], ["n2"], axis=2, p=2),
        helper.make_node("LpNormalization", ["xm"], ["n1"], axis=-1, p=1),
        helper.make_node("Shape", ["x"], ["s"], start=1),
        helper.make_node("ReduceProd", ["s"], ["k"], keepdims=1),
        helper.make_node("Concat", ["minus1", "k"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
    ]
    rows = np.array([[[1.0], [0.0], [1.0]]], np.float32)  # the second row: zeros
    inits = [const("two", np.int64(2)), const("last", np.int64(-1))]
    inits += [const("minus1", np.array([-1], np.int64))]
    inits += [const("axes", np.array([1, 2], np.int64)), const("rows", rows)]
    outs = {"c0": [3, 4], "c1": [3, 4], "p1": [3, 4], "p2": [3, 4], "r": [], "n2": [3, 4]}
    outs |= {"n1": [3, 4], "flat": [12]}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", *s]) for n, s in outs.items()],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    x = np.random.default_rng(0).uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):  # (the reference's 0 / 0, then 0)
        want = dict(zip(outs, ReferenceEvaluator(model).run(None, {"x": x}), strict=True))
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse", loss_output="n2")
    xt = torch.from_numpy(x).requires_grad_()
    got = cm(xt)
    for name in outs:
        np.testing.assert_allclose(got[name].detach().numpy(), want[name], rtol=1e-5, atol=1e-6)
    assert not got["n2"][:, 1].any() and not got["n1"][:, 1].any()  # the row of zeros
    got["n2"].sum().backward()
    assert torch.isfinite(xt.grad).all() and not xt.grad[:, 1].any()


def test_an_op_the_table_lacks_is_refused_naming_the_node_its_op_and_the_opset():
    model = _graph([helper.make_node("Shrink", ["x"], ["y"], name="pick")], [], [4])
    with pytest.raises(IRError, match=r"node 'pick' \(Shrink, opset 18\): .*no Shrink"):
        rootclad.onnx.load(model)


def test_an_attribute_the_table_does_not_read_or_a_shape_the_file_misdeclares_is_refused():
    shapes = {"W": (1, 8, 4), "R": (1, 8, 2)}
    weights = [numpy_helper.from_array(np.ones(s, np.float32), n) for n, s in shapes.items()]
    alpha = {"hidden_size": 2, "activation_alpha": [0.5]}  # (an LSTM's the table does not read)
    lstm = helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="m", **alpha)
    with pytest.raises(IRError, match=r"node 'm' \(LSTM, opset 18\): attribute activation_al"):
        rootclad.onnx.load(_graph([lstm], weights, [4]))
    scales = numpy_helper.from_array(np.array([1.0, 1.0], np.float32), "scales")
    resize = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="m", antialias=1)
    with pytest.raises(IRError, match=r"node 'm' \(Resize, opset 18\): antialias=1"):
        rootclad.onnx.load(_graph([resize], [scales], [4]))
    wrong = _graph([helper.make_node("Relu", ["x"], ["y"])], [], [5])
    with pytest.raises(IRError, match=r"gives 'y' of shape \(B, 4\), the file declares"):
        rootclad.onnx.load(wrong)


def test_what_the_export_front_end_refuses_is_named_by_the_files_node():
    """A node that fixes the batch size (torch.export's own message names no node), gathers
    along the batch axis, or becomes an ATen op rootclad does not lower is refused naming
    the file's node, its op and opset."""
    shape = numpy_helper.from_array(np.array([2, 2, 2], np.int64), "shape")
    fixed = _graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")], [shape], [2, 2])
    with pytest.raises(IRError, match=r"node 'r' \(Reshape, opset 18\): fixes the batch size to 2"):
        rootclad.onnx.load(fixed)  # (the example batch is 2)
    first = numpy_helper.from_array(np.array([0], np.int64), "first")
    gather = _graph([helper.make_node("Gather", ["x", "first"], ["y"], name="g")], [first], [4])
    with pytest.raises(IRError, match=r"node 'g' \(Gather, opset 18\): gathers along the batch"):
        rootclad.onnx.load(gather)
    floor = _graph([helper.make_node("Floor", ["x"], ["y"], name="f")], [], [4])
    with pytest.raises(IRError, match=r"node 'f' \(Floor, opset 18\), as ATen op aten\.floor"):
        rootclad.onnx.load(floor)


def test_initializer_names_no_python_or_cxx_may_take_are_renamed():
    hostile = ['w"); system("id"); //', "class", "1x", "__init__.weight"]
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    reads = zip(["x", "y0", "y1", "y2"], hostile, strict=True)
    nodes = [
        helper.make_node("MatMul", [prev, name], [f"y{i}" if i < 3 else "y"])
        for i, (prev, name) in enumerate(reads)
    ]
    model = _graph(nodes, [numpy_helper.from_array(w, n) for n in hostile], [4])
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    names = [n for n, _ in cm.named_parameters()]
    assert len(names) == 4 and all(n.replace(".", "").replace("_", "").isalnum() for n in names)
    x = torch.randn(2, 4)
    m = torch.from_numpy(w)
    want = x @ m @ m @ m @ m
    assert_close_rel(cm(x).detach(), want, 1e-5, "forward")


def _recurrents():
    """x (B, 3, 3), batch first (layout=1), through a bidirectional LSTM, then a GRU of each
    form (the reset gate before or after the recurrent product: torch writes the latter), each
    of hidden size 4 reading the last one's Y (B, 3, 2, 4) as (B, 3, 8): the last Y and the
    LSTM's final hidden state (B, 2, 4)."""
    rng = np.random.default_rng(3)
    nodes, inits, src, features = [], [], "x", 3
    layers = [
        ("LSTM", 4, {}),
        ("GRU", 3, {"linear_before_reset": 0}),
        ("GRU", 3, {"linear_before_reset": 1}),
    ]
    for i, (op, gates, attrs) in enumerate(layers):
        shapes = {"W": (2, gates * 4, features), "R": (2, gates * 4, 4), "Bias": (2, 8 * gates)}
        for name, shape in shapes.items():
            value = rng.standard_normal(shape).astype(np.float32)
            inits.append(numpy_helper.from_array(value, f"{name}{i}"))
        both = {"direction": "bidirectional", "layout": 1, "hidden_size": 4, **attrs}
        outs = [f"y{i}", "yh" if i == 0 else ""]
        nodes.append(helper.make_node(op, [src, f"W{i}", f"R{i}", f"Bias{i}"], outs, **both))
        nodes.append(helper.make_node("Reshape", [f"y{i}", "flat"], [f"f{i}"]))
        src, features = f"f{i}", 8
    inits.append(numpy_helper.from_array(np.array([0, 3, 8], dtype=np.int64), "flat"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, 3])],
        [
            helper.make_tensor_value_info("f2", TensorProto.FLOAT, ["B", 3, 8]),
            helper.make_tensor_value_info("yh", TensorProto.FLOAT, ["B", 2, 4]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_recurrent_layers_batch_first_and_both_ways_match_onnxs_reference():
    from onnx.reference import ReferenceEvaluator  # (onnxruntime takes no layout=1)

    model = _recurrents()
    x = np.random.default_rng(4).standard_normal((3, 3, 3)).astype(np.float32)
    want = dict(zip(["f2", "yh"], ReferenceEvaluator(model).run(None, {"x": x}), strict=True))
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    got = cm(torch.from_numpy(x))
    for key in want:
        assert_close_rel(got[key].detach(), torch.from_numpy(want[key]), 1e-5, key)


def test_a_file_asking_for_more_than_the_limits_is_refused_before_it_is_computed():
    sizes = numpy_helper.from_array(np.array([1, 4, 1 << 30], dtype=np.int64), "sizes")
    nodes = [
        helper.make_node("Unsqueeze", ["x", "axis"], ["u"]),
        helper.make_node("Expand", ["u", "sizes"], ["big"], name="huge"),
        helper.make_node("ReduceSum", ["big", "axis"], ["y"], keepdims=0),
    ]
    axis = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis")
    model = _graph(nodes, [sizes, axis], [4])
    with pytest.raises(IRError, match=r"node 'huge' \(Expand\)'s output .*ROOTCLAD_MAX_SAMPLE"):
        rootclad.onnx.load(model)
    values = {"zero": 0, "far": 1 << 40, "one": 1}
    bounds = [numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in values.items()]
    counted = [
        helper.make_node("Range", ["zero", "far", "one"], ["r"], name="count"),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["rf"], ["s"], keepdims=1),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    with pytest.raises(IRError, match=r"node 'count' \(Range, opset 18\): .* numbers"):
        rootclad.onnx.load(_graph(counted, bounds, [4]))


def _attention(**attrs):
    """q (B, 5, 12) attending to k and v (B, 6, 6): 4 query heads of size 3 over 2 key and
    value heads (grouped), through ONNX's Attention (opset 23)."""
    inputs = ["q", "k", "v", *(["mask"] if "mask" in attrs else [])]
    given = {k: v for k, v in attrs.items() if k != "mask"}
    node = helper.make_node("Attention", inputs, ["y"], q_num_heads=4, kv_num_heads=2, **given)
    inits = []
    if "mask" in attrs:  # True attends (a key masked for every query, one for the first two)
        keep = np.ones((5, 6), bool)
        keep[:, 4] = False
        keep[:2, 1] = False
        inits.append(numpy_helper.from_array(keep, "mask"))
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node],
        "g",
        [
            info(n, TensorProto.FLOAT, ["B", *s])
            for n, s in (("q", (5, 12)), ("k", (6, 6)), ("v", (6, 6)))
        ],
        [info("y", TensorProto.FLOAT, ["B", 5, 12])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize(
    "attrs",
    [{"is_causal": 1}, {"mask": True, "scale": 0.7, "softcap": 2.0}, {"scale": 0.0}],
    ids=["causal", "bool-mask-scale-softcap", "scale-0"],
)
def test_attention_nodes_match_onnxs_reference_and_torch_autograd(attrs):
    """ONNX's Attention node (opset 23): the forward against onnx's reference, the gradients
    against torch autograd through the table's own torch ops (float64)."""
    from onnx.reference import ReferenceEvaluator

    from rootclad.frontends.onnx import to_module

    model = _attention(**attrs)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(s).astype(np.float32) for s in ((3, 5, 12), (3, 6, 6), (3, 6, 6))]
    (want,) = ReferenceEvaluator(model).run(None, dict(zip("qkv", xs, strict=True)))
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    got = cm(*(torch.from_numpy(x) for x in xs))
    assert_close_rel(got.detach(), torch.from_numpy(want), 1e-5, "forward")
    cm64 = rootclad.onnx.load(model, loss="mse", engine="pullback", dtype=torch.float64)
    ref = to_module(model)[0].double()
    ins = [torch.from_numpy(x).double().requires_grad_(True) for x in xs]
    d_out = torch.randn(3, 5, 12, dtype=torch.float64)
    want_grads = torch.autograd.grad(ref(*ins), ins, d_out)
    ins = [x.detach().requires_grad_(True) for x in ins]
    got_grads = torch.autograd.grad(cm64(*ins), ins, d_out)
    for g, w in zip(got_grads, want_grads, strict=True):  # (scale 0: d_q is zeros)
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_what_follows_a_pool_whose_last_ceil_window_onnx_keeps_may_differ_from_the_file():
    """A MaxPool (5 long, kernel 2, stride 2, pads 1, ceil_mode) then a Relu: onnx's shape
    inference keeps a last window that starts in the padding (4 values), onnxruntime and torch
    drop it (3); the file declares 4 for the Relu's output, which rootclad does not hold
    against it, and the values are onnxruntime's."""
    pool = helper.make_node(
        "MaxPool", ["x"], ["p"], kernel_shape=[2], strides=[2], pads=[1, 1], ceil_mode=1
    )
    graph = helper.make_graph(
        [pool, helper.make_node("Relu", ["p"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(6).standard_normal((2, 1, 5)).astype(np.float32)
    from fixtures.onnx import run_ort

    want = run_ort(model, x)
    assert want.shape == (2, 1, 3)
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert_close_rel(cm(torch.from_numpy(x)).detach(), torch.from_numpy(want), 1e-6, "forward")
