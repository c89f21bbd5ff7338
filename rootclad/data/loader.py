"""Batches of whitened strain and labels from ROOT files, for PyTorch-style loops.

:class:`BatchIterator` reads with uproot (no ROOT needed). It measured faster
than ``ROOT.Experimental.ML.RDataLoader`` on these files (see docs/data.md),
and it needs no JIT warm-up. :class:`rootclad.data.compiled.CompiledBatchIterator`
has the same interface and reads with the C++ reader of
``rootclad/include/rootclad/tree_reader.h``; both follow the plan of
:mod:`rootclad.data.schedule` and so yield identical batches.

Bad input raises :class:`rootclad.data.DataError` naming the file, tree,
branch and entry: a missing file, tree or branch, a branch that is not an
array of float, an array of the wrong length, a non-finite value, a file
that cannot be read to the end. An epoch is never silently short: every
entry of the split is read or an error is raised.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence

import numpy as np

from rootclad.data.columns import open_columns
from rootclad.data.columns import why as _why
from rootclad.data.errors import DataError
from rootclad.data.schedule import (
    Block,
    batch_count,
    epoch_buffers,
    make_blocks,
    shard_sizes,
    split_range,
)

_STRAIN_KINDS = "expected a float[N] array or vector<float> per entry"


class _BatchIteratorBase:
    """Plan and batch assembly shared by the uproot and compiled readers."""

    def __init__(
        self,
        files: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        batch_size: int = 256,
        split: str = "all",
        validation_fraction: float = 0.0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        tree: str = "events",
        strain: str = "strain",
        label: str = "label",
        length: int | None = None,
        block_size: int = 1024,
        buffer_blocks: int = 8,
        check_finite: bool = True,
        as_torch: bool = False,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        if isinstance(files, (str, os.PathLike)):
            files = [files]
        self.files = [os.fspath(f) for f in files]
        if not self.files:
            raise DataError("no input files given")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        split_range(0, validation_fraction, split)  # validates both
        if not 0 <= seed < 2**63:
            raise ValueError("seed must be in [0, 2**63)")
        if not (isinstance(world_size, int) and world_size >= 1):
            raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
        if not (isinstance(rank, int) and 0 <= rank < world_size):
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
        self.rank, self.world_size = rank, world_size
        self.batch_size = int(batch_size)
        self.split = split
        self.validation_fraction = float(validation_fraction)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.tree = tree
        self.strain = strain
        self.label = label
        self.block_size = int(block_size)
        self.buffer_blocks = int(buffer_blocks)
        self.check_finite = bool(check_finite)
        self.as_torch = bool(as_torch)
        self.epoch = int(epoch)
        self.length = length
        offsets, entries = self._open()
        self.file_entries = entries
        ranges = [split_range(n, self.validation_fraction, split) for n in entries]
        self.blocks: list[Block] = make_blocks(offsets, ranges, self.block_size)
        self.entries = sum(b.size for b in self.blocks)  # of the split, all ranks together
        self._plan_share()

    def _plan_share(self) -> None:
        """What this rank yields per epoch (the ranks' shares: rootclad.data.schedule)."""
        if self.world_size == 1:
            drop = self.entries % self.batch_size if self.drop_last else 0
            self.rank_entries = self.entries - drop
        else:
            sizes = shard_sizes(self.entries, self.batch_size, self.world_size, self.drop_last)
            self.rank_entries = sizes[self.rank]

    # -- to implement -------------------------------------------------------
    def _open(self) -> tuple[list[np.ndarray], list[int]]:
        """Open every file; set ``self.length``; return basket offsets and entry counts."""
        raise NotImplementedError

    def _read_block(self, block: Block, x: np.ndarray, y: np.ndarray) -> None:
        """Fill ``x`` (k, N) float32 and ``y`` (k,) int32 with the entries of ``block``."""
        raise NotImplementedError

    # -- public -------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        return batch_count(self.entries, self.batch_size, self.drop_last, self.world_size)

    @property
    def schema(self):
        """The columns a batch's ``x`` is read from, for ``cm.export(stem, schema=...)``."""
        from rootclad.data.schema import Schema

        return Schema([(self.strain, self.length)], target=self.label)

    def unsharded(self):
        """This reader as one process reads it: the batches of the same arguments without
        ``rank`` and ``world_size`` (``Standardize.fit`` fits a sharded reader on it, so that
        the constants do not depend on the number of ranks). It shares this reader's open files:
        iterate it between this one's epochs."""
        if self.world_size == 1:
            return self
        whole = copy.copy(self)
        whole.__dict__.pop("_buffer", None)  # this reader's, not to be written over
        whole.rank, whole.world_size = 0, 1
        whole._plan_share()
        return whole

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration uses (the shuffle depends on it)."""
        self.epoch = int(epoch)

    def _columns(self) -> list[tuple[tuple[int, ...], type]]:
        """Per-entry shape and dtype of each array of a batch, in order (x first)."""
        return [((self.length,), np.float32), ((), np.int32)]

    def _shape_batch(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The batch as yielded: the GW strain as (B, 1, N), one channel."""
        x, *rest = arrays
        return [x.reshape(x.shape[0], 1, x.shape[1]), *rest]

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        """Yield ``(x, y)``: x float32 (B, 1, N) C-contiguous, y int32 (B,).

        Each iteration is one epoch and advances ``epoch`` by one. With ``world_size`` > 1,
        this rank's share of the epoch, in ``len(self)`` batches (the last one may be empty).
        """
        epoch = self.epoch
        self.epoch += 1
        bsz = self.batch_size
        cols = self._columns()
        # the buffers outlive the epoch: a fresh 64 MB each epoch costs page faults
        bufs = getattr(self, "_buffer", None) or [np.empty((0, *s), d) for s, d in cols]
        carry: list[list[np.ndarray]] = [[] for _ in cols]
        carried = 0
        produced = batches = 0
        for blocks, perm in epoch_buffers(
            self.blocks, self.shuffle, self.seed, epoch, self.buffer_blocks,
            self.rank, self.world_size, bsz, self.drop_last,
        ):  # fmt: skip
            m = sum(b.size for b in blocks)
            if bufs[0].shape[0] < m:
                bufs = [np.empty((m, *s), dtype=d) for s, d in cols]
                self._buffer = bufs
            pos = 0
            for b in blocks:
                self._read_block(b, *(buf[pos : pos + b.size] for buf in bufs))
                pos += b.size
            order = perm if perm is not None else np.arange(m)
            pos = 0
            while pos < m:
                take = min(bsz - carried, m - pos)
                idx = order[pos : pos + take]
                for part, buf in zip(carry, bufs, strict=True):
                    part.append(np.take(buf, idx, axis=0))
                carried += take
                pos += take
                if carried == bsz:
                    produced += bsz
                    batches += 1
                    yield self._emit(carry)
                    carry, carried = [[] for _ in cols], 0
        if carried and not self.drop_last:
            produced += carried
            batches += 1
            yield self._emit(carry)
        if produced != self.rank_entries:  # a bug, never bad input: fail loudly
            raise RuntimeError(f"epoch produced {produced} entries, planned {self.rank_entries}")
        yield from self._empty_batches(batches)

    def _empty_batches(self, batches: int):
        """The empty last batch of a rank whose share of the epoch ran out before the others'
        (every rank yields ``len(self)`` batches: a data-parallel step waits for all)."""
        for _ in range(batches, len(self)):
            yield self._emit([[np.empty((0, *s), dtype=d)] for s, d in self._columns()])

    def _emit(self, parts: list[list[np.ndarray]]):
        arrays = [p[0] if len(p) == 1 else np.concatenate(p) for p in parts]
        arrays = self._shape_batch(arrays)
        if self.as_torch:
            import torch

            return tuple(torch.from_numpy(a) for a in arrays)
        return tuple(arrays)

    def read_all(self) -> tuple[np.ndarray, ...]:
        """Every entry of the split in file order: x (E, 1, N), y (E,)."""
        arrays = [np.empty((self.entries, *s), dtype=d) for s, d in self._columns()]
        pos = 0
        for b in self.blocks:
            self._read_block(b, *(a[pos : pos + b.size] for a in arrays))
            pos += b.size
        return tuple(self._shape_batch(arrays))

    def _check_block(
        self, block: Block, x: np.ndarray, y_raw: np.ndarray, branch: str | None = None
    ) -> None:
        """Shared checks of a block that was read: finite strain, integral labels (in
        ``branch``, default the label branch)."""
        path = self.files[block.file]
        label = branch or self.label
        # row sums are finite unless a row holds inf/nan (or overflows, which the
        # exact test below then clears); one pass, no (k, N) boolean temporary
        if self.check_finite and not np.isfinite(x.sum(axis=1)).all() and not np.isfinite(x).all():
            row = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            bad = x[row][~np.isfinite(x[row])][0]
            raise DataError(
                f"non-finite value ({bad}) in the strain",
                file=path, tree=self.tree, branch=self.strain, entry=block.start + row,
            )  # fmt: skip
        if y_raw.dtype.kind == "f":
            wrong = ~np.isfinite(y_raw) | (y_raw != np.round(y_raw))
            if wrong.any():
                row = int(np.flatnonzero(wrong)[0])
                raise DataError(
                    f"label {y_raw[row]} is not an integer",
                    file=path, tree=self.tree, branch=label, entry=block.start + row,
                )  # fmt: skip
        # labels are int32: a wider value must not wrap (2**40 became 0); tree_reader.h says
        # the same words
        if y_raw.dtype.itemsize > 4 or y_raw.dtype.kind in "uf":
            wide = y_raw.astype(np.float64) if y_raw.dtype.kind == "f" else y_raw
            wrong = (wide < -(2**31)) | (wide > 2**31 - 1)
            if wrong.any():
                row = int(np.flatnonzero(wrong)[0])
                raise DataError(
                    f"label {int(y_raw[row])} does not fit a 32-bit integer",
                    file=path, tree=self.tree, branch=label, entry=block.start + row,
                )  # fmt: skip


class BatchIterator(_BatchIteratorBase):
    """Shuffled batches ``(x, y)`` from the TTree or RNTuple ``tree`` of one or more ROOT files,
    via uproot.

    ``x``: float32 (B, 1, N) C-contiguous whitened strain (branch or field ``strain``,
    a fixed ``float[N]`` array (``std::array<float, N>``) or a ``vector<float>``/``RVec<float>``
    whose entries all have N elements); ``y``: int32 (B,) from branch ``label``
    (torch tensors with ``as_torch=True``, sharing the memory).

    ``split``: 'all', 'train' or 'validation' with ``validation_fraction``
    (the last fraction of each file is validation); ``shuffle``/``seed``:
    reproducible per-epoch shuffling (see :mod:`rootclad.data.schedule`);
    ``drop_last``: drop the final short batch. ``block_size`` and
    ``buffer_blocks`` set the shuffle window: about ``block_size *
    buffer_blocks * N * 4`` bytes are held in memory. ``len()`` is the number
    of batches per epoch; each ``iter()`` is one epoch. ``rank``, ``world_size``: data-parallel
    training, each rank reading its own share of every epoch (the same seeded shuffle on all
    ranks; see :mod:`rootclad.data.schedule` and docs/distributed_training.md).
    """

    def _open(self):
        self._trees = []
        self._fixed = []
        offsets, entries = [], []
        for path in self.files:
            tree = open_columns(path, self.tree)
            for name in (self.strain, self.label):
                if name not in tree.keys():
                    raise DataError("no such branch", file=path, tree=self.tree, branch=name)
            fixed, n = self._strain_layout(path, tree)
            if self.length is None:
                self.length = n
            if n is not None and n != self.length:
                raise DataError(
                    f"strain arrays have {n} elements, expected {self.length}",
                    file=path, tree=self.tree, branch=self.strain, entry=0,
                )  # fmt: skip
            label = tree.layout(self.label)
            if label.dtype is None or not label.scalar:
                raise DataError(
                    f"label must be a number per entry, found {label.text}",
                    file=path, tree=self.tree, branch=self.label,
                )  # fmt: skip
            self._trees.append(tree)
            self._fixed.append(fixed)
            offsets.append(tree.offsets(self.strain))
            entries.append(tree.num_entries)
        if self.length is None:  # only variable-length branches: look at the first entry
            for tree, n_e in zip(self._trees, entries, strict=True):
                if n_e:
                    first = tree.array(self.strain, 0, 1, library="np")
                    self.length = len(first[0])
                    break
        if not self.length:
            raise DataError("cannot tell the strain length: every file is empty")
        return offsets, entries

    def _strain_layout(self, path, tree):
        """(fixed, N) for a float[N] branch (an std::array<float, N> field), (False, None) for
        vector<float>-like ones."""
        lay = tree.layout(self.strain)
        if lay.dtype == np.float32 and lay.dims == 1:
            if lay.width is None:
                return False, None
            if not lay.scalar:
                return True, lay.width
        found = "one number per entry" if lay.scalar else lay.text  # tree_reader.h's words
        raise DataError(
            f"{_STRAIN_KINDS}, found {found}",
            file=path, tree=self.tree, branch=self.strain,
        )  # fmt: skip

    def _read_block(self, block: Block, x: np.ndarray, y: np.ndarray) -> None:
        path = self.files[block.file]
        tree = self._trees[block.file]
        n_rows = block.size
        for name in (self.strain, self.label):
            try:
                if name == self.strain:
                    arr = self._read_strain(block, tree)
                else:
                    arr = tree.array(name, block.start, block.stop, library="np")
            except DataError:
                raise
            except Exception as err:
                entry = self._first_bad_basket(tree, name, block)
                raise DataError(
                    f"cannot read the data ({_why(err)}); the file may be truncated or corrupt",
                    file=path, tree=self.tree, branch=name, entry=entry,
                ) from err  # fmt: skip
            if len(arr) != n_rows:
                raise DataError(
                    f"read {len(arr)} entries where {n_rows} were expected (entries "
                    f"{block.start}..{block.stop - 1})",
                    file=path, tree=self.tree, branch=name, entry=block.start + len(arr),
                )  # fmt: skip
            if name == self.strain:
                x[...] = arr
            else:
                y_raw = arr
        self._check_block(block, x, y_raw)
        y[...] = y_raw

    def _read_strain(self, block: Block, tree) -> np.ndarray:
        if self._fixed[block.file]:
            return tree.array(self.strain, block.start, block.stop, library="np")
        import awkward as ak

        arr = tree.array(self.strain, block.start, block.stop, library="ak")
        counts = ak.to_numpy(ak.num(arr))
        wrong = np.flatnonzero(counts != self.length)
        if wrong.size:
            row = int(wrong[0])
            raise DataError(
                f"strain has {counts[row]} elements, expected {self.length}",
                file=self.files[block.file], tree=self.tree, branch=self.strain,
                entry=block.start + row,
            )  # fmt: skip
        return ak.to_numpy(ak.flatten(arr)).reshape(len(counts), self.length)

    @staticmethod
    def _first_bad_basket(tree, name: str, block: Block) -> int:
        """First entry of the first basket (cluster) in ``block`` that cannot be read."""
        offsets = tree.offsets(name)
        for b in range(len(offsets) - 1):
            lo, hi = int(offsets[b]), int(offsets[b + 1])
            if hi <= block.start or lo >= block.stop:
                continue
            try:
                tree.array(name, lo, hi, library="np")
            except Exception:
                return max(int(lo), block.start)
        return block.start
