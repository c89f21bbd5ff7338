"""Uncompressed ROOT baskets carry no checksum: a flipped byte reads back as another number.
``rootclad.gw.simulate`` and ``gw run`` write LZ4 by default, whose blocks carry one, so a
corrupted label is refused by uproot and by the C++ reader that training uses. Whitened strain
does not compress and is stored as it is under LZ4; ZLIB (Adler-32) protects it too."""

from __future__ import annotations

import numpy as np
import pytest
import uproot

from rootclad.data import BatchIterator
from rootclad.data.errors import DataError
from rootclad.gw.dataset import simulate
from rootclad.gw.run.config import ConfigError, resolve


def _flip(path, branch, tmp_path):
    """A copy of ``path`` with one bit flipped in the first basket of ``branch``."""
    with uproot.open(path) as f:
        b = f["events"][branch]
        seek, size = int(b.member("fBasketSeek")[0]), int(b.member("fBasketBytes")[0])
    data = bytearray(path.read_bytes())
    data[seek + size - 50] ^= 0x10  # in the basket's data, past its key
    bad = tmp_path / f"bad-{branch}-{path.name}"
    bad.write_bytes(data)
    return bad


def _readers():
    yield BatchIterator
    try:
        from rootclad.data.cling import import_root

        import_root()
    except ImportError:
        return
    from rootclad.data.compiled import CompiledBatchIterator

    yield CompiledBatchIterator


@pytest.fixture(scope="module")
def default_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gwcomp") / "default.root"
    simulate(path, 300, seed=5, workers=1, progress=False)
    return path


def test_simulate_writes_lz4_by_default(default_file):
    with uproot.open(default_file) as f:
        assert isinstance(f.file.compression, uproot.LZ4)
        assert f["events"]["label"].compressed_bytes < f["events"]["label"].uncompressed_bytes


@pytest.mark.parametrize("reader", list(_readers()), ids=lambda c: c.__name__)
def test_a_flipped_byte_in_a_default_file_is_refused_not_read(default_file, tmp_path, reader):
    bad = _flip(default_file, "label", tmp_path)
    with pytest.raises((DataError, ValueError), match=r"checksum|label|corrupt"):
        for _ in reader([str(bad)], batch_size=64, shuffle=False):
            pass


@pytest.mark.parametrize("reader", list(_readers()), ids=lambda c: c.__name__)
def test_zlib_protects_the_strain_too(tmp_path, reader):
    path = tmp_path / "zlib.root"
    simulate(path, 200, seed=5, compression="zlib", workers=1, progress=False)
    bad = _flip(path, "strain", tmp_path)
    with pytest.raises((DataError, ValueError), match=r"incorrect data check|strain|corrupt"):
        for _ in reader([str(bad)], batch_size=64, shuffle=False):
            pass


def test_the_run_config_chooses_the_compression(tmp_path):
    assert resolve().compression == "lz4"
    assert resolve(compression="none").simulation("train")["compression"] == "none"
    with pytest.raises(ConfigError, match="compression must be one of"):
        resolve(compression="gzip")


def test_uncompressed_strain_flips_go_unseen(tmp_path):
    """What the docs say is not detected: a flip in uncompressed data reads back changed."""
    path = tmp_path / "none.root"
    simulate(path, 200, seed=5, compression="none", workers=1, progress=False)
    bad = _flip(path, "strain", tmp_path)
    with uproot.open(path) as f, uproot.open(bad) as g:
        a, b = f["events"]["strain"].array(library="np"), g["events"]["strain"].array(library="np")
    assert not np.array_equal(a, b)


def test_data_written_with_another_compression_is_simulated_again(tmp_path):
    """`--compression zlib` reused the lz4 files of an earlier run: their strain stayed
    unprotected although the run asked for checksums over it."""
    from rootclad.gw.dataset import file_compression
    from rootclad.gw.run.pipeline import simulate_all

    small = dict(train_events=40, val_events=20, test_events=200, batch_size=8)
    small.update(training_data="file", curriculum_epochs=0)  # train.root too
    lines = []
    simulate_all(resolve(**small), tmp_path, False, lines.append)
    assert file_compression(tmp_path / "train.root") == "lz4:1"
    simulate_all(resolve(**small), tmp_path, False, lines.append)
    assert sum("reused" in ln for ln in lines) == 3
    files = simulate_all(resolve(**small, compression="zlib"), tmp_path, False, lines.append)
    assert sum("reused" in ln for ln in lines) == 3
    assert {file_compression(p) for p in files.values()} == {"zlib:1"}


def test_a_checkpoint_resumes_whatever_the_data_compression():
    """A checkpoint from before compression was a key (or with another) trains the same model;
    any other difference is another run."""
    from rootclad.gw.run.train import _same_training

    now = resolve().to_toml()
    before = "".join(ln for ln in now.splitlines(True) if not ln.startswith("compression"))
    assert _same_training(before, now)
    assert _same_training(resolve(compression="zlib").to_toml(), now)
    assert not _same_training(resolve(lr=0.5).to_toml(), now)
    assert not _same_training("not toml [", now)
