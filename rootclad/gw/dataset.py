"""The GW dataset: whitened detector strain with and without injected signals, in a ROOT file.

One event is one segment of ``n = duration * sample_rate`` samples:

1. Gaussian noise coloured by the PSD (drawn on the segment's Fourier grid);
2. with probability ``signal_fraction``, a binary-merger signal
   (:func:`rootclad.gw.waveforms.waveform`) with masses uniform in
   ``mass_range`` (``m1 >= m2``), coalescence ``t_merger`` seconds after the
   segment start (uniform), phase uniform, scaled to an optimal SNR drawn
   uniformly from ``snr`` over ``band`` with the same PSD;
3. whitened by the same PSD over ``band`` (:func:`rootclad.gw.whiten.whiten`).

Every event has its own seed (``seed`` column), derived from the run seed and
the event index, and everything about the event is drawn from a generator
seeded with it, in a fixed order. So a file does not depend on the chunk size
or the number of worker processes, and :func:`generate_events` regenerates any
event from its seed and the stored configuration.

File layout (readable by uproot and ROOT):

- TTree ``events``: ``strain[n]/F`` (whitened), ``label/I`` (1 = signal),
  ``snr/F``, ``m1/F``, ``m2/F`` (solar masses), ``t_merger/F`` (seconds from
  the segment start), ``seed/L``; ``snr``, masses and ``t_merger`` are 0 for
  noise-only events;
- TObjString ``config``: the run configuration as JSON;
- TTree ``psd``: ``frequency/D``, ``psd/D``: the one-sided PSD on the
  segment's rfft grid, as used for noise, SNR and whitening.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from rootclad.gw.noise import _check_length, spectrum_from_normals
from rootclad.gw.psd import psd_on_grid, rfft_frequencies
from rootclad.gw.waveforms import BUILTIN, waveform
from rootclad.gw.whiten import DEFAULT_BAND, band_mask, bin_weights, whitening_filter

FORMAT_VERSION = 1
EVENT_BRANCHES = ("strain", "label", "snr", "m1", "m2", "t_merger", "seed")


@dataclasses.dataclass(frozen=True)
class SimulationConfig:
    """Everything that determines a dataset, apart from the number of events."""

    seed: int = 0
    duration: float = 1.0
    sample_rate: float = 2048.0
    snr: tuple[float, float] = (5.0, 20.0)
    signal_fraction: float = 0.5
    mass_range: tuple[float, float] = (5.0, 95.0)
    t_merger: tuple[float, float] | None = None  # default (0.5, 0.9) x duration
    approximant: str = BUILTIN
    psd: str = "aligo"
    band: tuple[float, float] = DEFAULT_BAND
    f_lower: float = 15.0
    taper: float = 0.1

    def __post_init__(self):
        set_ = object.__setattr__
        for name in ("snr", "mass_range", "band"):
            set_(self, name, tuple(float(v) for v in getattr(self, name)))
        if self.t_merger is None:
            set_(self, "t_merger", (0.5 * self.duration, 0.9 * self.duration))
        else:
            set_(self, "t_merger", tuple(float(v) for v in self.t_merger))
        for f in dataclasses.fields(self):  # an infinite SNR wrote NaN strain
            value = getattr(self, f.name)
            values = value if isinstance(value, tuple) else (value,)
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                raise ValueError(f"{f.name} must be finite, got {value}")
        _check_length(self.n)
        if not 0.0 <= self.signal_fraction <= 1.0:
            raise ValueError(f"signal_fraction must be in [0, 1], got {self.signal_fraction}")
        lo, hi = self.snr
        if not 0.0 < lo <= hi:
            raise ValueError(f"snr range must satisfy 0 < low <= high, got {self.snr}")
        lo, hi = self.mass_range
        if not 0.0 < lo <= hi:
            raise ValueError(f"mass_range must satisfy 0 < low <= high, got {self.mass_range}")
        lo, hi = self.t_merger
        if not 0.0 <= lo <= hi <= self.duration:
            raise ValueError(f"t_merger must lie inside the segment, got {self.t_merger}")
        if not isinstance(self.psd, str):
            raise TypeError(
                "simulate takes a named PSD ('aligo' or 'lal:<name>') so it can be stored"
            )
        if not 0 <= self.seed < 2**63:
            raise ValueError("seed must be in [0, 2**63)")

    @property
    def n(self) -> int:
        return int(round(self.duration * self.sample_rate))

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["format_version"] = FORMAT_VERSION
        d["n"] = self.n
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SimulationConfig:
        d = json.loads(text)
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})


def event_seeds(seed: int, start: int, stop: int) -> np.ndarray:
    """Seeds of events ``start..stop-1`` of run ``seed``: int64 in [0, 2**63).

    splitmix64 of ``seed * 0xBF58476D1CE4E5B9 + (i + 1) * golden``, top 63 bits:
    distinct, well-mixed seeds for every (run, event), computed without a loop.
    """
    with np.errstate(over="ignore"):
        i = np.arange(start, stop, dtype=np.uint64) + np.uint64(1)
        z = np.uint64(seed) * np.uint64(0xBF58476D1CE4E5B9) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(1)).astype(np.int64)


class _Generator:
    """Per-configuration constants (PSD, filters) and the vectorised event pipeline."""

    def __init__(self, config: SimulationConfig):
        self.config = config
        n, fs = config.n, config.sample_rate
        self.dt = 1.0 / fs
        self.psd_grid = psd_on_grid(config.psd, n, fs)
        self.filter = whitening_filter(n, fs, config.psd, config.band)
        mask = band_mask(n, fs, config.band)
        # optimal SNR^2 = sum_k snr_weight_k |rfft(h)_k|^2
        self.snr_weight = np.where(mask, 2.0 * self.dt / n * bin_weights(n) / self.psd_grid, 0.0)

    # events are made in slices of this many: arrays stay a few MB, which the
    # allocator reuses; fresh 30 MB arrays cost more in page faults than in FFTs
    SLICE = 256

    # True: the whitened signal alone (the noise left out), for plots of what was injected
    signal_only = False

    def events(self, seeds: np.ndarray) -> dict[str, np.ndarray]:
        seeds = np.asarray(seeds, dtype=np.int64)
        if len(seeds) <= self.SLICE:
            return self._slice(seeds)
        out = None
        for i in range(0, len(seeds), self.SLICE):
            part = self._slice(seeds[i : i + self.SLICE])
            if out is None:
                out = {k: np.empty((len(seeds), *v.shape[1:]), v.dtype) for k, v in part.items()}
            for k, v in part.items():
                out[k][i : i + len(v)] = v
        return out

    def _slice(self, seeds: np.ndarray) -> dict[str, np.ndarray]:
        c = self.config
        n, b = c.n, len(seeds)
        nf = n // 2 + 1
        u = np.empty((b, 6))
        z = np.empty((b, nf, 2), dtype=np.float32)  # float32 normals: half the drawing time
        for j, s in enumerate(seeds.tolist()):
            rng = np.random.default_rng(s)
            rng.random(out=u[j])
            rng.standard_normal(out=z[j], dtype=np.float32)
        label = (u[:, 0] < c.signal_fraction).astype(np.int32)
        ma = c.mass_range[0] + (c.mass_range[1] - c.mass_range[0]) * u[:, 1]
        mb = c.mass_range[0] + (c.mass_range[1] - c.mass_range[0]) * u[:, 2]
        m1, m2 = np.maximum(ma, mb), np.minimum(ma, mb)
        t_merger = c.t_merger[0] + (c.t_merger[1] - c.t_merger[0]) * u[:, 3]
        phase = 2.0 * np.pi * u[:, 4]
        snr = c.snr[0] + (c.snr[1] - c.snr[0]) * u[:, 5]

        spec = spectrum_from_normals(z, self.psd_grid, n, self.dt)
        if self.signal_only:
            spec[:] = 0
        sig = np.flatnonzero(label)
        if sig.size:
            h = waveform(
                m1[sig], m2[sig], t_merger[sig], phase[sig], n=n, sample_rate=c.sample_rate,
                approximant=c.approximant, f_lower=c.f_lower, taper=c.taper,
            )  # fmt: skip
            hf = np.fft.rfft(h, axis=-1)
            rho = np.sqrt(np.sum(self.snr_weight * (hf.real**2 + hf.imag**2), axis=-1))
            if np.any(rho <= 0):
                bad = sig[rho <= 0][0]
                raise RuntimeError(f"event with seed {seeds[bad]} has no signal power in the band")
            spec[sig] += hf * (snr[sig] / rho)[:, None]
        strain = np.fft.irfft(spec * self.filter, n=n, axis=-1).astype(np.float32)
        noise_only = label == 0
        for arr in (snr, m1, m2, t_merger):
            arr[noise_only] = 0.0
        return {
            "strain": strain,
            "label": label,
            "snr": snr.astype(np.float32),
            "m1": m1.astype(np.float32),
            "m2": m2.astype(np.float32),
            "t_merger": t_merger.astype(np.float32),
            "seed": np.asarray(seeds, dtype=np.int64),
        }


def generate_events(seeds, config: SimulationConfig | None = None, workers: int = 1) -> dict:
    """Events with the given per-event ``seeds`` (int64), as :func:`simulate` writes them.

    Returns a dict of numpy arrays keyed by branch name (``strain``: float32 (B, n)).
    ``workers``: processes generating them (the same events whatever the number).
    """
    config = config or SimulationConfig()
    seeds = np.atleast_1d(np.asarray(seeds, dtype=np.int64))
    step = 4 * _Generator.SLICE
    chunks = [seeds[i : i + step] for i in range(0, len(seeds), step)]
    if min(workers, len(chunks)) <= 1:
        return _Generator(config).events(seeds)
    parts = list(_chunk_results(config, chunks, workers))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def injected_signals(seeds, config: SimulationConfig) -> np.ndarray:
    """The whitened signal that :func:`simulate` injected into the events of ``seeds``, without
    the noise (zeros for noise-only events): float32 (B, n). Same SNR scaling and whitening."""
    gen = _Generator(config)
    gen.signal_only = True
    return gen.events(np.atleast_1d(np.asarray(seeds, dtype=np.int64)))["strain"]


_WORKER: _Generator | None = None


def _worker_init(config_json: str, parent: int) -> None:
    global _WORKER
    _die_with_parent(parent)
    # Ctrl-C reaches the whole process group: the parent stops the workers, which must not
    # each print a KeyboardInterrupt traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a forked worker inherits the parent's SIGTERM handler, which raises SystemExit; the
    # pool's worker loop catches that around each chunk and goes on, so the parent's
    # terminate() could not stop it and shutdown() waited forever (seen in CI)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER = _Generator(SimulationConfig.from_json(config_json))


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel sends this process SIGKILL when its parent dies (a killed
    ``simulate`` left its workers running, 200 MB each)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _worker_chunk(seeds: np.ndarray) -> dict[str, np.ndarray]:
    assert _WORKER is not None
    return _WORKER.events(seeds)


def _compression(spec):
    """uproot compression object from 'none', 'lz4', 'zlib', 'lzma', 'zstd' with optional ':level'."""
    import uproot

    if spec is None or spec == "none":
        return None
    if not isinstance(spec, str):
        return spec
    name, _, level = spec.partition(":")
    cls = {"lz4": uproot.LZ4, "zlib": uproot.ZLIB, "lzma": uproot.LZMA, "zstd": uproot.ZSTD}.get(
        name.lower()
    )
    if cls is None:
        raise ValueError(f"unknown compression {spec!r}: none, lz4, zlib, lzma, zstd[:level]")
    return cls(int(level)) if level else cls(1)


def compression_name(spec) -> str:
    """A compression setting as ``name:level`` (``none``): what :func:`file_compression` reads."""
    comp = _compression(spec)
    return "none" if comp is None else f"{type(comp).__name__.lower()}:{comp.level}"


def file_compression(path) -> str:
    """The compression a ROOT file was written with, as :func:`compression_name` names it."""
    import uproot

    with uproot.open(path) as f:
        comp = f.file.compression
    return "none" if comp is None else f"{type(comp).__name__.lower()}:{comp.level}"


@dataclasses.dataclass
class SimulationResult:
    path: Path
    n_events: int
    seconds: float

    @property
    def events_per_second(self) -> float:
        return self.n_events / self.seconds if self.seconds > 0 else float("inf")


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def simulate(
    path,
    n_events: int,
    seed: int = 0,
    snr: tuple[float, float] = (5.0, 20.0),
    signal_fraction: float = 0.5,
    *,
    duration: float = 1.0,
    sample_rate: float = 2048.0,
    mass_range: tuple[float, float] = (5.0, 95.0),
    t_merger: tuple[float, float] | None = None,
    approximant: str = BUILTIN,
    psd: str = "aligo",
    band: tuple[float, float] = DEFAULT_BAND,
    f_lower: float = 15.0,
    taper: float = 0.1,
    compression: str | None = "lz4",
    chunk_size: int = 1024,
    workers: int | None = None,
    progress: bool | None = None,
    client=None,
) -> SimulationResult:
    """Write ``n_events`` simulated, whitened segments to the ROOT file ``path``.

    See the module docstring for the physics and the file layout. Same
    arguments (apart from ``chunk_size``, ``workers``, ``progress``) give the
    same file contents. The file is written chunk by chunk (``chunk_size``
    events, one basket per branch per chunk: 1024 events make 8 MB baskets,
    which uproot reads twice as fast as 2 MB ones; smaller chunks cost the
    writer less CPU, see docs/gw.md) to a temporary name in the same
    directory and renamed to ``path`` only when complete; on any error or
    interrupt the temporary file is removed and ``path`` is left untouched.

    ``compression``: ``"lz4"`` (default), ``"none"``, ``"zlib"``, ``"lzma"``, ``"zstd"``,
    optionally ``":<level>"``. LZ4 blocks carry a checksum, so a corrupted label, SNR or
    seed is refused on reading; whitened strain does not compress, and a basket that does
    not shrink is stored as it is, without one. ZLIB (Adler-32 in every block, strain
    shrinks by 7 %) detects corruption in the strain too, at a cost in speed (docs/gw.md).
    ``workers``: processes generating chunks (default: the usable cores;
    1 = in this process). ``progress``: tqdm bar (default: when stderr is a tty).
    ``client``: a ``dask.distributed.Client`` whose workers generate the chunks instead (this
    process still writes the file: the same events).
    """
    import uproot
    from tqdm.auto import tqdm

    if n_events < 1:
        raise ValueError("n_events must be at least 1")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if not 0 <= seed < 2**63:  # as the readers take it; event_seeds computes in 64 bits
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    config = SimulationConfig(
        seed=int(seed), duration=duration, sample_rate=sample_rate, snr=snr,
        signal_fraction=signal_fraction, mass_range=mass_range, t_merger=t_merger,
        approximant=approximant, psd=psd, band=band, f_lower=f_lower, taper=taper,
    )  # fmt: skip
    comp = _compression(compression)
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path.parent}: no such directory (create it first)")
    _remove_stale_partials(path)
    n = config.n
    workers = _default_workers() if workers is None else max(1, int(workers))
    chunks = [(i, min(i + chunk_size, n_events)) for i in range(0, n_events, chunk_size)]
    workers = min(workers, len(chunks))
    if progress is None:
        progress = sys.stderr.isatty()

    tmp = _partial_name(path, os.getpid(), uuid.uuid4().hex[:12])
    t0 = time.perf_counter()
    restore = _terminate_like_interrupt()
    try:
        with uproot.recreate(tmp, compression=comp) as f:
            tree = f.mktree(
                "events",
                {
                    "strain": np.dtype((np.float32, (n,))),
                    "label": np.int32,
                    "snr": np.float32,
                    "m1": np.float32,
                    "m2": np.float32,
                    "t_merger": np.float32,
                    "seed": np.int64,
                },
                title="rootclad GW events: whitened strain",
            )
            with tqdm(total=n_events, unit="ev", disable=not progress, desc=path.name) as bar:
                if client is not None:
                    results = _dask_chunks(client, config, chunks, path)
                else:
                    seeds = [event_seeds(config.seed, a, b) for a, b in chunks]
                    results = _chunk_results(config, seeds, workers)
                for data in results:
                    tree.extend(data)
                    bar.update(len(data["label"]))
            f["config"] = config.to_json()
            psd_tree = f.mktree("psd", {"frequency": np.float64, "psd": np.float64},
                                title="one-sided PSD used for noise, SNR and whitening")  # fmt: skip
            psd_tree.extend(
                {
                    "frequency": rfft_frequencies(n, config.sample_rate),
                    "psd": _Generator(config).psd_grid,
                }
            )
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename is None:  # uproot's writes name no file (a full disk)
            if err.errno is None:  # a message alone: keep it, with the file
                raise OSError(f"{path}: {err}") from err
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        restore()
    return SimulationResult(path, n_events, time.perf_counter() - t0)


def _partial_name(path: Path, pid: int, tag: str) -> Path:
    """The temporary file a run writes before renaming it to ``path``: named by the host and
    process that write it, so a later run can tell a dead writer's file from a live one."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{pid}.{tag}.partial")


def _remove_stale_partials(path: Path) -> None:
    """Delete the temporary files of earlier runs on this host whose process is gone (a
    SIGKILL leaves no chance to clean up)."""
    host = socket.gethostname()
    for partial in path.parent.glob(f".{path.name}.{host}.*.partial"):
        pid = partial.name[len(f".{path.name}.{host}.") :].split(".")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            partial.unlink(missing_ok=True)
        except PermissionError:  # alive, someone else's
            pass


def _terminate_like_interrupt():
    """While a file is written, SIGTERM (a batch system's kill, ``kill PID``) unwinds like
    Ctrl-C: the workers stop and the temporary file is removed. Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, old)


def _chunk_results(config: SimulationConfig, chunks, workers: int):
    """Yield the events of each chunk (an array of seeds) in order, at most ``2 * workers``
    chunks in flight."""
    if workers <= 1:
        gen = _Generator(config)
        for seeds in chunks:
            yield gen.events(seeds)
        return
    import multiprocessing as mp

    # fork: no re-import of the caller's script (spawn needs a __main__ guard there);
    # the workers only run numpy, so threads of the parent (ROOT, torch) do not matter
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init,
                               initargs=(config.to_json(), os.getpid()))  # fmt: skip
    pending = []
    finished = False
    try:
        for seeds in chunks:
            pending.append(pool.submit(_worker_chunk, seeds))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).result()
        while pending:
            yield pending.pop(0).result()
        finished = True
    finally:
        if not finished:  # interrupted: stop the workers now, not after their chunks
            if hasattr(pool, "terminate_workers"):  # Python 3.14
                pool.terminate_workers()
            else:  # no public way before: the executor's own table of processes
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.kill()
        pool.shutdown(wait=True, cancel_futures=True)


_DASK: dict = {}


def _dask_chunk(config_json: str, start: int, stop: int) -> dict[str, np.ndarray]:
    """One chunk on a Dask worker (its generator built once per configuration and process)."""
    if _DASK.get("config") != config_json:
        _DASK.update(config=config_json, gen=_Generator(SimulationConfig.from_json(config_json)))
    gen = _DASK["gen"]
    return gen.events(event_seeds(gen.config.seed, start, stop))


def _dask_chunks(client, config: SimulationConfig, chunks, path: Path):
    """Yield chunk results in order from ``client``'s workers, two per worker in flight (a
    worker that dies has its chunks rerun elsewhere by Dask; a chunk that fails is raised
    naming the file and its events)."""
    text = config.to_json()
    ahead = 2 * max(1, len(client.nthreads()))
    queue, pending = list(chunks), []
    try:
        while queue or pending:
            while queue and len(pending) < ahead:
                start, stop = queue.pop(0)
                f = client.submit(_dask_chunk, text, start, stop, pure=False)
                pending.append((f, (start, stop)))
            f, (start, stop) = pending.pop(0)
            try:
                data = f.result()
            except Exception as err:
                raise RuntimeError(f"{path}: generating events {start}..{stop - 1} on a Dask "
                                   f"worker failed: {type(err).__name__}: {err}") from err  # fmt: skip
            f.release()
            yield data
    finally:
        client.cancel([f for f, _ in pending])


def read_config(path) -> SimulationConfig:
    """The :class:`SimulationConfig` stored in a file written by :func:`simulate`."""
    import uproot

    with uproot.open(path) as f:
        if "config" not in f:
            raise KeyError(f"{path}: no 'config' object (not written by rootclad.gw.simulate?)")
        return SimulationConfig.from_json(str(f["config"]))


def read_psd(path) -> tuple[np.ndarray, np.ndarray]:
    """``(frequency, psd)`` stored in a file written by :func:`simulate`."""
    import uproot

    with uproot.open(path) as f:
        t = f["psd"]
        return t["frequency"].array(library="np"), t["psd"].array(library="np")
