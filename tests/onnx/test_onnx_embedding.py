"""nn.Embedding through ONNX (issue 27): torch's exporter writes it as Gather(weight, indices),
the indices an integer input of the graph. Imported as an Embedding: the forward against
onnxruntime, the float input's and every parameter's gradient against torch autograd, the
indices checked at every call; a Gather of a weight along another axis is refused naming the
node."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, perturbed
from fixtures.op_cases import Tokens, index_input

import rootclad
from rootclad.ir.graph import IRError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from fixtures.onnx import export, run_ort, torch_named  # noqa: E402


def test_embedding_from_torchs_export_matches_onnxruntime_and_torch():
    torch.manual_seed(0)
    net = perturbed(Tokens()).eval()
    ids, x = index_input()
    x = x.float()
    model = export(net, (ids, x))
    assert "Gather" in {n.op_type for n in model.graph.node}
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert_close_rel(cm(ids, x), torch.from_numpy(run_ort(model, ids.numpy(), x.numpy())), 1e-5,
                     "forward against onnxruntime")  # fmt: skip
    xc, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    d_out = torch.randn(4, 2, generator=torch.Generator().manual_seed(3))
    dx, *dp = torch.autograd.grad(cm(ids, xc), [xc, *cm.parameters()], d_out)
    names = [n for n, _ in cm.named_parameters()]
    assert {"tok.weight", "kind.weight"} <= set(names)  # where the initializers say
    plain = copy.deepcopy(net)
    plain.tok.padding_idx = None  # ONNX has no padding_idx: the file's row 0 trains
    dx_ref, *dp_ref = torch.autograd.grad(plain(ids, xr), [xr, *plain.parameters()], d_out)
    assert_close_rel(dx, dx_ref, 1e-4, "d_x")
    got = torch_named(cm, dict(zip(names, dp, strict=True)), plain)
    want = dict(zip([n for n, _ in plain.named_parameters()], dp_ref, strict=True))
    assert_grads_close(got, want, 1e-4, "parameters", against_all=True)
    assert float(got["tok.weight"][0].abs().max()) > 0  # the padding row, read by the ids, learns
    bad = ids.clone()
    bad[3, 0] = 3
    with pytest.raises(ValueError, match=r"input 0\[3, 0\] = 3: .* 3 rows"):
        cm(bad, x)


def _gather_file(axis: int, rows: int = 3) -> onnx.ModelProto:
    """Gather(w (rows, 7), ids (B, 4), axis) then ReduceSum over the ids' axis, by hand."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(
        np.arange(rows * 7, dtype=np.float32).reshape(rows, 7), "emb.weight"
    )
    nodes = [helper.make_node("Gather", ["emb.weight", "ids"], ["g"], axis=axis),
             helper.make_node("ReduceSum", ["g", "axes"], ["y"], keepdims=0)]  # fmt: skip
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        nodes, "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 7])], [w, axes])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_hand_written_gather_of_a_weight_is_an_embedding():
    cm = rootclad.onnx.load(_gather_file(0), loss="mse", engine="pullback")
    ids = torch.tensor([[0, 2, 2, 1], [1, 1, 0, 0]])
    assert_close_rel(cm(ids), torch.from_numpy(run_ort(_gather_file(0), ids.numpy())), 1e-6,
                     "forward")  # fmt: skip


def test_a_gather_of_a_weight_along_another_axis_is_refused_naming_the_node():
    """Gather(w (3, 7), ids (B, 4), axis=1) puts the batch axis second: the file's output
    is not what it declares."""
    with pytest.raises(IRError, match=r"gives 'y' of shape \(3, 4\), the file declares \(B, 7\)"):
        rootclad.onnx.load(_gather_file(1, rows=3), loss="mse", engine="pullback")


class _PaddedTokens(torch.nn.Module):
    """Token ids with a padding id 0: the mean over the tokens that are not padding, the mask
    ids != 0 computed in forward (Equal, Not and Cast in the file)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, ids):
        keep = (ids != 0).unsqueeze(-1).float()
        return self.head((torch.tanh(self.emb(ids)) * keep).sum(1) / keep.sum(1))


def test_a_mask_computed_from_token_ids_matches_onnxruntime():
    torch.manual_seed(0)
    net = _PaddedTokens().eval()
    ids = torch.randint(1, 10, (4, 6), generator=torch.Generator().manual_seed(1))
    ids[0, 3:] = ids[2, 5] = 0
    model = export(net, ids)
    assert {"Equal", "Not"} <= {n.op_type for n in model.graph.node}
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert_close_rel(cm(ids), torch.from_numpy(run_ort(model, ids.numpy())), 1e-5, "forward")
