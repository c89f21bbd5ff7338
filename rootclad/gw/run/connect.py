"""Connecting to Dask workers for ``rootclad gw run`` and ``rootclad gw background``: a
client of a scheduler, checked to have workers that run this rootclad."""

from __future__ import annotations

from rootclad.gw.run.config import ConfigError


def worker_version() -> str:
    from rootclad.version import __version__

    return __version__


def _dask():
    try:
        import dask.distributed as distributed
    except ImportError:
        raise ConfigError("--workers and --scheduler need dask's distributed scheduler (pip "
                          "install 'rootclad[dask]', or dask distributed)") from None  # fmt: skip
    return distributed


def dask_client(address: str, timeout: float):
    """A client of the scheduler at ``address`` whose workers run this rootclad; a clear error
    when dask is missing, the scheduler does not answer within ``timeout`` seconds, it has no
    workers, or they lack rootclad or run another version."""
    distributed = _dask()
    try:
        client = distributed.Client(address, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as err:
        raise ConfigError(f"the Dask scheduler at {address} did not answer within {timeout:g} s "
                          f"({type(err).__name__}: {err})") from None  # fmt: skip
    try:
        check_workers(client, address)
    except BaseException:
        client.close()
        raise
    return client


def check_workers(client, address: str) -> None:
    from rootclad.version import __version__

    try:
        seen = client.run(worker_version, wait=True)
    except Exception as err:  # a worker without rootclad cannot even unpickle the call
        raise ConfigError(f"the workers of {address} cannot run rootclad ({err})") from None
    wrong = {w: v for w, v in seen.items() if v != __version__}
    if wrong:
        raise ConfigError(f"workers with another rootclad than this one ({__version__}): "
                          + ", ".join(f"{w}: {v}" for w, v in sorted(wrong.items())))  # fmt: skip
    if not seen:
        raise ConfigError(f"the Dask scheduler at {address} has no workers")
