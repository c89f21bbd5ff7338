"""``score_files``: an export's scores over many ROOT files, one Dask task per file.

Each task runs ``rootclad::score_tree`` on one input file and writes its friend tree to
``<file>_scores.root`` (or ``output_dir/<name>_scores.root``) through ``write_root_file``: a
temporary name renamed once whole (an RNTuple's scores as an RNTuple: ``ntuple_output``, read
back before the rename). The output records what it was made from (a TNamed
``rootclad_scoring``: the model's content hash and library MD5, the input file, tree, columns
and entry count); a rerun skips the outputs that match and scores the rest. An output already
there without that record (a file score_files did not write) is refused, unless told to
overwrite it, and an output that is an input always. A file whose task fails (a bad file, a
worker that died) is reported by name, after the other files finished, with the worker's error
as text made there.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from rootclad.data.cling import import_root
from rootclad.data.schema import check_column_name
from rootclad.paths import check_outputs
from rootclad.root import shipping
from rootclad.root.errors import ExportError, ScoringError, cpp_errors, cpp_message
from rootclad.root.ntuple_output import FORMATS, written_as
from rootclad.root.ntuple_output import output_format as output_format_of
from rootclad.root.rdf import _model_class, _stem, columns_of, model_files
from rootclad.toolchain.build import file_digest


@dataclass
class ScoredFiles:
    """What :func:`score_files` did: ``outputs`` (one per input file, in order; in a
    :class:`ScoreFilesError`, those of the files not failed only), the input files ``scored``
    by this call and those ``skipped`` (their outputs were complete)."""

    outputs: list[Path]
    scored: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)


class ScoreFilesError(RuntimeError):
    """Some files were not scored: ``failed`` maps each to the reason; ``done`` holds the
    :class:`ScoredFiles` of the others (their outputs only), which are whole. Run again to
    complete."""

    def __init__(self, failed: dict[Path, str], done: ScoredFiles):
        self.failed, self.done = failed, done
        lines = "\n".join(f"  {f}: {why}" for f, why in failed.items())
        total = len(failed) + len(done.outputs)
        super().__init__(
            f"rootclad.root.score_files: {len(failed)} of {total} files were not "
            f"scored (the others' outputs are whole; run score_files again to score these):\n"
            f"{lines}"
        )


def _distributed():
    try:
        import dask  # noqa: F401
        import distributed
    except ImportError as err:
        raise ImportError(
            f"rootclad.root.score_files needs Dask: {err.name or err} is not installed "
            "(pip install dask distributed)"
        ) from err
    return distributed


def connect(client, timeout: float):
    """``(client, owned)``: a ``distributed.Client`` as given, or one connected to the
    scheduler address given, within ``timeout`` seconds (ConnectionError naming it)."""
    distributed = _distributed()
    if isinstance(client, distributed.Client):
        return client, False
    if not isinstance(client, str):
        raise TypeError(
            f"client: a dask.distributed.Client or a scheduler address, not {type(client)}"
        )
    try:
        return distributed.Client(client, timeout=timeout), True
    except (OSError, TimeoutError) as err:
        raise ConnectionError(
            f"no Dask scheduler answers at {client} within {timeout:g} s ({err})"
        ) from err


def _output_of(file: Path, output_dir) -> Path:
    d = Path(output_dir) if output_dir is not None else file.parent
    return d / (file.stem + "_scores.root")


def _entries(file: str, tree: str) -> int:
    """The entries of the TTree or RNTuple ``tree`` of ``file`` (C++ opens it as the readers
    do: ScoringError naming the file and tree where it cannot)."""
    _model_class()  # declares model.h and its scoring.h
    with cpp_errors(ScoringError):
        return int(import_root().rootclad.entries_of(file, tree))


def recorded(output: str) -> dict | None:
    """The record of what made ``output`` (its ``rootclad_scoring``) when score_files wrote
    it; None for a file without one that reads (another program's, or damaged)."""
    root = import_root()
    try:
        f = root.TFile.Open(output)
    except OSError:  # PyROOT's TFile.Open raises where ROOT returns a null pointer
        return None
    if not f or f.IsZombie():
        return None
    try:
        named = f.Get("rootclad_scoring")
        if not named or not named.InheritsFrom("TNamed"):
            return None
        try:
            note = json.loads(str(named.GetTitle()))
        except ValueError:
            return None
        return note if isinstance(note, dict) and {"model", "input"} <= set(note) else None
    finally:
        f.Close()


def _not_ours(output: str) -> bool:
    return os.path.lexists(output) and recorded(output) is None


def complete(output: str, note: dict) -> bool:
    """Whether ``output`` holds the whole scores ``note`` describes (its record equal, its tree
    as long as the input)."""
    if not os.path.isfile(output):
        return False
    root = import_root()
    try:
        f = root.TFile.Open(output)
    except OSError:  # PyROOT's TFile.Open raises where ROOT returns a null pointer
        return False
    if not f or f.IsZombie():
        return False
    try:
        named = f.Get("rootclad_scoring")
        if not named or not named.InheritsFrom("TNamed"):
            return False
        try:
            if json.loads(str(named.GetTitle())) != note:
                return False
        except ValueError:
            return False
    finally:
        f.Close()
    try:
        return _entries(output, note["out_tree"]) == note["entries"]
    except ScoringError:  # no such tree, or one that does not read
        return False


def score_task(
    file,
    output,
    model,
    want,
    inputs,
    tree,
    out_tree,
    column,
    batch,
    library_md5,
    overwrite=False,
    output_format="ttree",
):
    """One file on a Dask worker: "skipped" when ``output`` is complete, else "scored". Its
    error reaches the client as text made here (:class:`ScoringError`, naming the file, and
    for a bad entry the branch and entry): PyROOT's exception for a C++ one holds a C++
    object, which does not survive pickling (the client read garbage or failed to decode)."""
    try:
        return _score(
            file,
            output,
            model,
            want,
            inputs,
            tree,
            out_tree,
            column,
            batch,
            library_md5,
            overwrite,
            output_format,
        )
    except Exception as err:  # noqa: BLE001  (every error, as text)
        raise _portable(err, file) from None


def _portable(err: Exception, file: str) -> Exception:
    """``err`` as an exception that pickles: rootclad's and Python's own as they are, others
    (PyROOT's) as a ScoringError of their text, which names ``file``."""
    if isinstance(err, (ScoringError, ExportError)) or type(err).__module__ == "builtins":
        return err
    message = cpp_message(err) or f"{type(err).__name__}: {err}"
    return ScoringError(message if message.startswith(file) else f"{file}: {message}")


def _score(
    file, output, model, want, inputs, tree, out_tree, column, batch, library_md5, overwrite, fmt
):
    shipping.open_on_worker(model, want)
    fmt = output_format_of(fmt, file, tree)
    st = os.stat(file)  # a file rewritten with as many entries is another input
    note = {
        "model": model.digest,
        "library_md5": library_md5,
        "input": file,
        "tree": tree,
        "inputs": inputs,
        "entries": _entries(file, tree),
        "out_tree": out_tree,
        "column": column,
        "input_size": st.st_size,
        "input_mtime_ns": st.st_mtime_ns,
        "format": fmt,
    }
    if complete(output, note):
        return "skipped"
    if not overwrite and _not_ours(output):  # appeared after the client's check
        raise FileExistsError(_foreign_message([output]))
    root = import_root()
    cols = inputs
    if not isinstance(inputs, str):
        cols = root.std.vector["std::string"]()
        for c in inputs:
            cols.push_back(str(c))
    fn = root.rootclad.score_tree
    fn.__release_gil__ = True  # the worker's heartbeats go on while C++ scores
    with cpp_errors(ExportError):
        model_here = root.rootclad.shipped_model(model.id)
    with cpp_errors(ScoringError), written_as(fmt, output, out_tree, column) as written:
        fn(model_here, file, tree, cols, written, out_tree, column, int(batch), json.dumps(note))
    return "scored"


def _foreign_message(paths) -> str:
    lines = "\n".join(
        f"  {p}: not written by score_files (it holds no rootclad_scoring record); pass "
        "overwrite=True to replace it"
        for p in paths
    )
    return (
        f"score_files: {len(paths)} output file(s) exist that score_files did not write, "
        f"which scoring would replace:\n{lines}"
    )


def _reason(err: BaseException) -> str:
    if type(err).__name__ == "KilledWorker":
        return (
            f"its worker died while scoring it (KilledWorker: {err}; Dask gives up on a task "
            "after distributed.scheduler.allowed-failures deaths)"
        )
    return f"{type(err).__name__}: {err}"


def score_files(
    files,
    stem,
    client,
    inputs=None,
    tree: str = "events",
    output_dir=None,
    out_tree: str = "scores",
    column: str = "score",
    batch_size: int | None = None,
    retries: int = 0,
    timeout: float = 10.0,
    overwrite: bool = False,
    output_format: str = "auto",
) -> ScoredFiles:
    """Score every entry of the TTree or RNTuple ``tree`` in each of ``files`` with the export
    ``stem``, one Dask
    task per file, each writing a friend tree as :func:`score_tree` does to
    ``<file>_scores.root`` (or ``output_dir/<name>_scores.root``): whole or not at all.

    ``client``: a ``dask.distributed.Client`` or a scheduler address (``"tcp://host:8786"``,
    connected within ``timeout`` seconds, closed after). The input files and ``output_dir``
    must be seen at the same paths by this process and the workers (a shared file system); the
    model's files are uploaded to the workers (``Client.upload_file``). Before any task runs:
    each worker is checked to import the same rootclad (version and C++ headers) and ROOT, and
    to hold the model's files.

    An output recording the same model, input file (path, size and modification time), tree,
    columns and entry count is skipped
    (``ScoredFiles.skipped``); others are scored again. A task that raises is retried
    ``retries`` times (default 0: a bad file fails the same way again); a task whose worker
    dies is resubmitted by Dask up to ``distributed.scheduler.allowed-failures`` times (the
    scheduler's setting, 3 by default). Files still failing raise :class:`ScoreFilesError`
    naming each, once all the others are done; a rerun scores only those.

    Before any task runs: ``column`` must be an identifier and no output may be an input or
    the model's own file (ValueError); an output already there that score_files did not write
    (no record) raises FileExistsError naming it, unless ``overwrite=True``.
    ``output_format`` as :func:`score_tree`'s (``"auto"``: an RNTuple for an RNTuple input)."""
    _distributed()
    if output_format not in FORMATS:
        raise ValueError(
            f"output_format must be one of {', '.join(FORMATS)}, got {output_format!r}"
        )
    check_column_name(column, "score_files: column", dotted=False)
    stem = _stem(stem)
    files = [Path(f).resolve() for f in ([files] if isinstance(files, (str, Path)) else files)]
    if not files:
        raise ValueError("score_files: no input files given")
    if len(set(files)) != len(files):
        raise ValueError("score_files: an input file is listed twice")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"score_files: no such input files: {', '.join(missing)}")
    outputs = [_output_of(f, output_dir) for f in files]
    if len(set(outputs)) != len(outputs):
        raise ValueError(
            "score_files: two input files have the same name, so their outputs in "
            f"output_dir={output_dir} would collide; leave output_dir out to write each "
            "beside its input"
        )
    if output_dir is not None and not Path(output_dir).is_dir():
        raise FileNotFoundError(f"{output_dir}: no such directory (create it first)")
    check_outputs(inputs=files, outputs=outputs, model_files=model_files(stem), what="score_files")
    foreign = [] if overwrite else [o for o in outputs if _not_ours(str(o))]
    if foreign:
        raise FileExistsError(_foreign_message(foreign))
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    inputs = columns_of(stem, inputs, "score_files")
    inputs = inputs if isinstance(inputs, str) else [str(c) for c in inputs]
    client, owned = connect(client, timeout)
    try:
        return _run(
            client,
            stem,
            files,
            outputs,
            inputs,
            tree,
            out_tree,
            column,
            batch_size or 0,
            retries,
            overwrite,
            output_format,
        )
    finally:
        if owned:
            client.close()


def _run(
    client, stem, files, outputs, inputs, tree, out_tree, column, batch, retries, overwrite, fmt
):
    shipping.check_workers(client, "score_files")
    model = shipping.ship(stem)
    if _lacking(client, model):  # uploaded once (a plugin: workers that join later get it too)
        for ext in (".so", ".root"):
            client.upload_file(model.local + ext, load=False)
    lacking = _lacking(client, model)
    if lacking:
        raise FileNotFoundError(
            f"score_files: the model's files did not reach Dask workers: {'; '.join(lacking)}"
        )
    want = shipping.expected()
    md5 = file_digest(Path(stem + ".so"), "md5")
    token = uuid.uuid4().hex[:8]
    args = (model, want, inputs, tree, out_tree, column, batch, md5, overwrite, fmt)
    futures = []
    for i, (f, out) in enumerate(zip(files, outputs, strict=True)):
        key = f"rootclad-score-{f.name}-{i}-{token}"  # the file's name shows in Dask's dashboard
        futures.append(
            client.submit(score_task, str(f), str(out), *args, key=key, pure=False, retries=retries)
        )
    _distributed().wait(futures)
    done = ScoredFiles(outputs)
    failed = {}
    for f, fut in zip(files, futures, strict=True):
        if fut.status == "finished":
            (done.scored if fut.result() == "scored" else done.skipped).append(f)
        else:
            try:
                failed[f] = _reason(fut.exception())
            except Exception as unreadable:  # noqa: BLE001  (an error the client cannot read)
                failed[f] = (
                    f"its error could not be read back from the worker "
                    f"({type(unreadable).__name__}: {unreadable})"
                )
    if failed:
        done.outputs = [o for f, o in zip(files, outputs, strict=True) if f not in failed]
        raise ScoreFilesError(failed, done)
    return done


def _lacking(client, model) -> list[str]:
    """The workers that lack the model's files, each with what it lacks."""
    results = client.run(_files_here, model.name, on_error="return")
    lacking = []
    for addr, got in sorted(results.items()):
        if isinstance(got, BaseException):
            lacking.append(f"{addr} ({type(got).__name__}: {got})")
        elif got:
            lacking.append(f"{addr} (no {', '.join(got)})")
    return lacking


def _files_here(name: str, dask_worker=None) -> list[str]:
    where = Path(dask_worker.local_directory)
    return [name + ext for ext in (".so", ".root") if not (where / (name + ext)).is_file()]
