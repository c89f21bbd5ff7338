"""TableIterator, its C++ twin CompiledTableIterator and from_rdataframe: numeric columns as
features, a target and event weights.

Each entry carries its id in a column, so every batch is checked against arrays built here with
numpy from the values written, never against the reader's own output; the two readers are then
compared batch for batch.
"""

from __future__ import annotations

import awkward as ak
import numpy as np
import pytest
import uproot

from rootclad.data import DataError, TableIterator

N = 300


def _columns(ids: np.ndarray) -> dict:
    n = len(ids)
    return (
        {
            "id": ids.astype(np.int64),
            "pt": (ids * 1.5).astype(np.float32),
            "eta": np.sin(ids).astype(np.float64),
            "njet": (ids % 5).astype(np.int32),
            "jets": np.stack([ids + 0.25, ids + 0.5, ids + 0.75], 1).astype(np.float32),
            "tracks": ak.Array([[float(i), -float(i)] for i in ids]),
            "y_int": (ids % 2).astype(np.int32),
            "y_float": (ids / 10.0).astype(np.float64),
            "w": (1.0 + (ids % 3)).astype(np.float32),
        }
        if n
        else {}
    )


def _expected(ids: np.ndarray) -> np.ndarray:
    """The feature rows for features [id, pt, jets, tracks, eta, njet], built by hand."""
    ids = ids.astype(np.float64)
    return np.concatenate(
        [ids[:, None], ids[:, None] * 1.5, ids[:, None] + [0.25, 0.5, 0.75],
         np.stack([ids, -ids], 1), np.sin(ids)[:, None], (ids % 5)[:, None]], axis=1,
    ).astype(np.float32)  # fmt: skip


FEATURES = ["id", "pt", "jets", "tracks", "eta", "njet"]


def _write(path, ids, basket=64):
    with uproot.recreate(path) as f:
        cols = _columns(ids)
        f.mktree("t", {k: (v.type if isinstance(v, ak.Array) else v.dtype) if not
                       (isinstance(v, np.ndarray) and v.ndim == 2) else
                       np.dtype((v.dtype, (v.shape[1],))) for k, v in cols.items()})  # fmt: skip
        for lo in range(0, len(ids), basket):
            f["t"].extend({k: v[lo : lo + basket] for k, v in cols.items()})
    return str(path)


@pytest.fixture(params=["uproot", "compiled"])
def Reader(request):
    """Each test runs with the uproot reader and with the C++ one (tree_reader.h)."""
    if request.param == "uproot":
        return TableIterator
    pytest.importorskip("ROOT", reason="the C++ reader needs ROOT")
    from rootclad.data import CompiledTableIterator

    return CompiledTableIterator


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("table")
    return [_write(d / "a.root", np.arange(N)), _write(d / "b.root", 1000 + np.arange(170), 50)]


def test_mixed_features_target_and_weights_in_every_batch(Reader, files):
    it = Reader(files, tree="t", features=FEATURES, target="y_float", weight="w",
                       batch_size=64, seed=3)  # fmt: skip
    assert it.length == 1 + 1 + 3 + 2 + 1 + 1 and len(it) == -(-(N + 170) // 64)
    seen = []
    for x, y, w in it:
        assert x.dtype == np.float32 and y.dtype == np.float32 and w.dtype == np.float32
        ids = x[:, 0].astype(np.int64)
        np.testing.assert_array_equal(x, _expected(ids))
        np.testing.assert_allclose(y, (ids / 10.0).astype(np.float32))
        np.testing.assert_array_equal(w, 1.0 + (ids % 3))
        seen.append(ids)
    seen = np.concatenate(seen)
    assert sorted(seen) == [*range(N), *range(1000, 1170)]  # each entry once
    assert not np.array_equal(seen, np.sort(seen))  # shuffled


def test_integer_target_splits_and_epochs(Reader, files):
    train = Reader(files, tree="t", features=["id", "jets"], target="y_int",
                          split="train", validation_fraction=0.2, batch_size=50)  # fmt: skip
    val = Reader(files, tree="t", features=["id", "jets"], target="y_int",
                        split="validation", validation_fraction=0.2, batch_size=50)  # fmt: skip
    a = np.concatenate([x[:, 0] for x, y in train]).astype(np.int64)
    b = np.concatenate([x[:, 0] for x, y in val]).astype(np.int64)
    assert not set(a) & set(b) and len(a) + len(b) == N + 170
    x, y = next(iter(val))
    assert y.dtype == np.int32 and np.array_equal(y, x[:, 0].astype(np.int64) % 2)
    e1 = np.concatenate([x[:, 0] for x, _ in train])
    assert not np.array_equal(a, e1)  # the next epoch shuffles differently


def test_from_rdataframe_applies_filters_and_defines(files):
    ROOT = pytest.importorskip("ROOT", reason="from_rdataframe needs ROOT")
    from rootclad.data import from_rdataframe

    df = ROOT.RDataFrame("t", files[0]).Filter("njet > 1").Define("pt2", "pt * pt")
    it = from_rdataframe(df, features=["id", "pt2", "jets"], target="y_int", weight="w",
                         batch_size=32, shuffle=False)  # fmt: skip
    x, y, w = (np.concatenate(p) for p in zip(*it, strict=True))
    ids = np.arange(N)[np.arange(N) % 5 > 1]
    np.testing.assert_array_equal(x[:, 0], ids)
    np.testing.assert_allclose(x[:, 1], (ids * 1.5).astype(np.float32) ** 2, rtol=1e-6)
    np.testing.assert_array_equal(x[:, 2:], ids[:, None] + np.array([0.25, 0.5, 0.75]))
    np.testing.assert_array_equal(y, ids % 2)
    np.testing.assert_array_equal(w, 1.0 + ids % 3)


def test_table_bad_input_names_file_branch_and_entry(Reader, files, tmp_path):
    with pytest.raises(DataError, match="no such branch") as e:
        Reader(files, tree="t", features=["id", "nope"], target="y_int")
    assert e.value.branch == "nope"
    with pytest.raises(DataError, match="one number per entry") as e:
        Reader(files, tree="t", features=["id"], target="jets")
    ids = np.arange(40)
    cols = _columns(ids)
    cols["tracks"] = ak.Array([[1.0, 2.0]] * 17 + [[1.0]] + [[1.0, 2.0]] * 22)
    cols["w"][25] = np.nan
    path = tmp_path / "bad.root"
    with uproot.recreate(path) as f:
        sub = {k: cols[k] for k in ("id", "tracks", "y_int")}
        f.mktree("t", {k: (v.type if isinstance(v, ak.Array) else v.dtype)
                       for k, v in sub.items()}).extend(sub)  # fmt: skip
    with pytest.raises(DataError, match="1 values where the first entry had 2") as e:
        list(Reader(str(path), tree="t", features=["id", "tracks"], target="y_int",
                           shuffle=False))  # fmt: skip
    assert (e.value.branch, e.value.entry) == ("tracks", 17)
    path2 = tmp_path / "badw.root"
    with uproot.recreate(path2) as f:
        sub = {k: cols[k] for k in ("id", "y_int", "w")}
        f.mktree("t", {k: v.dtype for k, v in sub.items()}).extend(sub)
    with pytest.raises(DataError, match="non-finite weight") as e:
        list(Reader(str(path2), tree="t", features=["id"], target="y_int", weight="w"))
    assert (e.value.branch, e.value.entry) == ("w", 25)
    with pytest.raises(TypeError, match="features= and target="):
        Reader(files, tree="t", features=["id"], target="y_int", strain="id")


def _batches(it, epochs=2):
    return [[a.copy() for a in batch] for _ in range(epochs) for batch in it]


def _assert_same_batches(a, b):
    assert len(a) == len(b)
    for ba, bb in zip(a, b, strict=True):
        assert [x.dtype for x in ba] == [x.dtype for x in bb]
        for xa, xb in zip(ba, bb, strict=True):
            np.testing.assert_array_equal(xa, xb)


def test_assert_same_batches_fails_on_a_wrong_batch():
    a = [[np.zeros((2, 3), np.float32), np.zeros(2, np.int32)]]
    b = [[np.zeros((2, 3), np.float32), np.array([0, 1], np.int32)]]
    with pytest.raises(AssertionError):
        _assert_same_batches(a, b)


@pytest.fixture(scope="module")
def vector_file(tmp_path_factory):
    """std::vector<double>, RVec<int> and a float target written by ROOT itself (uproot writes
    jagged columns as counted arrays, not as vectors)."""
    ROOT = pytest.importorskip("ROOT", reason="writes vector branches with ROOT")
    path = str(tmp_path_factory.mktemp("vec") / "vec.root")
    opts = ROOT.RDF.RSnapshotOptions()
    opts.fAutoFlush = 37  # several baskets, so the plan has several blocks
    (
        ROOT.RDataFrame(230)
        .Define("id", "(long long)rdfentry_")
        .Define("vd", "std::vector<double>{id * 0.5, id * 0.25}")
        .Define("ri", "ROOT::RVecI{int(id), -int(id), 7}")
        .Define("yf", "float(id) / 3.f")
        .Define("w", "1.f + id % 4")
        .Snapshot("t", path, ["id", "vd", "ri", "yf", "w"], opts)
    )
    return path


def test_python_and_cxx_readers_give_identical_batches(files, vector_file):
    """Scalars of several types, fixed arrays, counted arrays, vectors and RVecs; int and float
    targets; weights; shuffled, split, over two epochs and several files."""
    pytest.importorskip("ROOT", reason="the C++ reader needs ROOT")
    from rootclad.data import CompiledTableIterator

    cases = [
        (files, dict(features=FEATURES, target="y_float", weight="w")),
        (
            files,
            dict(
                features=["tracks", "njet"],
                target="y_int",
                split="train",
                validation_fraction=0.3,
                block_size=40,
                buffer_blocks=2,
            ),
        ),  # fmt: skip
        ([vector_file], dict(features=["ri", "id", "vd"], target="yf", weight="w")),
        ([vector_file], dict(features=["vd"], target="id", shuffle=False, drop_last=True)),
    ]
    for paths, kwargs in cases:
        common = dict(tree="t", batch_size=29, seed=5, **kwargs)
        py, cxx = TableIterator(paths, **common), CompiledTableIterator(paths, **common)
        assert (py.length, len(py), py.blocks) == (cxx.length, len(cxx), cxx.blocks)
        _assert_same_batches(_batches(py), _batches(cxx))
        _assert_same_batches([py.read_all()], [cxx.read_all()])
    x, y, w = CompiledTableIterator([vector_file], tree="t", features=["ri", "id", "vd"],
                                    target="yf", weight="w", shuffle=False).read_all()  # fmt: skip
    ids = np.arange(230.0)
    np.testing.assert_array_equal(
        x, np.stack([ids, -ids, 7 + 0 * ids, ids, ids * 0.5, ids * 0.25], 1).astype(np.float32)
    )
    np.testing.assert_array_equal(y, (ids.astype(np.float32) / np.float32(3)))
    np.testing.assert_array_equal(w, 1 + ids % 4)


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "cxx"])
def test_rdataframe_errors_name_its_column_and_entry(tmp_path, compiled):
    """A misspelt column: its name and the close matches, before any event loop. A vector of
    another length and a non-finite weight: the column and the RDataFrame's entry number
    (after a Filter, not the row of the temporary snapshot), never the temporary file."""
    ROOT = pytest.importorskip("ROOT", reason="from_rdataframe needs ROOT")
    from rootclad.data import from_rdataframe

    ids = np.arange(40)
    cols = {"id": ids.astype(np.int64), "pT": ids.astype(np.float32),
            "tracks": ak.Array([[1.0, 2.0]] * 30 + [[1.0]] + [[1.0, 2.0]] * 9),
            "y": (ids % 2).astype(np.int32), "w": np.ones(40)}  # fmt: skip
    cols["w"][35] = np.inf
    path = tmp_path / "bad.root"
    with uproot.recreate(path) as f:
        f.mktree("t", {k: (v.type if isinstance(v, ak.Array) else v.dtype)
                       for k, v in cols.items()}).extend(cols)  # fmt: skip
    df = ROOT.RDataFrame("t", str(path)).Filter("id >= 10")
    with pytest.raises(
        DataError, match=r'Unknown column "pt" in the RDataFrame; close matches: pT'
    ):
        from_rdataframe(df, features=["pt"], target="y", compiled=compiled)
    for features, weight, branch, entry in ((["id", "tracks"], None, "tracks", 30),
                                            (["id"], "w", "w", 35)):  # fmt: skip
        with pytest.raises(DataError) as e:
            it = from_rdataframe(df, features=features, target="y", weight=weight,
                                 batch_size=8, shuffle=False, compiled=compiled)  # fmt: skip
            list(it)
        assert (e.value.file, e.value.branch, e.value.entry) == ("RDataFrame", branch, entry), (
            e.value
        )
        assert "rootclad-rdf-" not in str(e.value)


def test_filtered_rdataframe_reads_the_same_in_python_and_cxx(files):
    ROOT = pytest.importorskip("ROOT", reason="from_rdataframe needs ROOT")
    from rootclad.data import from_rdataframe

    def make(compiled):
        df = ROOT.RDataFrame("t", files[1]).Filter("njet != 2").Define("pt2", "pt * pt")
        return from_rdataframe(df, features=["pt2", "tracks", "eta"], target="y_float",
                               weight="w", batch_size=16, seed=2, compiled=compiled)  # fmt: skip

    from rootclad.data import CompiledTableIterator

    py, cxx = make(False), make(True)
    assert isinstance(cxx, CompiledTableIterator)
    _assert_same_batches(_batches(py), _batches(cxx))
