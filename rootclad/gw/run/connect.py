"""Connecting to Dask workers for ``rootclad gw run`` and ``rootclad gw background``: a
client of a scheduler, checked to have workers that run this rootclad."""

from __future__ import annotations

from rootclad.gw.run.config import ConfigError


def worker_version() -> str:
    from rootclad.version import __version__

    return __version__


def _dask(what: str = "--workers and --scheduler need"):
    try:
        import dask.distributed as distributed
    except ImportError:
        raise ConfigError(f"{what} dask's distributed scheduler (pip install 'rootclad[dask]', "
                          "or dask distributed)") from None  # fmt: skip
    return distributed


def workers_of(client) -> list[str]:
    """The addresses of all of ``client``'s workers (``scheduler_info()`` lists at most five
    on some dask releases)."""
    return sorted(client.nthreads())


def dask_client(address: str, timeout: float, what: str = "--scheduler needs"):
    """A client of the scheduler at ``address`` whose workers run this rootclad; a clear error
    when dask is missing, the scheduler does not answer within ``timeout`` seconds, it has no
    workers, or they lack rootclad or run another version."""
    distributed = _dask(what)
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
    """Raise ConfigError naming each worker of ``client`` without rootclad or with another
    version than this process's, or when there is none."""
    from rootclad.version import __version__

    seen = client.run(worker_version, wait=True, on_error="return")
    if not seen:
        raise ConfigError(f"the Dask scheduler at {address} has no workers")
    problems = []
    for w, v in sorted(seen.items()):
        if isinstance(v, BaseException):  # no rootclad: the call cannot even be unpickled
            problems.append(f"{w}: cannot run rootclad ({type(v).__name__}: {v})")
        elif v != __version__:
            problems.append(f"{w}: rootclad {v}")
    if problems:
        raise ConfigError(f"workers of {address} that cannot run this rootclad "
                          f"({__version__}): " + "; ".join(problems))  # fmt: skip
