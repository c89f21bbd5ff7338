"""An exported model on Dask workers (or Spark executors): shipped, checked, opened once per
worker process.

Used by ``define_score`` / ``define_saliency`` on a distributed RDataFrame
(``ROOT.RDataFrame(tree, files, executor=client)``) and by :func:`rootclad.root.score_files`.

- **Shipped**: the export's ``STEM.so`` and ``STEM.root`` are copied to a private directory
  of this process under a name made of their content's hash (``rootclad_<hash>``: two exports
  named alike in different directories never overwrite each other on a worker), with this
  rootclad's C++ host as ``rootclad_<hash>.h`` (an export's own ``STEM.h`` may be of an older
  rootclad, which the workers' would refuse), and sent with ROOT's ``ROOT.RDF.Distributed.DistributeFiles`` / ``DistributeHeaders``
  (Dask's ``Client.upload_file`` underneath, into each worker's ``local_directory``, also to
  workers that join later; Spark's ``SparkContext.addFile``, into each executor's
  ``SparkFiles`` directory); ``score_files`` uploads the same files itself.
- **Opened** on each worker by :func:`open_on_worker`, run by ``ROOT.RDF.Distributed.
  initialize`` before each task (or by ``score_files``' task): the files found in the
  worker's directory are checked against the hash, copied beside it (Dask writes an upload
  over the old file in place, which a loaded library must never see) and opened once per
  process (``rootclad::open_shipped``). A Define finds the model through the hash as a number,
  ``rootclad::shipped_model(<id>ull)``, one Model per thread: the stem reaches C++ as a value,
  never as source text.
- **Checked** first (:func:`check_workers`): every worker imports the same rootclad, with the
  same C++ headers (``headers_id``), and has ROOT; each task checks again (workers that joined
  later).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from rootclad import version
from rootclad.data.cling import CLING_LOCK, declare_header, import_root
from rootclad.root.errors import ExportError, cpp_errors

_LOCK = threading.Lock()
_STAGE: list[Path] = []  # this process's private directory of shipped copies, made on first use


@dataclass(frozen=True)
class Shipped:
    """An export as shipped: ``name`` (``rootclad_<hash>``, its files' name on a worker),
    ``id`` (the hash as a number, for C++), ``digest`` (sha256 of its ``.so`` and ``.root``) and
    ``local`` (the stem of this process's copy)."""

    name: str
    id: int
    digest: str
    local: str


def _digest(stem: str) -> str:
    h = hashlib.sha256()
    for ext in (".so", ".root"):
        with open(stem + ext, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _stage_dir() -> Path:
    with _LOCK:
        if not _STAGE:
            d = Path(tempfile.mkdtemp(prefix="rootclad-ship-"))  # mode 0700, ours alone
            atexit.register(shutil.rmtree, d, True)
            _STAGE.append(d)
        return _STAGE[0]


def _copy(src: Path, dst: Path) -> None:
    """``dst`` whole or not at all (a copy under a temporary name, then renamed)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


@functools.lru_cache(maxsize=64)
def _ship_cached(stem: str, files: tuple) -> Shipped:
    digest = _digest(stem)
    name = "rootclad_" + digest[:16]
    d = _stage_dir()
    for ext in (".so", ".root"):
        if not (d / (name + ext)).exists():
            _copy(Path(stem + ext), d / (name + ext))
    header = d / (name + ".h")
    if not header.exists():
        tmp = header.with_name(f".{header.name}.{os.getpid()}.{threading.get_ident()}.partial")
        tmp.write_text(_host())
        os.replace(tmp, header)
    return Shipped(name, int(digest[:15], 16), digest, str(d / name))


@functools.lru_cache(maxsize=1)
def _host() -> str:
    from rootclad.codegen.standalone import amalgamate
    from rootclad.paths import get_include

    body = amalgamate('#include "rootclad/model.h"\n', Path(get_include()) / "rootclad")
    return f"// rootclad {version.__version__}'s C++ host, shipped to Dask workers\n{body}\n"


def ship(stem: str) -> Shipped:
    """This process's content-named copy of the export ``stem`` (made once per version)."""
    for ext in (".so", ".root"):
        if not os.path.exists(stem + ext):
            raise FileNotFoundError(f"{stem}{ext}: no such file (write it with cm.export)")
    # a replacement by rename is a new inode (it may keep its old modification time)
    stats = [os.stat(stem + ext) for ext in (".so", ".root")]
    return _ship_cached(stem, tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats))


def expected() -> tuple[str, str]:
    """What every worker must have: this rootclad's version and its C++ headers' fingerprint."""
    return version.__version__, _headers_id()


@functools.lru_cache(maxsize=1)
def _headers_id() -> str:
    from rootclad.root.export import headers_id

    return headers_id()


# Evaluated on each worker by builtins' eval: it runs where rootclad cannot be imported too.
_PROBE = (
    "(__import__('rootclad.version', fromlist=['__version__']).__version__, "
    "__import__('rootclad.root.export', fromlist=['headers_id']).headers_id(), "
    "__import__('importlib.util', fromlist=['find_spec']).find_spec('ROOT') is not None)"
)


def check_workers(client, what: str) -> int:
    """Raise RuntimeError naming each worker of ``client`` that has no rootclad, another
    rootclad (version or C++ headers) or no ROOT; returns the number of workers checked (0:
    none yet, as on a batch farm before its jobs start; each task checks its worker again)."""
    want = expected()
    results = client.run(eval, _PROBE, on_error="return")
    problems = []
    for addr, got in sorted(results.items()):
        if isinstance(got, BaseException):
            problems.append(f"{addr}: cannot import rootclad ({type(got).__name__}: {got})")
        elif not got[2]:
            problems.append(f"{addr}: cannot import ROOT")
        elif tuple(got[:2]) != want:
            problems.append(f"{addr}: rootclad {got[0]} (C++ headers {got[1]})")
    if problems:
        raise RuntimeError(
            f"{what}: Dask workers that cannot run this model: {'; '.join(problems)}. This "
            f"process has rootclad {want[0]} (C++ headers {want[1]}): install the same "
            "rootclad (and ROOT) on every worker"
        )
    return len(results)


# --- on a worker ---------------------------------------------------------------------------

_OPENED: dict[int, str] = {}  # model id -> the stem opened in this process
_OPEN_COUNT: dict[int, int] = {}  # how many times this process opened each model (tests)


def current_worker():
    """The Dask worker running the calling task; None elsewhere (the client)."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def _spark_task():
    """The Spark task running the calling code (on an executor); None elsewhere."""
    import sys

    if "pyspark" not in sys.modules:  # never imported here: not an executor
        return None
    from pyspark import TaskContext

    return TaskContext.get()


def _place() -> tuple[str, Path] | None:
    """``(name, directory)`` of the worker running the calling task, the directory where the
    distributed files arrive: a Dask worker's ``local_directory``, a Spark executor's
    ``SparkFiles`` root; None in the client."""
    worker = current_worker()
    if worker is not None:
        return f"the Dask worker {worker.address}", Path(worker.local_directory)
    task = _spark_task()
    if task is not None:
        from pyspark import SparkFiles

        return (
            f"the Spark executor of stage {task.stageId()} partition {task.partitionId()} "
            f"(process {os.getpid()})",
            Path(SparkFiles.getRootDirectory()),
        )
    return None


def opened_here() -> dict[int, int]:
    """``{model id: times opened}`` in this process (rootclad opens each once)."""
    return dict(_OPEN_COUNT)


def _check_here(want) -> None:
    got = expected()
    if got != tuple(want):
        place = _place()
        where = place[0] if place is not None else f"process {os.getpid()}"
        raise RuntimeError(
            f"rootclad on {where} is {got[0]} (C++ headers {got[1]}); the "
            f"client's is {want[0]} ({want[1]}): install the same rootclad on every worker"
        )


def open_on_worker(model: Shipped, want) -> str:
    """Open ``model`` in this worker process, once: its files in the worker's directory, checked
    against ``model.digest``; returns the stem opened. Missing or different files raise
    FileNotFoundError / RuntimeError naming the worker and the file (ExportError: a file C++
    refuses)."""
    _check_here(want)
    with CLING_LOCK:
        if model.id in _OPENED:
            return _OPENED[model.id]
        place = _place()
        address, where = place or (f"process {os.getpid()}", Path(model.local).parent)
        found = {ext: where / (model.name + ext) for ext in (".so", ".root")}
        missing = [str(p) for p in found.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"rootclad: {address} has no {' and no '.join(missing)}: the "
                "model's files did not reach it (they are uploaded when the computation starts; "
                "a worker whose directory was cleaned meanwhile lacks them: run again)"
            )
        private = where / "rootclad-models"
        private.mkdir(exist_ok=True)
        stem = str(private / model.name)
        for ext, path in found.items():
            if not os.path.exists(stem + ext):
                _copy(path, Path(stem + ext))
        if _digest(stem) != model.digest:
            for ext in found:
                os.unlink(stem + ext)
            raise RuntimeError(
                f"rootclad: {address} holds {model.name}.so/.root of other "
                "content than the export shipped (overwritten meanwhile?): run again"
            )
        declare_header("model.h")
        root = import_root()
        with cpp_errors(ExportError):
            opened = root.rootclad.open_shipped(model.id, stem)
        if opened:
            _OPEN_COUNT[model.id] = _OPEN_COUNT.get(model.id, 0) + 1
        _OPENED[model.id] = stem
        return stem


# --- distributed RDataFrame ----------------------------------------------------------------

_MODELS: dict[int, Shipped] = {}  # shipped for distributed RDataFrames by this process
_NAMES: dict[int, str] = {}  # column lists named in their Defines


def backend_of(df):
    """The distributed backend of ``df`` (a ``ROOT.RDataFrame(..., executor=...)`` or a node
    made from one); None for an RDataFrame of this process."""
    if not type(df).__module__.startswith("ROOT._distrdf"):
        return None
    state = vars(df)
    head = state["_headnode"] if "_headnode" in state else state["proxied_node"].get_head()
    return head.backend


def setup(previous, want, models, names) -> None:
    """Run by ``ROOT.RDF.Distributed.initialize`` in each task: the set-up registered before
    rootclad's, then rootclad's models opened (once per process) and their columns' names.
    A model that cannot be opened here (its files missing, another rootclad) raises where a
    Define uses it, naming the cause; the others' Defines run on."""
    if _place() is None:
        return  # this process: ROOT runs the function here at registration; done already
    previous()
    root = import_root()
    for model in models:
        try:
            open_on_worker(model, want)
        except Exception as err:  # noqa: BLE001  (thrown by the Define that needs it)
            declare_header("model.h")
            root.rootclad.shipped_failed(model.id, f"{type(err).__name__}: {err}")
    for nid, text in names:
        root.rootclad.register_shipped_names(nid, text)


def _register(root) -> None:
    """(Re)register :func:`setup` with every model and name shipped so far, chaining the
    set-up a user registered before (ROOT keeps one initialization function)."""
    from ROOT._distrdf.Backends.Base import BaseBackend

    previous = BaseBackend.initialization
    if isinstance(previous, functools.partial) and previous.func is setup:
        previous = previous.args[0]
    root.RDF.Distributed.initialize(
        setup, previous, expected(), tuple(_MODELS.values()), tuple(_NAMES.items())
    )


def model_expr(df, stem: str, what: str) -> str:
    """For a distributed ``df``: the export shipped to its workers, its set-up registered,
    and the C++ expression of its Model in a Define (``rootclad::shipped_model(<id>ull)``)."""
    backend = backend_of(df)
    kind = type(backend).__name__
    if kind not in ("DaskBackend", "SparkBackend"):
        raise NotImplementedError(
            f"{what}: a distributed RDataFrame on {kind}: rootclad ships models to Dask "
            "workers and Spark executors (ROOT.RDataFrame(..., executor=client or "
            "sparkcontext))"
        )
    if kind == "DaskBackend":
        _checked(backend.client, what)
    # Spark runs nothing on every executor ahead of a job: each task checks its own (setup)
    model = ship(stem)
    root = import_root()
    with CLING_LOCK:
        declare_header("model.h")
        with cpp_errors(ExportError):
            root.rootclad.open_shipped(model.id, model.local)  # the client's JIT of the Define
        _MODELS[model.id] = model
        dist = root.RDF.Distributed
        dist.DistributeFiles([model.local + ".so", model.local + ".root"])
        dist.DistributeHeaders([model.local + ".h"])
        _register(root)
    return f"rootclad::shipped_model({model.id}ull)"


def names_expr(cols) -> str:
    """The columns' names for a distributed Define's messages: ``rootclad::ShippedNames``."""
    text = ",".join(cols)
    nid = int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)
    root = import_root()
    with CLING_LOCK:
        if nid not in _NAMES:
            root.rootclad.register_shipped_names(nid, text)
            _NAMES[nid] = text
            _register(root)
    return f"rootclad::ShippedNames{{{nid}ull}}"


_CHECKED: set = set()  # (scheduler, workers) checked by this process


def _checked(client, what: str) -> None:
    key = (client.scheduler.address, tuple(sorted(client.nthreads())))
    if key not in _CHECKED and check_workers(client, what):
        _CHECKED.add(key)
