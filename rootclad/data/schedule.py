"""Which entries go into which batch: split, blocks, shuffling.

The Python iterator and the compiled C++ reader
(``rootclad/include/rootclad/tree_reader.h``) follow this same plan, with the
same random numbers, so for the same files and settings they yield the same
batches (a test checks it).

- **Split**: per file, the last ``round(validation_fraction * entries)``
  entries are the validation set, the rest the training set. Every file
  contributes to both, so signal and background kept in separate files are
  both in each split.
- **Blocks**: each file's range is cut into blocks of whole baskets of the
  strain branch (as many as fit in ``block_size`` entries, at least one), so
  a basket is read and decompressed once per epoch.
- **Shuffling** (per epoch): the blocks of all files are permuted, taken
  ``buffer_blocks`` at a time into a buffer, and the entries in each buffer
  permuted. Batches are consecutive ``batch_size`` entries of that stream
  (a batch may span two buffers); the last, shorter batch is dropped with
  ``drop_last``. Without shuffling, entries come in file order.
- **Ranks** (data-parallel training, ``world_size`` > 1): every rank plans the same blocks
  and the same block order, then reads its own contiguous share of that epoch's stream of
  entries (a block on a boundary is cut there). With E entries, batch B and W ranks,
  ``E = q * W * B + rem``: each rank takes ``q * B`` entries and its part of ``rem`` (split as
  evenly as can be; with ``drop_last`` the ``rem`` entries at the stream's end are dropped), so
  every rank yields the same number of batches, ``q`` (+ 1 when ``rem`` is kept): a rank whose
  part of ``rem`` is empty yields an empty last batch. The ranks' shares are disjoint and
  together the whole epoch. A rank's buffer i is permuted with stream ``1 + i * W + rank``.
  One rank (W = 1) is the single-process plan above, unchanged.
- **Random numbers**: splitmix64. The generator for (seed, epoch, stream)
  starts from ``seed * G + epoch * H + stream`` (mod 2^64); stream 0 permutes
  blocks, stream 1 + i the entries of buffer i. A permutation of n items is
  Fisher-Yates from the last item down, swapping item i with item
  ``next() % (i + 1)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

_M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
EPOCH_MUL = 0xD1B54A32D192ED03
SEED_MUL = 0xBF58476D1CE4E5B9


def stream_key(seed: int, epoch: int, stream: int) -> int:
    """Start state of the splitmix64 generator of (seed, epoch, stream)."""
    return (seed * SEED_MUL + epoch * EPOCH_MUL + stream) & _M64


def splitmix64(key: int, count: int) -> np.ndarray:
    """The first ``count`` outputs of splitmix64 started at state ``key`` (uint64)."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def permutation(n: int, key: int) -> np.ndarray:
    """Fisher-Yates permutation of ``range(n)`` (int64) driven by splitmix64 from ``key``."""
    out = np.arange(n, dtype=np.int64)
    if n < 2:
        return out
    r = splitmix64(key, n - 1)
    i = np.arange(n - 1, 0, -1, dtype=np.uint64)
    js = (r % (i + np.uint64(1))).astype(np.int64).tolist()
    perm = out.tolist()
    for i, j in zip(range(n - 1, 0, -1), js, strict=True):
        perm[i], perm[j] = perm[j], perm[i]
    return np.asarray(perm, dtype=np.int64)


def split_range(entries: int, validation_fraction: float, split: str) -> tuple[int, int]:
    """Entry range ``[lo, hi)`` of ``split`` ('train', 'validation' or 'all') in one file."""
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    n_val = int(np.floor(validation_fraction * entries + 0.5))
    if split == "train":
        return 0, entries - n_val
    if split == "validation":
        return entries - n_val, entries
    if split == "all":
        return 0, entries
    raise ValueError(f"split must be 'train', 'validation' or 'all', got {split!r}")


@dataclasses.dataclass(frozen=True)
class Block:
    file: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def make_blocks(
    basket_offsets: list[np.ndarray], ranges: list[tuple[int, int]], block_size: int
) -> list[Block]:
    """Blocks of whole baskets inside each file's range.

    ``basket_offsets[f]``: first entry of each basket of file f, then its entry
    count. A block takes baskets while it stays within ``block_size`` entries
    (at least one basket); baskets are clipped to the range.
    """
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    blocks = []
    for f, (offsets, (lo, hi)) in enumerate(zip(basket_offsets, ranges, strict=True)):
        start = lo
        cur = lo
        for b in range(len(offsets) - 1):
            b_lo, b_hi = max(int(offsets[b]), lo), min(int(offsets[b + 1]), hi)
            if b_hi <= b_lo:
                continue
            if cur > start and (b_hi - start) > block_size:
                blocks.append(Block(f, start, cur))
                start = b_lo
            cur = b_hi
        if cur > start:
            blocks.append(Block(f, start, cur))
    return blocks


def shard_sizes(entries: int, batch_size: int, world_size: int, drop_last: bool) -> list[int]:
    """The entries each of ``world_size`` ranks reads per epoch (see the module's text)."""
    q, rem = divmod(entries, world_size * batch_size)
    if drop_last:
        rem = 0
    return [q * batch_size + rem // world_size + (r < rem % world_size) for r in range(world_size)]


def shard_blocks(blocks: list[Block], lo: int, hi: int) -> list[Block]:
    """The pieces of ``blocks`` (in read order) that hold entries [lo, hi) of their stream."""
    out, pos = [], 0
    for b in blocks:
        a, z = max(lo, pos), min(hi, pos + b.size)
        if a < z:
            out.append(Block(b.file, b.start + a - pos, b.start + z - pos))
        pos += b.size
    return out


def epoch_buffers(
    blocks: list[Block], shuffle: bool, seed: int, epoch: int, buffer_blocks: int,
    rank: int = 0, world_size: int = 1, batch_size: int = 1, drop_last: bool = False,
) -> list[tuple[list[Block], np.ndarray | None]]:  # fmt: skip
    """The buffers of one epoch (of rank ``rank`` of ``world_size``): (blocks in read order,
    permutation of their entries or None)."""
    if buffer_blocks < 1:
        raise ValueError("buffer_blocks must be at least 1")
    order = permutation(len(blocks), stream_key(seed, epoch, 0)) if shuffle else range(len(blocks))
    ordered = [blocks[j] for j in order]
    if world_size > 1:
        sizes = shard_sizes(sum(b.size for b in blocks), batch_size, world_size, drop_last)
        lo = sum(sizes[:rank])
        ordered = shard_blocks(ordered, lo, lo + sizes[rank])
    out = []
    for i, lo in enumerate(range(0, len(ordered), buffer_blocks)):
        chosen = ordered[lo : lo + buffer_blocks]
        if not shuffle:
            out.append((chosen, None))
            continue
        n = sum(b.size for b in chosen)
        out.append((chosen, permutation(n, stream_key(seed, epoch, 1 + i * world_size + rank))))
    return out


def batch_count(entries: int, batch_size: int, drop_last: bool, world_size: int = 1) -> int:
    """Batches per epoch (per rank) for ``entries`` entries."""
    if world_size == 1:
        return entries // batch_size if drop_last else -(-entries // batch_size)
    q, rem = divmod(entries, world_size * batch_size)
    return q + (rem > 0 and not drop_last)
