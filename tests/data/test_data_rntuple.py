"""RNTuple inputs read as TTrees are: the same columns written once as a TTree and once as an
RNTuple (uproot, clusters where the TTree has baskets) give identical batches in every reader,
and the same errors name the file, the RNTuple, the field and the entry.

The TTree readers are the reference here; each of them is checked against arrays built by hand
in test_data_table.py and test_data_loader.py."""

from __future__ import annotations

import awkward as ak
import numpy as np
import pytest
import uproot

from rootclad.data import BatchIterator, DataError, TableIterator

N, L = 300, 40


def _columns(ids: np.ndarray) -> dict:
    return {
        "id": ids.astype(np.int64),
        "pt": (ids * 1.5).astype(np.float32),
        "njet": (ids % 5).astype(np.int16),
        "jets": np.stack([ids + 0.25, ids + 0.5, ids + 0.75], 1).astype(np.float32),
        "tracks": ak.Array([[float(i), -float(i)] for i in ids]),
        "strain": np.sin(np.outer(ids, np.arange(L)) * 0.01).astype(np.float32),
        "strain_vec": ak.values_astype(
            ak.Array([np.cos(i * np.arange(L)) for i in ids]), np.float32
        ),
        "label": (ids % 2).astype(np.int32),
        "w": (1.0 + (ids % 3)).astype(np.float32),
    }


def _write(path, ids, ntuple: bool, block: int = 64) -> str:
    cols = _columns(ids)
    with uproot.recreate(path) as f:
        if ntuple:
            data = ak.Array(cols)
            out = f.mkrntuple("t", data.layout.form)
            for lo in range(0, len(ids), block):
                out.extend(data[lo : lo + block])
        else:
            f.mktree(
                "t",
                {
                    k: v.type if isinstance(v, ak.Array) else np.dtype((v.dtype, v.shape[1:]))
                    for k, v in cols.items()
                },
            )
            for lo in range(0, len(ids), block):
                f["t"].extend({k: v[lo : lo + block] for k, v in cols.items()})
    return str(path)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """{"TTree": [files], "RNTuple": [files]}: the same two files in each format."""
    d = tmp_path_factory.mktemp("rntuple")
    out = {}
    for kind, nt in (("TTree", False), ("RNTuple", True)):
        out[kind] = [
            _write(d / f"a_{kind}.root", np.arange(N), nt),
            _write(d / f"b_{kind}.root", 1000 + np.arange(170), nt, 50),
        ]
    return out


@pytest.fixture(params=["uproot", "compiled"])
def readers(request):
    """(TableIterator-like, BatchIterator-like) under test: uproot's or the C++ readers."""
    if request.param == "uproot":
        return TableIterator, BatchIterator
    pytest.importorskip("ROOT", reason="the C++ readers need ROOT")
    from rootclad.data import CompiledBatchIterator, CompiledTableIterator

    return CompiledTableIterator, CompiledBatchIterator


def _batches(it) -> list[tuple]:
    return [tuple(np.array(a) for a in batch) for batch in it]


def _assert_same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b) and a
    for ba, bb in zip(a, b, strict=True):
        for xa, xb in zip(ba, bb, strict=True):
            assert xa.dtype == xb.dtype
            np.testing.assert_array_equal(xa, xb)


def test_assert_same_fails_on_a_wrong_batch():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    good = [(x, np.zeros(2, np.int32))]
    bad = [(x + np.eye(2, 3, dtype=np.float32), np.zeros(2, np.int32))]
    _assert_same(good, good)
    with pytest.raises(AssertionError):
        _assert_same(good, bad)


def test_rntuple_table_reads_as_the_ttree(pairs, readers):
    kw = dict(
        tree="t",
        features=["id", "pt", "jets", "tracks", "njet"],
        target="label",
        weight="w",
        batch_size=48,
        seed=5,
        split="train",
        validation_fraction=0.25,
    )
    ref = TableIterator(pairs["TTree"], **kw)
    it = readers[0](pairs["RNTuple"], **kw)
    assert it.length == ref.length == 1 + 1 + 3 + 2 + 1
    assert [b.start for b in it.blocks] == [b.start for b in ref.blocks]  # clusters as baskets
    _assert_same(_batches(it), _batches(ref))


@pytest.mark.parametrize("strain", ["strain", "strain_vec"])
def test_rntuple_strain_reads_as_the_ttree(pairs, readers, strain):
    kw = dict(tree="t", strain=strain, batch_size=64, seed=2)
    ref = BatchIterator(pairs["TTree"], **kw)
    it = readers[1](pairs["RNTuple"], **kw)
    assert it.length == ref.length == L
    _assert_same(_batches(it), _batches(ref))


@pytest.mark.parametrize(
    "kwargs, what, branch",
    [
        (dict(features=["id", "nope"], target="label"), "no such branch", "nope"),
        (
            dict(features=["id"], target="jets"),
            "expected one number per entry, found std::array<float,3>",
            "jets",
        ),
        (
            dict(features=["id"], target="label", weight="tracks"),
            "expected one number per entry, found std::vector<double>",
            "tracks",
        ),
    ],
)
def test_rntuple_bad_columns_name_the_file_ntuple_and_field(pairs, readers, kwargs, what, branch):
    path = pairs["RNTuple"][0]
    with pytest.raises(DataError, match=what) as e:
        readers[0](path, tree="t", **kwargs)
    assert (e.value.file, e.value.tree, e.value.branch) == (path, "t", branch)


def test_rntuple_entry_of_the_wrong_length_is_named(tmp_path, readers):
    ids = np.arange(100)
    cols = _columns(ids)
    lengths = np.full(100, L)
    lengths[70] = L - 1  # one vector entry a value short
    cols["strain_vec"] = ak.unflatten(np.zeros(lengths.sum(), np.float32), lengths)
    path = tmp_path / "short.root"
    data = ak.Array(cols)
    with uproot.recreate(path) as f:
        f.mkrntuple("t", data.layout.form).extend(data)
    with pytest.raises(DataError, match=f"strain has {L - 1} elements, expected {L}") as e:
        _batches(readers[1](str(path), tree="t", strain="strain_vec", batch_size=32))
    assert (e.value.file, e.value.tree, e.value.branch, e.value.entry) == (
        str(path),
        "t",
        "strain_vec",
        70,
    )


def test_rntuple_strain_of_the_wrong_kind_is_refused(pairs, readers):
    with pytest.raises(DataError, match="found one number per entry") as e:
        readers[1](pairs["RNTuple"][0], tree="t", strain="pt")
    assert e.value.branch == "pt"
    with pytest.raises(DataError, match="found std::vector<double>"):
        readers[1](pairs["RNTuple"][0], tree="t", strain="tracks")
