"""The configuration of ``rootclad gw run``: defaults, presets, a TOML file, checks.

Every value is checked before any work starts; a mistake names its key. The resolved
configuration is written next to the results (``config.toml``), so a run can be repeated.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import tomllib


class ConfigError(ValueError):
    """A bad configuration value; the message names the key."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What ``rootclad gw run`` does. Sizes in events; SNRs are optimal SNRs."""

    seed: int = 1
    # data: one training, validation and test file each
    train_events: int = 24576
    val_events: int = 4096
    test_events: int = 12288
    duration: float = 1.0
    sample_rate: float = 2048.0
    snr: tuple[float, float] = (2.0, 12.0)  # injected optimal SNR, uniform
    mass_range: tuple[float, float] = (10.0, 50.0)
    approximant: str = "builtin"
    compression: str = "lz4"  # of the data files; "zlib" also detects corrupted strain
    # training
    model: str = "cnn"
    engine: str = "auto"
    epochs: int = 12
    batch_size: int = 64
    lr: float = 1e-3
    patience: int = 4  # epochs without a better validation loss before stopping
    # evaluation
    bank_min_match: float = 0.97
    bootstrap: int = 200
    saliency_examples: int = 3
    device: str = "cpu"
    # a background study after the report (rootclad gw background; 0: none)
    background_segments: int = 0
    # the distributed route (cluster.py): local Dask worker processes (0 or 1: this process
    # alone), or a Dask scheduler's address (its workers; ``workers`` then at most that many)
    workers: int = 0
    scheduler: str = ""

    def to_toml(self) -> str:
        lines = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, str):
                lines.append(f'{f.name} = "{v}"')
            elif isinstance(v, tuple):
                lines.append(f"{f.name} = [{', '.join(repr(float(x)) for x in v)}]")
            else:
                lines.append(f"{f.name} = {v!r}")
        return "\n".join(lines) + "\n"

    def simulation(self, split: str) -> dict:
        """Arguments of :func:`rootclad.gw.simulate` for one split (its own seed)."""
        offset = {"train": 0, "val": 1, "test": 2}[split]
        n = {"train": self.train_events, "val": self.val_events, "test": self.test_events}[split]
        return dict(n_events=n, seed=self.seed * 1000 + offset, snr=self.snr,
                    duration=self.duration, sample_rate=self.sample_rate,
                    mass_range=self.mass_range, approximant=self.approximant,
                    compression=self.compression)  # fmt: skip


PRESETS = {
    "default": {},
    # longer training on more data; not run in CI (8 minutes on 2 cores, docs/gw_run.md)
    "full": {
        "train_events": 200_000,
        "val_events": 20_000,
        "test_events": 40_000,
        "epochs": 30,
        "patience": 6,
    },  # fmt: skip
    # the default run, then 1e6 noise-only segments through both methods (thresholds down to
    # 1e-5, docs/gw_background.md): about an hour on 2 cores
    "search": {"background_segments": 1_000_000},
}

_INT = {"seed", "train_events", "val_events", "test_events", "epochs", "batch_size", "patience",
        "bootstrap", "saliency_examples", "background_segments", "workers"}  # fmt: skip
_FLOAT = {"duration", "sample_rate", "lr", "bank_min_match"}
_PAIR = {"snr", "mass_range"}
_STR = {"approximant": None, "compression": ("lz4", "none", "zlib", "zstd", "lzma"), "model": ("cnn", "mlp"), "engine": ("auto", "clad", "pullback"),
        "device": ("cpu", "cuda"), "scheduler": None}  # fmt: skip


def _typed(key: str, value):
    if key in _INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if key in _FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if key in _PAIR:
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        ):
            raise ConfigError(f"{key} must be two numbers [low, high], got {value!r}")
        return (float(value[0]), float(value[1]))
    choices = _STR[key]
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if choices and value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return value


# split seeds are seed * 1000 + 0, 1, 2; the readers and simulate take seeds below 2**63
MAX_SEED = (2**63 - 1 - 2) // 1000


def check(c: RunConfig) -> RunConfig:
    """Raise ConfigError naming the first impossible value."""
    positive = ["train_events", "val_events", "test_events", "epochs", "batch_size", "patience"]
    for key in positive:
        if getattr(c, key) < 1:
            raise ConfigError(f"{key} must be at least 1, got {getattr(c, key)}")
    if c.test_events < 200:
        raise ConfigError(f"test_events must be at least 200 (thresholds at a false-alarm "
                          f"probability of 1e-2 need noise events), got {c.test_events}")  # fmt: skip
    for key in ("bootstrap", "saliency_examples", "seed", "background_segments", "workers"):
        if getattr(c, key) < 0:
            raise ConfigError(f"{key} must not be negative, got {getattr(c, key)}")
    if c.seed > MAX_SEED:
        raise ConfigError(f"seed must be at most {MAX_SEED} (the data files' seeds, seed * 1000 "
                          f"+ split, must fit the readers' 63 bits), got {c.seed}")  # fmt: skip
    if c.batch_size > c.train_events:
        raise ConfigError(f"batch_size must be at most train_events ({c.train_events}), "
                          f"got {c.batch_size}")  # fmt: skip
    if c.workers > 1 and c.batch_size % c.workers:
        raise ConfigError(f"batch_size ({c.batch_size}) is the global batch: it must split "
                          f"evenly over workers = {c.workers} ranks")  # fmt: skip
    if c.device == "cuda" and (c.workers > 1 or c.scheduler):
        raise ConfigError('device = "cuda" runs in one process; the distributed route trains '
                          "on the workers' CPUs (for several GPUs: rootclad.distributed with a "
                          "DeviceModel per rank, docs/distributed_training.md)")  # fmt: skip
    for key in ("duration", "sample_rate", "lr"):
        v = getattr(c, key)
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{key} must be a positive number, got {v}")
    if not 0.5 < c.bank_min_match < 1:
        raise ConfigError(f"bank_min_match must be in (0.5, 1), got {c.bank_min_match}")
    for key in ("snr", "mass_range"):
        lo, hi = getattr(c, key)
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
            raise ConfigError(f"{key} must be [low, high] with 0 < low <= high, got {[lo, hi]}")
    n = c.duration * c.sample_rate
    if abs(n - round(n)) > 1e-9 or round(n) < 280:
        raise ConfigError(f"duration * sample_rate must be a whole number of samples, at least "
                          f"280 for the networks, got {n}")  # fmt: skip
    if c.approximant != "builtin":
        try:
            import lalsimulation  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"approximant {c.approximant!r} needs lalsuite (pip install lalsuite); "
                "'builtin' needs nothing"
            ) from None
    return c


def resolve(path=None, preset: str = "default", **overrides) -> RunConfig:
    """The preset, then the TOML file ``path``, then ``overrides`` (None values ignored)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r} ({', '.join(PRESETS)})")
    values = dict(PRESETS[preset])
    known = {f.name for f in dataclasses.fields(RunConfig)}
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such configuration file") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: not TOML ({err})") from None
        for key, value in data.items():
            if key not in known:
                raise ConfigError(
                    f"{path}: unknown key {key!r} (known: {', '.join(sorted(known))})"
                )
            values[key] = value
    values.update({k: v for k, v in overrides.items() if v is not None})
    given = set(data if path is not None else ()) | {
        k for k, v in overrides.items() if v is not None
    }
    if "batch_size" not in given:
        # the preset's batch may exceed a small training set (--events 20): take it whole; a
        # batch_size the user gave is checked as given
        default = {f.name: f.default for f in dataclasses.fields(RunConfig)}
        batch = values.get("batch_size", default["batch_size"])
        train = values.get("train_events", default["train_events"])
        if isinstance(train, int) and not isinstance(train, bool) and 1 <= train < batch:
            values["batch_size"] = train
    for key in list(values):
        if key not in known:
            raise ConfigError(f"unknown key {key!r}")
        values[key] = _typed(key, values[key])
    return check(RunConfig(**values))
