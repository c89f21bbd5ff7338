"""Bad input: a DataError naming file, tree, branch and entry; never a crash or a short epoch."""

import numpy as np
import pytest
import uproot
from fixtures.data import N, encoded_rows, write_uproot

from rootclad.data import DataError


def _epoch(reader, path, **kw):
    """Consume a whole epoch (so an error anywhere in the file must surface)."""
    it = reader(path, batch_size=100, **kw)
    return sum(len(y) for _, y in it)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    ids = np.arange(1000)
    return write_uproot(tmp_path_factory.mktemp("good") / "good.root", ids, ids % 2, basket=100)


def test_missing_file(reader, tmp_path):
    path = str(tmp_path / "nope.root")
    with pytest.raises(DataError, match="file not found") as e:
        reader(path)
    assert e.value.file == path


def test_not_a_root_file(reader, tmp_path):
    path = tmp_path / "text.root"
    path.write_text("hello, this is not ROOT\n" * 100)
    with pytest.raises(DataError) as e:
        reader(str(path))
    assert e.value.file == str(path)


def test_no_input_files(reader):
    with pytest.raises(DataError, match="no input files"):
        reader([])


def test_missing_tree(reader, good):
    with pytest.raises(DataError, match="no such tree") as e:
        reader(str(good), tree="Events")
    assert (e.value.file, e.value.tree) == (str(good), "Events")


def test_a_histogram_is_neither_a_ttree_nor_an_rntuple(reader, tmp_path):
    path = tmp_path / "histogram.root"
    with uproot.recreate(path) as f:
        f["events"] = np.histogram(np.zeros(5), bins=3)
    with pytest.raises(DataError, match="TH1D, not a TTree or an RNTuple") as e:
        reader(str(path))
    assert (e.value.file, e.value.tree) == (str(path), "events")


@pytest.mark.parametrize("which", ["strain", "label"])
def test_missing_branch(reader, good, which):
    kw = {which: "nothing_here"}
    with pytest.raises(DataError, match="no such branch") as e:
        reader(str(good), **kw)
    assert (e.value.tree, e.value.branch) == ("events", "nothing_here")


def test_strain_of_the_wrong_type(reader, tmp_path):
    path = tmp_path / "double.root"
    with uproot.recreate(path) as f:
        f.mktree("events", {"strain": np.dtype((np.float64, (N,))), "label": np.int32}).extend(
            {"strain": np.zeros((10, N)), "label": np.zeros(10, np.int32)}
        )
    with pytest.raises(DataError, match="expected a float") as e:
        reader(str(path))
    assert e.value.branch == "strain"


def test_files_with_different_array_lengths(reader, tmp_path, good):
    short = write_uproot(tmp_path / "short.root", np.arange(50), np.zeros(50), n=N // 2)
    with pytest.raises(DataError, match=f"{N // 2} elements, expected {N}") as e:
        reader([str(good), str(short)])
    assert (e.value.file, e.value.branch, e.value.entry) == (str(short), "strain", 0)
    with pytest.raises(DataError, match="expected 2048"):
        reader(str(good), length=2048)


def test_variable_length_entry_of_the_wrong_length(reader, tmp_path):
    import awkward as ak

    rows = [list(r) for r in encoded_rows(np.arange(30))]
    rows[17] = rows[17][:-3]
    path = tmp_path / "jagged.root"
    with uproot.recreate(path) as f:  # strain[nstrain]/F, a leaf with a counter
        f.mktree("events", {"strain": "var * float32", "label": np.int32}).extend(
            {"strain": ak.Array(rows), "label": np.zeros(30, np.int32)}
        )
    it = reader(str(path), batch_size=8, shuffle=False)
    with pytest.raises(DataError, match=f"{N - 3} elements, expected {N}") as e:
        list(it)
    assert (e.value.file, e.value.branch, e.value.entry) == (str(path), "strain", 17)


@pytest.mark.parametrize("bad,entry", [(np.nan, 13), (np.inf, 457), (-np.inf, 999)])
def test_non_finite_values(reader, tmp_path, bad, entry):
    ids = np.arange(1000)
    strain = encoded_rows(ids)
    strain[entry, 5] = bad
    path = write_uproot(tmp_path / "nan.root", ids, ids % 2, strain=strain)
    with pytest.raises(DataError, match="non-finite") as e:
        _epoch(reader, str(path))
    assert (e.value.file, e.value.tree, e.value.branch, e.value.entry) == (
        str(path),
        "events",
        "strain",
        entry,
    )
    assert _epoch(reader, str(path), check_finite=False) == 1000


def test_non_integer_label(reader, tmp_path):
    path = tmp_path / "label.root"
    with uproot.recreate(path) as f:
        labels = np.zeros(20, np.float32)
        labels[11] = 0.5
        f.mktree("events", {"strain": np.dtype((np.float32, (N,))), "label": np.float32}).extend(
            {"strain": encoded_rows(np.arange(20)), "label": labels}
        )
    with pytest.raises(DataError, match="not an integer") as e:
        _epoch(reader, str(path))
    assert (e.value.branch, e.value.entry) == ("label", 11)


# Both readers refuse these with the same words (the C++ reader used to turn 2**40 into
# INT_MIN and the Python one into 0, and the C++ one read a scalar as a strain of length 1).
MESSAGES = {}


@pytest.mark.parametrize(
    "dtype, value",
    [(np.int64, 2**40), (np.int64, -(2**31) - 1), (np.uint32, 2**31), (np.float64, 1e10)],
)
def test_label_that_does_not_fit_int32_is_refused(reader, tmp_path, dtype, value):
    path = tmp_path / "wide.root"
    labels = np.zeros(20, dtype)
    labels[7] = value
    with uproot.recreate(path) as f:
        f.mktree("events", {"strain": np.dtype((np.float32, (N,))), "label": dtype}).extend(
            {"strain": encoded_rows(np.arange(20)), "label": labels}
        )
    with pytest.raises(DataError) as e:
        _epoch(reader, str(path))
    assert (e.value.branch, e.value.entry) == ("label", 7)
    assert e.value.what == f"label {int(value)} does not fit a 32-bit integer"
    assert MESSAGES.setdefault(("label", dtype, value), e.value.what) == e.value.what


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_a_scalar_branch_is_no_strain(reader, tmp_path, dtype):
    path = tmp_path / "scalar.root"
    with uproot.recreate(path) as f:
        f.mktree("events", {"strain": dtype, "label": np.int32}).extend(
            {"strain": np.arange(20).astype(dtype), "label": np.zeros(20, np.int32)}
        )
    with pytest.raises(DataError) as e:
        reader(str(path))
    assert e.value.branch == "strain"
    assert e.value.what.endswith("found one number per entry"), e.value.what
    assert MESSAGES.setdefault(("scalar", dtype), e.value.what) == e.value.what


def test_labels_at_the_int32_limits_are_read(reader, tmp_path):
    path = tmp_path / "limits.root"
    labels = np.zeros(20, np.int64)
    labels[[3, 4]] = [2**31 - 1, -(2**31)]
    with uproot.recreate(path) as f:
        f.mktree("events", {"strain": np.dtype((np.float32, (N,))), "label": np.int64}).extend(
            {"strain": encoded_rows(np.arange(20)), "label": labels}
        )
    _, y = reader(str(path), shuffle=False).read_all()
    assert y.tolist() == labels.tolist()


@pytest.mark.parametrize("fraction", [0.3, 0.95, 0.999])
def test_truncated_file(reader, tmp_path, good, fraction):
    data = good.read_bytes()
    path = tmp_path / "truncated.root"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(DataError) as e:
        _epoch(reader, str(path))  # either at open or while reading, never a short epoch
    assert e.value.file == str(path)


def test_corrupt_basket(reader, tmp_path):
    ids = np.arange(1000)
    strain = np.zeros((1000, N), np.float32)
    strain[:, 0] = ids  # compressible, so LZ4 really compresses (and checksums) it
    path = write_uproot(
        tmp_path / "lz4.root", ids, ids % 2, strain=strain, compression=uproot.LZ4(1)
    )
    with uproot.open(path) as f:
        seek = int(f["events"]["strain"].member("fBasketSeek")[3])  # entries 300..399
    data = bytearray(path.read_bytes())
    for k in range(30):
        data[seek + 90 + k] ^= 0x5A
    bad = tmp_path / "corrupt.root"
    bad.write_bytes(bytes(data))
    with pytest.raises(DataError, match="corrupt") as e:
        _epoch(reader, str(bad))
    assert (e.value.file, e.value.branch, e.value.entry) == (str(bad), "strain", 300)
