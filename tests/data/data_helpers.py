"""Files and comparisons for the data tests; each comparison has a must-fail test.

Rows are written with their own identity in them (``strain[i, :] = i + j / N``), so a
batch can be traced back to the entries it holds without trusting the reader.
"""

from __future__ import annotations

import numpy as np
import pytest

N = 64


def encoded_rows(ids: np.ndarray, n: int = N) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.float64)
    return (ids[:, None] + np.arange(n)[None, :] / n).astype(np.float32)


def decode_rows(x: np.ndarray) -> np.ndarray:
    """Entry ids from rows made by :func:`encoded_rows` (x: (B, 1, n) or (B, n))."""
    x = np.asarray(x).reshape(len(x), -1)
    ids = np.rint(x[:, 0]).astype(np.int64)
    expected = encoded_rows(ids, x.shape[1])
    assert np.array_equal(x, expected), "rows do not hold the values written for their entry"
    return ids


def write_uproot(
    path, ids, labels, *, n: int = N, basket: int = 100, compression=None, strain=None
):
    """A TTree 'events' (strain[n]/F, label/I) written by uproot in baskets of ``basket`` entries."""
    import uproot

    strain = encoded_rows(ids, n) if strain is None else strain
    with uproot.recreate(path, compression=compression) as f:
        t = f.mktree("events", {"strain": np.dtype((np.float32, (n,))), "label": np.int32})
        for lo in range(0, len(ids), basket):
            t.extend(
                {
                    "strain": strain[lo : lo + basket],
                    "label": np.asarray(labels[lo : lo + basket], np.int32),
                }
            )
    return path


def write_root_fixed(path, ids, labels, *, n: int = N):
    """The same layout written by ROOT itself (TTree::Branch with a leaf list)."""
    ROOT = pytest.importorskip("ROOT")
    f = ROOT.TFile(str(path), "RECREATE")
    t = ROOT.TTree("events", "written by ROOT")
    xs = np.zeros(n, dtype=np.float32)
    lab = np.zeros(1, dtype=np.int32)
    t.Branch("strain", xs, f"strain[{n}]/F")
    t.Branch("label", lab, "label/I")
    rows = encoded_rows(ids, n)
    for row, y in zip(rows, labels, strict=True):
        xs[:] = row
        lab[0] = y
        t.Fill()
    t.Write()
    f.Close()
    return path


def collect(iterator):
    """All batches of one epoch: (ids in order, labels, batch sizes)."""
    ids, labels, sizes = [], [], []
    for x, y in iterator:
        assert x.dtype == np.float32 and x.ndim == 3 and x.shape[1] == 1 and x.flags.c_contiguous
        assert len(y) == len(x)
        ids.append(decode_rows(x))
        labels.append(np.asarray(y))
        sizes.append(len(x))
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), []
    return np.concatenate(ids), np.concatenate(labels), sizes


def assert_each_once(ids, expected_ids, what: str = "") -> None:
    """``ids`` is a permutation of ``expected_ids``: nothing lost, nothing repeated."""
    ids, expected = np.sort(np.asarray(ids)), np.sort(np.asarray(expected_ids))
    assert ids.shape == expected.shape, f"{what}: {ids.size} entries, expected {expected.size}"
    assert np.array_equal(ids, expected), f"{what}: entries differ from the expected set"


def assert_same_batches(a, b, what: str = "") -> None:
    """Two iterables of (x, y) yield equal batches, in the same order, and as many."""
    n = 0
    for batch_a, batch_b in zip(a, b, strict=True):
        xa, ya = (np.asarray(v) for v in batch_a)
        xb, yb = (np.asarray(v) for v in batch_b)
        assert xa.shape == xb.shape, f"{what}: batch {n}: shapes {xa.shape} != {xb.shape}"
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb), f"{what}: batch {n} differs"
        n += 1
    assert n > 0, f"{what}: no batches"
