"""The weights of a ``rootclad gw run`` directory that a background study scores: the run's
current best, and their content hash.

The checkpoint is the training's record (its configuration and its best weights so far); the
export, ``model/gwnet.root``, is what the run wrote when its training finished. A run that
starts another training removes the old export (pipeline.py), and a study refuses an export
whose weights are not the checkpoint's best: a directory reused for another configuration
never has its old network scored under the new one. The study records the sha256 it scored
(``background.json``, ``study.json``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from rootclad.gw.run.config import ConfigError


def weights_sha256(weights: dict[str, np.ndarray]) -> str:
    """The content hash of a set of weights: their names and float64 values, by name."""
    h = hashlib.sha256()
    for k in sorted(weights):
        a = np.ascontiguousarray(weights[k], np.float64).reshape(-1)
        h.update(f"{k}\0{a.size}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def current_best(run: Path, cfg) -> tuple[dict[str, np.ndarray], dict]:
    """The run's current best weights and where they were read. The checkpoint is the
    training's record: its configuration must be config.toml's, and its best weights are the
    current best. The export (model/gwnet.root) must hold those same weights; one that does
    not is an earlier training's (the directory was reused and the new run has not finished)
    and is refused. Without an export, the checkpoint's best weights are scored."""
    from rootclad.gw.run.train import _same_training

    ckpt, export, toml = run / "checkpoint.pt", run / "model" / "gwnet.root", run / "config.toml"
    best, info = None, {"checkpoint_epoch": None, "best_epoch": None}
    if ckpt.exists():
        best, info, config = _checkpoint_best(ckpt)
        if not _same_training(config, cfg.to_toml()):
            raise ConfigError(
                f"{ckpt} is of another training than {toml}: the directory was reused for "
                "another configuration, whose run stopped before its first epoch; finish that "
                f"run (`rootclad gw run --config {toml} --out {run}`) first"
            )
    if export.exists():
        weights = _export_weights(export)
        if best is not None and weights_sha256(weights) != weights_sha256(best):
            raise ConfigError(
                f"{export} holds weights (sha256 {weights_sha256(weights)[:16]}) that are not "
                f"the run's current best ({ckpt}, epoch {info['checkpoint_epoch']}: sha256 "
                f"{weights_sha256(best)[:16]}): it is an earlier training's export; finish the "
                f"run (`rootclad gw run --resume --config {toml} --out {run}`)"
            )
        source = export
    elif best is not None:
        weights, source = best, ckpt
    else:
        raise ConfigError(
            f"{run}: no trained model (neither model/gwnet.root from the export stage nor "
            f"checkpoint.pt); run `rootclad gw run --out {run}` first"
        )
    return weights, {"sha256": weights_sha256(weights), "file": str(source), **info}


def _checkpoint_best(ckpt: Path) -> tuple[dict[str, np.ndarray], dict, str]:
    """The best weights of checkpoint.pt (read with weights_only: nothing in it runs), each a
    finite floating tensor; its epoch and best epoch; its configuration."""
    import torch

    from rootclad.gw.run.train import load_checkpoint

    try:
        state = load_checkpoint(ckpt, map_location="cpu")
    except ValueError as err:
        raise ConfigError(f"{err}; the study reads the run's best weights from it") from None
    epoch, best_epoch = state["epoch"], state.get("best_epoch")
    if best_epoch is not None and (
        isinstance(best_epoch, bool) or not isinstance(best_epoch, int) or best_epoch > epoch
    ):
        got = repr(best_epoch)[:40]
        raise ConfigError(f"{ckpt}: best_epoch must be a whole number up to epoch, got {got}")
    if best_epoch is not None and best_epoch < 0:
        raise ConfigError(f"{ckpt}: best_epoch must not be negative, got {best_epoch}")
    # no best epoch (no finite validation loss): the export holds the last weights
    field = "best_model" if state.get("best_model") is not None else "model"
    tensors = state.get(field)
    if not isinstance(tensors, dict) or not tensors:
        raise ConfigError(f"{ckpt}: {field} is not a dict of tensors")
    best = {}
    for k, v in tensors.items():
        name = repr(str(k)[:40])
        if not (isinstance(k, str) and isinstance(v, torch.Tensor) and v.is_floating_point()):
            raise ConfigError(f"{ckpt}: {field}[{name}] is not a floating tensor")
        best[k] = v.detach().double().reshape(-1).numpy()
        if not np.all(np.isfinite(best[k])):
            raise ConfigError(f"{ckpt}: {field}[{name}] holds values that are not finite")
    return best, {"checkpoint_epoch": epoch, "best_epoch": best_epoch}, state["config"]


def _export_weights(path: Path) -> dict[str, np.ndarray]:
    """The weights in an export's ROOT file, each a row of finite numbers."""
    import uproot

    try:
        with uproot.open(path) as f:
            names = [k for k in f.keys(cycle=False) if not k.startswith("rootclad_")]
            weights = {k: np.asarray(f[k]["values"].array(library="np")[0]) for k in names}
    except Exception as err:  # a torn or foreign ROOT file: uproot says why
        why = f"{type(err).__name__}: {str(err)[:120]}"
        raise ConfigError(f"{path}: not a readable export ({why})") from None
    for k, a in weights.items():
        if a.dtype.kind != "f" or a.ndim != 1 or not np.all(np.isfinite(a)):
            raise ConfigError(f"{path}: {k[:40]!r} is not a row of finite numbers")
    return weights
