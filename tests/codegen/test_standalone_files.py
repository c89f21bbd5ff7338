"""``rootclad emit`` onto a full disk: the error says so and no ``.partial`` file is left (the
header and weights are written to temporary names, then renamed). The disk is a 1 MB tmpfs
filled to the last byte (needs root to mount; skipped otherwise)."""

from __future__ import annotations

import errno

import pytest
import torch


def test_emit_onto_a_full_disk_leaves_no_partial_file(full_disk):
    from rootclad.compiler import emit_header

    torch.manual_seed(0)
    with pytest.raises(OSError) as e:
        emit_header(torch.nn.Linear(4, 2), torch.zeros(2, 4), full_disk / "net.hxx")
    assert e.value.errno == errno.ENOSPC
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]


def test_emit_replaces_header_and_weights_together(tmp_path, monkeypatch):
    """The weights' write failing after the header was renamed left a new header beside the old
    weights: both are now written before either replaces its old file."""
    from pathlib import Path

    from rootclad.compiler import emit_header

    torch.manual_seed(0)
    out = tmp_path / "net.hxx"
    emit_header(torch.nn.Linear(4, 2), torch.zeros(2, 4), out)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    write_bytes = Path.write_bytes

    def failing(path, data):
        if path.name.startswith(".net.dat"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_bytes(path, data)

    monkeypatch.setattr(Path, "write_bytes", failing)
    with pytest.raises(OSError):
        emit_header(torch.nn.Linear(4, 3), torch.zeros(2, 4), out)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
