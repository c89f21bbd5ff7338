"""topk, torch.gather by its indices, and expand / repeat (issue 27): the indices against
torch's stable sort (ties to the lower index, NaN largest), topk's values and the gathers'
gradients against torch autograd on both engines and in float32, an EdgeConv through ONNX
against onnxruntime, topk's indices used as numbers against torch, and each construct rootclad
does not compile refused naming the ATen op or the model's output. ParticleNet itself is in
tests/models/test_hep.py."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, check_against_torch, perturbed
from fixtures.op_cases import Fn, Neighbours
from torch import nn

import rootclad
from rootclad.ir.graph import IRError

F64 = torch.float64
NAN = float("nan")


def _positions(largest):
    """(B, 2, R, N): values, and each position's number; out: the numbers of the topk."""
    return Fn(lambda x: torch.gather(x[:, 1], 2, x[:, 0].topk(3, dim=-1, largest=largest)[1]))


@pytest.mark.parametrize("largest", [True, False])
def test_topk_indices_follow_torchs_stable_sort_with_ties_and_nan(largest):
    """Where values tie and where NaN stands (torch counts NaN the largest), topk's indices
    are those of torch's stable sort; read here through a gather of the positions."""
    v = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.5, NAN, -1.0, 0.5, 0.5],
                      [2.0, 2.0, 2.0, 2.0, 2.0], [-4.0, 1.0, NAN, 7.0, NAN]], dtype=F64)  # fmt: skip
    pos = torch.arange(5, dtype=F64).expand(4, 5)
    x = torch.stack([v, pos])[None].repeat(2, 1, 1, 1)
    cm = rootclad.compile(_positions(largest), x.nan_to_num(), loss="mse", engine="pullback")
    got = cm.predict(x)
    want = torch.sort(v, dim=-1, descending=largest, stable=True).indices[:, :3]
    assert torch.equal(got[0].long(), want) and torch.equal(got[1].long(), want), (got, want)


def _net():
    torch.manual_seed(0)
    return perturbed(Neighbours().double())


def _x(B=3, seed=1):
    return torch.randn(B, 3, 8, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _check(cm, net, x, rtol):
    ref = copy.deepcopy(net).to(x.dtype).double()
    xr = x.double().requires_grad_(True)
    out_ref = ref(xr)
    d_out = torch.randn(out_ref.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    dx_ref, *dp_ref = torch.autograd.grad(out_ref, [xr, *ref.parameters()], d_out)
    xc = x.clone().requires_grad_(True)
    out = cm(xc)
    dx, *dp = torch.autograd.grad(out, [xc, *cm.parameters()], d_out.to(x.dtype))
    assert_close_rel(out, out_ref, rtol, "forward")
    assert_close_rel(dx, dx_ref, rtol, "d_x")
    names = [n for n, _ in ref.named_parameters()]
    assert_grads_close(dict(zip(names, dp, strict=True)), dict(zip(names, dp_ref, strict=True)),
                       rtol, "parameters", against_all=True)  # fmt: skip


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("engine", ["pullback", pytest.param("clad", marks=pytest.mark.clad)])
def test_edge_convolution_matches_torch(engine, dtype, request):
    """The nearest neighbours by topk, their features by gather, the centres by repeat: the
    gradient reaches the input through the gathers (twice where a point is the neighbour of
    several) and not through the distances, as in torch."""
    if engine == "clad":
        request.getfixturevalue("clad")
    net, x = _net(), _x().to(dtype)
    cm = rootclad.compile(copy.deepcopy(net).to(dtype), x, loss="mse", engine=engine)
    _check(cm, net, x, 1e-9 if dtype == F64 else 1e-4)


def test_edge_convolution_with_max_aggregation_matches_torch():
    """DGCNN's aggregation: the maximum over the neighbours (x.max(dim=-1)[0])."""
    torch.manual_seed(0)
    net = perturbed(Neighbours(aggregate="max").double())
    x = _x()
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="pullback")
    _check(cm, net, x, 1e-9)


@pytest.mark.clad
def test_edge_convolution_with_clad_differentiating_the_kernels(clad):
    net, x = _net(), _x()
    cm = rootclad.compile(copy.deepcopy(net), x, loss="mse", engine="clad", pullbacks=False)
    assert cm.engine == "clad"
    _check(cm, net, x, 1e-9)


def test_topk_values_gradient_goes_to_the_selected_places():
    """topk's values are a gather by its indices: each selected place gets its gradient once,
    the others none (torch's gradient of topk)."""
    net = Fn(lambda x: torch.cat([x.topk(2, dim=1).values.flatten(1),
                                  x.topk(1, dim=-1, largest=False)[0].flatten(1)], 1))  # fmt: skip
    x = _x(B=2)
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    xr = x.clone().requires_grad_(True)
    out = net(xr)
    d_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    (want,) = torch.autograd.grad(out, [xr], d_out)
    assert_close_rel(cm.predict(x), out.detach(), 1e-15, "forward")
    assert_close_rel(cm.input_grad(x, d_out=d_out), want, 1e-15, "d_x")


def test_edge_convolution_through_onnx_matches_onnxruntime_and_torch():
    """torch's exporter writes TopK, GatherElements, Expand (with its ConstantOfShape / Equal /
    Where shape arithmetic) and Tile for the EdgeConv: imported, its output equals
    onnxruntime's and its input gradient torch's."""
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import export, run_ort

    net, x = _net().eval(), _x()
    model = export(copy.deepcopy(net).float(), x.float(), opset=18)
    ops = {n.op_type for n in model.graph.node}
    assert {"TopK", "GatherElements", "Expand", "Tile"} <= ops, ops
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    assert_close_rel(cm.predict(x.float()), torch.from_numpy(run_ort(model, x.float().numpy())),
                     1e-4, "forward against onnxruntime")  # fmt: skip
    d_out = torch.randn(3, 5, 8, dtype=F64, generator=torch.Generator().manual_seed(2))
    xr = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(net(xr), [xr], d_out)
    assert_close_rel(cm.input_grad(x.float(), d_out=d_out.float()), want, 1e-4, "d_x")


def test_edge_convolution_training_tracks_torch_optim():
    torch.manual_seed(0)
    net = nn.Sequential(Neighbours(), nn.Flatten(), nn.Linear(40, 2)).double()
    x, y = (
        _x(B=16, seed=3),
        torch.randn(16, 2, dtype=F64, generator=torch.Generator().manual_seed(5)),
    )
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    ref = copy.deepcopy(net)
    opt, opt_ref = rootclad.optim.Adam(cm, lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(20):
        idx = torch.arange(step % 2 * 8, step % 2 * 8 + 8)
        loss = cm.train_step(x[idx], y[idx], opt)
        opt_ref.zero_grad()
        ref_loss = nn.functional.mse_loss(ref(x[idx]), y[idx])
        ref_loss.backward()
        opt_ref.step()
        assert abs(loss - ref_loss.item()) <= 1e-9 * abs(ref_loss.item()), step
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        assert_close_rel(p.detach(), q.detach(), 1e-8, k)


# (model, input shape, words the refusal says)
REFUSED = [
    ("index-by-indices", lambda x: x[:, :, x.topk(2, dim=-1).indices], (3, 5), r"aten\.index\.Tensor .*computed from the inputs' values"),
    ("topk-of-the-batch", lambda x: x.topk(2, dim=0).values, (3, 5), r"aten\.topk\.default .*dim=0 is the batch axis"),
    ("expand-the-batch", lambda x: x[:1].expand(4, -1, -1), (1, 5), r"aten\.slice\.Tensor .*dim=0 is the batch axis"),
    ("power-of-a-tensor", lambda x: x**x, (3, 5), r"aten\.pow\.Tensor_Tensor .*not supported"),
    # weaver's batch-wide indexing (tests/models/test_hep.py compiles it as written)
    ("rows-of-another-stride", lambda x: _weaver_rows(x, stride=-1), (3, 5), "times 4 into a value that does not hold 4 rows of each sample"),
    ("indices-not-flattened", lambda x: _weaver_rows(x, flat=False), (3, 5), "offset indices that are not flat"),
    ("merged-rows-elsewhere", lambda x: x.transpose(2, 1).reshape(-1, 3).sum(-1), (3, 5), "batch axis must stay first and hold one row per sample"),
    ("offsets-elsewhere", lambda x: x + torch.arange(0, x.size(0)).view(-1, 1, 1), (3, 5), r"aten\.arange\.start_step .*not supported"),
    # offsets (B, 1) that torch lines up with the points' axis (B == N here), a view back to
    # a batch size written as a number, a topk over more values than a sample's rows
    ("offsets-of-another-rank", lambda x: _weaver_rows(x, base=lambda B: torch.arange(0, B).view(-1, 1)), (2, 2), "fixes the batch size"),
    ("view-back-to-a-fixed-batch", lambda x: _weaver_rows(x, batch=2), (3, 5), "fixes the batch size"),
    ("indices-beyond-the-rows", lambda x: _weaver_rows(torch.cat([x, x - 10], 1), rows=x), (3, 5), "a topk over 6\\): they may read another sample"),
]  # fmt: skip


def _weaver_rows(x, stride=0, flat=True, base=None, batch=None, rows=None):
    """weaver's neighbours' features (topk along the channels, positions below N here), its
    offsets' stride changed by ``stride``, offsets ``base``, the view back to ``batch``, the
    rows of ``rows``."""
    rows = x if rows is None else rows
    B, C, N = rows.size()
    idx = x.topk(2, dim=1).indices.transpose(1, 2)  # (B, N, 2)
    idx = idx + (base or (lambda B: torch.arange(0, B).view(-1, 1, 1)))(B) * (N + stride)
    fts = rows.transpose(2, 1).reshape(-1, C)
    return fts[idx.reshape(-1) if flat else idx, :].view(batch or B, N, 2, C)


@pytest.mark.parametrize("fn, shape, words", [pytest.param(*c[1:], id=c[0]) for c in REFUSED])
def test_what_rootclad_does_not_compile_is_refused_naming_the_node(fn, shape, words):
    with pytest.raises(IRError, match=words) as err:
        rootclad.compile(Fn(fn), torch.randn(2, *shape, dtype=F64), loss="mse", engine="pullback")
    # where: the ATen op, the model's output, or the line of the forward torch.export stopped at
    assert re.search(r"ATen op|the model's output|\.py:\d+", str(err.value)), str(err.value)


# topk's indices used as numbers, a gather by a constant index, a repeat of a whole axis
COMPUTED = [
    ("arithmetic-on-indices", lambda x: x.topk(2, dim=-1).indices * 1.0),
    ("returned-indices", lambda x: x.topk(2, dim=-1).indices),
    (
        "gather-of-the-indices",
        lambda x: torch.gather(x.topk(2, dim=-1).indices, 2, x[..., :2].topk(1, dim=-1).indices),
    ),
    (
        "gather-by-a-constant-index",
        lambda x: torch.gather(x, 2, torch.ones_like(x, dtype=torch.long)),
    ),
    ("repeat-a-full-axis", lambda x: x.repeat(1, 2, 1)),
]


@pytest.mark.parametrize("fn", [pytest.param(c[1], id=c[0]) for c in COMPUTED])
def test_indices_as_numbers_and_gathers_of_constant_indices_match_torch(fn):
    """The values equal torch's (indices in the compiled model's floating type), the input
    gradient torch autograd's (none through the indices, as in torch)."""
    x = torch.randn(2, 3, 5, dtype=F64, generator=torch.Generator().manual_seed(6))
    cm = rootclad.compile(Fn(fn), x, loss="mse", engine="pullback")
    xr = x.clone().requires_grad_(True)
    out = Fn(fn)(xr)
    d_out = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(7))
    want = torch.autograd.grad(out, [xr], d_out)[0] if out.requires_grad else torch.zeros_like(x)
    torch.testing.assert_close(cm.predict(x), out.detach().to(F64), rtol=0, atol=0)
    torch.testing.assert_close(cm.input_grad(x, d_out=d_out), want, rtol=1e-15, atol=1e-15)


def test_repeat_by_a_tuple_and_shape_queries_of_the_indices():
    """x.repeat((1, 3, 1)) as x.repeat(1, 3, 1); idx.size(-1) of topk's indices is a number."""

    def fn(x):
        idx = x.topk(2, dim=-1).indices
        k = idx.size(-1)
        return torch.gather(x, 2, idx)[:, :, :1].repeat((1, 1, k)) + x[:, :, :1].repeat([1, 1, k])

    x = _x(B=2)
    cm = rootclad.compile(Fn(fn), x, loss="mse", engine="pullback")
    assert_close_rel(cm.predict(x), Fn(fn)(x), 1e-15, "forward")


def test_nearest_neighbours_by_cdist_match_torch():
    """ParticleNet's neighbours by torch.cdist instead of the products: topk of the negated
    distances (each point's own, 0, among them: no gradient there, as torch's), their values'
    gradient through cdist, and a gather by the indices."""

    def knn_features(x):  # (B, C, N)
        pts = x.transpose(1, 2)
        near = (-torch.cdist(pts, pts)).topk(3, dim=-1)
        B, C, N = x.shape
        idx = near.indices.reshape(B, 1, N * 3).expand(-1, C, -1)
        return torch.cat([near.values.flatten(1), torch.gather(x, 2, idx).flatten(1)], 1)

    net = Fn(knn_features)
    x = torch.randn(3, 4, 6, dtype=F64, generator=torch.Generator().manual_seed(3))
    check_against_torch(net, x, F64, loss="mse")
