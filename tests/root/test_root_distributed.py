"""Scoring on Dask: ``define_score`` / ``define_saliency`` on a distributed RDataFrame and
``score_files`` over a file list, on a ``LocalCluster`` of 2 worker processes (loopback).

References: the single-process ``define_score`` / ``define_saliency`` / ``score_tree`` (each
tested against torch in the other tests/root modules) and the torch module itself, event by
event (matched through an ``event`` column: a distributed AsNumpy concatenates its tasks in no
fixed order). A worker is killed by a worker plugin (SIGKILL as its task starts).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import awkward as ak
import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="distributed RDataFrame is ROOT's")
pytest.importorskip("dask", reason="distributed scoring needs dask (the test extra)")
distributed = pytest.importorskip("distributed", reason="needs dask's distributed (test extra)")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402
import rootclad.root as rr  # noqa: E402
from rootclad.data import Schema  # noqa: E402
from rootclad.root import shipping  # noqa: E402
from rootclad.root.scale_out import recorded  # noqa: E402

N = 400  # events per file
SCHEMA = Schema({"pt": 1, "jets": 4})


def write_events(path: Path, first: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with uproot.recreate(path) as f:
        f.mktree("events", {"pt": np.float32, "jets": np.dtype((np.float32, (4,))),
                            "event": np.int64}).extend(
            {"pt": rng.normal(50, 10, N).astype(np.float32),
             "jets": rng.normal(0, 1, (N, 4)).astype(np.float32),
             "event": np.arange(first, first + N)})  # fmt: skip


def export(d: Path, name: str, seed: int):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    cm = rootclad.compile(net, torch.zeros(1, 5), engine="pullback")
    cm.export(d / name, schema=SCHEMA)
    return net, str(d / name)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    files = [d / f"part{i}.root" for i in range(3)]
    for i, f in enumerate(files):
        write_events(f, i * N, seed=i)
    net, stem = export(d, "net", seed=0)
    return d, [str(f) for f in files], net, stem


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)  # fmt: skip
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def local_scores(files, stem):
    df = rr.define_score(ROOT.RDataFrame("events", files), stem)
    return df.AsNumpy(["event", "score"])


def torch_scores(net, files):
    x = [uproot.open(f)["events"].arrays(["pt", "jets"], library="np") for f in files]
    feats = np.concatenate([np.concatenate([a["pt"][:, None], a["jets"]], 1) for a in x])
    with torch.no_grad():
        return net(torch.from_numpy(feats)).numpy()[:, 0]


def by_event(columns: dict) -> dict:
    order = np.argsort(columns["event"])
    return {k: np.asarray(v)[order] for k, v in columns.items()}


def test_define_score_on_a_distributed_rdataframe_equals_one_process(data, client, tmp_path):
    """AsNumpy, a histogram and a Snapshot (with the saliency) of a 4-partition distributed
    RDataFrame equal the single-process ones event by event; each worker opened the model
    once over three event loops."""
    d, files, net, stem = data
    df = ROOT.RDataFrame("events", files, executor=client, npartitions=4)
    df = rr.define_saliency(rr.define_score(df, stem), stem)
    got = by_event(df.AsNumpy(["event", "score"]))
    want = local_scores(files, stem)
    np.testing.assert_array_equal(got["event"], want["event"])
    np.testing.assert_array_equal(got["score"], want["score"])
    np.testing.assert_allclose(got["score"], torch_scores(net, files), rtol=1e-5, atol=1e-6)

    model = ("h", "scores", 40, -3.0, 3.0)
    hist = df.Histo1D(model, "score").GetValue()
    local = rr.define_score(ROOT.RDataFrame("events", files), stem).Histo1D(model, "score")
    assert hist.GetEntries() == 3 * N
    assert [hist.GetBinContent(i) for i in range(42)] == [local.GetBinContent(i) for i in range(42)]

    out = tmp_path / "snap.root"
    df.Snapshot("snap", str(out), ["event", "score", "saliency"])
    parts = sorted(tmp_path.glob("snap*.root"))
    assert parts, "the distributed Snapshot wrote no file"
    trees = [uproot.open(p)["snap"].arrays(["event", "score", "saliency"], library="np")
             for p in parts]  # fmt: skip
    snap = by_event({k: np.concatenate([np.stack(t[k]) if k == "saliency" else t[k]
                                        for t in trees]) for k in trees[0]})  # fmt: skip
    np.testing.assert_array_equal(snap["event"], want["event"])
    np.testing.assert_array_equal(snap["score"], want["score"])
    local_sal = rr.define_saliency(ROOT.RDataFrame("events", files), stem).AsNumpy(["saliency"])
    np.testing.assert_array_equal(snap["saliency"], np.stack(local_sal["saliency"]))

    opened = client.run(shipping.opened_here)
    ids = {k for counts in opened.values() for k in counts}
    assert len(ids) == 1 and all(set(c.values()) <= {1} for c in opened.values()), opened


def test_a_users_initialize_still_runs_on_the_workers(data, client):
    """rootclad chains the function a user registered with ROOT.RDF.Distributed.initialize
    (ROOT keeps one): the user's C++ global is there for the user's own Define."""
    d, files, net, stem = data
    user = "ROOT.gInterpreter.Declare('const double rootclad_test_offset = 7.5;')"
    ROOT.RDF.Distributed.initialize(exec, f"import ROOT\n{user}", {})
    df = ROOT.RDataFrame("events", files, executor=client, npartitions=2)
    df = rr.define_score(df, stem).Define("shifted", "score + rootclad_test_offset")
    got = by_event(df.AsNumpy(["event", "score", "shifted"]))
    np.testing.assert_array_equal(got["shifted"], got["score"] + 7.5)
    np.testing.assert_array_equal(got["score"], local_scores(files, stem)["score"])


def test_model_files_missing_on_the_workers_are_named(data, client, monkeypatch, tmp_path):
    """A model whose files never reached the workers (DistributeFiles made a no-op): the event
    loop raises naming the file missing on the worker; other models' Defines still run."""
    d, files, net, stem = data
    _, other = export(tmp_path, "unshipped", seed=5)
    monkeypatch.setattr(ROOT.RDF.Distributed, "DistributeFiles", lambda paths: None)
    df = ROOT.RDataFrame("events", files, executor=client, npartitions=2)
    bad = rr.define_score(df, other)
    name = shipping.ship(other).name
    with pytest.raises(Exception, match=rf"has no .*{name}\.so"):
        bad.AsNumpy(["score"])
    monkeypatch.undo()
    good = ROOT.RDataFrame("events", files, executor=client, npartitions=2)
    assert len(rr.define_score(good, stem).AsNumpy(["score"])["score"]) == 3 * N


def reference_outputs(files, stem, tmp_path) -> list[np.ndarray]:
    out = []
    for i, f in enumerate(files):
        ref = rr.score_tree(f, stem, output=tmp_path / f"ref{i}.root")
        out.append(uproot.open(ref)["scores"]["score"].array(library="np"))
    return out


def read_scores(path) -> np.ndarray:
    return uproot.open(path)["scores"]["score"].array(library="np")


def test_score_files_equals_score_tree_and_skips_complete_outputs(data, client, tmp_path):
    """One task per file; each output equals single-process score_tree's; a rerun skips the
    complete outputs and rescores a deleted one, a damaged one when told to overwrite it, and
    all for another model."""
    d, files, net, stem = data
    outdir = tmp_path / "out"
    outdir.mkdir()
    done = rr.score_files(files, stem, client, output_dir=outdir)
    assert done.scored == [Path(f) for f in files] and done.skipped == []
    refs = reference_outputs(files, stem, tmp_path)
    for out, ref in zip(done.outputs, refs, strict=True):
        np.testing.assert_array_equal(read_scores(out), ref)

    times = [os.stat(o).st_mtime_ns for o in done.outputs]
    again = rr.score_files(files, stem, client, output_dir=outdir)
    assert again.scored == [] and again.skipped == [Path(f) for f in files]
    assert [os.stat(o).st_mtime_ns for o in done.outputs] == times

    done.outputs[0].unlink()
    done.outputs[2].write_bytes(b"not a ROOT file")  # damaged: no longer known as an output
    with pytest.raises(FileExistsError, match=rf"{done.outputs[2]}: .*not written by"):
        rr.score_files(files, stem, client, output_dir=outdir)
    third = rr.score_files(files, stem, client, output_dir=outdir, overwrite=True)
    assert third.scored == [Path(files[0]), Path(files[2])] and third.skipped == [Path(files[1])]
    for out, ref in zip(third.outputs, refs, strict=True):
        np.testing.assert_array_equal(read_scores(out), ref)

    # an input rewritten with as many entries (reprocessed): its stale scores are redone
    os.utime(files[1], ns=(os.stat(files[1]).st_atime_ns, os.stat(files[1]).st_mtime_ns + 10**9))
    redo = rr.score_files(files, stem, client, output_dir=outdir)
    assert redo.scored == [Path(files[1])] and len(redo.skipped) == 2

    _, other = export(tmp_path, "other", seed=3)
    fourth = rr.score_files(files, other, client, output_dir=outdir)
    assert fourth.scored == [Path(f) for f in files]
    for out, ref in zip(fourth.outputs, reference_outputs(files, other, tmp_path), strict=True):
        np.testing.assert_array_equal(read_scores(out), ref)

    ntuples = tmp_path / "ntuples"  # scores as an RNTuple, recognised as complete when there
    ntuples.mkdir()
    kw = dict(output_dir=ntuples, output_format="rntuple")
    fifth = rr.score_files(files[:1], stem, client, **kw)
    with uproot.open(fifth.outputs[0]) as f:
        assert f.classname_of("scores") == "ROOT::RNTuple"
    np.testing.assert_array_equal(read_scores(fifth.outputs[0]), refs[0])
    assert rr.score_files(files[:1], stem, client, **kw).skipped == [Path(files[0])]


def test_a_bad_file_is_named_and_the_others_are_scored(data, client, tmp_path):
    """A file ROOT cannot read among good ones: ScoreFilesError names it (and only it) after
    the others were scored, as score_tree scores them."""
    d, files, net, stem = data
    bad = tmp_path / "broken.root"
    bad.write_bytes(b"not a ROOT file")
    outdir = tmp_path / "out"
    outdir.mkdir()
    with pytest.raises(rr.ScoreFilesError, match=r"1 of 4 files") as err:
        rr.score_files([files[0], bad, files[2]] + [files[1]], stem, client, output_dir=outdir)
    assert list(err.value.failed) == [bad] and "broken.root" in err.value.failed[bad]
    assert err.value.done.scored == [Path(files[0]), Path(files[2]), Path(files[1])]
    # the outputs listed are the whole ones only
    assert err.value.done.outputs == [outdir / f"{Path(f).stem}_scores.root"
                                      for f in (files[0], files[2], files[1])]  # fmt: skip
    assert not (outdir / "broken_scores.root").exists()
    refs = reference_outputs(files, stem, tmp_path)
    for i, f in enumerate(files):
        np.testing.assert_array_equal(read_scores(outdir / f"{Path(f).stem}_scores.root"), refs[i])


def test_score_files_never_writes_over_a_file_it_did_not_write(data, client, tmp_path):
    """An output already there that score_files did not write (no record of its own) was
    replaced: refused, naming it, before any task runs, unless overwrite=True. An output that
    is one of the inputs is refused even then."""
    d, files, net, stem = data
    outdir = tmp_path / "out"
    outdir.mkdir()
    mine = outdir / "part1_scores.root"
    with uproot.recreate(mine) as f:
        f["scores"] = {"score": np.arange(3.0)}
    before = mine.read_bytes()
    with pytest.raises(FileExistsError, match=rf"{mine}: .*not written by .*overwrite=True"):
        rr.score_files(files, stem, client, output_dir=outdir)
    assert mine.read_bytes() == before and sorted(outdir.iterdir()) == [mine]
    done = rr.score_files(files, stem, client, output_dir=outdir, overwrite=True)
    assert done.scored == [Path(f) for f in files]
    np.testing.assert_array_equal(read_scores(mine), reference_outputs(files, stem, tmp_path)[1])

    own = tmp_path / "own.root"  # its output, own_scores.root, is the next input
    write_events(own, 0, seed=4)
    write_events(tmp_path / "own_scores.root", 0, seed=5)
    inputs = [own, tmp_path / "own_scores.root"]
    sizes = [p.stat().st_size for p in inputs]
    with pytest.raises(ValueError, match=r"output \S*own_scores\.root is the input"):
        rr.score_files(inputs, stem, client, overwrite=True)
    assert [p.stat().st_size for p in inputs] == sizes
    assert not (tmp_path / "own_scores_scores.root").exists()


def test_a_bad_score_column_is_refused_before_any_task(data, client, tmp_path):
    d, files, net, stem = data
    with pytest.raises(ValueError, match=r"score_files: column 's\[64\]' is not an identifier"):
        rr.score_files(files, stem, client, output_dir=tmp_path, column="s[64]")
    assert list(tmp_path.iterdir()) == []


def test_a_cpp_error_on_a_worker_names_the_file_and_entry(data, client, tmp_path):
    """An array column too short at entry 7: the C++ error reached the client as a pickled
    cppyy object (UnicodeDecodeError, or a garbled class name); now as the worker's text."""
    d, files, net, stem = data
    rng = np.random.default_rng(6)
    jets = [rng.normal(0, 1, 3 if i == 7 else 4).astype(np.float32) for i in range(200)]
    bad = tmp_path / "short.root"
    with uproot.recreate(bad) as f:
        f.mktree("events", {"pt": np.float32, "jets": "var * float32"}).extend(
            {"pt": np.ones(200, np.float32), "jets": ak.Array(jets)}
        )
    with pytest.raises(rr.ScoreFilesError) as err:
        rr.score_files([files[0], bad], stem, client, output_dir=tmp_path)
    assert list(err.value.failed) == [bad]
    why = err.value.failed[bad]
    assert why.startswith(f"ScoringError: {bad}: tree 'events', branch 'jets', entry 7: "), why
    assert "3 values" in why and not (tmp_path / "short_scores.root").exists()
    assert err.value.done.scored == [Path(files[0])]


@pytest.mark.slow
def test_a_killed_worker_is_reported_by_file_and_a_rerun_completes(data, client, tmp_path):
    """A worker SIGKILLed as it starts scoring part1.root: with Dask's retries off
    (allowed-failures 0) the call names that file after the others finished; a rerun scores it
    alone. With one retry allowed, Dask moves the task to a restarted worker and the call
    completes."""
    d, files, net, stem = data
    outdir = tmp_path / "out"
    outdir.mkdir()
    victim = Path(files[1]).name

    class KillOnce(distributed.WorkerPlugin):
        def __init__(self, marker):
            self.marker = marker

        def transition(self, key, start, finish, **kwargs):
            if finish == "executing" and f"-{victim}-" in str(key):
                if not os.path.exists(self.marker):
                    open(self.marker, "w").close()
                    os.kill(os.getpid(), 9)

    scheduler = client.cluster.scheduler
    allowed = scheduler.allowed_failures
    try:
        scheduler.allowed_failures = 0
        client.register_plugin(KillOnce(str(tmp_path / "killed-1")), name="kill-once")
        with pytest.raises(rr.ScoreFilesError) as err:
            rr.score_files(files, stem, client, output_dir=outdir)
        # part1's, and any other task the dead worker held (Dask counts those too)
        failed = list(err.value.failed)
        assert Path(files[1]) in failed
        assert f"{files[1]}: its worker died" in str(err.value)
        for f in failed:  # another task the worker held fails as Dask reports it (or was lost)
            assert f"{f}: " in str(err.value)
            out = outdir / f"{f.stem}_scores.root"
            # none half-written: a task that finished on the dying worker, and whose result
            # Dask then lost with it, left its whole output (renamed once written)
            assert not out.exists() or (f != Path(files[1]) and recorded(str(out)) is not None)
        assert sorted(err.value.done.scored + failed) == [Path(f) for f in files]
        for f in err.value.done.scored:
            assert (outdir / f"{f.stem}_scores.root").exists()
        client.wait_for_workers(2, timeout=60)
        rerun = rr.score_files(files, stem, client, output_dir=outdir)
        assert Path(files[1]) in rerun.scored and set(rerun.scored) <= set(failed)
        assert sorted(rerun.scored + rerun.skipped) == [Path(f) for f in files]

        (outdir / "part1_scores.root").unlink()
        scheduler.allowed_failures = 1
        client.register_plugin(KillOnce(str(tmp_path / "killed-2")), name="kill-once")
        absorbed = rr.score_files(files, stem, client, output_dir=outdir)
        assert (tmp_path / "killed-2").exists()  # the worker did die once
        assert absorbed.scored == [Path(files[1])]
    finally:
        scheduler.allowed_failures = allowed
        client.unregister_worker_plugin("kill-once")
        client.wait_for_workers(2, timeout=60)
    for out, ref in zip(rerun.outputs, reference_outputs(files, stem, tmp_path), strict=True):
        np.testing.assert_array_equal(read_scores(out), ref)
        assert len(read_scores(out)) == N


def test_without_dask_score_files_says_what_to_install(data, monkeypatch):
    d, files, net, stem = data
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ImportError, match="distributed.*pip install dask distributed"):
        rr.score_files(files, stem, "tcp://127.0.0.1:1")


def test_a_scheduler_that_does_not_answer_is_named_quickly(data):
    d, files, net, stem = data
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"no Dask scheduler answers at {address}"):
        rr.score_files(files, stem, address, timeout=1)
    assert time.perf_counter() - start < 20


def test_missing_model_files_are_named_before_work(data, client, tmp_path, monkeypatch):
    """Here: FileNotFoundError naming STEM.so. On the workers (the upload made a no-op): the
    workers and the file named, and no output written."""
    d, files, net, stem = data
    with pytest.raises(FileNotFoundError, match=r"nowhere\.so"):
        rr.score_files(files, tmp_path / "nowhere", client)
    _, fresh = export(tmp_path, "fresh", seed=9)
    monkeypatch.setattr(client, "upload_file", lambda *a, **k: None)
    outdir = tmp_path / "out"
    outdir.mkdir()
    name = shipping.ship(fresh).name
    with pytest.raises(FileNotFoundError, match=rf"did not reach Dask workers: tcp://.*{name}"):
        rr.score_files(files, fresh, client, output_dir=outdir)
    assert list(outdir.iterdir()) == []


# rootclad made unimportable on one worker (None in sys.modules stops an import), whether it
# imported rootclad already or not (a worker restarted by its nanny has not), and restored
_HIDE = """import sys
sys.rootclad_hidden = {k: v for k, v in sys.modules.items()
                       if k == "rootclad" or k.startswith("rootclad.")}
sys.modules.update({k: None for k in [*sys.rootclad_hidden, "rootclad"]})
"""
_SHOW = """import sys
for k in [k for k in sys.modules if k == "rootclad" or k.startswith("rootclad.")]:
    del sys.modules[k]
sys.modules.update(sys.rootclad_hidden)
"""


def test_workers_without_rootclad_or_with_another_are_named_before_work(
    data, client, tmp_path, monkeypatch
):
    """One worker that cannot import rootclad, then one with another version: score_files and
    define_score raise naming that worker before any task runs (no output written)."""
    d, files, net, stem = data
    outdir = tmp_path / "out"
    outdir.mkdir()
    worker = sorted(client.scheduler_info()["workers"])[0]
    client.run(exec, _HIDE, {}, workers=[worker])
    try:
        with pytest.raises(RuntimeError, match=rf"{worker}: cannot import rootclad"):
            rr.score_files(files, stem, client, output_dir=outdir)
    finally:
        client.run(exec, _SHOW, {}, workers=[worker])
    client.run(exec, "import rootclad.version as v\nv.__version__ = '0.0.0+other'", {},
               workers=[worker])  # fmt: skip
    try:
        with pytest.raises(RuntimeError, match=rf"{worker}: rootclad 0\.0\.0\+other"):
            rr.score_files(files, stem, client, output_dir=outdir)
        monkeypatch.setattr(shipping, "_CHECKED", set())
        df = ROOT.RDataFrame("events", files, executor=client, npartitions=2)
        with pytest.raises(RuntimeError, match=rf"define_score: .*{worker}: rootclad 0\.0\.0"):
            rr.define_score(df, stem)
    finally:
        client.run(exec, f"import rootclad.version as v\nv.__version__ = {rootclad.__version__!r}",
                   {}, workers=[worker])  # fmt: skip
    assert list(outdir.iterdir()) == []


# -- Spark -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spark():
    """A local Spark of 2 executor threads (its Python workers are processes)."""
    import shutil

    pyspark = pytest.importorskip("pyspark", reason="Spark needs pyspark (the test extra)")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime: java is not on PATH")
    conf = (pyspark.SparkConf().setMaster("local[2]").setAppName("rootclad-tests")
            .set("spark.ui.enabled", "false"))  # fmt: skip
    context = pyspark.SparkContext(conf=conf)
    context.setLogLevel("ERROR")
    yield context
    context.stop()


def test_define_score_on_a_spark_rdataframe_equals_one_process(data, spark, tmp_path):
    """The model reaches the executors through ROOT's DistributeFiles / DistributeHeaders
    (SparkContext.addFile); each Python worker finds it through SparkFiles and opens it.
    (The saliency is compared through a Snapshot: this ROOT's Spark backend fails to clone an
    AsNumpy of a vector column, with or without rootclad.)"""
    d, files, net, stem = data
    df = ROOT.RDataFrame("events", files, executor=spark, npartitions=3)
    df = rr.define_saliency(rr.define_score(df, stem), stem)
    got = by_event(df.AsNumpy(["event", "score"]))
    want = local_scores(files, stem)
    assert len(got["event"]) == 3 * N
    np.testing.assert_array_equal(got["event"], want["event"])
    np.testing.assert_array_equal(got["score"], want["score"])
    np.testing.assert_allclose(got["score"], torch_scores(net, files), rtol=1e-5, atol=1e-6)
    df.Snapshot("snap", str(tmp_path / "snap.root"), ["event", "saliency"])
    trees = [uproot.open(p)["snap"].arrays(["event", "saliency"], library="np")
             for p in sorted(tmp_path.glob("snap*.root"))]  # fmt: skip
    snap = by_event({k: np.concatenate([np.stack(t[k]) if k == "saliency" else t[k]
                                        for t in trees]) for k in ("event", "saliency")})  # fmt: skip
    local = rr.define_saliency(ROOT.RDataFrame("events", files), stem).AsNumpy(["saliency"])
    np.testing.assert_array_equal(snap["event"], want["event"])
    np.testing.assert_array_equal(snap["saliency"], np.stack(local["saliency"]))
