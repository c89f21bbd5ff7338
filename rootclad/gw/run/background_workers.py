"""Where a background study's tasks run (:mod:`.background`): spawned local processes or a Dask
cluster's workers. Each runner yields ``(task, result)`` as tasks finish; a failed task raises
naming it (its finished siblings are kept: a rerun runs only the missing tasks)."""

from __future__ import annotations


def run_local(run_task, spec, study, todo, workers):
    """Yield (task, result) from ``workers`` spawned processes (fresh interpreters: the
    compiled model's thread pool and torch's are not forked), one thread each."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    pending: dict = {}
    queue = list(todo)
    finished = False
    try:
        while queue or pending:
            while queue and len(pending) < 2 * workers:
                i = queue.pop(0)
                pending[_submit(pool, run_task, spec, study, i)] = i
            done, _ = wait(set(pending), return_when=FIRST_COMPLETED)
            for f in done:
                i = pending.pop(f)
                yield i, _result(f, i)
        finished = True
    finally:
        if not finished:  # stop the workers now, not after their tasks
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.kill()
        pool.shutdown(wait=True, cancel_futures=True)


def _submit(pool, run_task, spec, study, task: int):
    """Submit a task; a pool broken by a worker that died before this task was queued fails
    it the way a running task fails (named, with the same advice)."""
    try:
        return pool.submit(run_task, spec, study, task, 1)
    except Exception as err:
        raise _task_failed(task, err) from err


def _task_failed(task: int, err: BaseException) -> RuntimeError:
    return RuntimeError(
        f"background task {task} failed: {type(err).__name__}: {err} "
        "(the finished tasks are kept; run the study again to complete it)"
    )


def _result(future, task: int):
    """A task's result; its failure raised naming the task."""
    try:
        return future.result()
    except Exception as err:
        raise _task_failed(task, err) from err


def run_dask(run_task, client, spec, study, todo):
    """Yield (task, result) from the workers of the Dask ``client``."""
    from dask.distributed import as_completed

    # in a list: a dict is scattered value by value, under its keys' names
    (shared,) = client.scatter([spec], broadcast=True)
    futures = {client.submit(run_task, shared, study, i, 1, pure=False): i for i in todo}
    try:
        for f in as_completed(list(futures)):
            yield futures[f], _result(f, futures[f])
    finally:
        client.cancel(list(futures))
