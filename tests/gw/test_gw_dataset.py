"""The dataset file: layout, reproducibility, atomic writing; read back by uproot and by ROOT."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import uproot

from rootclad.gw import dataset as dataset_module
from rootclad.gw.dataset import (
    SimulationConfig,
    generate_events,
    read_config,
    read_psd,
    simulate,
)
from rootclad.gw.psd import aligo_psd

BRANCHES = {
    "strain": ("float32", (2048,)),
    "label": ("int32", ()),
    "snr": ("float32", ()),
    "m1": ("float32", ()),
    "m2": ("float32", ()),
    "t_merger": ("float32", ()),
    "seed": ("int64", ()),
}


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gw") / "small.root"
    simulate(path, 300, seed=42, chunk_size=128, workers=1, progress=False)
    return path


def _contents(path):
    with uproot.open(path) as f:
        ev = f["events"].arrays(library="np")
        return ev, str(f["config"]), f["psd"].arrays(library="np")


def test_file_layout(small_file):
    with uproot.open(small_file) as f:
        tree = f["events"]
        assert tree.num_entries == 300
        for name, (dtype, shape) in BRANCHES.items():
            dt = tree[name].interpretation.to_dtype
            base = dt.subdtype[0] if dt.subdtype else dt
            assert base == np.dtype(dtype).newbyteorder("=") or base.newbyteorder("=") == np.dtype(
                dtype
            )
            assert dt.shape == shape, name
        assert set(tree.keys()) == set(BRANCHES)
    ev, config, psd = _contents(small_file)
    cfg = json.loads(config)
    assert cfg["seed"] == 42 and cfg["n"] == 2048 and cfg["band"] == [20.0, 1000.0]
    np.testing.assert_allclose(psd["psd"], aligo_psd(psd["frequency"]), rtol=1e-12)
    np.testing.assert_array_equal(psd["frequency"], np.arange(1025.0))
    assert read_config(small_file) == SimulationConfig(seed=42)
    f, s = read_psd(small_file)
    assert f.shape == s.shape == (1025,)
    sig = ev["label"] == 1
    assert 0.35 < sig.mean() < 0.65
    assert np.all((ev["snr"][sig] >= 5) & (ev["snr"][sig] <= 20))
    assert np.all(ev["m1"][sig] >= ev["m2"][sig]) and np.all(ev["m2"][sig] >= 5)
    assert np.all((ev["t_merger"][sig] >= 0.5) & (ev["t_merger"][sig] <= 0.9))
    assert np.all(ev["snr"][~sig] == 0) and np.all(ev["m1"][~sig] == 0)
    assert len(np.unique(ev["seed"])) == 300 and np.all(ev["seed"] >= 0)


def test_same_seed_same_contents_whatever_the_chunking(small_file, tmp_path):
    other = tmp_path / "again.root"
    simulate(other, 300, seed=42, chunk_size=50, workers=2, progress=False)
    a, ca, pa = _contents(small_file)
    b, cb, pb = _contents(other)
    assert ca == cb
    for k in BRANCHES:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k])
    third = tmp_path / "different.root"
    simulate(third, 300, seed=43, chunk_size=128, workers=1, progress=False)
    c, _, _ = _contents(third)
    assert not np.array_equal(a["strain"], c["strain"])


def test_any_event_regenerates_from_its_seed(small_file):
    ev, _, _ = _contents(small_file)
    pick = [0, 17, 299]
    again = generate_events(ev["seed"][pick], read_config(small_file))
    for k in BRANCHES:
        np.testing.assert_array_equal(again[k], ev[k][pick], err_msg=k)


def test_events_made_by_worker_processes_are_this_processs_in_the_seeds_order():
    """generate_events with workers (fresh training's epochs): chunks of 1024 seeds in two
    processes, put back in order; 2,500 seeds span three chunks, the last one short."""
    config = SimulationConfig(seed=5, duration=0.25, mass_range=(10.0, 50.0), t_merger=(0.12, 0.2))
    seeds = np.random.default_rng(0).integers(0, 2**62, 2500)
    one = generate_events(seeds, config)
    two = generate_events(seeds, config, workers=2)
    for k in BRANCHES:
        np.testing.assert_array_equal(two[k], one[k], err_msg=k)
    assert one["label"].min() == 0 and one["label"].max() == 1  # both kinds of event


def test_interrupted_run_leaves_no_file(tmp_path, monkeypatch):
    target = tmp_path / "run.root"
    calls = {"n": 0}
    original = dataset_module._Generator.events

    def failing(self, seeds):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated Ctrl-C")
        return original(self, seeds)

    monkeypatch.setattr(dataset_module._Generator, "events", failing)
    with pytest.raises(KeyboardInterrupt):
        simulate(target, 500, seed=1, chunk_size=100, workers=1, progress=False)
    assert os.listdir(tmp_path) == []
    # an existing file is left as it was
    target.write_bytes(b"previous")
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        simulate(target, 500, seed=1, chunk_size=100, workers=1, progress=False)
    assert target.read_bytes() == b"previous" and os.listdir(tmp_path) == ["run.root"]


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="power of two"):
        simulate(tmp_path / "x.root", 10, duration=0.75)
    with pytest.raises(ValueError, match="snr"):
        simulate(tmp_path / "x.root", 10, snr=(10, 5))
    with pytest.raises(ValueError, match="compression"):
        simulate(tmp_path / "x.root", 10, compression="gzip")
    # an infinite SNR wrote NaN strain; a chunk size of 0 failed inside range()
    with pytest.raises(ValueError, match=r"snr must be finite, got \(5.0, inf\)"):
        simulate(tmp_path / "x.root", 10, snr=(5, math.inf))
    for name, value in (("mass_range", (5, math.nan)), ("duration", math.inf),
                        ("band", (20, math.inf)), ("signal_fraction", math.nan)):  # fmt: skip
        with pytest.raises(ValueError, match=name):
            simulate(tmp_path / "x.root", 10, **{name: value})
    with pytest.raises(ValueError, match="chunk_size must be at least 1, got 0"):
        simulate(tmp_path / "x.root", 10, chunk_size=0)
    # a directory that does not exist is not made up (a typo would scatter files)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        simulate(tmp_path / "nonexistent" / "dir" / "x.root", 10)
    assert not any(tmp_path.iterdir())


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _running(pid: int) -> bool:
    try:  # a zombie has ended; only its exit status waits to be collected
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_simulation_leaves_no_workers_and_no_partial_file(tmp_path, sig):
    """`rootclad gw simulate --workers 2` killed mid-run: the workers (200 MB each) used to
    outlive it, and its temporary file stayed. SIGTERM now unwinds like Ctrl-C; after a
    SIGKILL the workers die with their parent and the next run removes the dead run's file."""
    target = tmp_path / "x.root"
    cmd = [sys.executable, "-m", "rootclad", "gw", "simulate", str(target), "-n", "200000",
           "--workers", "2", "-q"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_children(proc.pid)) < 2 or not list(tmp_path.glob(".*.partial")):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        workers = _children(proc.pid)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig)
    deadline = time.monotonic() + 30
    while any(_running(w) for w in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their parent"
        time.sleep(0.05)
    partials = list(tmp_path.glob(".*.partial"))
    assert not target.exists()
    if sig == signal.SIGTERM:
        assert partials == []
    else:  # no process can clean up after a SIGKILL; the next run does
        assert len(partials) == 1
        simulate(target, 10, workers=1, progress=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["x.root"]


def _worker_sigterm_handler(queue):
    queue.put(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks")
def test_workers_do_not_inherit_the_parents_sigterm_handler():
    """A forked worker inherited `simulate`'s SIGTERM handler (raise SystemExit), which the
    pool's worker loop catches around each chunk: the parent's terminate() left it running
    and shutdown() waited forever (the SIGTERM test above hung in CI once)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    old = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        config = SimulationConfig().to_json()
        proc = ctx.Process(target=lambda: (dataset_module._worker_init(config, os.getppid()),
                                           _worker_sigterm_handler(queue)))  # fmt: skip
        proc.start()
        default = queue.get(timeout=60)
        proc.join(60)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert default, "a simulation worker keeps the parent's Python SIGTERM handler"


def test_a_live_runs_partial_file_is_left_alone(tmp_path):
    """Only a dead writer's file is removed: a run of this host whose process still lives
    (this one) keeps its file, and so does one of another host."""
    live = dataset_module._partial_name(tmp_path / "x.root", os.getpid(), "a")
    other = tmp_path / ".x.root.otherhost.1.b.partial"
    for p in (live, other):
        p.write_bytes(b"")
    simulate(tmp_path / "x.root", 10, workers=1, progress=False)
    assert live.exists() and other.exists()


def test_compressed_files_hold_the_same_events(small_file, tmp_path):
    lz4 = tmp_path / "lz4.root"
    simulate(lz4, 300, seed=42, compression="lz4", workers=1, progress=False)
    a, _, _ = _contents(small_file)
    b, _, _ = _contents(lz4)
    np.testing.assert_array_equal(a["strain"], b["strain"])
    with uproot.open(lz4) as f:
        assert isinstance(f.file.compression, uproot.LZ4)
        label = f["events"]["label"]
        assert label.compressed_bytes < label.uncompressed_bytes
        # whitened noise does not compress: LZ4 stores those baskets as they are
        strain = f["events"]["strain"]
        assert strain.compressed_bytes > 0.95 * strain.uncompressed_bytes


@pytest.mark.root
def test_root_reads_the_file_like_uproot(small_file):
    ROOT = pytest.importorskip("ROOT")
    f = ROOT.TFile.Open(str(small_file))
    tree = f.Get("events")
    leaf = tree.GetLeaf("strain")
    assert leaf.GetTypeName() == "Float_t" and leaf.GetLen() == 2048
    assert tree.GetBranch("strain").GetTitle() == "strain[2048]/F"
    types = {
        b: tree.GetLeaf(b).GetTypeName() for b in ("label", "snr", "m1", "m2", "t_merger", "seed")
    }
    assert types == {
        "label": "Int_t", "snr": "Float_t", "m1": "Float_t", "m2": "Float_t",
        "t_merger": "Float_t", "seed": "Long64_t",
    }  # fmt: skip
    ev, config, _ = _contents(small_file)
    # TTree with SetBranchAddress
    buf = np.zeros(2048, dtype=np.float32)
    tree.SetBranchAddress("strain", buf)
    for i in (0, 123, 299):
        tree.GetEntry(i)
        np.testing.assert_array_equal(buf, ev["strain"][i])
    tree.ResetBranchAddresses()
    # RDataFrame
    cols = ROOT.RDataFrame("events", str(small_file)).AsNumpy(["label", "snr", "seed", "t_merger"])
    for k in cols:
        np.testing.assert_array_equal(np.asarray(cols[k]), ev[k], err_msg=k)
    assert str(f.Get("config").GetString()) == config
    f.Close()


def test_cli_simulate_and_info(tmp_path, capsys):
    import argparse

    from rootclad.gw.cli import register

    parser = argparse.ArgumentParser(prog="rootclad")
    register(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "cli.root"
    args = parser.parse_args(
        [
            "gw",
            "simulate",
            str(out),
            "-n",
            "40",
            "--seed",
            "3",
            "--snr",
            "6,9",
            "-q",
            "--workers",
            "1",
        ]
    )
    assert args.func(args) == 0
    assert read_config(out).snr == (6.0, 9.0)
    args = parser.parse_args(["gw", "info", str(out)])
    assert args.func(args) == 0
    assert "events: 40" in capsys.readouterr().out


def test_package_names_do_not_depend_on_import_order():
    import subprocess
    import sys

    code = (
        "import sys, rootclad.gw as gw, rootclad.data\n"
        "assert 'ROOT' not in sys.modules and 'uproot' not in sys.modules\n"
        "import rootclad.gw.dataset, rootclad.gw.matched_filter, rootclad.gw.whiten\n"
        "assert callable(gw.simulate) and gw.simulate.__module__ == 'rootclad.gw.dataset'\n"
        "assert gw.matched_filter.__name__ == 'rootclad.gw.matched_filter'\n"
        "assert gw.matched_filter_snr.__module__ == 'rootclad.gw.matched_filter'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
