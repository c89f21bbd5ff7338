"""Training that targets the noise tail (``training_data = "fresh"`` and the keys after it):
events simulated afresh every epoch, a curriculum over SNR, hard negatives, and a validation
number that is the partial area under the ROC at false-alarm probabilities up to 1e-3.

- **Fresh events**: epoch ``e`` trains on ``train_events`` events generated from seeds of its
  own (:func:`epoch_seeds`), so the network never sees the same noise twice; the training
  file is not written. Generation, in a process per core, is a few seconds an epoch.
- **Curriculum** (``curriculum_epochs = K``): epoch ``e < K`` draws its signals' SNR from
  ``[lo + (2/3 hi - lo)(1 - e/K), hi]`` (loud signals first), then from the configured range.
- **Hard negatives** (``hard_negatives = H``): from epoch 2 on, before each epoch the network
  scores ``hard_pool`` fresh noise segments (seeds of their own) and the ``H`` loudest replace
  as many of the epoch's noise events. With ``hard_mining = "carry"`` the last epoch's hard
  negatives join the pool (scored again), so the set keeps the loudest noise of every pool so
  far: after 40 epochs of 65,536 the loudest 1,024 of 2.6 million, near a false-alarm
  probability of 4e-4 rather than 1.6e-2. They come from the training's seeds only: a
  background study's segments and the test file's never reach training.
- **Partial AUC** (``select = "pauc"``): after each epoch, the mean signal efficiency at the
  thresholds of false-alarm probability 1/N .. 1e-3 over ``val_noise`` validation noise
  segments (seeds of their own) and the validation file's signals; the run keeps the epoch
  where it is highest (the monitored number is 1 - pAUC) and stops ``patience`` epochs later.

The seeds of every kind are drawn by ``SeedSequence((seed, DOMAIN, kind, epoch))`` and any seed
of the run's validation or test file is dropped from them; :func:`training_seeds` lists them
all, which a background study checks its own seeds against (:mod:`.background`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

DOMAIN = 0x67772D74  # "gw-t": the training's seeds, apart from the study's spawn keys
KINDS = {"train": 0, "hard": 1, "val_noise": 2}
FAP_MAX = 1e-3  # the partial AUC's range of false-alarm probabilities


def kind_seeds(seed: int, kind: str, epoch: int, n: int, exclude=()) -> np.ndarray:
    """``n`` seeds (int64, [0, 2**63)) of a kind of training data for an epoch, none of them in
    ``exclude`` (the validation and test files' seeds)."""
    ss = np.random.SeedSequence((seed, DOMAIN, KINDS[kind], epoch))
    out = (ss.generate_state(n + 64, dtype=np.uint64) >> np.uint64(1)).astype(np.int64)
    out = out[~np.isin(out, np.asarray(exclude, dtype=np.int64))]
    if len(out) < n:  # 64 of 2**63 values collide with a file's seeds: never, in practice
        raise RuntimeError(f"{kind} seeds of epoch {epoch}: too many collide with the files'")
    return out[:n]


def file_seeds(cfg) -> np.ndarray:
    """The seeds of the run's validation and test files (as simulate draws them)."""
    from rootclad.gw.dataset import event_seeds

    parts = []
    for split in ("val", "test"):
        sim = cfg.simulation(split)
        parts.append(event_seeds(sim["seed"], 0, sim["n_events"]))
    return np.concatenate(parts)


def training_seeds(cfg) -> np.ndarray:
    """Every seed the run's training and validation can have drawn (the training file's, or
    the fresh events', hard-negative pools' and validation noise's of every epoch), sorted."""
    from rootclad.gw.dataset import event_seeds

    sim = cfg.simulation("train")
    parts = [event_seeds(sim["seed"], 0, sim["n_events"])]
    sim = cfg.simulation("val")
    parts.append(event_seeds(sim["seed"], 0, sim["n_events"]))
    if cfg.training_data == "fresh":
        ex = file_seeds(cfg)
        for e in range(cfg.epochs):
            parts.append(kind_seeds(cfg.seed, "train", e, cfg.train_events, ex))
            if cfg.hard_negatives:
                parts.append(kind_seeds(cfg.seed, "hard", e, cfg.hard_pool, ex))
    if cfg.select == "pauc":  # with either training data
        parts.append(kind_seeds(cfg.seed, "val_noise", 0, cfg.val_noise, file_seeds(cfg)))
    return np.unique(np.concatenate(parts))


def curriculum_snr(cfg, epoch: int) -> tuple[float, float]:
    lo, hi = cfg.snr
    k = cfg.curriculum_epochs
    if epoch >= k:
        return lo, hi
    start = max(lo, 2.0 / 3.0 * hi)
    return lo + (start - lo) * (1.0 - epoch / k), hi


def _generated(seeds: np.ndarray, sim) -> dict[str, np.ndarray]:
    """The events of ``seeds``, made by a process per core (the per-event random draws hold
    Python's lock: threads would not run them side by side)."""
    from rootclad.gw.dataset import _default_workers, generate_events

    return generate_events(seeds, sim, workers=_default_workers())


class FreshBatches:
    """The batches of an epoch of fresh events (``set_epoch`` before each pass): (x, y) with x
    float32 (B, 1, n), y float32 (B, 1); the order shuffled by (seed, epoch)."""

    def __init__(self, cfg, sim, miner=None):
        self.cfg, self.sim, self.miner = cfg, sim, miner
        self.exclude = file_seeds(cfg)
        self.epoch = 0
        self._data = None

    def __len__(self) -> int:
        return -(-self.cfg.train_events // self.cfg.batch_size)

    def set_epoch(self, epoch: int) -> None:
        if self._data is not None and self.epoch == epoch:
            return
        self.epoch, self._data = epoch, None  # the last epoch's events go first
        cfg = self.cfg
        seeds = kind_seeds(cfg.seed, "train", epoch, cfg.train_events, self.exclude)
        sim = dataclasses.replace(self.sim, snr=curriculum_snr(cfg, epoch))
        ev = _generated(seeds, sim)
        x, y = ev["strain"][:, None, :], ev["label"].astype(np.float32)[:, None]
        if self.miner is not None and epoch > 0:
            hard = self.miner(epoch)
            noise = np.flatnonzero(y[:, 0] == 0)[: len(hard)]
            x[noise[: len(hard)]] = hard[: len(noise)]
        order = np.random.default_rng((cfg.seed, DOMAIN, 9, epoch)).permutation(len(x))
        self._data = (x[order], y[order])

    def __iter__(self):
        if self._data is None:
            self.set_epoch(0)
        x, y = self._data
        b = self.cfg.batch_size
        for lo in range(0, len(x), b):
            yield x[lo : lo + b], y[lo : lo + b]


def hard_miner(cfg, sim, score):
    """A function of the epoch: the ``hard_negatives`` loudest of ``hard_pool`` fresh noise
    segments as the network now scores them ((H, 1, n) float32). With ``hard_mining =
    "carry"`` the seeds it returned last (``mine.kept``, which a checkpoint holds so that a
    resumed run mines what an uninterrupted one would) are part of the pool."""
    noise = dataclasses.replace(sim, signal_fraction=0.0)
    exclude = file_seeds(cfg)

    def mine(epoch: int) -> np.ndarray:
        seeds = kind_seeds(cfg.seed, "hard", epoch, cfg.hard_pool, exclude)
        if cfg.hard_mining == "carry":
            seeds = np.concatenate([mine.kept, seeds])
        best_s, best_seed = np.empty(0), np.empty(0, np.int64)
        best_x = np.empty((0, 1, sim.n), np.float32)
        for lo in range(0, len(seeds), 8192):
            x = _generated(seeds[lo : lo + 8192], noise)["strain"][:, None, :]
            s = np.concatenate([best_s, score(x)])
            xs = np.concatenate([best_x, x])
            ss = np.concatenate([best_seed, seeds[lo : lo + 8192]])
            keep = np.argsort(-s, kind="stable")[: cfg.hard_negatives]
            best_s, best_x, best_seed = s[keep], xs[keep], ss[keep]
        mine.kept = best_seed
        return best_x

    mine.kept = np.empty(0, np.int64)
    return mine


def carried_seeds(cfg, state: dict, path) -> np.ndarray:
    """The carried hard negatives' seeds a checkpoint holds, refused (ValueError naming the
    file) unless they are at most ``hard_negatives`` of the hard-negative pools' seeds of the
    epochs it has done: no other noise, least of all a test segment, enters training."""
    import torch

    kept, epoch = state.get("hard_kept"), state["epoch"]
    ok = isinstance(kept, torch.Tensor) and kept.dtype == torch.int64 and kept.dim() == 1
    if ok:
        kept = kept.numpy()
        ex = file_seeds(cfg)
        pools = [kind_seeds(cfg.seed, "hard", e, cfg.hard_pool, ex) for e in range(1, epoch)]
        pools = np.concatenate([np.empty(0, np.int64), *pools])
        ok = len(kept) <= cfg.hard_negatives and bool(np.isin(kept, pools).all())
    if not ok:
        raise ValueError(
            f"{path}: its hard_kept is not at most {cfg.hard_negatives} seeds of the "
            f"hard-negative pools of its {epoch} epochs; remove it or run without --resume"
        )
    return kept


def partial_auc(signal: np.ndarray, noise: np.ndarray, fap_max: float = FAP_MAX) -> float:
    """The mean efficiency of ``signal`` scores above the thresholds at false-alarm
    probabilities k/N, k = 1 .. fap_max N, of ``noise`` (N values): the area under the ROC up
    to ``fap_max``, divided by it."""
    k = max(1, int(fap_max * len(noise)))
    thresholds = -np.sort(-np.asarray(noise))[:k]  # the k loudest
    s = np.sort(np.asarray(signal))
    above = len(s) - np.searchsorted(s, thresholds, side="right")
    return float(above.mean() / len(s))


def pauc_validation(cfg, sim, val_file, score):
    """A function of no arguments returning 1 - partial AUC on the validation file's signals
    and ``val_noise`` fresh noise segments (generated once)."""
    from rootclad.gw.run.inputs import read_test, strain_chunks

    meta = read_test(val_file)
    sig = [x[meta["label"][lo : lo + len(x)] == 1] for lo, x in _chunks(strain_chunks(val_file))]
    signal_x = np.concatenate(sig)
    seeds = kind_seeds(cfg.seed, "val_noise", 0, cfg.val_noise, file_seeds(cfg))
    noise_x = _generated(seeds, dataclasses.replace(sim, signal_fraction=0.0))["strain"][:, None, :]

    def monitored() -> float:
        return 1.0 - partial_auc(score(signal_x), score(noise_x))

    return monitored


def _chunks(chunks):
    lo = 0
    for x in chunks:
        yield lo, x
        lo += len(x)


def check_disjoint(config: str, tasks: int, seeds_of_task) -> None:
    """Refuse a background study (``tasks`` tasks, ``seeds_of_task(i)`` the seeds of task i) of
    the run configured by ``config`` (TOML) when one of its segments is one the run trained or
    validated on, or one of its test file. Seeds of every kind are drawn apart, so this never
    happens by chance: it guards against a change that would let test noise leak."""
    import tomllib

    from rootclad.gw.run.config import ConfigError, resolve

    cfg = resolve(**tomllib.loads(config))
    used = np.union1d(training_seeds(cfg), file_seeds(cfg))
    parts = [seeds_of_task(i) for i in range(tasks)]
    hit = np.isin(np.concatenate(parts), used)  # one sort: 2e6 seeds take a second
    if hit.any():
        i = int(np.searchsorted(np.cumsum([len(p) for p in parts]), np.argmax(hit), "right"))
        raise ConfigError(
            f"background task {i} holds a segment seed of the run's training, "
            "validation or test data; choose another --seed"
        )
