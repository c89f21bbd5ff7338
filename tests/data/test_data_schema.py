"""``rootclad.data.Schema`` (what an export says its input is) and ``Standardize`` (a
preprocessing stage compiled into the model).

References: numpy's mean and population std on the same values, torch autograd through the
same module for the compiled model's output and input gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import uproot
from torch import nn

import rootclad
from rootclad.data import BatchIterator, Schema, Standardize, TableIterator

N = 257


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    rng = np.random.default_rng(5)
    data = {"a": rng.normal(3, 2, N).astype(np.float32), "k": rng.integers(0, 9, N).astype(np.int32),
            "v": rng.normal(-1e4, 0.5, (N, 3)).astype(np.float32), "c": np.full(N, 7.0),
            "y": rng.integers(0, 2, N).astype(np.int32)}  # fmt: skip
    path = tmp_path_factory.mktemp("schema") / "t.root"
    with uproot.recreate(path) as f:
        types = {k: np.dtype((v.dtype, v.shape[1:])) if v.ndim > 1 else v.dtype
                 for k, v in data.items()}  # fmt: skip
        f.mktree("t", types).extend(data)
    x = np.concatenate([data["a"][:, None], data["k"][:, None], data["v"], data["c"][:, None]], 1)
    return str(path), x.astype(np.float64), data


def test_fit_on_a_reader_equals_numpy(table):
    path, x, _ = table
    it = TableIterator(path, tree="t", features=["a", "k", "v", "c"], target="y", batch_size=10)
    s = Standardize.fit(it)
    # float32 values summed in float64 about the first batch's mean: no cancellation at -1e4
    np.testing.assert_allclose(s.mean.numpy(), x.astype(np.float32).mean(0), rtol=1e-6)
    np.testing.assert_allclose(s.std.numpy()[:5], x.std(0)[:5], rtol=1e-4)
    assert s.std[5] == 1.0  # a constant column is divided by 1


def test_fit_on_an_array_and_the_check_fails_on_a_wrong_answer(table):
    _, x, _ = table
    s = Standardize.fit(x)
    np.testing.assert_allclose(s.mean.double().numpy(), x.mean(0), rtol=1e-6)
    with pytest.raises(AssertionError):  # the comparison above sees a different std
        np.testing.assert_allclose(s.std.double().numpy(), x.std(0, ddof=1), rtol=1e-6)


def test_fit_on_an_rdataframe_with_a_filter(table):
    ROOT = pytest.importorskip("ROOT", reason="an RDataFrame needs ROOT")
    path, x, data = table
    df = ROOT.RDataFrame("t", path).Filter("k > 3")
    s = Standardize.fit(df, features=["a", "k", "v"])
    keep = data["k"] > 3
    np.testing.assert_allclose(s.mean.numpy(), x[keep, :5].mean(0), rtol=1e-5)
    np.testing.assert_allclose(s.std.numpy(), x[keep, :5].std(0), rtol=1e-4)
    with pytest.raises(TypeError, match="features="):
        Standardize.fit(df)


def test_compiled_model_applies_it_in_forward_and_input_gradients():
    torch.manual_seed(1)
    stage = Standardize(torch.randn(5) * 10, torch.rand(5) + 0.1)
    net = nn.Sequential(stage, nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 2)).double()
    cm = rootclad.compile(net, torch.zeros(1, 5, dtype=torch.float64), engine="pullback",
                          loss="mse")  # fmt: skip
    x = (torch.randn(7, 5, dtype=torch.float64) * 10).requires_grad_()
    out, ref = cm(x), net(x)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(7, 2, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(out, x, g)[0],
                               torch.autograd.grad(ref, x, g)[0], rtol=1e-12, atol=1e-14)  # fmt: skip
    assert [n for n, p in cm.named_parameters() if not p.requires_grad] == ["0.mean", "0.std"]
    before = cm.state_dict()["0.mean"].clone()
    opt = rootclad.optim.Adam(cm, lr=0.1)
    cm.train_step(x.detach(), torch.zeros(7, 2, dtype=torch.float64), opt)
    torch.testing.assert_close(cm.state_dict()["0.mean"], before, rtol=0, atol=0)


def test_double_restores_the_float64_statistics_and_fit_keeps_the_readers_epoch(table):
    """A GPS-time-like feature (1.4e9 +- 100): float32 rounds its mean by up to 64, half a
    standard deviation; .double() on the model must give the fitted float64 values back."""
    x = (1.4e9 + 100 * np.random.default_rng(0).standard_normal((500, 1))).astype(np.float64)
    s = Standardize.fit(x)
    assert s.mean.dtype == torch.float32
    net = nn.Sequential(s).double()
    assert abs(float(net[0].mean) - x.mean()) < 1e-6 and abs(float(net[0].std) - x.std()) < 1e-6
    assert float(Standardize.fit(x, dtype=torch.float64).mean) == pytest.approx(x.mean(), abs=1e-6)
    path, _, _ = table
    it = TableIterator(path, tree="t", features=["a"], target="y", epoch=3)
    Standardize.fit(it)
    assert it.epoch == 3


def test_standardize_refuses_bad_constants():
    with pytest.raises(ValueError, match="differ in shape"):
        Standardize(torch.zeros(3), torch.ones(2))
    with pytest.raises(ValueError, match="finite"):
        Standardize(torch.zeros(2), torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="no entries"):
        Standardize.fit(np.zeros((0, 3)))
    with pytest.raises(ValueError, match=r"expected \(N, \*per-sample shape\)"):
        Standardize.fit(np.arange(10.0))


def test_readers_give_their_schema(table, tmp_path):
    path, _, _ = table
    it = TableIterator(path, tree="t", features=["a", "v"], target="y")
    assert it.schema == Schema([("a", 1), ("v", 3)], target="y")
    gw = tmp_path / "gw.root"
    with uproot.recreate(gw) as f:
        f.mktree("events", {"strain": np.dtype((np.float32, (16,))), "label": np.int32}).extend(
            {"strain": np.zeros((4, 16), np.float32), "label": np.zeros(4, np.int32)}
        )
    assert BatchIterator(str(gw)).schema == Schema({"strain": 16}, target="label")


@pytest.mark.parametrize(
    "columns, kw, match",
    [
        ({"pt;system(1)": 1}, {}, "not a C\\+\\+ name"),
        ([("pt", 0)], {}, "not a count"),
        ([("pt", 2.5)], {}, "not a count"),
        (["pt", "pt"], {}, "repeat"),
        ([], {}, "at least one"),
        (["pt"], {"target": "a b"}, "target column"),
        (["pt"], {"classes": "sig"}, "list of names"),
        (["pt", "y"], {"target": "y"}, "also an input"),
        (["pt"], {"target": "y", "weight": "y"}, "one column"),
    ],
)
def test_schema_refuses_what_cannot_be_used(columns, kw, match):
    with pytest.raises(ValueError, match=match):
        Schema(columns, **kw)


def test_schema_forms_and_json_round_trip():
    s = Schema(["pt", ("jets", 4)], target="y", classes=["b", "s"])
    assert s == Schema({"pt": 1, "jets": 4}, target="y", classes=("b", "s"))
    assert (s.names, s.lengths, s.size) == (["pt", "jets"], [1, 4], 5)
    assert Schema.from_json(s.to_json()) == s
    assert s.replace(weight="w").weight == "w" and s.weight is None
    assert Schema.from_json({}) is None
    with pytest.raises(TypeError, match="Schema or a reader"):
        Schema.of(["pt"])
