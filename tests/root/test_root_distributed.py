"""Scoring on Dask: ``define_score`` / ``define_saliency`` on a distributed RDataFrame, on a
``LocalCluster`` of 2 worker processes (loopback).

References: the single-process ``define_score`` / ``define_saliency`` / ``score_tree`` (each
tested against torch in the other tests/root modules) and the torch module itself, event by
event (matched through an ``event`` column: a distributed AsNumpy concatenates its tasks in no
fixed order). A worker is killed by a worker plugin (SIGKILL as its task starts).
"""

from __future__ import annotations

from pathlib import Path

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
