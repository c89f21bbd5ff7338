"""``rootclad emit`` onto a full disk: the error says so and no ``.partial`` file is left (the
header and weights are written to temporary names, then renamed). The disk is a 1 MB tmpfs
filled to the last byte (needs root to mount; skipped otherwise)."""

from __future__ import annotations

import errno
import subprocess

import pytest
import torch


@pytest.fixture
def full_disk(tmp_path):
    d = tmp_path / "disk"
    d.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        with open(d / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as err:
                assert err.errno == errno.ENOSPC
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)


def test_emit_onto_a_full_disk_leaves_no_partial_file(full_disk):
    from rootclad.codegen.standalone import emit_header

    torch.manual_seed(0)
    with pytest.raises(OSError) as e:
        emit_header(torch.nn.Linear(4, 2), torch.zeros(2, 4), full_disk / "net.hxx")
    assert e.value.errno == errno.ENOSPC
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]
