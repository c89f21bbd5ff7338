"""ONNX LSTM and GRU (frontends/onnx/ops_recurrent.py): torch's exporter writes each layer as
one node over a sequence with the batch axis second, its states as (n, B, H) and its initial
states as zeros of a shape holding the batch size. Files of stacked, bidirectional and chained
layers (a GRU on an LSTM's output, a decoder started from an encoder's final states, DeepJet's
last states) are imported and compared with onnxruntime, their input gradients with torch
autograd of the exported module, every parameter's (the file's weights, in ONNX's gate order)
with torch autograd of the file's nodes run by torch; what the table does not compute
(clips, peepholes, other activations) is refused naming the node."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close
from torch import nn

import rootclad
from rootclad.frontends.onnx import to_module
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from fixtures.onnx import export, run_ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

F64 = torch.float64


class Stacked(nn.Module):
    """A 2-layer LSTM, a GRU on its output sequence, the last step and both final states."""

    def __init__(self, bidirectional=False):
        super().__init__()
        D = 2 if bidirectional else 1
        self.lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.gru = nn.GRU(4 * D, 5, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(5 * D + 4 + 5, 2)

    def forward(self, x):
        o, (h, c) = self.lstm(x)
        o2, h2 = self.gru(o)
        return self.head(torch.cat([o2[:, -1], h[-1], h2[0]], 1))


class Seq2Seq(nn.Module):
    """An encoder LSTM whose final (h, c) start a decoder LSTM, no biases; the output
    sequence."""

    def __init__(self):
        super().__init__()
        self.enc = nn.LSTM(3, 6, batch_first=True, bias=False)
        self.dec = nn.LSTM(3, 6, batch_first=True, bias=False)

    def forward(self, x):
        _, (h, c) = self.enc(x)
        return self.dec(x * 0.5, (h, c))[0]


class Tagger(nn.Module):
    """DeepJet's shape: per-particle dense layers, an LSTM over the list, its last state."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        _, (h, _) = self.lstm(self.dense(x))
        return self.head(h[-1])


MODELS = {
    "stacked": lambda: Stacked(),
    "stacked-bidirectional": lambda: Stacked(bidirectional=True),
    "seq2seq": lambda: Seq2Seq(),
    "tagger": lambda: Tagger(),
}


@pytest.mark.parametrize("name", MODELS)
def test_recurrent_file_matches_onnxruntime_and_torch(name):
    torch.manual_seed(0)
    net = MODELS[name]().eval()
    x = torch.randn(3, 5, 6 if name == "tagger" else 3, generator=torch.Generator().manual_seed(1))
    model = export(copy.deepcopy(net), x, opset=18)
    assert {"LSTM"} <= {n.op_type for n in model.graph.node}
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert_close_rel(cm.predict(x), torch.from_numpy(run_ort(model, x.numpy())), 1e-5,
                     "forward against onnxruntime")  # fmt: skip
    ref = copy.deepcopy(net).double()
    xr = x.double().requires_grad_(True)
    out = ref(xr)
    d_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (dx_ref,) = torch.autograd.grad(out, [xr], d_out)
    assert_close_rel(cm.input_grad(x, d_out=d_out.float()), dx_ref, 1e-4, "d_x")
    # every parameter's gradient (of loss_and_grad's mse against d_out): the file's weights
    # hold ONNX's gate order, differentiated by torch through the file's nodes (whose forward
    # is onnxruntime's, above)
    _, grads = cm.loss_and_grad(x, d_out.float())
    nodes = to_module(model)[0].double()
    loss = torch.nn.functional.mse_loss(nodes(x.double()), d_out)
    want = dict(
        zip(grads, torch.autograd.grad(loss, [nodes.get_parameter(k) for k in grads]), strict=True)
    )
    # (a reverse GRU's weight_hh gets no gradient from the last step alone: against all)
    assert_grads_close(grads, want, 1e-4, name, against_all=True)


def _node_file(op, attrs=None, extra_inputs=(), direction_count=1, H=2):
    """A hand-made file: x (B, 4, 3) transposed to a sequence, one LSTM / GRU node, its output
    squeezed and transposed back."""
    gates = 4 if op == "LSTM" else 3
    rng = np.random.default_rng(0)
    inits = [
        helper.make_tensor("W", TensorProto.FLOAT, (1, gates * H, 3), rng.standard_normal(gates * H * 3)),
        helper.make_tensor("R", TensorProto.FLOAT, (1, gates * H, H), rng.standard_normal(gates * H * H)),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        helper.make_node(op, ["t", "W", "R", *extra_inputs], ["y"], hidden_size=H, **(attrs or {})),
        helper.make_node("Squeeze", ["y", "ax"], ["s"]),
        helper.make_node("Transpose", ["s"], ["out"], perm=[1, 0, 2]),
    ]
    inits.append(helper.make_tensor("ax", TensorProto.INT64, (1,), [1]))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", 4, H])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    "op, attrs",
    [("GRU", {"linear_before_reset": 1}), ("GRU", {}), ("LSTM", {"direction": "reverse"})],
)
def test_a_hand_made_layer_matches_onnxruntime(op, attrs):
    """Layers written by hand (not by torch): ONNX's gate order; a GRU that resets before its
    recurrent product (which torch's GRU does not), an LSTM that runs backwards."""
    model = _node_file(op, attrs)
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(3))
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert_close_rel(cm.predict(x), torch.from_numpy(run_ort(model, x.numpy())), 1e-5, "forward")


REFUSED = [
    ("lstm-clip", "LSTM", {"clip": 1.0}, (), "a clip"),
    ("lstm-peepholes", "LSTM", {}, ("", "", "", "", "P"), "peepholes"),
    ("lstm-activations", "LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}, (), "activations"),
]  # fmt: skip


@pytest.mark.parametrize(
    "op, attrs, extra, words", [pytest.param(*c[1:], id=c[0]) for c in REFUSED]
)
def test_what_torch_cannot_express_is_refused_naming_the_node(op, attrs, extra, words):
    model = _node_file(op, attrs, extra)
    if "P" in extra:
        model.graph.initializer.append(
            helper.make_tensor("P", TensorProto.FLOAT, (1, 6), [0.1] * 6)
        )
    with pytest.raises(IRError, match=words) as err:
        rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert f"({op}, opset 18)" in str(err.value)


def test_a_sequence_read_by_another_op_is_refused_naming_it():
    """The time-first sequence taken by something other than a transpose back (a Relu)."""
    model = _node_file("LSTM")
    model.graph.node[2].op_type = "Relu"
    del model.graph.node[2].input[1:]
    with pytest.raises(IRError, match=r"node '#3' \(Transpose, opset 18\): not computed"):
        rootclad.onnx.load(model, loss="mse", engine="pullback")


def test_a_sequence_read_beside_another_value_is_refused_naming_it():
    """Mul(constant, sequence): the time-first sequence as the second input of a node."""
    model = _node_file("LSTM")
    model.graph.initializer.append(helper.make_tensor("two", TensorProto.FLOAT, (1,), [2.0]))
    model.graph.node[3].op_type = "Mul"
    model.graph.node[3].input[:] = ["two", "s"]
    del model.graph.node[3].attribute[:]
    with pytest.raises(
        IRError, match=r"output \(made by .*'#3' \(Mul.* batch axis at axis 1, not first"
    ):
        rootclad.onnx.load(model, loss="mse", engine="pullback")
