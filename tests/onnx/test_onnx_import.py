"""ONNX import (rootclad.onnx.load) against references no one here wrote: onnxruntime for the
forward pass of the file itself, torch autograd of the model the file was exported from for the
gradients, and hand-built graphs (onnx.helper) for the attribute combinations of single ops.
"""

from __future__ import annotations

import io
import itertools
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import rootclad
from rootclad.gw.models import gw_cnn, gw_mlp, gw_resnet
from rootclad.ir.graph import IRError
from rootclad.nets import digits_cnn
from rootclad.toolchain import find_clad

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from fixtures.onnx import export, run_ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


class _Tabular(nn.Module):
    """LayerNorm, residual addition, concatenation, GELU, log-softmax: ops a chain lacks."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(6)
        self.fc1 = nn.Linear(6, 6)
        self.fc2 = nn.Linear(12, 4)

    def forward(self, x):
        h = self.norm(x)
        h = nn.functional.gelu(self.fc1(h)) + h
        return torch.log_softmax(self.fc2(torch.cat([h, x * 0.5], dim=1)), dim=1)


class _ParamNet(nn.Module):
    """f(x, theta): a parameterised network, the two inputs concatenated."""

    def __init__(self):
        super().__init__()
        self.features = nn.Linear(8, 6)
        self.head = nn.Sequential(nn.Linear(6 + 2, 5), nn.Tanh(), nn.Linear(5, 1))

    def forward(self, x, theta):
        return self.head(torch.cat([torch.relu(self.features(x)), theta], dim=1))


MODELS = {
    "gw-mlp": (lambda: gw_mlp(2048), [(2048,)]),
    "gw-cnn": (lambda: gw_cnn(2048), [(1, 2048)]),
    "gw-resnet-bn": (lambda: gw_resnet(2048, batch_norm=True), [(1, 2048)]),
    "digits-cnn": (lambda: digits_cnn(), [(1, 28, 28)]),
    "tabular": (lambda: _Tabular(), [(6,)]),
    "softmax-classifier": (
        lambda: nn.Sequential(nn.Linear(5, 8), nn.ELU(), nn.Linear(8, 3), nn.Softmax(dim=1)),
        [(5,)],
    ),  # fmt: skip
    "param-net": (lambda: _ParamNet(), [(8,), (2,)]),
}


def _perturb_bn(net):
    g = torch.Generator().manual_seed(3)
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return net


def _engine(engine: str) -> str:
    if engine == "clad" and find_clad()[0] is None:
        pytest.skip(f"needs Clad: {find_clad()[1]}")
    return engine


def _close(got, want, rtol, what):
    scale = want.abs().max().item()
    err = (got.double() - want.double()).abs().max().item()
    assert err <= rtol * max(scale, 1e-30), f"{what}: {err:.3e} against {scale:.3e}"


@pytest.mark.parametrize("engine", ["pullback", pytest.param("clad", marks=pytest.mark.clad)])
@pytest.mark.parametrize("name", MODELS)
def test_exported_model_matches_onnxruntime_and_torch_gradients(name, engine):
    """Forward: onnxruntime on the file, and the torch module it came from. Gradients: torch
    autograd of the module the file came from (input gradients) and of the importer's own
    module in float64 (every parameter's: an exporter may fold layers, BatchNorm into Conv)."""
    build, shapes = MODELS[name]
    torch.manual_seed(0)
    net = _perturb_bn(build()).eval()
    xs = tuple(torch.randn(5, *s) for s in shapes)
    model = export(net, xs if len(xs) > 1 else xs[0])
    cm = rootclad.onnx.load(model, engine=_engine(engine))
    out = cm(*xs).detach().numpy()
    ref = run_ort(model, *(x.numpy() for x in xs))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_allclose(out, net(*xs).detach().numpy(), rtol=1e-4,
                               atol=1e-5 * np.abs(ref).max())  # fmt: skip
    d_out = torch.randn(out.shape)
    # the compiled VJP: inputs and parameters
    xr = tuple(x.clone().requires_grad_(True) for x in xs)
    got = torch.autograd.grad(cm(*xr), [*xr, *cm.parameters()], d_out)
    # input gradients: the torch model the file came from, in float64
    ref64 = build().double()
    ref64.load_state_dict(net.state_dict())
    ref64.eval()
    x64 = tuple(x.double().requires_grad_(True) for x in xs)
    want = torch.autograd.grad(ref64(*x64), x64, d_out.double())
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        _close(g, w, 1e-4, f"{name} d input {i}")
    without = cm.input_grad(*xs, d_out=d_out)  # the same without autograd
    without = without if isinstance(without, tuple) else (without,)
    for g, w in zip(without, got, strict=False):
        _close(g, w, 1e-6, f"{name} input_grad")
    # parameter gradients: torch autograd through the importer's module, in float64
    module, _, _ = rootclad.onnx.to_module(model)
    module = module.double()
    m64 = tuple(x.double().requires_grad_(True) for x in xs)
    names = [n for n, _ in module.named_parameters()]
    assert names == [n for n, _ in cm.named_parameters()]
    want = torch.autograd.grad(module(*m64), list(module.parameters()), d_out.double())
    for n, g, w in zip(names, got[len(xs) :], want, strict=True):
        _close(g, w, 1e-4, f"{name} d {n}")


@pytest.mark.parametrize("opset, dtype", [(13, torch.float32), (17, torch.float64),
                                           (20, torch.float32)])  # fmt: skip
def test_opsets_and_float64(opset, dtype):
    """GELU is an Erf pattern before opset 20 and an op from it; a float64 graph compiles in
    float64, its weights kept to the last bit (they are not float32 numbers)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(1, 3, 5), nn.PReLU(3), nn.GELU(), nn.MaxPool1d(2), nn.Flatten(),
                        nn.Linear(3 * 14, 4), nn.Softmax(dim=1)).double()  # fmt: skip
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1e-6 * torch.randn_like(p))
    net = net.to(dtype).eval()
    x = torch.randn(5, 1, 32, dtype=dtype)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, x, f, dynamo=False, input_names=["x"], opset_version=opset,
                          dynamic_axes={"x": {0: "B"}})  # fmt: skip
    model = onnx.load_from_string(f.getvalue())
    ops = {n.op_type for n in model.graph.node}
    assert ("Gelu" in ops) == (opset >= 20) and ("Erf" in ops) == (opset < 20)
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    assert cm.dtype == dtype
    if dtype == torch.float32:
        ref, rtol, atol = run_ort(model, x.numpy()), 1e-5, 1e-7
    else:  # onnxruntime has no float64 Conv: the module the file came from
        ref, rtol, atol = net(x).detach().numpy(), 1e-12, 0.0
    np.testing.assert_allclose(cm(x).detach().numpy(), ref, rtol=rtol, atol=atol)


def test_named_parameters_keep_the_torch_names_where_the_file_has_them():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1)).eval()
    cm = rootclad.onnx.load(export(net, torch.randn(2, 4)), engine="pullback")
    assert [n for n, _ in cm.named_parameters()] == [n for n, _ in net.named_parameters()]


def test_fine_tuning_an_imported_model_tracks_torch():
    """loss_and_grad and train_step of the imported MLP against torch.optim on the original."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 1)).double().eval()
    x = torch.randn(16, 8, dtype=torch.float64)
    y = torch.randint(0, 2, (16, 1)).double()
    model = export(net.float(), x.float())
    net.double()
    cm = rootclad.onnx.load(model, engine="pullback", dtype=torch.float64)
    cm.load_state_dict(net.state_dict())
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    topt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(20):
        loss = cm.train_step(x, y, opt)
        topt.zero_grad()
        ref = nn.functional.binary_cross_entropy_with_logits(net(x), y)
        ref.backward()
        topt.step()
        assert abs(float(loss) - ref.item()) <= 1e-10 * abs(ref.item())
    for n, p in net.named_parameters():
        assert torch.allclose(dict(cm.named_parameters())[n], p, rtol=1e-9, atol=1e-12), n


class _ScaledGroupNorm(nn.Module):
    """A layer scale of shape (C, 1) and a GroupNorm: the file holds both as initializers that
    meet Mul / Add (torch's exporter writes GroupNorm as InstanceNormalization on the input
    reshaped to groups, then the channels' weight and bias)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3)
        self.norm = nn.GroupNorm(2, 4)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, 4).reshape(4, 1))

    def forward(self, x):
        return (self.norm(self.conv(x)) * self.gamma).flatten(1)


def test_initializers_meeting_mul_and_add_train_as_the_parameters_they_are():
    """Their gradients against torch autograd of the module the file came from."""
    torch.manual_seed(0)
    net = _ScaledGroupNorm().eval()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(3, 2, 9)
    cm = rootclad.onnx.load(export(net, x), engine="pullback", dtype=torch.float64, loss="mse")
    # torch's exporter keeps gamma's name; GroupNorm's weights become copies of shape (C, 1)
    # named onnx::Mul_*: matched by value
    assert "gamma" in dict(cm.named_parameters())
    xd = x.double().requires_grad_(True)
    out_ref = net.double()(xd)
    d_out = torch.randn_like(out_ref)
    want = torch.autograd.grad(out_ref, list(net.parameters()), d_out)
    out = cm(xd)
    trained = [p for p in cm.parameters() if p.requires_grad]  # (the file's Constant nodes:
    got = torch.autograd.grad(out, trained, d_out)  # the groups' unit scale and zero shift)
    torch.testing.assert_close(out, out_ref, rtol=1e-6, atol=1e-6)
    mine = list(zip(trained, got, strict=True))
    for (name, p), g in zip(net.named_parameters(), want, strict=True):
        match = [d for q, d in mine if q.numel() == p.numel()
                 and torch.allclose(q.detach().reshape(p.shape).double(), p.detach(), atol=1e-6)]  # fmt: skip
        assert len(match) == 1, name
        torch.testing.assert_close(match[0].reshape(g.shape), g, rtol=1e-5, atol=1e-6, msg=name)


# -- single ops built by hand ---------------------------------------------------------------
def _model(nodes, inputs, output, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, [output], initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _vi(name, *dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", *dims])


@pytest.mark.parametrize("trans_b, alpha, beta, c_shape", [
    pytest.param(tb, al, be, cs, id=f"transB{tb}-alpha{al}-beta{be}-C{cs}")
    for tb, al, be, cs in itertools.product((0, 1), (1.0, 0.5), (1.0, 2.0), ((4,), (1, 4), None))
])  # fmt: skip
def test_gemm_attributes_against_onnxruntime(trans_b, alpha, beta, c_shape):
    g = np.random.default_rng(0)
    w = g.standard_normal((4, 3) if trans_b else (3, 4)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    names = ["x", "W"]
    if c_shape is not None:
        inits.append(numpy_helper.from_array(g.standard_normal(c_shape).astype(np.float32), "C"))
        names.append("C")
    node = helper.make_node("Gemm", names, ["y"], alpha=alpha, beta=beta, transB=trans_b)
    model = _model([node], [_vi("x", 3)], _vi("y", 4), inits)
    x = g.standard_normal((5, 3)).astype(np.float32)
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    np.testing.assert_allclose(cm(torch.from_numpy(x)).detach().numpy(), run_ort(model, x),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize(
    "case", ["conv1d", "conv2d-groups", "maxpool2d", "avgpool1d-nocip", "shape-flatten"]
)
def test_hand_built_ops_against_onnxruntime(case):
    g = np.random.default_rng(1)
    if case == "conv1d":
        w = numpy_helper.from_array(g.standard_normal((4, 2, 3)).astype(np.float32), "W")
        node = helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1], strides=[2], dilations=[2])
        model, shape = _model([node], [_vi("x", 2, 11)], _vi("y", 4, 5), [w]), (2, 11)
    elif case == "conv2d-groups":
        w = numpy_helper.from_array(g.standard_normal((4, 1, 3, 3)).astype(np.float32), "W")
        b = numpy_helper.from_array(g.standard_normal(4).astype(np.float32), "b")
        node = helper.make_node("Conv", ["x", "W", "b"], ["y"], group=2, pads=[1, 1, 1, 1])
        model, shape = _model([node], [_vi("x", 2, 6, 5)], _vi("y", 4, 6, 5), [w, b]), (2, 6, 5)
    elif case == "maxpool2d":
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 3], strides=[2, 1])
        model, shape = _model([node], [_vi("x", 2, 6, 7)], _vi("y", 2, 3, 5)), (2, 6, 7)
    elif case == "avgpool1d-nocip":
        node = helper.make_node(
            "AveragePool", ["x"], ["y"], kernel_shape=[3], pads=[1, 1], strides=[2]
        )
        model, shape = _model([node], [_vi("x", 2, 9)], _vi("y", 2, 5)), (2, 9)
    else:  # x.view(x.size(0), -1) as torch's exporter writes it, then a Relu
        nodes = [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node(
                "Constant", [], ["i0"], value=numpy_helper.from_array(np.array(0, np.int64))
            ),
            helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
            helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
            helper.make_node("Concat", ["b1", "m1"], ["shape"], axis=0),
            helper.make_node("Reshape", ["x", "shape"], ["f"]),
            helper.make_node("Relu", ["f"], ["y"]),
        ]
        inits = [numpy_helper.from_array(np.array([0], np.int64), "ax"),
                 numpy_helper.from_array(np.array([-1], np.int64), "m1")]  # fmt: skip
        model, shape = _model(nodes, [_vi("x", 3, 4)], _vi("y", 12), inits), (3, 4)
    x = g.standard_normal((4, *shape)).astype(np.float32)
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    np.testing.assert_allclose(cm(torch.from_numpy(x)).detach().numpy(), run_ort(model, x),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_onnxruntime_comparison_fails_on_a_wrong_answer():
    """The reference check above is not vacuous: a different weight gives a different output."""
    w = np.ones((3, 4), np.float32)
    node = helper.make_node("Gemm", ["x", "W"], ["y"])
    model = _model([node], [_vi("x", 3)], _vi("y", 4), [numpy_helper.from_array(w, "W")])
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    with torch.no_grad():
        next(iter(cm.parameters())).add_(0.1)
    x = np.ones((2, 3), np.float32)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(cm(torch.from_numpy(x)).detach().numpy(), run_ort(model, x),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip


# -- refused, naming the node ---------------------------------------------------------------
def test_unsupported_op_is_refused_naming_node_op_and_opset():
    node = helper.make_node("Shrink", ["x"], ["y"], name="head/shrink")
    model = _model([node], [_vi("x", 4)], _vi("y", 4))
    with pytest.raises(IRError, match=r"'head/shrink' \(Shrink, opset 17\).*Gemm"):
        rootclad.onnx.load(model, engine="pullback")


def test_gemm_transposing_the_batch_axis_is_refused():
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "W")
    node = helper.make_node("Gemm", ["x", "W"], ["y"], transA=1, name="g")
    model = _model([node], [_vi("x", 3)], _vi("y", 4), [w])
    with pytest.raises(IRError, match=r"'g' \(Gemm, opset 17\): not computed as written"):
        rootclad.onnx.load(model, engine="pullback")


def test_old_opset_and_missing_file_are_refused(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    with pytest.raises(IRError, match="opset 11"):
        rootclad.onnx.load(_model([node], [_vi("x", 4)], _vi("y", 4), opset=11))
    with pytest.raises(FileNotFoundError, match="nothing.onnx"):
        rootclad.onnx.load(tmp_path / "nothing.onnx")


def test_load_reads_a_file(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid()).eval()
    x = torch.randn(3, 4)
    path = tmp_path / "net.onnx"
    onnx.save(export(net, x), str(path))
    cm = rootclad.onnx.load(path, engine="pullback")
    assert torch.allclose(cm(x), net(x), rtol=1e-5, atol=1e-6)


def _gemm_model(opset=17, initializers=True, x_dims=(3,), x_type=TensorProto.FLOAT):
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "W")
    node = helper.make_node("Gemm", ["x", "W"], ["y"], name="fc")
    x = helper.make_tensor_value_info("x", x_type, ["B", *x_dims])
    return _model([node], [x], _vi("y", 4), [w] if initializers else [], opset=opset)


def test_bad_files_are_refused_naming_the_file(tmp_path):
    onnx.save(_gemm_model(), str(tmp_path / "ok.onnx"))
    data = (tmp_path / "ok.onnx").read_bytes()
    (tmp_path / "truncated.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(IRError, match="truncated.onnx: cannot read the ONNX file"):
        rootclad.onnx.load(tmp_path / "truncated.onnx")
    # weights in an external-data file that is missing
    (tmp_path / "ext").mkdir()
    onnx.save(_gemm_model(), str(tmp_path / "ext" / "m.onnx"), save_as_external_data=True,
              location="w.bin", size_threshold=0)  # fmt: skip
    (tmp_path / "ext" / "w.bin").unlink()
    with pytest.raises(IRError, match=r"m.onnx: .*cannot read the ONNX file.*w.bin"):
        rootclad.onnx.load(tmp_path / "ext" / "m.onnx")


@pytest.mark.parametrize("kw, words", [
    ({"opset": 99}, "opset 99 is newer"),
    ({"initializers": False}, "'W'"),
    ({"x_dims": (5,)}, r"'fc' \(Gemm, opset 17\): not computed as written .*\[3, 4\]"),
    ({"x_dims": ("L",)}, r"shape \[None, None\]: rootclad needs .* fixed sizes"),
    ({"x_type": TensorProto.INT64}, r"'fc' \(Gemm, opset 17\): not computed as written"),
    ({"x_type": TensorProto.INT8}, "element type INT8; rootclad takes float32 or float64"),
])  # fmt: skip
def test_bad_graphs_are_refused(kw, words):
    with pytest.raises(IRError, match=words):
        rootclad.onnx.load(_gemm_model(**kw), engine="pullback")


def test_prelu_without_a_channel_axis_broadcasts_its_slope():
    """A PRelu on (N,) inputs has no channel axis: its one slope broadcasts, as onnx says."""
    slope = numpy_helper.from_array(np.array([0.25], np.float32), "slope")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("Squeeze", ["x", "axes"], ["s"], name="squeeze"),
             helper.make_node("PRelu", ["s", "slope"], ["y"], name="act")]  # fmt: skip
    model = _model(nodes, [_vi("x", 1)], _vi("y"), [slope, axes])
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    x = np.array([[-2.0], [3.0], [-0.5]], np.float32)
    np.testing.assert_allclose(cm(torch.from_numpy(x)).detach().numpy(), run_ort(model, x))
    assert run_ort(model, x)[0] == -0.5


def test_group_norm_of_one_value_per_channel_imports():
    """torch's exporter writes GroupNorm(4, 4) on (B, 4) as InstanceNormalization over one value
    per channel, which onnx computes (the output is the shift)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.GroupNorm(4, 4)).eval()
    x = torch.randn(5, 3)
    model = export(net, x)
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    np.testing.assert_allclose(cm(x).detach().numpy(), run_ort(model, x.numpy()), atol=1e-6)


def _reduce(axes, **attrs):
    inits = [] if axes is None else [numpy_helper.from_array(np.array(axes, np.int64), "axes")]
    node = helper.make_node("ReduceSum", ["x", "axes"] if axes is not None else ["x"], ["y"],
                            **attrs)  # fmt: skip
    return _model([node], [_vi("x", 2, 3)], _vi("y", 2, 3) if not axes else _vi("y", 3), inits,
                  opset=18)  # fmt: skip


def test_reduce_sum_axes_as_onnx_defines_them():
    x = np.random.default_rng(0).standard_normal((4, 2, 3)).astype(np.float32)
    model = _reduce([-2], keepdims=0)
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    np.testing.assert_allclose(cm(torch.from_numpy(x)).detach().numpy(), run_ort(model, x),
                               rtol=1e-6)  # fmt: skip
    model = _reduce([], noop_with_empty_axes=1)  # no axes: the identity (then a Relu)
    model.graph.node[0].output[0] = "r"
    model.graph.node.append(helper.make_node("Relu", ["r"], ["y"]))
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    np.testing.assert_allclose(cm(torch.from_numpy(x)).detach().numpy(), run_ort(model, x))
    with pytest.raises(IRError, match=r"'#0' \(ReduceSum.*Dimension out of range"):
        rootclad.onnx.load(_reduce([4], keepdims=0), engine="pullback", loss="mse")
    with pytest.raises(
        IRError, match=r"'#0' \(ReduceSum.*gives 'y' of shape \(\), the file declares"
    ):
        rootclad.onnx.load(_reduce(None, keepdims=0), engine="pullback", loss="mse")


def _resize(scales=None, sizes=None):
    inits = []
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
    if sizes is not None:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
    node = helper.make_node("Resize", ["x", "", "scales" if scales else "", *(["sizes"] if sizes else [])],
                            ["y"], mode="nearest", coordinate_transformation_mode="asymmetric",
                            nearest_mode="floor")  # fmt: skip
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 2, "L"])  # undeclared L
    return _model([node], [_vi("x", 2, 10)], out, inits, opset=18)


def test_resize_sizes_onnx_and_torch_would_count_differently_are_refused():
    # 10 * float32(0.7) is 7 in float32 (onnxruntime) and 6.99... in double (torch)
    with pytest.raises(IRError, match="give sizes instead"):
        rootclad.onnx.load(_resize(scales=[1, 1, 0.7]), engine="pullback", loss="mse")
    with pytest.raises(IRError, match="sizes .* that change the batch or the channels"):
        rootclad.onnx.load(_resize(sizes=[1, 2, 8]), engine="pullback", loss="mse")
    x = np.random.default_rng(0).standard_normal((3, 2, 10)).astype(np.float32)
    model = _resize(scales=[1, 1, 0.5])
    cm = rootclad.onnx.load(model, engine="pullback", loss="mse")
    np.testing.assert_allclose(cm(torch.from_numpy(x)).detach().numpy(), run_ort(model, x))
