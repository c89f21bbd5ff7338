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
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    patience: int = 4  # epochs without a better validation loss before stopping
    # training that targets the noise tail (fresh.py): "file" trains on train.root every
    # epoch; "fresh" on events simulated afresh each epoch, with a curriculum over SNR for the
    # first curriculum_epochs, the hard_negatives loudest of hard_pool fresh noise segments in
    # each epoch's noise, and (select = "pauc") the epoch kept by the partial AUC at
    # false-alarm probabilities up to 1e-3 over val_noise noise segments. The default trains
    # on fresh events with a curriculum (measured against train.root: docs/gw_run.md)
    training_data: str = "fresh"
    curriculum_epochs: int = 4
    hard_negatives: int = 0
    hard_pool: int = 65536
    hard_mining: str = "pool"  # "carry": the last epoch's hard negatives join the pool
    select: str = "loss"
    val_noise: int = 32768
    # the learning rate: constant, halved when the monitored number has not improved for 2
    # epochs ("plateau"), or annealed to 0 over the epochs ("cosine")
    lr_schedule: str = "constant"
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
        """The configuration as TOML that ``resolve`` reads back as itself, whatever text
        its strings hold."""
        fields = dataclasses.fields(self)
        return "".join(f"{f.name} = {toml_value(getattr(self, f.name))}\n" for f in fields)

    def simulation(self, split: str) -> dict:
        """Arguments of :func:`rootclad.gw.simulate` for one split (its own seed)."""
        offset = {"train": 0, "val": 1, "test": 2}[split]
        n = {"train": self.train_events, "val": self.val_events, "test": self.test_events}[split]
        return dict(n_events=n, seed=self.seed * 1000 + offset, snr=self.snr,
                    duration=self.duration, sample_rate=self.sample_rate,
                    mass_range=self.mass_range, approximant=self.approximant,
                    compression=self.compression)  # fmt: skip


# a TOML basic string escapes the quote, the backslash and every control character
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
_TOML_STRING = str.maketrans(
    {**{c: f"\\u{c:04X}" for c in [*range(0x20), 0x7F]}, **{ord(k): v for k, v in _ESCAPES.items()}}
)


def toml_value(v) -> str:
    """``v`` (text, a whole number, a float or a tuple of them) as a TOML value that
    ``tomllib`` reads back as ``v``: text as a basic string with what the TOML spec requires
    escaped (the quote, the backslash, control characters), integers within TOML's 64 bits,
    floats as Python writes them (``inf``, ``nan`` and ``1e-05`` are TOML). What TOML cannot
    hold raises ValueError (text that is not Unicode, an integer past 64 bits) or TypeError."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{shown(v)} is not Unicode text (an undecodable byte?)") from None
        return f'"{v.translate(_TOML_STRING)}"'
    if isinstance(v, bool) or not isinstance(v, (int, float, tuple)):
        raise TypeError(f"no TOML form for a {type(v).__name__} in a run configuration")
    if isinstance(v, tuple):
        return f"[{', '.join(toml_value(x) for x in v)}]"
    if isinstance(v, int) and not -(2**63) <= v < 2**63:
        raise ValueError(f"{shown(v)} does not fit TOML's 64-bit integers")
    return repr(v)


def shown(value) -> str:
    """A value for a message: its repr, cut when long (a 400-digit number, a long array)."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4300 digits for a string
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


PRESETS = {
    "default": {},
    # longer training on more data; not run in CI (8 minutes on 2 cores, docs/gw_run.md)
    "full": {
        "training_data": "file",  # the kept run's (docs/benchmarks/gw_run.md)
        "curriculum_epochs": 0,
        "train_events": 200_000,
        "val_events": 20_000,
        "test_events": 40_000,
        "epochs": 30,
        "patience": 6,
    },  # fmt: skip
    # training for the noise tail (fresh.py, the recipe of docs/gw_background.md's ablation),
    # then 2e6 noise-only segments through both methods (thresholds down to 1e-5 on 21
    # segments, docs/gw_background.md)
    "search": {
        "train_events": 98304,
        "training_data": "fresh",
        "curriculum_epochs": 6,
        "hard_negatives": 1024,
        "select": "pauc",
        "epochs": 40,
        "patience": 10,
        "lr_schedule": "cosine",
        "background_segments": 2_000_000,
    },
}

_INT = {
    "seed",
    "train_events",
    "val_events",
    "test_events",
    "epochs",
    "batch_size",
    "patience",
    "bootstrap",
    "saliency_examples",
    "background_segments",
    "workers",
    "curriculum_epochs",
    "hard_negatives",
    "hard_pool",
    "val_noise",
}
_FLOAT = {"duration", "sample_rate", "lr", "bank_min_match"}
_PAIR = {"snr", "mass_range"}
_STR = {"approximant": None, "compression": ("lz4", "none", "zlib", "zstd", "lzma"), "model": ("cnn", "mlp", "resnet", "resnet-deep"),
        "training_data": ("file", "fresh"), "select": ("loss", "pauc"),
        "hard_mining": ("pool", "carry"),
        "lr_schedule": ("constant", "plateau", "cosine"), "engine": ("auto", "clad", "pullback"),
        "device": ("cpu", "cuda"), "scheduler": None}  # fmt: skip


def _typed(key: str, value):
    if key in _INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {shown(value)}")
        return value
    if key in _FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {shown(value)}")
        return _float(key, value)
    if key in _PAIR:
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        ):
            raise ConfigError(f"{key} must be two numbers [low, high], got {shown(value)}")
        return (_float(key, value[0]), _float(key, value[1]))
    choices = _STR[key]
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {shown(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # an argument's undecodable bytes: no TOML file holds them
        raise ConfigError(f"{key} must be text (UTF-8), got {shown(value)}") from None
    if choices and value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {shown(value)}")
    return value


def _float(key: str, value) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past a float's range
        raise ConfigError(f"{key} must be a finite number, got {shown(value)}") from None


# split seeds are seed * 1000 + 0, 1, 2; the readers and simulate take seeds below 2**63
MAX_SEED = (2**63 - 1 - 2) // 1000


def check(c: RunConfig) -> RunConfig:
    """Raise ConfigError naming the first impossible value (each message begins with the
    key it is about, which ``resolve`` goes by to name the file the key came from)."""
    positive = ["train_events", "val_events", "test_events", "epochs", "batch_size", "patience"]
    for key in positive:
        if getattr(c, key) < 1:
            raise ConfigError(f"{key} must be at least 1, got {shown(getattr(c, key))}")
    if c.test_events < 200:
        raise ConfigError(f"test_events must be at least 200 (thresholds at a false-alarm "
                          f"probability of 1e-2 need noise events), got {c.test_events}")  # fmt: skip
    for key in (
        "bootstrap",
        "saliency_examples",
        "seed",
        "background_segments",
        "workers",
        "curriculum_epochs",
        "hard_negatives",
    ):
        if getattr(c, key) < 0:
            raise ConfigError(f"{key} must not be negative, got {shown(getattr(c, key))}")
    if c.seed > MAX_SEED:
        raise ConfigError(f"seed must be at most {MAX_SEED} (the data files' seeds, seed * 1000 "
                          f"+ split, must fit the readers' 63 bits), got {shown(c.seed)}")  # fmt: skip
    if c.batch_size > c.train_events:
        raise ConfigError(f"batch_size must be at most train_events ({c.train_events}), "
                          f"got {shown(c.batch_size)}")  # fmt: skip
    if c.workers > 1 and c.batch_size % c.workers:
        raise ConfigError(f"batch_size ({c.batch_size}) is the global batch: it must split "
                          f"evenly over workers = {c.workers} ranks")  # fmt: skip
    if c.device == "cuda" and (c.workers > 1 or c.scheduler):
        raise ConfigError('device = "cuda" runs in one process; the distributed route trains '
                          "on the workers' CPUs (for several GPUs: rootclad.distributed with a "
                          "DeviceModel per rank, docs/distributed_training.md)")  # fmt: skip
    if c.training_data == "file" and (c.curriculum_epochs or c.hard_negatives):
        raise ConfigError(
            'curriculum_epochs and hard_negatives need training_data = "fresh" '
            "(events simulated for each epoch)"
        )
    if c.hard_negatives and not c.hard_negatives <= min(c.hard_pool, c.train_events // 2):
        raise ConfigError(
            f"hard_negatives must be at most hard_pool ({c.hard_pool}) and half "
            f"of train_events ({c.train_events}), got {c.hard_negatives}"
        )
    if c.hard_mining == "carry" and not c.hard_negatives:
        raise ConfigError('hard_mining = "carry" needs hard_negatives (the set it carries)')
    if c.val_noise < 1000 or c.hard_pool < 1:
        raise ConfigError(
            "val_noise must be at least 1000 (a partial AUC to 1e-3 needs the "
            "noise) and hard_pool at least 1"
        )
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
    for key in sorted(_INT):  # what TOML and the readers hold; sizes past it overflow floats
        if not -(2**63) <= getattr(c, key) < 2**63:
            raise ConfigError(f"{key} must fit 64 bits, got {shown(getattr(c, key))}")
    n = c.duration * c.sample_rate
    if not math.isfinite(n) or abs(n - round(n)) > 1e-9 or round(n) < 280:
        raise ConfigError(f"duration * sample_rate must be a whole number of samples, at least "
                          f"280 for the networks, got {n}")  # fmt: skip
    if c.approximant != "builtin":
        try:
            import lalsimulation  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"approximant {shown(c.approximant)} needs lalsuite (pip install lalsuite); "
                "'builtin' needs nothing"
            ) from None
    return c


def resolve(path=None, preset: str = "default", **overrides) -> RunConfig:
    """The preset, then the TOML file ``path``, then ``overrides`` (None values ignored)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r} ({', '.join(PRESETS)})")
    values = dict(PRESETS[preset])
    known = {f.name for f in dataclasses.fields(RunConfig)}
    data = {} if path is None else _read_toml(Path(path))
    for key, value in data.items():
        if key not in known:
            raise ConfigError(
                f"{path}: unknown key {shown(key)} (known: {', '.join(sorted(known))})"
            )
        values[key] = value
    given = {k for k, v in overrides.items() if v is not None}
    values.update({k: v for k, v in overrides.items() if v is not None})
    from_file = set(data) - given
    if "batch_size" not in given | set(data):
        # the preset's batch may exceed a small training set (--events 20): take it whole; a
        # batch_size the user gave is checked as given
        default = {f.name: f.default for f in dataclasses.fields(RunConfig)}
        batch = values.get("batch_size", default["batch_size"])
        train = values.get("train_events", default["train_events"])
        if isinstance(train, int) and not isinstance(train, bool) and 1 <= train < batch:
            values["batch_size"] = train
    try:
        for key in list(values):
            if key not in known:
                raise ConfigError(f"unknown key {shown(key)}")
            values[key] = _typed(key, values[key])
        return check(RunConfig(**values))
    except ConfigError as err:
        # a mistake in the file names the file (the messages begin with their key)
        if str(err).split(" ", 1)[0] in from_file:
            raise ConfigError(f"{path}: {err}") from None
        raise


# a configuration is a few hundred bytes: a larger file is not one
_MAX_FILE = 1 << 20


def _read_toml(path: Path) -> dict:
    """The TOML file ``path``; whatever keeps it from being one is a ConfigError naming it."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_FILE + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file") from None
    if len(raw) > _MAX_FILE:
        raise ConfigError(f"{path}: larger than {_MAX_FILE} bytes, not a run configuration")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: not TOML (values nested too deeply)") from None
    except ValueError as err:  # TOMLDecodeError, or an integer past Python's 4300 digits
        raise ConfigError(f"{path}: not TOML ({err})") from None
