"""The compiled C++ readers (``rootclad/include/rootclad/tree_reader.h``) behind the iterator interface.

:class:`CompiledBatchIterator` takes the same arguments and yields the same
batches as :class:`rootclad.data.BatchIterator`, and :class:`CompiledTableIterator`
those of :class:`rootclad.data.TableIterator`; the reading, checking,
shuffling and batch assembly all run in C++ (``rootclad::data::BatchReader``, ``TableReader``),
declared to Cling once per process. The GIL is released while C++ fills a
batch. C++ training loops and ``root.exe`` macros use the header directly
(see ``macros/read_gw_batches.C``).

Cling compiles the header at -O1. That is enough here: the loop spends its
time in ROOT's own (compiled) basket reading and in ``memcpy``; see
docs/data.md for the numbers.
"""

from __future__ import annotations

import numpy as np

from rootclad.data.cling import CLING_LOCK, declare_header, import_root
from rootclad.data.errors import DataError
from rootclad.data.loader import _BatchIteratorBase
from rootclad.data.table import TableIterator


def _cxx_error(err: Exception) -> DataError:
    text = str(err)
    for marker in ("runtime_error: ", "invalid_argument: ", "out_of_range: "):
        if marker in text:
            return DataError.from_message(text.split(marker, 1)[1].strip())
    return DataError(text.strip())


_CLASS = None


def reader_class():
    """``ROOT.rootclad.data.BatchReader``, declared and bound once per process.

    All of it under the Cling lock: two threads that made their first reader at once raced in
    PyROOT's lazy lookups (one got an extra batch of memory that was never read, or
    ``ROOT.std`` missing). ROOT's own thread safety is switched on, since readers in several
    threads read files at the same time."""
    global _CLASS
    with CLING_LOCK:
        if _CLASS is None:
            root = import_root()
            root.EnableThreadSafety()
            declare_header("tree_reader.h")
            cls = root.rootclad.data.BatchReader
            # every binding the iterator uses, resolved now rather than at a first call
            root.std.vector["std::string"]
            for c in (cls, root.rootclad.data.TableReader):
                c.next_batch.__release_gil__ = True
                c.read_range.__release_gil__ = True
            _CLASS = cls
    return _CLASS


def _strings(values):
    vec = import_root().std.vector["std::string"]()
    for v in values:
        vec.push_back(v)
    return vec


class _CompiledReading:
    """Epochs and blocks read by a C++ reader (``self._reader``, a ``RowBatcher``) whose plan
    must equal :mod:`rootclad.data.schedule`'s; the batch's arrays are ``self._columns()``."""

    def _configure(self) -> None:
        try:
            self._reader.configure(
                self.batch_size, self.split, self.validation_fraction, self.shuffle, self.seed,
                self.drop_last, self.block_size, self.buffer_blocks, self.check_finite,
                self.rank, self.world_size,
            )  # fmt: skip
        except Exception as err:
            raise _cxx_error(err) from None
        plan = np.asarray(list(self._reader.plan()), dtype=np.int64).reshape(-1, 3)
        mine = np.array([(b.file, b.start, b.stop) for b in self.blocks], dtype=np.int64)
        if not np.array_equal(plan, mine.reshape(-1, 3)):  # a bug, never bad input
            raise RuntimeError(
                "the C++ reader planned different blocks than rootclad.data.schedule"
            )

    def _reader_files(self):
        r = self._reader
        entries = [int(r.file_entries(f)) for f in range(r.files())]
        offsets = [np.asarray(list(r.basket_offsets(f)), dtype=np.int64) for f in range(r.files())]
        return offsets, entries

    def __iter__(self):
        epoch = self.epoch
        self.epoch += 1
        self._configure()
        r = self._reader
        r.start_epoch(epoch)
        bsz = self.batch_size
        cols = self._columns()
        left = self.rank_entries
        # the reader fills at most the split's entries (a batch of 10**12 asked for 58 TiB up
        # front); with drop_last it fills a short last batch before dropping it
        rows = max(1, min(bsz, self.entries))
        batches = 0
        while True:
            arrays = [np.empty((rows, *shape), dtype=dtype) for shape, dtype in cols]
            try:
                k = int(r.next_batch(*arrays))
            except Exception as err:
                raise _cxx_error(err) from None
            if not 0 <= k <= min(bsz, left) or (k == 0 and left):  # a bug, never bad input
                raise RuntimeError(
                    f"the C++ reader reported a batch of {k} with {left} entries of the epoch "
                    "left; no rows it did not read are handed out"
                )
            left -= k
            if k == 0:
                yield from self._empty_batches(batches)
                return
            batches += 1
            yield self._emit([[a[:k] if k < rows else a] for a in arrays])

    def _read_block(self, block, *arrays):
        try:
            self._reader.read_range(block.file, block.start, block.stop, *arrays)
        except Exception as err:
            raise _cxx_error(err) from None


class CompiledBatchIterator(_CompiledReading, _BatchIteratorBase):
    """Like :class:`rootclad.data.BatchIterator`, read by the C++ ``BatchReader``. Needs ROOT."""

    def _open(self):
        cls = reader_class()
        with CLING_LOCK:  # the first construction and calls instantiate wrappers in Cling
            try:
                self._reader = cls(_strings(self.files), self.tree, self.strain, self.label,
                                   -1 if self.length is None else int(self.length))  # fmt: skip
            except Exception as err:
                raise _cxx_error(err) from None
        if self.length is None:
            self.length = int(self._reader.length())
        return self._reader_files()


class CompiledTableIterator(_CompiledReading, TableIterator):
    """Like :class:`rootclad.data.TableIterator`, read by the C++ ``TableReader``. Needs ROOT."""

    def _open(self):
        reader_class()  # declares the header, once
        cls = import_root().rootclad.data.TableReader
        with CLING_LOCK:
            try:
                self._reader = cls(_strings(self.files), self.tree, _strings(self.features),
                                   self.target, self.weight or "")  # fmt: skip
            except Exception as err:
                raise _cxx_error(err) from None
        r = self._reader
        self._widths = [int(v) for v in r.widths()]
        self._target_dtype = np.int32 if r.integral_target() else np.float32
        self.length = int(r.length())
        self._starts = np.cumsum([0, *self._widths])
        return self._reader_files()
