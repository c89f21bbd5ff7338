"""The compiled reader against the Python one and against ROOT's own view of the files."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures.data import (
    N,
    assert_same_batches,
    collect,
    encoded_rows,
    write_root_fixed,
    write_uproot,
)

ROOT = pytest.importorskip("ROOT", reason="the compiled reader needs ROOT (PyROOT)")
pytestmark = pytest.mark.root

from rootclad.data.compiled import CompiledBatchIterator  # noqa: E402
from rootclad.data.loader import BatchIterator  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("compiled")
    a = write_uproot(d / "a.root", np.arange(700), np.arange(700) % 3 == 0, basket=70)
    b = write_uproot(d / "b.root", 5000 + np.arange(450), np.zeros(450), basket=128)
    return [str(a), str(b)]


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(
            batch_size=100,
            split="train",
            validation_fraction=0.3,
            drop_last=True,
            block_size=150,
            buffer_blocks=3,
        ),
        dict(batch_size=77, split="validation", validation_fraction=0.25, shuffle=False),
        dict(batch_size=1000, seed=99, buffer_blocks=1),
    ],
)
def test_same_batches_as_the_python_reader(files, kw):
    kw = {"seed": 5, **kw}
    py = BatchIterator(files, **kw)
    cxx = CompiledBatchIterator(files, **kw)
    assert len(py) == len(cxx)
    for _ in range(2):  # two epochs
        assert_same_batches(py, cxx, str(kw))


def test_file_written_by_root_reads_the_same_in_both(tmp_path):
    ids = np.arange(333)
    path = write_root_fixed(tmp_path / "by_root.root", ids, ids % 2)
    for cls in (BatchIterator, CompiledBatchIterator):
        got, labels, _ = collect(cls(str(path), batch_size=50, shuffle=False))
        assert np.array_equal(got, ids) and np.array_equal(labels, ids % 2)


def test_rvec_column_from_rdataframe_snapshot(tmp_path):
    # RDataFrame writes a defined RVec as ROOT::VecOps::RVec<float>, not strain[N]/F
    path = str(tmp_path / "snapshot.root")
    df = ROOT.RDataFrame(120).Define("i", "(int)rdfentry_")
    df = df.Define(
        "strain",
        f"ROOT::RVec<float> v({N}); for (int j = 0; j < {N}; ++j) v[j] = i + j / float({N}); return v;",
    )
    df.Define("label", "i % 2").Snapshot("events", path, ["strain", "label"])
    f = ROOT.TFile.Open(path)
    assert "RVec" in f.Get("events").GetBranch("strain").GetClassName()
    f.Close()
    for cls in (BatchIterator, CompiledBatchIterator):
        got, labels, _ = collect(cls(path, batch_size=32, shuffle=False))
        assert np.array_equal(got, np.arange(120)) and np.array_equal(labels, np.arange(120) % 2)


def test_vector_float_branch_written_by_root(tmp_path):
    path = str(tmp_path / "vector.root")
    f = ROOT.TFile(path, "RECREATE")
    t = ROOT.TTree("events", "")
    vec = ROOT.std.vector["float"]()
    lab = np.zeros(1, dtype=np.int32)
    t.Branch("strain", vec)
    t.Branch("label", lab, "label/I")
    for i, row in enumerate(encoded_rows(np.arange(40))):
        vec.clear()
        for v in row:
            vec.push_back(float(v))
        lab[0] = i % 2
        t.Fill()
    t.Write()
    f.Close()
    for cls in (BatchIterator, CompiledBatchIterator):
        got, labels, _ = collect(cls(path, batch_size=16, shuffle=False))
        assert np.array_equal(got, np.arange(40))


def test_simulated_file_matches_roots_own_entries(tmp_path):
    from rootclad.gw.dataset import simulate

    path = tmp_path / "gw.root"
    simulate(path, 150, seed=3, workers=1, chunk_size=64, progress=False)
    x, y = CompiledBatchIterator(str(path), shuffle=False).read_all()
    f = ROOT.TFile.Open(str(path))
    t = f.Get("events")
    buf = np.zeros(2048, dtype=np.float32)
    t.SetBranchAddress("strain", buf)
    for i in (0, 63, 64, 149):
        t.GetEntry(i)
        np.testing.assert_array_equal(x[i, 0], buf)
        assert y[i] == t.label
    t.ResetBranchAddresses()
    f.Close()


def _checksum(iterator):
    total, pos = 0.0, 0
    for x, y in iterator:
        for i in range(len(y)):
            pos += 1
            total += pos * (float(x[i, 0, 0]) + float(y[i]))
    return total


@pytest.mark.skipif(shutil.which("root") is None, reason="root.exe not on PATH")
def test_root_macro_reads_the_same_batches(files):
    arg = ",".join(files)
    cmd = [
        "root",
        "-b",
        "-q",
        "-l",
        f'{REPO}/macros/read_gw_batches.C("{arg}", 64, 2, "train", 0.2, 11)',
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("epoch")]
    assert len(lines) == 2, out.stdout
    py = BatchIterator(files, batch_size=64, split="train", validation_fraction=0.2, seed=11)
    for line in lines:
        fields = line.split()
        entries = int(fields[fields.index("entries") + 1])
        checksum = float(fields[fields.index("checksum") + 1])
        assert entries == py.entries
        assert checksum == pytest.approx(_checksum(py), rel=1e-12)


@pytest.mark.skipif(shutil.which("root") is None, reason="root.exe not on PATH")
def test_root_macro_reports_bad_input(tmp_path):
    missing = tmp_path / "missing.root"
    cmd = ["root", "-b", "-q", "-l", f'{REPO}/macros/read_gw_batches.C("{missing}", 64, 1)']
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert f"{missing}: file not found" in out.stderr


def test_declare_is_cached_and_names_are_hashed():
    from rootclad.data import cling

    code = "namespace rootclad_test_cache { inline int answer() { return 42; } }"
    cling.declare(code)
    cling.declare(code)  # a second Declare of the same code would be refused by Cling
    assert ROOT.rootclad_test_cache.answer() == 42
    a, b = cling.hashed_name("f", "x"), cling.hashed_name("f", "y")
    assert a != b and a == cling.hashed_name("f", "x") and a.startswith("f_")
    with pytest.raises(RuntimeError, match="refused"):
        cling.declare("this is not C++;")
    assert sys.modules.get("ROOT") is not None


_FIRST_USE_IN_TWO_THREADS = """
import sys, threading
import numpy as np
from rootclad.data.compiled import CompiledBatchIterator
from rootclad.data.loader import BatchIterator
path = sys.argv[1]
out, errors = {}, []
def run(k):
    try:
        it = CompiledBatchIterator(path, batch_size=64, seed=k)
        out[k] = [(x.copy(), y.copy()) for x, y in it]
    except BaseException as err:
        errors.append(repr(err))
threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
for k in range(2):
    ref = list(BatchIterator(path, batch_size=64, seed=k))
    assert len(ref) == len(out[k]), (len(ref), len(out[k]))
    for (x, y), (rx, ry) in zip(out[k], ref):
        assert np.array_equal(x, rx) and np.array_equal(y, ry)
print("ok", sum(len(y) for _, y in out[0]), sum(len(y) for _, y in out[1]))
"""


def test_first_use_from_two_threads_at_once(tmp_path):
    """Two threads making their first reader at the same moment, each in a fresh process (the
    first use is what raced): one of them used to get an extra batch of memory that was never
    read (663 entries of a 600-entry file, labels like -604993500) or a half-set-up ROOT.
    Each thread's batches must equal the uproot reader's."""
    path = write_uproot(tmp_path / "t600.root", np.arange(600), np.arange(600) % 2, basket=50)
    for _ in range(4):
        proc = subprocess.run(
            [sys.executable, "-c", _FIRST_USE_IN_TWO_THREADS, str(path)],
            capture_output=True, text=True, timeout=300, cwd=REPO,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == ["ok", "600", "600"]
