"""What ``rootclad gw run`` and its background study read from a run's files: the test
file's labels, SNRs and strain (in chunks), and the template bank for its configuration,
cached in the run directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from rootclad.gw.run.config import RunConfig
from rootclad.paths import replacing


def _entries(path: Path) -> int:
    import uproot

    with uproot.open(path) as f:
        return int(f["events"].num_entries)


def read_test(path: Path) -> dict[str, np.ndarray]:
    """Label, injected SNR and seed of every test event (the strain is read in chunks)."""
    import uproot

    with uproot.open(path) as f:
        return f["events"].arrays(["label", "snr", "seed"], library="np")


def strain_chunks(path: Path, step: int = 4096):
    """The test file's strain, (k, 1, n) float32 chunks of ``step`` events, in entry order: a
    test set of any size is never held in memory whole."""
    import uproot

    with uproot.open(path) as f:
        for part in f["events"].iterate(["strain"], step_size=step, library="np"):
            x = part["strain"]
            yield np.ascontiguousarray(x.reshape(len(x), 1, -1), dtype=np.float32)


def strain_of(path: Path, entries) -> np.ndarray:
    """The strain of a few entries, (k, 1, n)."""
    import uproot

    with uproot.open(path) as f:
        branch = f["events"]["strain"]
        rows = [branch.array(entry_start=int(e), entry_stop=int(e) + 1, library="np")[0]
                for e in entries]  # fmt: skip
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), 1, -1)


def template_bank(cfg: RunConfig, test_file: Path, cache: Path, log):
    """The bank for the test file's configuration, cached by that configuration."""
    from rootclad.gw.dataset import read_config
    from rootclad.gw.matched_filter import TemplateBank, bank_for_file

    sim = read_config(test_file)
    key = hashlib.sha256(f"{sim.to_json()}:{cfg.bank_min_match}".encode()).hexdigest()[:16]
    path = cache / f"bank-{key}.npz"
    if path.exists():
        try:
            # np.load(path) leaves the file open when the zip is broken: ours is closed
            with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as z:
                bank = TemplateBank(z["masses"], z["templates"], int(z["n"]),
                                    float(z["sample_rate"]), tuple(z["band"]), sim.psd,
                                    float(z["t_ref"]), sim.approximant)  # fmt: skip
            log(f"template bank: {len(bank)} templates, cached in {path}")
            return bank
        except Exception as err:  # truncated or not ours: built again, and the cache replaced
            log(f"warning: the cached template bank {path} cannot be read "
                f"({type(err).__name__}: {err}); building it again")  # fmt: skip
    bank = bank_for_file(test_file, min_match=cfg.bank_min_match, seed=cfg.seed)
    cache.mkdir(parents=True, exist_ok=True)
    with replacing(path, ".npz") as tmp:
        np.savez(tmp, masses=bank.masses, templates=bank.templates, n=bank.n,
                 sample_rate=bank.sample_rate, band=np.asarray(bank.band), t_ref=bank.t_ref)  # fmt: skip
    log(f"template bank: {len(bank)} templates (min match {cfg.bank_min_match}), cached")
    return bank
