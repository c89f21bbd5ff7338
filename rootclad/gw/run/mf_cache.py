"""The matched filter's statistics of a background study's tasks, kept per template bank and
noise, so that studies of other networks on the same segments skip it.

A task's segments depend on the study seed, the task's index, ``per_task`` and the noise
configuration only; the matched filter's SNR, template and time of each on the bank alone. At
60 templates the matched filter is about 85% of a task's time, so a second network's study of
2,000,000 segments costs the network's time, not the filter's again. The values live in the
private cache (``rootclad.toolchain.build.cache_dir()``, owner-only) under
``gw-matched-filter/<key>/task-NNNNNN.npz``, the key a hash of everything they depend on;
every file is checked on reading (its fields, shapes, types, finite SNRs, templates of the
bank, times in the segment) and one that is not a task's values is computed again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from rootclad.paths import replacing

FORMAT = 1  # of the values; a change to the filter's arithmetic raises it


def key(spec: dict, study: dict) -> str:
    """What a task's matched-filter values depend on: the noise, the bank, the task's seeds."""
    h = hashlib.sha256(f"{FORMAT}:{study['seed']}:{study['per_task']}:".encode())
    h.update(spec["simulation"].encode())
    h.update(np.ascontiguousarray(spec["bank"]["templates"]).tobytes())
    return h.hexdigest()[:24]


def _path(k: str, task: int) -> Path:
    from rootclad.toolchain.build import cache_dir

    return cache_dir() / "gw-matched-filter" / k / f"task-{task:06d}.npz"


def load(k: str, task: int, n: int, templates: int, duration: float) -> dict | None:
    """Task ``task``'s values (``snr``, ``template``, ``time``: (n,) each), or None when they
    are not cached or are not a task's values (then computed again and replaced)."""
    path = _path(k, task)
    if not path.exists():
        return None
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as z:
            r = {f: z[f] for f in ("snr", "template", "time")}
    except Exception:  # torn, or not an npz of these fields
        return None
    ok = (
        all(v.shape == (n,) for v in r.values())
        and r["snr"].dtype == np.float64
        and r["template"].dtype == np.int64
        and r["time"].dtype == np.float64
        and np.all(np.isfinite(r["snr"]) & (r["snr"] >= 0))
        and np.all((r["template"] >= 0) & (r["template"] < templates))
        and np.all((r["time"] >= 0) & (r["time"] < duration))
    )
    return r if ok else None


def store(k: str, task: int, values: dict) -> None:
    """Keep task ``task``'s values (written to a temporary name and renamed)."""
    path = _path(k, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, ".npz") as tmp:
        np.savez(tmp, **values)
