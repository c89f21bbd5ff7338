"""Readers sharded over data-parallel ranks (``rank``, ``world_size``): one epoch's shares are
disjoint and together the single-process epoch's entries, every rank yields the same number of
batches, the shuffle is seeded and the same for the Python and the C++ reader.

Each entry carries its id in a column, so the entries a rank read are known exactly; the
reference is the set of ids written and the single-process reader's epoch.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import uproot

from rootclad.data import TableIterator
from rootclad.data.schedule import shard_sizes


def _write(path, ids, basket=37):
    with uproot.recreate(path) as f:
        f.mktree("t", {"id": np.float32, "y": np.int32, "w": np.float32})
        for lo in range(0, len(ids), basket):
            part = ids[lo : lo + basket]
            f["t"].extend({"id": part.astype(np.float32), "y": (part % 2).astype(np.int32),
                           "w": (1 + part % 3).astype(np.float32)})  # fmt: skip
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    return [_write(d / "a.root", np.arange(0, 250)), _write(d / "b.root", np.arange(250, 403))]


def _classes():
    out = [TableIterator]
    if importlib.util.find_spec("ROOT") is not None:
        from rootclad.data.compiled import CompiledTableIterator

        out.append(CompiledTableIterator)
    return out


def _epoch(cls, files, **kw):
    it = cls(files, tree="t", features=["id"], target="y", weight="w", block_size=50,
             buffer_blocks=3, seed=11, **kw)  # fmt: skip
    it.set_epoch(2)
    return it, [b[0][:, 0].astype(np.int64) for b in it]


@pytest.mark.parametrize("world_size", [2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [16, 100])
def test_shards_are_disjoint_and_cover_the_epoch(files, world_size, drop_last, batch_size):
    for cls in _classes():
        # the single-process epoch, every entry of the split (drop_last drops other entries
        # there: its own last batch's)
        _, single = _epoch(cls, files, batch_size=batch_size, split="train",
                           validation_fraction=0.1)  # fmt: skip
        everything = np.concatenate(single)
        seen, lengths = [], set()
        for r in range(world_size):
            it, batches = _epoch(cls, files, batch_size=batch_size, drop_last=drop_last,
                                 split="train", validation_fraction=0.1, rank=r,
                                 world_size=world_size)  # fmt: skip
            assert len(batches) == len(it)
            lengths.add(len(batches))
            assert all(len(b) <= batch_size for b in batches)
            assert all(len(b) == batch_size for b in batches[:-1])
            seen.append(np.concatenate([np.empty(0, np.int64), *batches]))
        assert len(lengths) == 1, f"{cls.__name__}: ranks yield different numbers of batches"
        union = np.concatenate(seen)
        assert len(np.unique(union)) == len(union), "an entry was read by two ranks"
        if drop_last:  # the global batch is world_size * batch_size: the rest is dropped
            kept = len(everything) - len(everything) % (world_size * batch_size)
            assert len(union) == kept
            assert set(union) <= set(everything)
        else:
            assert sorted(union) == sorted(everything), "the shares miss entries of the epoch"


def test_shares_are_seeded_and_the_same_in_python_and_cpp(files):
    classes = _classes()
    kw = dict(batch_size=16, rank=1, world_size=3)
    a = _epoch(classes[0], files, **kw)[1]
    assert all(np.array_equal(x, y) for x, y in zip(a, _epoch(classes[0], files, **kw)[1],
                                                    strict=True))  # fmt: skip
    other_epoch = classes[0](files, tree="t", features=["id"], target="y", block_size=50,
                             buffer_blocks=3, seed=11, **kw)  # fmt: skip
    other_epoch.set_epoch(3)
    assert not np.array_equal(np.concatenate(a), next(iter(other_epoch))[0][:, 0])
    if len(classes) == 1:
        pytest.skip("the compiled reader needs ROOT")
    b = _epoch(classes[1], files, **kw)[1]
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_an_empty_last_batch_when_the_rest_is_smaller_than_the_ranks(files):
    # 403 entries, batch 100, 4 ranks: one full round of 400, then 3 entries for 4 ranks
    assert shard_sizes(403, 100, 4, False) == [101, 101, 101, 100]
    it, batches = _epoch(TableIterator, files, batch_size=100, rank=3, world_size=4)
    assert [len(b) for b in batches] == [100, 0] and len(it) == 2


@pytest.mark.parametrize("rank, world_size", [(2, 2), (-1, 2), (0, 0)])
def test_bad_rank(files, rank, world_size):
    with pytest.raises(ValueError, match="rank|world_size"):
        TableIterator(files, tree="t", features=["id"], target="y", rank=rank,
                      world_size=world_size)  # fmt: skip


def test_standardize_on_a_shard_fits_the_whole_split(files):
    """Standardize.fit on rank r's reader gives the constants of the same reader without rank
    and world_size, bit for bit: the preprocessing does not depend on the number of ranks. A
    rank's own share has other statistics (the comparison can fail); the reader still yields
    its share afterwards, at the epoch it was at."""
    import torch

    from rootclad.data import Standardize

    kw = dict(
        tree="t",
        features=["id", "w"],
        target="y",
        batch_size=16,
        split="train",
        validation_fraction=0.2,
        drop_last=True,
        block_size=50,
        buffer_blocks=3,
        seed=11,
        epoch=2,
    )
    for cls in _classes():
        whole = Standardize.fit(cls(files, **kw), dtype=torch.float64)
        for rank in range(3):
            it = cls(files, rank=rank, world_size=3, **kw)
            share = np.concatenate([b[0] for b in it]).astype(np.float64)
            assert not np.allclose(share.mean(0), whole.mean.numpy(), rtol=1e-6, atol=0)
            it.set_epoch(2)
            s = Standardize.fit(it, dtype=torch.float64)
            assert torch.equal(s.mean, whole.mean) and torch.equal(s.std, whole.std), cls
            assert it.epoch == 2
            again = np.concatenate([b[0] for b in it]).astype(np.float64)
            np.testing.assert_array_equal(again, share)


def test_standardize_refuses_a_distributed_sampler():
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from rootclad.data import Standardize

    data = TensorDataset(torch.arange(40.0).reshape(20, 2))
    sharded = DataLoader(
        data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2, rank=1)
    )
    with pytest.raises(ValueError, match=r"rank 1 of 2.*whole"):
        Standardize.fit(sharded)
    whole = Standardize.fit(DataLoader(data, batch_size=4), dtype=torch.float64)
    assert float(whole.mean[0]) == 19.0
