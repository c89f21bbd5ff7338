"""An exported model in ROOT: rootclad::Model from PyROOT, RDataFrame score and saliency columns.

References: the compiled model's own Python path (cm.predict, cm.train_step, itself checked
against torch in tests/core), torch autograd for saliency, uproot for the weights file.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="rootclad.root needs ROOT (PyROOT)")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402
import rootclad.root  # noqa: E402

F64 = torch.float64
L = 64


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(1, 4, 5), nn.ReLU(), nn.MaxPool1d(2), nn.Flatten(),
                         nn.Linear(4 * 30, 8), nn.Tanh(), nn.Linear(8, 1))  # fmt: skip


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    net = _cnn()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 1, L), engine="pullback")
    paths = cm.export(d / "cnn")
    return net, cm, d / "cnn", paths


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(300, 1, L, generator=gen)
    path = tmp_path_factory.mktemp("events") / "events.root"
    with uproot.recreate(path) as f:
        f.mktree("events", {"strain": np.dtype((np.float32, (L,))), "label": np.int32}).extend(
            {"strain": x.numpy().reshape(300, L), "label": np.arange(300, dtype=np.int32) % 2}
        )
    return x, path


def test_export_writes_library_weights_and_header(exported):
    net, cm, stem, paths = exported
    assert sorted(p.name for p in stem.parent.iterdir()) == ["cnn.h", "cnn.root", "cnn.so"]
    with uproot.open(paths[".root"]) as f:
        for name, p in net.named_parameters():
            values = f[name]["values"].array(library="np")
            assert values.shape == (1, p.numel())
            assert np.array_equal(values[0], p.detach().double().numpy().reshape(-1))
            assert str(tuple(p.shape)) in f[name].title
        assert '"prefix": "' + cm._em.prefix in str(f["rootclad_metadata"])
    header = paths[".h"].read_text()  # the C++ host inlined: no rootclad include is left
    assert "class Model {" in header and '#include "' not in header


def test_model_predicts_and_differentiates_like_the_compiled_model(exported, events):
    net, cm, stem, _ = exported
    x, _ = events
    m = rootclad.root.load(stem)
    assert (m.n_params(), m.input_size(), m.output_size()) == (cm._em.n_params, L, 1)
    xs = x[:7].numpy().copy()
    out = np.zeros((7, 1), np.float32)
    m.predict(xs, out, 7)
    assert np.array_equal(out, cm.predict(x[:7]).numpy())
    out64 = np.zeros((7, 1), np.float64)  # double in and out of a float32 model: converted
    m.predict(xs.astype(np.float64), out64, 7)
    assert np.array_equal(out64.astype(np.float32), out)
    dx = np.zeros_like(xs)
    m.input_grad(xs, dx, 7)
    xr = x[:7].clone().requires_grad_()
    (ref,) = torch.autograd.grad(net(xr).sum(), xr)
    np.testing.assert_allclose(dx, ref.numpy(), rtol=1e-4, atol=1e-6 * float(ref.abs().max()))
    assert float(np.abs(ref.numpy()).max()) > 0


def test_rdataframe_score_and_saliency_columns(exported, events):
    net, cm, stem, _ = exported
    x, path = events
    df = ROOT.RDataFrame("events", str(path))
    df = rootclad.root.define_score(df, stem, inputs="strain", column="score")
    df = rootclad.root.define_saliency(df, stem, inputs="strain", column="saliency")
    cols = df.AsNumpy(["score", "saliency"])
    np.testing.assert_allclose(cols["score"], cm(x).detach().numpy()[:, 0], rtol=1e-5, atol=1e-6)
    sal = np.stack([np.asarray(v) for v in cols["saliency"]])
    xr = x.clone().requires_grad_()
    (ref,) = torch.autograd.grad(net(xr).sum(), xr)
    np.testing.assert_allclose(sal, ref.numpy().reshape(300, L), rtol=1e-4,
                               atol=1e-6 * float(ref.abs().max()))  # fmt: skip


_MT = """
import sys, numpy as np, ROOT, rootclad.root
ROOT.EnableImplicitMT(2)
df = ROOT.RDataFrame("events", sys.argv[1])
df = rootclad.root.define_score(df, sys.argv[2], inputs="strain", column="score")
cols = df.AsNumpy(["score", "label"])
np.save(sys.argv[3], cols["score"])
"""


def test_rdataframe_score_under_implicit_mt_equals_single_threaded(exported, events, tmp_path):
    """One model per processing slot; the scores do not depend on the threads (own process:
    implicit MT is process-wide)."""
    _, cm, stem, _ = exported
    x, path = events
    out = tmp_path / "mt.npy"
    proc = subprocess.run([sys.executable, "-c", _MT, str(path), str(stem), str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = np.load(out)
    ref = cm.predict(x).numpy()[:, 0]  # the entry order may differ under MT: compare as sets
    np.testing.assert_allclose(np.sort(scores), np.sort(ref), rtol=1e-5, atol=1e-6)


def test_scalar_columns_make_one_input_vector(tmp_path):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 3, dtype=F64), engine="pullback")
    cm.export(tmp_path / "tab")
    n = 50
    cols = {"pt": np.linspace(1, 50, n, dtype=np.float32), "eta": np.linspace(-2, 2, n),
            "njet": np.arange(n, dtype=np.int32) % 4}  # fmt: skip
    with uproot.recreate(tmp_path / "tab.root.data") as f:
        f["t"] = cols
    df = ROOT.RDataFrame("t", str(tmp_path / "tab.root.data"))
    df = rootclad.root.define_score(df, tmp_path / "tab", inputs=["pt", "eta", "njet"])
    df = rootclad.root.define_saliency(df, tmp_path / "tab", inputs=["pt", "eta", "njet"])
    got = df.AsNumpy(["score", "saliency"])
    x = torch.tensor(np.stack([cols["pt"], cols["eta"], cols["njet"]], 1), dtype=F64)
    np.testing.assert_allclose(got["score"], net(x).detach().numpy()[:, 0], rtol=1e-12)
    xr = x.clone().requires_grad_()
    (ref,) = torch.autograd.grad(net(xr).sum(), xr)
    np.testing.assert_allclose(np.stack([np.asarray(v) for v in got["saliency"]]), ref.numpy(),
                               rtol=1e-10)  # fmt: skip


def test_training_in_cpp_equals_training_in_python(tmp_path):
    """The same model, data order and optimizer: rootclad::Model.train_step from PyROOT and
    CompiledModel.train_step end with the same weights (float64)."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 6, dtype=F64), engine="pullback")
    cm.export(tmp_path / "mlp")
    m = rootclad.root.load(tmp_path / "mlp")
    opt_py = rootclad.optim.Adam(cm, lr=1e-2)
    opt_cpp = ROOT.rootclad.Adam(m, 1e-2)
    gen = torch.Generator().manual_seed(4)
    for B in (3, 16, 5, 40, 8):
        x = torch.randn(B, 6, generator=gen, dtype=F64)
        y = (x[:, :1] > 0).to(F64)
        a = cm.train_step(x, y, opt_py)
        b = m.train_step(x.numpy().copy(), y.numpy().copy(), B, opt_cpp)
        assert abs(a - b) <= 1e-12 * abs(a)
    flat = torch.cat([p.detach().reshape(-1) for p in cm.parameters()])
    np.testing.assert_allclose(np.asarray(m.parameters()), flat.numpy(), rtol=1e-10, atol=1e-14)
    assert not np.allclose(
        np.asarray(m.parameters()),
        torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy(),
    )
    # the trained weights round-trip through a ROOT file, read by uproot and by load()
    m.save(str(tmp_path / "trained.root"))
    with uproot.open(tmp_path / "trained.root") as f:
        got = f["0.weight"]["values"].array(library="np")[0]
    np.testing.assert_array_equal(got, cm.state_dict()["0.weight"].reshape(-1).numpy())
    fresh = rootclad.root.load(tmp_path / "mlp")
    fresh.load(str(tmp_path / "trained.root"))
    assert np.array_equal(np.asarray(fresh.parameters()), np.asarray(m.parameters()))


def test_bad_files_and_events_are_clear_errors(exported, tmp_path):
    _, cm, stem, _ = exported
    with pytest.raises(FileNotFoundError, match="nope.so"):
        rootclad.root.load(tmp_path / "nope")
    # a library of another model under this stem: the weights name the library's MD5
    other = rootclad.compile(nn.Sequential(nn.Linear(3, 1)), torch.zeros(1, 3), engine="pullback")
    for ext in (".root", ".h"):
        shutil.copyfile(f"{stem}{ext}", tmp_path / f"stale{ext}")
    shutil.copyfile(other.library_path, tmp_path / "stale.so")
    with pytest.raises(Exception, match="not the library"):
        rootclad.root.load(tmp_path / "stale")
    # weights of other shapes
    other.export(tmp_path / "small")
    m = rootclad.root.load(stem)
    with pytest.raises(Exception, match="tensor '0.weight'|has no tensor"):
        m.load(str(tmp_path / "small.root"))
    # an event of the wrong length
    with pytest.raises(Exception, match="an event of 5 values"):
        m.score(ROOT.RVec["float"]([1.0] * 5))
    with pytest.raises(FileNotFoundError, match="no such directory"):
        cm.export(tmp_path / "missing" / "dir" / "x")
    assert not list(tmp_path.glob("*.partial"))


def test_export_replaces_files_atomically(exported, tmp_path, monkeypatch):
    """A failure while writing leaves the previous export whole and no partial files (a
    library of another model is exported over the first, and fails)."""
    _, cm, _, _ = exported
    cm.export(tmp_path / "a")
    other = rootclad.compile(nn.Sequential(nn.Linear(3, 1)), torch.zeros(1, 3), engine="pullback")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = uproot.recreate

    def full_disk(path, *args, **kwargs):  # the weights file breaks after the library copy
        real(path, *args, **kwargs).close()
        raise OSError("disk full")

    monkeypatch.setattr(uproot, "recreate", full_disk)
    with pytest.raises(OSError, match="disk full"):
        other.export(tmp_path / "a")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    rootclad.root.load(tmp_path / "a")  # still a matching pair


def test_weighted_loss_from_cpp_equals_python(tmp_path):
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 4, dtype=F64), engine="pullback")
    cm.export(tmp_path / "w")
    m = rootclad.root.load(tmp_path / "w")
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(9, 4, generator=gen, dtype=F64)
    y = (torch.rand(9, 1, generator=gen, dtype=F64) > 0.5).to(F64)
    w = torch.rand(9, generator=gen, dtype=F64) + 0.5
    ref, ref_grads = cm.loss_and_grad(x, y, weight=w)
    got = m.loss_and_grad(x.numpy().copy(), y.numpy().copy(), 9, w.numpy().copy())
    assert abs(got - ref.item()) <= 1e-12 * abs(ref.item())
    flat = torch.cat([g.reshape(-1) for g in ref_grads.values()]).numpy()
    np.testing.assert_allclose(np.asarray(m.gradients()), flat, rtol=1e-12)
    unweighted = m.loss_and_grad(x.numpy().copy(), y.numpy().copy(), 9)
    assert abs(unweighted - cm.loss_and_grad(x, y)[0].item()) <= 1e-12
    # HEP fits' normalisation, sum(w l) / sum(w): the same in C++ as in Python
    m.set_weight_norm("sum_w")
    assert m.weight_norm() == "sum_w"
    ref, ref_grads = cm.loss_and_grad(x, y, weight=w, weight_norm="sum_w")
    got = m.loss_and_grad(x.numpy().copy(), y.numpy().copy(), 9, w.numpy().copy())
    assert abs(got - ref.item()) <= 1e-12 * abs(ref.item())
    flat = torch.cat([g.reshape(-1) for g in ref_grads.values()]).numpy()
    np.testing.assert_allclose(np.asarray(m.gradients()), flat, rtol=1e-12)
    with pytest.raises(Exception, match="weight_norm 'sum'"):
        m.set_weight_norm("sum")


def test_batched_scorer_writes_a_friend_tree_aligned_entry_by_entry(exported, events, tmp_path):
    _, cm, stem, _ = exported
    x, path = events
    out = rootclad.root.score_tree(path, stem, inputs="strain", output=tmp_path / "s.root",
                                   batch_size=64)  # fmt: skip
    with uproot.open(out) as f:
        scores = f["scores"]["score"].array(library="np")
    # 300 = 4 full batches + 44; batches of other sizes round differently (BLAS blocking)
    np.testing.assert_allclose(scores, cm.predict(x).numpy()[:, 0], rtol=1e-5, atol=1e-6)
    f_in = ROOT.TFile(str(path))
    t = f_in.Get("events")
    t.AddFriend("scores", str(out))
    df = ROOT.RDataFrame(t)
    both = df.Define("again", "strain[0]").AsNumpy(["scores.score", "again"])
    np.testing.assert_array_equal(both["scores.score"], scores)
    np.testing.assert_array_equal(both["again"], x.numpy()[:, 0, 0])
    with pytest.raises(Exception, match="tree 'nope': no such tree in the file"):
        rootclad.root.score_tree(
            path, stem, inputs="strain", tree="nope", output=tmp_path / "t.root"
        )
    assert not list(tmp_path.glob("*.partial"))


def test_batched_scorer_reads_vector_branches_and_names_bad_entries(exported, tmp_path):
    """The other read path (a vector<float> branch) and its errors."""
    _, cm, stem, _ = exported
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(40, 1, L, generator=gen)
    rows = [list(r) for r in x.numpy().reshape(40, L)]
    path = tmp_path / "vec.root"
    f = ROOT.TFile(str(path), "RECREATE")
    t = ROOT.TTree("events", "vector<float> strain")
    v = ROOT.std.vector["float"]()
    t.Branch("strain", v)
    for i, r in enumerate(rows):
        v.clear()
        for value in r if i != 33 else r[:-1]:  # entry 33 is one sample short
            v.push_back(value)
        t.Fill()
    t.Write()
    f.Close()
    with pytest.raises(Exception, match=f"entry 33: strain has {L - 1} elements, expected {L}"):
        rootclad.root.score_tree(
            path, stem, inputs="strain", output=tmp_path / "s.root", batch_size=16
        )
    assert not (tmp_path / "s.root").exists()
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
    ok = tmp_path / "vec_ok.root"
    f = ROOT.TFile(str(ok), "RECREATE")
    t = ROOT.TTree("events", "vector<float> strain")
    t.Branch("strain", v)
    for r in rows:
        v.clear()
        for value in r:
            v.push_back(value)
        t.Fill()
    t.Write()
    f.Close()
    out = rootclad.root.score_tree(
        ok, stem, inputs="strain", output=tmp_path / "s.root", batch_size=16
    )
    with uproot.open(out) as fo:
        scores = fo["scores"]["score"].array(library="np")
    np.testing.assert_allclose(scores, cm.predict(x).numpy()[:, 0], rtol=1e-5, atol=1e-6)


def test_saved_optimizer_state_resumes_training_exactly(tmp_path):
    """5 Adam steps in one go equal 3 steps, save with the optimizer, load into a fresh model
    and optimizer, 2 more steps (float64)."""
    torch.manual_seed(7)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 4, dtype=F64), engine="pullback")
    cm.export(tmp_path / "r")
    gen = torch.Generator().manual_seed(8)
    batches = [torch.randn(7, 4, generator=gen, dtype=F64) for _ in range(5)]
    data = [(x.numpy().copy(), (x[:, :1] > 0).to(F64).numpy().copy()) for x in batches]
    straight = rootclad.root.load(tmp_path / "r")
    opt = ROOT.rootclad.Adam(straight, 1e-2)
    for x, y in data:
        straight.train_step(x, y, 7, opt)
    first = rootclad.root.load(tmp_path / "r")
    opt1 = ROOT.rootclad.Adam(first, 1e-2)
    for x, y in data[:3]:
        first.train_step(x, y, 7, opt1)
    first.save(str(tmp_path / "ckpt.root"), opt1)
    resumed = rootclad.root.load(tmp_path / "r")
    opt2 = ROOT.rootclad.Adam(resumed, 0.5)  # the saved lr comes back too
    resumed.load(str(tmp_path / "ckpt.root"), opt2)
    assert opt2.step == 3 and opt2.config.lr == 1e-2
    for x, y in data[3:]:
        resumed.train_step(x, y, 7, opt2)
    np.testing.assert_array_equal(np.asarray(resumed.parameters()),
                                  np.asarray(straight.parameters()))  # fmt: skip
    without = rootclad.root.load(tmp_path / "r")  # parameters alone do not resume Adam
    opt3 = ROOT.rootclad.Adam(without, 1e-2)
    without.load(str(tmp_path / "ckpt.root"))
    for x, y in data[3:]:
        without.train_step(x, y, 7, opt3)
    assert not np.array_equal(np.asarray(without.parameters()), np.asarray(straight.parameters()))
    with pytest.raises(Exception, match="another kind of optimizer"):
        resumed.load(str(tmp_path / "ckpt.root"), ROOT.rootclad.SGD(resumed, 0.1))
    with pytest.raises(Exception, match="holds no optimizer state"):
        resumed.load(str(tmp_path / "r.root"), opt2)


def test_training_started_in_python_resumes_in_cpp(tmp_path):
    torch.manual_seed(11)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 4, dtype=F64), engine="pullback")
    opt = rootclad.optim.Adam(cm, lr=1e-2, betas=(0.8, 0.99))
    gen = torch.Generator().manual_seed(12)
    batches = [torch.randn(7, 4, generator=gen, dtype=F64) for _ in range(5)]
    ys = [(x[:, :1] > 0).to(F64) for x in batches]
    for x, y in zip(batches[:3], ys[:3], strict=True):
        cm.train_step(x, y, opt)
    cm.export(tmp_path / "p", optimizer=opt)
    m = rootclad.root.load(tmp_path / "p")
    opt_cpp = ROOT.rootclad.Adam(m)
    m.load(str(tmp_path / "p.root"), opt_cpp)
    assert opt_cpp.step == 3 and opt_cpp.config.beta1 == 0.8
    for x, y in zip(batches[3:], ys[3:], strict=True):
        cm.train_step(x, y, opt)
        m.train_step(x.numpy().copy(), y.numpy().copy(), 7, opt_cpp)
    flat = torch.cat([p.detach().reshape(-1) for p in cm.parameters()]).numpy()
    np.testing.assert_allclose(np.asarray(m.parameters()), flat, rtol=1e-12, atol=1e-15)
    cm._views["0.bias"].requires_grad_(False)  # per-tensor step counts now differ
    cm.train_step(batches[0], ys[0], opt)
    cm.export(tmp_path / "q", optimizer=opt)  # frozen now: exported frozen, its count moot
    cm._views["0.bias"].requires_grad_(True)  # trainable again, one step behind the others
    with pytest.raises(ValueError, match="different numbers of steps"):
        cm.export(tmp_path / "q", optimizer=opt)


def test_batched_scorer_sees_weights_written_after_its_first_use(events, tmp_path):
    """score_tree keeps the opened model per stem; new weights (a macro's training) are read."""
    x, path = events
    net = _cnn()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 1, L), engine="pullback")
    cm.export(tmp_path / "m")
    first = rootclad.root.score_tree(
        path, tmp_path / "m", inputs="strain", output=tmp_path / "a.root"
    )
    with torch.no_grad():
        for p in cm.parameters():
            p.mul_(1.5)
    cm.export(tmp_path / "m")  # same library, new weights
    second = rootclad.root.score_tree(
        path, tmp_path / "m", inputs="strain", output=tmp_path / "b.root"
    )
    with uproot.open(first) as f, uproot.open(second) as g:
        a, b = f["scores"]["score"].array(library="np"), g["scores"]["score"].array(library="np")
    assert not np.allclose(a, b)
    np.testing.assert_allclose(b, cm.predict(x).numpy()[:, 0], rtol=1e-5, atol=1e-6)


def test_define_score_reads_weights_written_after_its_first_use(events, tmp_path):
    x, path = events
    cm = rootclad.compile(_cnn(), example_input=torch.zeros(1, 1, L), engine="pullback")
    cm.export(tmp_path / "d")

    def scores():
        df = rootclad.root.define_score(ROOT.RDataFrame("events", str(path)), tmp_path / "d",
                                        inputs="strain")  # fmt: skip
        return df.AsNumpy(["score"])["score"]

    first = scores()
    with torch.no_grad():
        for p in cm.parameters():
            p.mul_(0.5)
    cm.export(tmp_path / "d")
    second = scores()
    assert not np.allclose(first, second)
    np.testing.assert_allclose(second, cm.predict(x).numpy()[:, 0], rtol=1e-5, atol=1e-6)
    shutil.copyfile(tmp_path / "d.root", tmp_path / "stale.root")  # weights of "d" ...
    other = rootclad.compile(nn.Sequential(nn.Flatten(), nn.Linear(L, 1)),
                             torch.zeros(1, 1, L), engine="pullback")  # fmt: skip
    shutil.copyfile(other.library_path, tmp_path / "stale.so")  # ... with another library
    with pytest.raises(Exception, match="not the library"):
        rootclad.root.define_score(ROOT.RDataFrame("events", str(path)), tmp_path / "stale",
                                   inputs="strain")  # fmt: skip


_BAD_MT = r"""
import sys, ROOT, rootclad.root
ROOT.EnableImplicitMT(2)
df = ROOT.RDataFrame(2000).Define("v", "ROOT::RVecF(rdfentry_ == 1500 ? 5 : %d, 1.f)")
try:
    rootclad.root.define_score(df, sys.argv[1], "v").Sum("score").GetValue()
except Exception as err:
    print("raised:", str(err).splitlines()[-1])
ok = rootclad.root.define_score(ROOT.RDataFrame(10).Define("v", "ROOT::RVecF(%d, 1.f)"),
                                sys.argv[1], "v").Count().GetValue()
print("after:", ok)
"""


def test_bad_rdataframe_columns_are_python_errors_never_an_abort(exported, tmp_path):
    """Wrong column types or counts are refused in Python naming the columns; an event of the
    wrong length raises from the event loop, single- and multi-threaded, and the session goes
    on; NaN inputs give NaN scores, as cm(x) does."""
    _, cm, stem, _ = exported
    df = (
        ROOT.RDataFrame(20)
        .Define("v", "ROOT::RVecF(rdfentry_ == 7 ? 3 : 64, 0.5f)")
        .Define("vi", "ROOT::RVecI(64, int(rdfentry_ % 3))")
        .Define("s", 'std::string("x")')
        .Define("a", "1.0")
    )
    with pytest.raises(ValueError, match="column 's' holds .*string"):
        rootclad.root.define_score(df, stem, ["a", "s"])
    with pytest.raises(ValueError, match="column 'a' holds double; one input column must hold"):
        rootclad.root.define_score(df, stem, "a")
    with pytest.raises(ValueError, match=r"1 input columns \['a'\]; the model .* takes 64"):
        rootclad.root.define_score(df, stem, ["a"])
    with pytest.raises(ValueError, match="no column 'nope'"):
        rootclad.root.define_saliency(df, stem, "nope")
    with pytest.raises(
        Exception, match=r"entry 7: column v \(3\) holds 3 values; the model takes 64"
    ):
        rootclad.root.define_score(df, stem, "v").Sum("score").GetValue()
    # a list mixing numbers and arrays, as the readers take: concatenated in order
    mixed = df.Define("w", "ROOT::RVecF(62, 0.5f)").Define("b", "float(rdfentry_ % 3)")
    scores = rootclad.root.define_score(mixed, stem, ["a", "w", "b"]).AsNumpy(["score"])["score"]
    x = torch.full((20, 1, L), 0.5)
    x[:, 0, 0], x[:, 0, -1] = 1.0, (torch.arange(20) % 3).float()
    np.testing.assert_allclose(scores, cm.predict(x).numpy()[:, 0], rtol=1e-5, atol=1e-6)
    short = df.Define("u", "ROOT::RVecF(rdfentry_ == 7 ? 3 : 63, 0.5f)")
    with pytest.raises(Exception, match=r"entry 7: columns a \(1\), u \(3\) hold 4 values"):
        rootclad.root.define_score(short, stem, ["a", "u"]).Sum("score").GetValue()
    # an RVec<int> column is converted
    scores = rootclad.root.define_score(df, stem, "vi").AsNumpy(["score"])["score"]
    x = (torch.arange(20) % 3).float()[:, None, None].expand(20, 1, L)
    np.testing.assert_allclose(scores, cm.predict(x).numpy()[:, 0], rtol=1e-5, atol=1e-6)
    nan = ROOT.RDataFrame(2).Define("v", "ROOT::RVecF(64, rdfentry_ == 1 ? NAN : 0.f)")
    s = rootclad.root.define_score(nan, stem, "v").AsNumpy(["score"])["score"]
    assert np.isfinite(s[0]) and np.isnan(s[1])
    assert torch.isnan(cm.predict(torch.full((1, 1, L), float("nan")))).all()
    proc = subprocess.run([sys.executable, "-c", _BAD_MT % (L, L), str(stem)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "entry 1500: column v (5) holds 5 values" in proc.stdout, proc.stdout
    assert "after: 10" in proc.stdout, proc.stdout


def test_model_refuses_batches_larger_than_its_arrays_and_nan_training(exported):
    _, cm, stem, _ = exported
    m = rootclad.root.load(stem)
    x = np.zeros((4, L), np.float32)
    out = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="predict: a batch of 5 needs 320 input values, the "
                                         "array given holds 256"):  # fmt: skip
        m.predict(x, out, 5)
    with pytest.raises(ValueError, match="a batch of 4 needs 4 output values, the array given "
                                         "holds 3"):  # fmt: skip
        m.predict(x, out[:3], 4)
    with pytest.raises(Exception, match="batch size must be at least 1"):
        m.predict(x, out, 0)
    opt = ROOT.rootclad.Adam(m, 1e-3)
    y = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="train_step: a batch of 4 needs 4 target values"):
        m.train_step(x, y[:2], 4, opt)
    before = np.asarray(m.parameters()).copy()
    x[2, 7] = np.nan
    with pytest.raises(Exception, match=r"train_step: non-finite input \(nan\) in sample 2, "
                                        "value 7; .* was not updated"):  # fmt: skip
        m.train_step(x, y, 4, opt)
    x[2, 7] = 0
    w = np.ones(4, np.float32)
    w[1] = np.inf
    with pytest.raises(Exception, match=r"non-finite weight \(inf\) in sample 1"):
        m.loss_and_grad(x, y, 4, w)
    np.testing.assert_array_equal(np.asarray(m.parameters()), before)
    assert np.isfinite(m.train_step(x, y, 4, opt))  # the model still trains
