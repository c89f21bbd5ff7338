"""Training batches streamed from RDataFrames (from_rdataframe(..., stream=True)): every row
checked against numpy arrays built from the values written (test_data_table's helpers), the
same rows as the snapshot route, over TTrees and RNTuples, several RDataFrames, splits, ranks,
ImplicitMT refused, and errors naming the RDataFrame, column and entry."""

from __future__ import annotations

import numpy as np
import pytest
import uproot
from test_data_table import N, _columns, _expected, _write

from rootclad.data import DataError

ROOT = pytest.importorskip("ROOT", reason="streaming from RDataFrames needs ROOT")
from rootclad.data import from_rdataframe  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    ttree = [_write(d / "a.root", np.arange(N)), _write(d / "b.root", 1000 + np.arange(170), 50)]
    ntuple = d / "a_ntuple.root"
    cols = {k: v for k, v in _columns(np.arange(N)).items() if k != "tracks"}
    with uproot.recreate(ntuple) as f:
        f.mkrntuple("t", cols)  # "jets" an std::array<float, 3>
    return ttree, str(ntuple)


def _stream(dfs, **kw):
    kw.setdefault("features", ["id", "pt2", "jets", "tracks"])
    kw.setdefault("target", "y_int")
    return from_rdataframe(dfs, stream=True, **kw)


def _df(path):
    return ROOT.RDataFrame("t", path).Filter("njet > 1").Define("pt2", "pt * pt")


def _rows(ids):
    """[id, pt2, jets(3), tracks(2)] by hand."""
    e = _expected(ids)
    return np.concatenate([e[:, :1], (e[:, 1:2] ** 2), e[:, 2:7]], axis=1)


def _ids(path_ids):
    return path_ids[path_ids % 5 > 1]


def test_streamed_rows_are_the_filtered_rows_and_the_snapshots(files):
    ttree, _ = files
    df = _df(ttree[0])
    it = _stream(df, weight="w", batch_size=32, seed=5, block_size=40)
    x, y, w = (np.concatenate(p) for p in zip(*it, strict=True))
    ids = x[:, 0].astype(np.int64)
    assert sorted(ids) == list(_ids(np.arange(N))) and not np.array_equal(ids, np.sort(ids))
    np.testing.assert_allclose(x, _rows(ids), rtol=1e-6)
    np.testing.assert_array_equal(y, ids % 2)
    np.testing.assert_array_equal(w, 1.0 + ids % 3)
    kw = dict(target="y_int", weight="w", batch_size=32, seed=5, block_size=40)
    snap = from_rdataframe(df, features=["id", "pt2", "jets", "tracks"], **kw)
    for a, b in zip(snap.read_all(), it.read_all(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert df.Count().GetValue() == len(_ids(np.arange(N)))  # the user's loop runs whole again


def test_the_same_seed_gives_the_same_epoch_and_splits_do_not_meet(files):
    ttree, _ = files
    kw = dict(batch_size=16, seed=9, validation_fraction=0.25, block_size=24)
    train = _stream(_df(ttree[0]), split="train", **kw)
    again = _stream(_df(ttree[0]), split="train", **kw)
    val = _stream(_df(ttree[0]), split="validation", **kw)
    a = np.concatenate([x[:, 0] for x, _ in train])
    np.testing.assert_array_equal(a, np.concatenate([x[:, 0] for x, _ in again]))
    b = np.concatenate([x[:, 0] for x, _ in val])
    assert not set(a) & set(b) and sorted([*a, *b]) == list(_ids(np.arange(N)))
    assert not np.array_equal(a, np.concatenate([x[:, 0] for x, _ in train]))  # next epoch


def test_several_dataframes_ranks_and_an_rntuple(files):
    ttree, ntuple = files
    dfs = [_df(ttree[0]), _df(ttree[1]), _df(ntuple)]
    want = sorted([*_ids(np.arange(N)), *_ids(1000 + np.arange(170)), *_ids(np.arange(N))])
    feats = ["id", "pt2", "jets"]
    whole = np.concatenate([x[:, 0] for x, _ in _stream(dfs, features=feats, batch_size=20)])
    assert sorted(whole) == want
    shares = [_stream(dfs, features=feats, batch_size=20, rank=r, world_size=3) for r in range(3)]
    assert len({len(s) for s in shares}) == 1
    seen = np.concatenate([x[:, 0] for s in shares for x, _ in s])
    assert sorted(seen) == want
    rnt = _stream(_df(ntuple), features=feats, shuffle=False).read_all()[0]
    np.testing.assert_allclose(rnt, _rows(_ids(np.arange(N)))[:, :5], rtol=1e-6)


def test_implicit_mt_is_refused(files):
    """A multi-threaded loop's rdfentry_ is not the entry number of a TTree's entry: refused,
    never batches in another order than planned."""
    ROOT.EnableImplicitMT(2)
    try:
        with pytest.raises(DataError, match="cannot stream while ROOT's ImplicitMT is on"):
            _stream(_df(files[0][0]))
    finally:
        ROOT.DisableImplicitMT()


def test_stream_errors_name_the_dataframe_column_and_entry(files, tmp_path):
    ttree, _ = files
    with pytest.raises(DataError, match="no such column; close matches: pt, pt2") as e:
        _stream(_df(ttree[0]), features=["id", "pt3"])
    assert (e.value.file, e.value.branch) == ("RDataFrame", "pt3")
    with pytest.raises(DataError, match="expected one number per entry, found") as e:
        _stream(_df(ttree[0]), target="jets")
    with pytest.raises(DataError, match="no data source"):
        _stream(ROOT.RDataFrame(10).Define("a", "1.f").Define("y", "1"), features=["a"], target="y")
    bad = ROOT.RDataFrame("t", ttree[0]).Filter("gRandom->Rndm() < 0.5").Define("pt2", "pt")
    with pytest.raises(DataError, match="must pass the same entries every time"):
        list(_stream(bad, batch_size=8))
    short = (
        ROOT.RDataFrame("t", ttree[0])
        .Define("pt2", "pt")
        .Define("v", "rdfentry_ == 77 ? ROOT::RVecF{1.f} : ROOT::RVecF{1.f, 2.f}")
    )
    with pytest.raises(DataError, match="1 values where the first entry had 2") as e:
        list(_stream(short, features=["id", "v"], shuffle=False))
    assert (e.value.file, e.value.branch, e.value.entry) == ("RDataFrame", "v", 77)
    nan = ROOT.RDataFrame("t", ttree[0]).Define("pt2", "rdfentry_ == 33 ? NAN : pt")
    with pytest.raises(DataError, match="non-finite value") as e:
        list(_stream(nan, features=["id", "pt2"], shuffle=False))
    assert (e.value.branch, e.value.entry) == ("pt2", 33)
    with pytest.raises(DataError, match="RDataFrame 1: .*differ"):
        _stream([_df(ttree[0]), _df(ttree[1]).Redefine("pt2", "int(pt)")])
