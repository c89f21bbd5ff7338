"""The batch plan: permutations, split, blocks (shared by the Python and C++ readers)."""

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from rootclad.data.schedule import (
    batch_count,
    epoch_buffers,
    make_blocks,
    permutation,
    split_range,
    stream_key,
)


def test_permutation_is_uniform_over_all_orders():
    counts = {p: 0 for p in itertools.permutations(range(4))}
    for key in range(24000):
        counts[tuple(permutation(4, stream_key(key, 0, 0)))] += 1
    assert all(v > 0 for v in counts.values())
    assert chisquare(list(counts.values())).pvalue > 1e-4


def test_permutation_is_a_permutation_and_depends_on_the_key():
    p = permutation(1000, 5)
    assert sorted(p) == list(range(1000))
    assert not np.array_equal(p, permutation(1000, 6))
    assert np.array_equal(p, permutation(1000, 5))
    assert list(permutation(1, 5)) == [0] and len(permutation(0, 5)) == 0


def test_split_takes_the_tail_of_each_file():
    assert split_range(100, 0.2, "train") == (0, 80)
    assert split_range(100, 0.2, "validation") == (80, 100)
    assert split_range(100, 0.0, "validation") == (100, 100)
    assert split_range(7, 0.5, "train") == (0, 3)  # round half up: 3.5 -> 4 validation
    with pytest.raises(ValueError):
        split_range(10, 1.0, "train")
    with pytest.raises(ValueError):
        split_range(10, 0.1, "test")


def test_blocks_are_whole_baskets_and_cover_the_range():
    offsets = [np.array([0, 100, 200, 300, 350, 1000]), np.array([0, 7, 14, 21, 28])]
    ranges = [(50, 1000), (0, 28)]
    blocks = make_blocks(offsets, ranges, block_size=150)
    got = {0: [], 1: []}
    for b in blocks:
        got[b.file].extend(range(b.start, b.stop))
        inner = offsets[b.file]
        # starts and stops on basket boundaries (or the range ends)
        assert b.start in set(inner) | {ranges[b.file][0]}
        assert b.stop in set(inner) | {ranges[b.file][1]}
        assert b.size <= 150 or np.sum((inner > b.start) & (inner < b.stop)) == 0
    assert got[0] == list(range(50, 1000)) and got[1] == list(range(28))


def test_epoch_buffers_cover_every_block_once_and_change_with_the_epoch():
    offsets = [np.arange(0, 1001, 50)]
    blocks = make_blocks(offsets, [(0, 1000)], 100)
    e0 = epoch_buffers(blocks, True, 3, 0, 3)
    e1 = epoch_buffers(blocks, True, 3, 1, 3)
    for plan in (e0, e1):
        seen = [b for bl, _ in plan for b in bl]
        assert sorted(seen, key=lambda b: b.start) == blocks
        for bl, perm in plan:
            assert sorted(perm) == list(range(sum(b.size for b in bl)))
    assert [b for bl, _ in e0 for b in bl] != [b for bl, _ in e1 for b in bl]
    assert [b for bl, _ in epoch_buffers(blocks, False, 3, 0, 3) for b in bl] == blocks


def test_batch_count():
    assert batch_count(10, 4, False) == 3 and batch_count(10, 4, True) == 2
    assert batch_count(8, 4, True) == batch_count(8, 4, False) == 2
