"""The distributed route of ``rootclad gw run`` (``--workers N``, ``--scheduler ADDRESS``).

The work runs on the workers of a ``dask.distributed`` cluster: ``N`` local worker processes
(a ``LocalCluster``, one thread each) or the workers of a running scheduler (a batch farm's,
``docs/distributed.md``). The run's stages then go as follows:

- **simulate**: the chunks of each data file are generated on the workers from their events'
  seeds; this process writes the file, which therefore holds the same events as a
  single-process run's;
- **train**: one rank per worker under ``torch.distributed`` (gloo), joined at the first
  chosen worker's host: :class:`rootclad.distributed.DataParallel`, readers sharded by rank,
  ``batch_size`` the global batch (``batch_size / N`` per rank), the checkpoint written by
  rank 0 after each epoch (``--resume`` continues from it with any number of ranks); rank 0's
  epoch lines are shown here;
- **score**: the test file is cut into entry ranges; each task scores its range with the
  network (the trained weights, sent once) and the matched filter (the template bank);
- the evaluation, saliency, export, ROOT and ONNX stages run in this process (seconds).

The workers read the data files and rank 0 writes the checkpoint: the output directory must
be on a file system the workers see (checked before any work). A worker that dies stops the
run with its name; ``--resume`` continues training from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from rootclad.gw.run.config import ConfigError
from rootclad.gw.run.connect import _dask, check_workers, dask_client, workers_of

# seconds a rank waits for the others at a collective call before it gives up (a dead rank)
COLLECTIVE_TIMEOUT = 600
SCORE_STEP = 2048  # test events per scoring task


@contextlib.contextmanager
def cluster(cfg, timeout: float = 10.0):
    """The run's Dask client: ``cfg.workers`` local worker processes, or the scheduler at
    ``cfg.scheduler``; None for a single-process run."""
    if not cfg.scheduler and cfg.workers <= 1:
        yield None
        return
    if cfg.scheduler:
        client = dask_client(cfg.scheduler, timeout)
        try:
            have = len(workers_of(client))
            if cfg.workers > have:
                raise ConfigError(f"workers = {cfg.workers}, but the scheduler at "
                                  f"{cfg.scheduler} has {have}")  # fmt: skip
            ranks_of(client, cfg)  # the global batch splits over them: checked before any work
            yield client
        finally:
            client.close()
        return
    from rootclad.gw.dataset import _default_workers

    distributed = _dask()
    threads = max(1, _default_workers() // cfg.workers)  # the cores this process may use
    env = {"ROOTCLAD_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    with (
        distributed.LocalCluster(n_workers=cfg.workers, threads_per_worker=1, processes=True,
                                 dashboard_address="127.0.0.1:0", env=env) as lc,
        distributed.Client(lc) as client,
    ):  # fmt: skip
        check_workers(client, "the local cluster")
        yield client


def ranks_of(client, cfg) -> list[str]:
    """The workers that train, one rank each, in rank order (all the scheduler's workers, or
    the first ``cfg.workers``); ``batch_size`` must split evenly over them."""
    addresses = workers_of(client)
    if cfg.workers > 0:
        addresses = addresses[: cfg.workers]
    if cfg.batch_size % len(addresses):
        raise ConfigError(f"batch_size ({cfg.batch_size}) is the global batch: it must split "
                          f"evenly over the {len(addresses)} ranks")  # fmt: skip
    return addresses


def _sees(path: str) -> str:
    """What a worker lacks of the output directory that holds ``path``: "" (nothing), "see"
    or "write"."""
    if not os.path.exists(path):
        return "see"
    try:
        fd, mine = tempfile.mkstemp(prefix=".rootclad-write-", dir=os.path.dirname(path))
        os.close(fd)
        os.unlink(mine)
    except OSError:
        return "write"
    return ""


def check_shared(client, out: Path) -> None:
    """Every worker must see the output directory and write there (the ranks read the data
    files there, rank 0 writes the checkpoint): a file written here is looked for on each, and
    each writes one, before any work."""
    fd, probe = tempfile.mkstemp(prefix=".rootclad-shared-", dir=out)
    os.close(fd)
    try:
        seen = client.run(_sees, str(Path(probe).resolve()), wait=True)
    finally:
        os.unlink(probe)
    for lack, why in (("see", "must be on a file system every worker mounts at the same path"),
                      ("write", "every worker must be able to write there")):  # fmt: skip
        bad = sorted(w for w, got in seen.items() if got == lack)
        if bad:
            raise ConfigError(f"the workers {', '.join(bad)} cannot {lack} into the output "
                              f"directory {out.resolve()}: it {why}")  # fmt: skip


# -- training: one rank per worker -------------------------------------------------------------
def _free_port() -> int:
    from rootclad.torch.distributed import _free_port as free

    return free()


def _log_line(topic: str, line: str) -> None:
    from distributed import get_worker

    get_worker().log_event(topic, line)


def _gloo_interface(host: str) -> None:
    """Gloo takes the address it offers the other ranks from the host name, which may resolve
    to a loopback address (127.0.1.1 on Debian) on a farm node: the network interface that
    holds the Dask worker's own address is named instead (``GLOO_SOCKET_IFNAME``, unless set)."""
    if "GLOO_SOCKET_IFNAME" in os.environ or host.startswith("127.") or host in ("::1", ""):
        return
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == host for a in addrs):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def train_rank(rank: int, world: int, master: str, port: int, job: dict) -> dict:
    """One rank of the run's training (on a worker): what :func:`rootclad.gw.run.train.train`
    does in one process, data-parallel."""
    import tomllib
    import torch.distributed as dist

    import rootclad
    from rootclad.gw.run.config import resolve
    from rootclad.gw.run.train import _shape, batches, compile_model, resume_state
    from rootclad.torch.distributed import DataParallel, save_checkpoint
    from rootclad.torch.fit import fit

    cfg = resolve(**tomllib.loads(job["config"]))
    out = Path(job["out"])
    if dist.is_initialized():  # a rank of an earlier run still waits here (see cluster.train)
        raise RuntimeError(f"this worker process is still in another training's process group "
                           f"(a rank of a failed run waits up to {COLLECTIVE_TIMEOUT} s at its "
                           "next all-reduce); restart the workers or wait")  # fmt: skip
    _gloo_interface(job["hosts"][rank])
    host = f"[{master}]" if ":" in master else master  # IPv6
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))  # fmt: skip
    try:
        cm = compile_model(cfg)
        dp = DataParallel(cm)
        opt = rootclad.optim.Adam(cm, lr=cfg.lr)
        shard = {"rank": rank, "world_size": world}
        tr = batches([job["train"]], cfg, batch_size=cfg.batch_size // world, **shard)
        va = batches([job["val"]], cfg, batch_size=1024, shuffle=False, **shard)
        log = (lambda line: _log_line(job["topic"], line)) if rank == 0 else None
        ckpt = out / "checkpoint.pt"
        state = resume_state(cfg, ckpt, job["resume"], log or (lambda line: None))

        def save(s) -> None:
            save_checkpoint({"config": cfg.to_toml(), **s.checkpoint()}, ckpt)

        result = fit(dp, opt, tr, epochs=cfg.epochs, validation=va, patience=cfg.patience,
                     transform=lambda x: _shape(cfg, x), progress=False, log=log,
                     on_epoch_end=save, resume=state)  # fmt: skip
        weights = {k: v.detach().cpu().numpy() for k, v in cm.state_dict().items()}
        return {"rank": rank, "engine": cm.engine, "history": result.history, "best_epoch": result.best_epoch,
                "stopped_early": result.stopped_early, "resumed_from": result.resumed_from,
                "weights": weights if rank == 0 else None, "timings": dict(dp.timings)}  # fmt: skip
    finally:
        dist.destroy_process_group()


def train(client, cfg, train_file: Path, val_file: Path, out: Path, *, resume: bool, log):
    """The run's training on one rank per worker; a TrainResult as the single-process one."""
    import torch
    from distributed.comm import get_address_host

    from rootclad.gw.run.train import TrainResult, compile_model

    ranks = ranks_of(client, cfg)
    world = len(ranks)
    out.mkdir(parents=True, exist_ok=True)
    # compiled here first: the ranks find the library in the cache instead of all building it
    cm = compile_model(cfg)
    master = get_address_host(ranks[0])
    port = client.run(_free_port, workers=[ranks[0]])[ranks[0]]
    topic = f"rootclad-train-{uuid.uuid4().hex[:12]}"
    job = {"config": cfg.to_toml(), "train": str(Path(train_file).resolve()),
           "val": str(Path(val_file).resolve()), "out": str(out.resolve()), "resume": resume,
           "topic": topic, "hosts": [get_address_host(w) for w in ranks]}  # fmt: skip
    log(f"training on {world} ranks ({cfg.batch_size // world} events per rank and step): "
        + ", ".join(ranks))  # fmt: skip
    futures = [client.submit(train_rank, r, world, master, port, job, workers=[w],
                             allow_other_workers=False, pure=False, retries=0,
                             key=f"{topic}-rank{r}")
               for r, w in enumerate(ranks)]  # fmt: skip
    results = _wait_ranks(client, futures, ranks, topic, log)
    r0 = results[0]
    state = cm.state_dict()
    cm.load_state_dict({k: torch.from_numpy(np.asarray(r0["weights"][k])).reshape(v.shape)
                        .to(v.dtype) for k, v in state.items()})  # fmt: skip
    return TrainResult(cm, r0["engine"], r0["history"], r0["best_epoch"], r0["stopped_early"],
                       r0["resumed_from"], world, [r["timings"] for r in results])  # fmt: skip


def _wait_ranks(client, futures, ranks, topic, log) -> list[dict]:
    """The ranks' results; rank 0's log lines shown as they come. A rank that fails or whose
    worker dies stops the wait with its name (the others are cancelled)."""
    shown = 0
    try:
        while True:
            events = client.get_events(topic)
            for _, line in events[shown:]:
                log(line)
            shown = len(events)
            failed = [r for r, f in enumerate(futures) if f.status in ("error", "cancelled")]
            if failed:
                # a dead rank makes the others fail at their next collective call: name it
                for _ in range(25):
                    if _gone(client, ranks):
                        break
                    time.sleep(0.2)
                r = failed[0]
                err = futures[r].exception() if futures[r].status == "error" else None
                why = f"{type(err).__name__}: {err}" if err is not None else "cancelled"
                _raise_gone(client, ranks, f" (rank {r} then failed: {why})")
                raise RuntimeError(f"training rank {r} on {ranks[r]} failed: {why} (rerun with "
                                   "--resume to continue from the last checkpoint)") from err  # fmt: skip
            if all(f.status == "finished" for f in futures):
                break
            _raise_gone(client, ranks, "")
            time.sleep(0.2)
        results = client.gather(futures)
        for _, line in client.get_events(topic)[shown:]:
            log(line)
        return results
    finally:
        client.cancel([f for f in futures if f.status != "finished"])


def _gone(client, ranks) -> list[tuple[int, str]]:
    alive = set(workers_of(client))
    return [(r, w) for r, w in enumerate(ranks) if w not in alive]


def _raise_gone(client, ranks, then: str) -> None:
    gone = _gone(client, ranks)
    if gone:
        r, w = gone[0]
        raise RuntimeError(f"the worker of training rank {r} ({w}) died{then}; rerun with "
                           "--resume to continue from the last checkpoint")  # fmt: skip


# -- scoring the test file -------------------------------------------------------------------
def score_range(spec: dict, path: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """The network's logit and the matched-filter SNR of test entries ``start..stop-1``."""
    import uproot

    from rootclad.gw.matched_filter import matched_filter_snr
    from rootclad.gw.run.background import scorer
    from rootclad.gw.run.train import scores

    cfg, cm, bank, _ = scorer(spec, 1)
    with uproot.open(path) as f:
        x = f["events"]["strain"].array(entry_start=start, entry_stop=stop, library="np")
    x = np.ascontiguousarray(x.reshape(len(x), 1, -1), dtype=np.float32)
    return scores(cm, cfg, x), matched_filter_snr(x, bank, workers=1).snr


def score_test(client, spec: dict, test_file: Path, progress: bool) -> tuple[np.ndarray, ...]:
    """Both statistics of every test event (network, matched filter), range by range on the
    workers, in entry order; a failed range is raised naming its entries."""
    from tqdm.auto import tqdm

    from rootclad.gw.run.inputs import _entries

    n = _entries(test_file)
    ranges = [(lo, min(lo + SCORE_STEP, n)) for lo in range(0, n, SCORE_STEP)]
    (shared,) = client.scatter([spec], broadcast=True)
    path = str(Path(test_file).resolve())
    futures = [client.submit(score_range, shared, path, lo, hi, pure=False) for lo, hi in ranges]
    net, mf = [], []
    try:
        with tqdm(total=n, unit="ev", disable=not progress, desc="score on the workers") as bar:
            for f, (lo, hi) in zip(futures, ranges, strict=True):
                try:
                    a, b = f.result()
                except Exception as err:
                    raise RuntimeError(f"{test_file}: scoring entries {lo}..{hi - 1} on the "
                                       f"workers failed: {type(err).__name__}: {err}") from err  # fmt: skip
                f.release()
                net.append(a)
                mf.append(b)
                bar.update(hi - lo)
    finally:
        client.cancel(futures)
    return np.concatenate(net), np.concatenate(mf)
