"""Batches, epochs, shuffling, split and multiple files, for both readers."""

import numpy as np
import pytest
from fixtures.data import N, assert_each_once, collect, write_uproot

ENTRIES = 1000


@pytest.fixture(scope="module")
def one_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "one.root"
    ids = np.arange(ENTRIES)
    return write_uproot(path, ids, ids % 2, basket=90)


@pytest.fixture(scope="module")
def two_files(tmp_path_factory):
    """Signal (label 1, ids 0..599) and background (label 0, ids 10000..10799) apart."""
    d = tmp_path_factory.mktemp("data2")
    sig = write_uproot(d / "signal.root", np.arange(600), np.ones(600), basket=64)
    bkg = write_uproot(d / "background.root", 10000 + np.arange(800), np.zeros(800), basket=50)
    return sig, bkg


def test_an_epoch_holds_every_entry_once(reader, one_file):
    it = reader(one_file, batch_size=64, seed=1, block_size=200, buffer_blocks=2)
    ids, labels, sizes = collect(it)
    assert_each_once(ids, np.arange(ENTRIES))
    assert np.array_equal(labels, ids % 2)
    assert sizes == [64] * 15 + [40] and len(it) == 16
    assert not np.array_equal(ids, np.arange(ENTRIES))  # shuffled


def test_shuffle_is_seeded_and_changes_each_epoch(reader, one_file):
    a = reader(one_file, batch_size=100, seed=7)
    b = reader(one_file, batch_size=100, seed=7)
    c = reader(one_file, batch_size=100, seed=8)
    e0, e1 = collect(a)[0], collect(a)[0]
    assert np.array_equal(e0, collect(b)[0])
    assert not np.array_equal(e0, e1)
    assert not np.array_equal(e0, collect(c)[0])
    b.set_epoch(1)
    assert np.array_equal(e1, collect(b)[0])


def test_without_shuffle_entries_come_in_file_order(reader, one_file):
    ids, _, _ = collect(reader(one_file, batch_size=128, shuffle=False))
    assert np.array_equal(ids, np.arange(ENTRIES))


def test_drop_last(reader, one_file):
    it = reader(one_file, batch_size=300, drop_last=True, seed=2)
    ids, _, sizes = collect(it)
    assert sizes == [300, 300, 300] and len(it) == 3
    assert len(np.unique(ids)) == 900


def test_train_and_validation_split_every_file(reader, two_files):
    kw = dict(batch_size=50, validation_fraction=0.25, seed=3)
    train = collect(reader(two_files, split="train", **kw))
    val = collect(reader(two_files, split="validation", **kw))
    everything = np.r_[np.arange(600), 10000 + np.arange(800)]
    assert_each_once(np.r_[train[0], val[0]], everything)
    # the last quarter of each file is validation: both classes in both splits
    assert_each_once(val[0], np.r_[np.arange(450, 600), 10000 + np.arange(600, 800)])
    for ids, labels, _ in (train, val):
        assert set(labels) == {0, 1}
        assert np.array_equal(labels, (ids < 10000).astype(int))


def test_signal_and_background_files_are_mixed_in_batches(reader, two_files):
    it = reader(list(two_files), batch_size=64, seed=4, block_size=128, buffer_blocks=4)
    mixed = [len(set(np.asarray(y).tolist())) == 2 for _, y in it]
    assert np.mean(mixed) > 0.8, f"only {np.mean(mixed):.0%} of the batches hold both classes"
    ids, _, _ = collect(it)
    assert_each_once(ids, np.r_[np.arange(600), 10000 + np.arange(800)])


def test_batches_as_torch_tensors(reader, one_file):
    torch = pytest.importorskip("torch")
    x, y = next(iter(reader(one_file, batch_size=32, as_torch=True)))
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.shape == (32, 1, N)
    assert x.is_contiguous() and y.dtype == torch.int32


def test_read_all_in_file_order(reader, two_files):
    x, y = reader(list(two_files), split="validation", validation_fraction=0.1).read_all()
    assert x.shape == (140, 1, N)
    ids = np.rint(x[:, 0, 0]).astype(int)
    assert np.array_equal(ids, np.r_[np.arange(540, 600), 10000 + np.arange(720, 800)])


def test_compressed_files(reader, tmp_path):
    import uproot

    ids = np.arange(300)
    for comp in (uproot.LZ4(1), uproot.ZLIB(1)):
        path = write_uproot(
            tmp_path / f"{comp.__class__.__name__}.root", ids, ids % 2, compression=comp
        )
        got, labels, _ = collect(reader(path, batch_size=64, seed=1))
        assert_each_once(got, ids)
