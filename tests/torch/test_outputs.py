"""Models that return several tensors (a tuple, a list or a dict): ``cm(x)`` returns them as
the module does, torch autograd reaches the inputs and parameters through every one of them,
and the loss reads the one ``loss_output`` names, against torch autograd and torch.optim."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fixtures.core import assert_close_rel, assert_grads_close
from torch import nn

import rootclad
from rootclad.compiler import compile_device
from rootclad.ir.graph import IRError

F64 = torch.float64


class Heads(nn.Module):
    """A body and three heads: class logits (3), a regression (2, 2) and a score (1); the
    regression also feeds the score, so that one output is read by another."""

    def __init__(self, kind="tuple"):
        super().__init__()
        self.kind = kind
        self.body = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.cls = nn.Linear(16, 3)
        self.reg = nn.Linear(16, 4)
        self.score = nn.Linear(4, 1)

    def forward(self, x):
        h = self.body(x)
        reg = self.reg(h)
        outs = (self.cls(h), reg.reshape(-1, 2, 2), self.score(torch.sigmoid(reg)))
        if self.kind == "dict":
            return dict(zip(("logits", "reg", "score"), outs, strict=True))
        return list(outs) if self.kind == "list" else outs


def _values(out):
    return list(out.values()) if isinstance(out, dict) else list(out)


def _batch(B=6, seed=1):
    return torch.randn(B, 5, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _targets(loss, shape, B=6, seed=2):
    gen = torch.Generator().manual_seed(seed)
    if loss == "cross_entropy":
        return torch.randint(0, shape[-1], (B,), generator=gen)
    if loss == "bce_with_logits":
        return torch.randint(0, 2, (B, *shape[1:]), generator=gen).to(F64)
    return torch.randn(B, *shape[1:], dtype=F64, generator=gen)


@pytest.mark.parametrize("engine", ["pullback", pytest.param("clad", marks=pytest.mark.clad)])
@pytest.mark.parametrize("kind", ["tuple", "list", "dict"])
def test_outputs_and_their_gradients_match_torch(kind, engine, request):
    if engine == "clad":
        request.getfixturevalue("clad")  # skips, saying why, without Clad
    torch.manual_seed(0)
    net = Heads(kind).double()
    x = _batch()
    cm = rootclad.compile(net, x[:2], engine=engine)
    out, ref = cm(x.requires_grad_()), net(x)
    assert type(out) is type(ref)
    if kind == "dict":
        assert list(out) == list(ref)
    # a different weight on every element of every output: the backward sees all of them
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(r.shape, dtype=F64, generator=gen) for r in _values(ref)]
    total = sum((o * w).sum() for o, w in zip(_values(out), weights, strict=True))
    total_ref = sum((r * w).sum() for r, w in zip(_values(ref), weights, strict=True))
    params = list(cm.parameters())
    grads = torch.autograd.grad(total, [x, *params])
    grads_ref = torch.autograd.grad(total_ref, [x, *net.parameters()])
    for o, r in zip(_values(out), _values(ref), strict=True):
        assert_close_rel(o, r, 1e-12, "output")
    assert_close_rel(grads[0], grads_ref[0], 1e-10, "input gradient")
    names = [n for n, _ in cm.named_parameters()]
    assert_grads_close(dict(zip(names, grads[1:], strict=True)),
                       dict(zip(names, grads_ref[1:], strict=True)), 1e-10, against_all=True)  # fmt: skip


@pytest.mark.parametrize(
    "loss_output, loss",
    [(0, "cross_entropy"), (1, "mse"), (2, "bce_with_logits"), (-2, "huber"), ("reg", "mse")],
)
def test_the_loss_reads_the_output_it_is_given(loss_output, loss):
    """loss_and_grad (unweighted and weighted) against torch's loss on that output alone: the
    other heads' parameters get no gradient, as in torch. 64 samples: the batch is split over
    the threads, each chunk's rows read at their own offset."""
    torch.manual_seed(0)
    net = Heads("dict" if isinstance(loss_output, str) else "tuple").double()
    x = _batch(64)
    cm = rootclad.compile(net, x[:2], loss=loss, engine="pullback", loss_output=loss_output)
    pick = net(x)[loss_output]
    y = _targets(loss, tuple(pick.shape), B=64)
    w = torch.rand(64, dtype=F64, generator=torch.Generator().manual_seed(4)) + 0.5
    for weight in (None, w):
        value, grads = cm.loss_and_grad(x, y, weight=weight)
        out = net(x)[loss_output]
        if weight is None:
            ref = _torch_loss(loss, out, y)
        else:
            per = _torch_loss(loss, out, y, reduction="none")
            ref = (per * weight.view(-1, *[1] * (per.dim() - 1))).mean()
        expected = torch.autograd.grad(ref, list(net.parameters()), allow_unused=True)
        expected = {n: torch.zeros_like(p) if g is None else g
                    for (n, p), g in zip(net.named_parameters(), expected, strict=True)}  # fmt: skip
        assert_close_rel(value, ref, 1e-12, f"{loss} on output {loss_output!r}")
        if weight is None:  # the C API's loss alone (rootclad::Model::loss in ROOT)
            assert_close_rel(_c_api_loss(cm, x, y), ref, 1e-12, "loss_value")
        assert_grads_close(grads, expected, 1e-10, f"weight={weight is not None}",
                           against_all=True)  # fmt: skip
        # the class head feeds only its own output: exactly zero unless the loss reads it
        assert (float(grads["cls.weight"].abs().max()) == 0) == (loss_output != 0)


def _c_api_loss(cm, x, y):
    B = x.shape[0]
    act, _, act_ptr = cm._views_for(B)
    cm._load_input(act, x, B)
    cm._lib.forward(cm._arena.data_ptr(), act_ptr, B, 0, 0)
    y = y.reshape(-1).to(F64).contiguous()
    return torch.tensor(cm._lib.loss_value(act_ptr, y.data_ptr(), B), dtype=F64)


def _torch_loss(loss, out, y, reduction="mean"):
    if loss == "cross_entropy":
        return F.cross_entropy(out, y, reduction=reduction)
    if loss == "bce_with_logits":
        return F.binary_cross_entropy_with_logits(out, y, reduction=reduction)
    if loss == "huber":
        return F.huber_loss(out, y, reduction=reduction)
    return F.mse_loss(out, y, reduction=reduction)


def test_training_on_one_output_tracks_torch_optim():
    torch.manual_seed(0)
    net = Heads("dict").double()
    ref = copy.deepcopy(net)
    x = _batch(24, seed=5)
    y = _targets("mse", (24, 2, 2), B=24)
    cm = rootclad.compile(net, x[:2], loss="mse", engine="pullback", loss_output="reg")
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(10):
        idx = torch.arange(step % 3 * 8, step % 3 * 8 + 8)
        for B in (idx[:2], idx):  # a batch the fused step would take, and a larger one
            loss = cm.train_step(x[B], y[B], opt)
            opt_ref.zero_grad()
            value = F.mse_loss(ref(x[B])["reg"], y[B])
            value.backward()
            opt_ref.step()
            assert abs(loss - value.item()) <= 1e-10 * abs(value.item())
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        assert_close_rel(p, q, 1e-9, k)


def test_input_grad_and_predict_with_several_outputs():
    torch.manual_seed(0)
    net = Heads("tuple").double()
    x = _batch()
    cm = rootclad.compile(net, x[:2], loss="mse", engine="pullback", loss_output=2)
    pred = cm.predict(x)
    assert isinstance(pred, tuple) and [tuple(p.shape) for p in pred] == [(6, 3), (6, 2, 2), (6, 1)]
    assert cm.output_parts == ((0, (3,)), (1, (2, 2)), (2, (1,)))
    xr = x.clone().requires_grad_()
    # by default the saliency of the output the loss reads
    (expected,) = torch.autograd.grad(net(xr)[2].sum(), xr)
    assert_close_rel(cm.input_grad(x), expected, 1e-10, "saliency of the score")
    d_out = [torch.randn(p.shape, dtype=F64) for p in pred]
    (expected,) = torch.autograd.grad(
        sum((o * d).sum() for o, d in zip(net(xr), d_out, strict=True)), xr
    )
    assert_close_rel(cm.input_grad(x, d_out=d_out), expected, 1e-10, "given d_out")
    with pytest.raises(ValueError, match=r"d_out for output 1 has shape \(6, 4\), expected"):
        cm.input_grad(x, d_out=[d_out[0], torch.zeros(6, 4, dtype=F64), d_out[2]])
    with pytest.raises(ValueError, match="a tuple of 3 tensors"):
        cm.input_grad(x, d_out=torch.zeros(6, 8, dtype=F64))


def test_targets_are_checked_against_the_output_the_loss_reads():
    net = Heads("tuple").double()
    x = _batch()
    cm = rootclad.compile(net, x[:2], loss="cross_entropy", engine="pullback")
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
        cm.loss_and_grad(x, torch.full((6,), 3))
    cm = rootclad.compile(net, x[:2], loss="mse", engine="pullback", loss_output=1)
    with pytest.raises(ValueError, match=r"expected \(6, 2, 2\)"):
        cm.loss_and_grad(x, torch.zeros(6, 3, dtype=F64))


class _Returns(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.make = make

    def forward(self, x):
        return self.make(self.lin(x))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda h: (h, (h, h)), r"(?s)returns TreeSpec\(tuple, .*TreeSpec\(tuple.*\(not nested\)"),
        (lambda h: (h, None), r"returns None or numbers beside its tensors"),
        (lambda h: {1: h, 2: h}, r"returns dict .*string keys"),
        (lambda h: (), r"returns tuple \[\]"),
    ],
)
def test_outputs_that_are_not_tensors_are_refused_naming_them(make, match):
    with pytest.raises(IRError, match=match):
        rootclad.compile(_Returns(make), torch.randn(2, 4), engine="pullback")


def test_hosts_that_read_one_output_refuse_several(tmp_path):
    """rootclad::Model, the macros and RDataFrame read one output and its targets: export
    refuses; a torch.export program returning several would lose their names: refused."""
    x = _batch()
    cm = rootclad.compile(Heads().double(), x[:2], engine="pullback")
    with pytest.raises(ValueError, match="returns a tuple of 3 tensors; the ROOT artifact is for "
                       "single-output models"):  # fmt: skip
        cm.export(tmp_path / "heads")
    assert not list(tmp_path.iterdir())
    path = tmp_path / "heads.pt2"
    torch.export.save(torch.export.export(Heads().double(), (x[:2],)), str(path))
    with pytest.raises(ValueError, match="the program returns 3 tensors"):
        rootclad.load(path, trusted=True)


def test_a_module_named_like_the_concatenation_keeps_its_name():
    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.rc_outputs = nn.Linear(4, 2)

        def forward(self, x):
            return self.rc_outputs(x), torch.tanh(x)

    x = torch.randn(3, 4, dtype=F64)
    cm = rootclad.compile(Named().double(), x, engine="pullback")
    torch.manual_seed(0)
    net = Named().double()
    cm.load_state_dict(net.state_dict())
    for got, want in zip(cm(x), net(x), strict=True):
        assert_close_rel(got, want, 1e-12, "output")


def test_loss_output_must_name_an_output():
    x = _batch()
    with pytest.raises(
        ValueError, match=r"loss_output=3 is none of the model's outputs \[0, 1, 2\]"
    ):
        rootclad.compile(Heads().double(), x[:2], loss_output=3, engine="pullback")
    with pytest.raises(ValueError, match=r"'regression' is none of .*\['logits', 'reg', 'score'\]"):
        rootclad.compile(Heads("dict").double(), x[:2], loss_output="regression", engine="pullback")
    with pytest.raises(ValueError, match="the model returns one tensor"):
        rootclad.compile(nn.Linear(5, 1).double(), x[:2], loss_output=1, engine="pullback")
    with pytest.raises(IRError, match=r"cross_entropy needs logits .* \(2, 2\) \(output 1, which"):
        rootclad.compile(Heads().double(), x[:2], loss="cross_entropy", loss_output=1,
                         engine="pullback")  # fmt: skip


@pytest.mark.parametrize("loss, loss_output", [("cross_entropy", "logits"), ("mse", "reg"),
                                               ("bce_with_logits", "score")])  # fmt: skip
def test_the_device_kernels_take_several_outputs(loss, loss_output):
    """The device program (its kernels as host loops here): the outputs as a dict, the input
    gradient through all of them, and the loss (weighted) on the one it names."""
    torch.manual_seed(0)
    net = Heads("dict").double()
    x = _batch()
    dm = compile_device(net, x[:2], device="cpu", loss=loss, loss_output=loss_output)
    out, ref = dm.predict(x), net(x)
    assert list(out) == ["logits", "reg", "score"]
    for key in out:
        assert_close_rel(out[key], ref[key], 1e-12, key)
    d_out = {k: torch.randn(v.shape, dtype=F64) for k, v in ref.items()}
    xr = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(sum((net(xr)[k] * d_out[k]).sum() for k in d_out), xr)
    assert_close_rel(dm.input_grad(x, d_out=d_out), want, 1e-10, "input gradient")
    y = _targets(loss, tuple(ref[loss_output].shape))
    w = torch.rand(6, dtype=F64, generator=torch.Generator().manual_seed(4)) + 0.5
    value, grads = dm.loss_and_grad(x, y, weight=w)
    per = _torch_loss(loss, net(x)[loss_output], y, reduction="none")
    ref_loss = (per * w.view(-1, *[1] * (per.dim() - 1))).mean()
    expected = torch.autograd.grad(ref_loss, list(net.parameters()), allow_unused=True)
    expected = {n: torch.zeros_like(p) if g is None else g
                for (n, p), g in zip(net.named_parameters(), expected, strict=True)}  # fmt: skip
    assert_close_rel(value, ref_loss, 1e-12, "loss")
    assert_grads_close(grads, expected, 1e-10, "parameters", against_all=True)


def test_an_onnx_file_with_several_outputs_gives_them_by_name():
    """torch's exporter writes the tuple as three graph outputs: imported, they come back as a
    dict by the file's output names, equal to onnxruntime's, with torch's gradients."""
    import io

    import onnx
    import onnxruntime as ort

    torch.manual_seed(0)
    net = Heads("tuple").double()
    x = _batch()
    names = ["logits", "reg", "score"]
    f = io.BytesIO()
    torch.onnx.export(net, (x[:2],), f, dynamo=False, input_names=["x"], output_names=names,
                      dynamic_axes={n: {0: "B"} for n in ["x", *names]}, opset_version=17)  # fmt: skip
    model = onnx.load_from_string(f.getvalue())
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback", loss_output="reg")
    out = cm(x.requires_grad_())
    assert list(out) == names
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, ref in zip(names, sess.run(None, {"x": x.detach().numpy()}), strict=True):
        assert_close_rel(out[name], torch.from_numpy(ref), 1e-12, name)
    weights = [torch.randn(o.shape, dtype=F64) for o in out.values()]
    pairs = zip(out.values(), weights, strict=True)
    (got,) = torch.autograd.grad(sum((o * w).sum() for o, w in pairs), x)
    (want,) = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(net(x), weights, strict=True)), x
    )
    assert_close_rel(got, want, 1e-10, "input gradient through every output")
    y = _targets("mse", (6, 2, 2))
    value, _ = cm.loss_and_grad(x.detach(), y)
    assert_close_rel(value, F.mse_loss(net(x)[1], y), 1e-12, "loss on 'reg'")
