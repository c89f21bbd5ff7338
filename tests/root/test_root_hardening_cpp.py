"""rootclad::Model and score_tree against full disks, input branches and weights of other types,
and null arrays (issue 25, items 4, 5, 7, 8 and 12).

References: the bytes of the file that was there before, the parameters and scores of the
compiled model in Python, the values written here with uproot or ROOT.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="rootclad.root needs ROOT (PyROOT)")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402
import rootclad.root  # noqa: E402

N = 8


@pytest.fixture(scope="module")
def stem(tmp_path_factory):
    """A float64 MLP of 2561 parameters (20 KB of weights), exported."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(N, 256), nn.Tanh(), nn.Linear(256, 1)).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, N, dtype=torch.float64),
                          engine="pullback")  # fmt: skip
    stem = tmp_path_factory.mktemp("export") / "mlp"
    cm.export(stem)
    return cm, stem


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    x = np.random.default_rng(1).standard_normal((20000, N)).astype(np.float32)
    path = tmp_path_factory.mktemp("events") / "events.root"
    with uproot.recreate(path) as f:
        f.mktree("events", {"strain": np.dtype((np.float32, (N,)))}).extend({"strain": x})
    return x, path


@pytest.fixture
def full_disk(tmp_path):
    """A 4 MiB tmpfs (room for an export: the MLP's is about 1.1 MB), to be filled by fill()
    up to the last few KB."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")

    def fill(leave: int = 8192):
        with open(disk / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        os.truncate(disk / "filler", os.path.getsize(disk / "filler") - leave)

    yield disk, fill
    subprocess.run(["umount", "-l", str(disk)], check=True)


def _contents(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if p.name != "filler"}


# ---- item 4: Model::save on a full disk -------------------------------------------------------


def test_save_on_a_full_disk_raises_enospc_and_keeps_the_old_file(stem, full_disk):
    cm, s = stem
    disk, fill = full_disk
    shutil.copyfile(f"{s}.root", disk / "mlp.root")  # the good weights, then the disk fills
    fill()
    before = _contents(disk)
    m = rootclad.root.load(s)
    opt = ROOT.rootclad.Adam(m, 1e-3)
    x = np.zeros((4, N))
    m.train_step(x, np.ones((4, 1)), 4, opt)
    with pytest.raises(Exception, match=f"cannot write {disk / 'mlp.root'}: No space left on "
                                        "device"):  # fmt: skip
        m.save(str(disk / "mlp.root"), opt)
    assert _contents(disk) == before  # byte-identical, no partial file
    with uproot.open(disk / "mlp.root") as f:
        np.testing.assert_array_equal(f["0.weight"]["values"].array(library="np")[0],
                                      cm.state_dict()["0.weight"].reshape(-1).numpy())  # fmt: skip


def test_save_writes_a_file_load_reads_and_names_the_file_it_cannot_write(stem, tmp_path):
    """The working case, and a directory that does not exist: the error names the file."""
    _, s = stem
    m = rootclad.root.load(s)
    m.save(str(tmp_path / "w.root"))
    fresh = rootclad.root.load(s)
    fresh.load(str(tmp_path / "w.root"))
    assert np.array_equal(np.asarray(fresh.parameters()), np.asarray(m.parameters()))
    with pytest.raises(Exception, match=f"cannot write {tmp_path / 'no' / 'w.root'}: No such "
                                        "file or directory"):  # fmt: skip
        m.save(str(tmp_path / "no" / "w.root"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.root"]


@pytest.mark.parametrize("name", ["w#1.root", "w?filetype=raw.root", "run#3/w.root"])
def test_a_name_root_would_read_as_another_file_is_refused(stem, tmp_path, name):
    """TFile reads "w#1.root" as the file "w" with an anchor: the temporary file went to another
    path (".w"), overwriting whatever was there, and the rename then failed."""
    _, s = stem
    m = rootclad.root.load(s)
    (tmp_path / "run#3").mkdir()
    (tmp_path / ".w").write_text("someone else's file")
    with pytest.raises(Exception, match="ROOT reads what follows '#' or '\\?' in a file name"):
        m.save(str(tmp_path / name))
    assert (tmp_path / ".w").read_text() == "someone else's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".w", "run#3"]


# ---- item 5: score_tree on a full disk ----------------------------------------------------------


_SCORE = """
import sys, ROOT, rootclad.root
m = rootclad.root.load(sys.argv[1])
try:
    ROOT.rootclad.score_tree(m, sys.argv[2], "events", "strain", sys.argv[3])
    print("returned")
except Exception as err:
    print("raised:", str(err).splitlines()[-1].strip())
"""


def test_score_tree_on_a_full_disk_raises_and_leaves_no_output(stem, events, full_disk):
    """(In a subprocess: how ROOT's error print meets Python is item 11's, not this test's.)"""
    _, s = stem
    _, path = events
    disk, fill = full_disk
    (disk / "old_scores.root").write_bytes(b"an older output")
    fill(4096)  # 20000 scores take about 60 KB
    before = _contents(disk)
    for out in (disk / "scores.root", disk / "old_scores.root"):
        proc = subprocess.run([sys.executable, "-c", _SCORE, str(s), str(path), str(out)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (
            f"runtime_error: rootclad: cannot write {out}: No space left on device" in proc.stdout
        ), proc.stdout + proc.stderr[-3000:]
        assert _contents(disk) == before


# ---- item 7: score_tree on input branches of other types ---------------------------------------


def _root_tree(path, kind):
    """A TTree "events" whose branch "strain" holds N numbers per entry as `kind`, by ROOT."""
    f = ROOT.TFile(str(path), "RECREATE")
    t = ROOT.TTree("events", kind)
    if kind.startswith("vector"):
        v = ROOT.std.vector[kind[7:-1]]()
        t.Branch("strain", v)
    else:
        a = np.zeros(N, np.float64 if kind == "double" else np.int32)
        t.Branch("strain", a, f"strain[{N}]/{'D' if kind == 'double' else 'I'}")
    for e in range(20):
        if kind.startswith("vector"):
            v.clear()
            for i in range(N):
                v.push_back(e + 0.5 * i)
        else:
            a[:] = e + np.arange(N) // 2
        t.Fill()
    t.Write()
    f.Close()


@pytest.mark.parametrize("kind, found", [("double", r"Double_t \(strain\[8\]/D\)"),
                                         ("int", r"Int_t \(strain\[8\]/I\)"),
                                         ("vector<double>", "vector<double>")])  # fmt: skip
def test_score_tree_refuses_input_branches_it_would_read_as_garbage(stem, tmp_path, kind, found):
    _, s = stem
    path = tmp_path / "in.root"
    _root_tree(path, kind)
    m = rootclad.root.load(s)
    with pytest.raises(Exception, match=f"{path}: tree 'events', branch 'strain': expected a "
                                        f"float\\[N\\] array or vector<float> per entry, found "
                                        f"{found}"):  # fmt: skip
        ROOT.rootclad.score_tree(m, str(path), "events", "strain", str(tmp_path / "s.root"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.root"]


def test_score_tree_still_scores_float_arrays_and_refuses_other_lengths(stem, events, tmp_path):
    cm, s = stem
    x, path = events
    m = rootclad.root.load(s)
    assert ROOT.rootclad.score_tree(m, str(path), "events", "strain", str(tmp_path / "s.root"),
                                    "scores", "score", 64) == 20000  # fmt: skip
    with uproot.open(tmp_path / "s.root") as f:
        got = f["scores"]["score"].array(library="np")
    ref = cm.predict(torch.from_numpy(x).double()).numpy()[:, 0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    short = tmp_path / "short.root"
    with uproot.recreate(short) as f:
        f.mktree("events", {"strain": np.dtype((np.float32, (N - 1,)))}).extend(
            {"strain": np.zeros((5, N - 1), np.float32)}
        )
    with pytest.raises(
        Exception, match="branch 'strain': 7 values per entry, the model .* takes 8"
    ):
        ROOT.rootclad.score_tree(m, str(short), "events", "strain", str(tmp_path / "t.root"))
    assert not (tmp_path / "t.root").exists()


def test_score_tree_with_a_batch_larger_than_the_file_allocates_only_the_file(stem, tmp_path):
    """A batch of 2**30 allocated 2**30 inputs up front (32 GiB) before reading 5 entries."""
    cm, s = stem
    path = tmp_path / "five.root"
    x = np.random.default_rng(3).standard_normal((5, N)).astype(np.float32)
    with uproot.recreate(path) as f:
        f.mktree("events", {"strain": np.dtype((np.float32, (N,)))}).extend({"strain": x})
    out = rootclad.root.score_tree(
        path, s, inputs="strain", output=tmp_path / "s.root", batch_size=2**30
    )
    with uproot.open(out) as f:
        got = f["scores"]["score"].array(library="np")
    ref = cm.predict(torch.from_numpy(x).double()).numpy()[:, 0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


# ---- item 8: weights stored as float32 or another type ---------------------------------------


def _rewrite_weights(src, dst, dtype):
    """`src` as rootclad writes it, with every tensor's values stored as `dtype` (uproot)."""
    with uproot.open(src) as f:
        meta = str(f["rootclad_metadata"])
        tensors = {k.split(";")[0]: f[k]["values"].array(library="np") for k in f.keys()
                   if k.split(";")[0] != "rootclad_metadata"}  # fmt: skip
    with uproot.recreate(dst) as f:
        for name, values in tensors.items():
            v = values.astype(dtype)
            f.mktree(name, {"values": np.dtype((dtype, (v.shape[1],)))}).extend({"values": v})
        f["rootclad_metadata"] = meta
    return {k: v[0] for k, v in tensors.items()}


def test_float32_weights_are_widened_exactly(stem, tmp_path):
    cm, s = stem
    tensors = _rewrite_weights(f"{s}.root", tmp_path / "f32.root", np.float32)
    m = rootclad.root.load(s)
    m.load(str(tmp_path / "f32.root"))
    want = np.concatenate([tensors[n].astype(np.float32).astype(np.float64)
                           for n, _ in cm.named_parameters()])  # fmt: skip
    assert np.array_equal(np.asarray(m.parameters()), want)
    assert np.abs(want).max() > 0
    # the constructor reads the weights the same way
    for ext in (".so", ".h"):
        shutil.copyfile(f"{s}{ext}", tmp_path / f"f32{ext}")
    assert np.array_equal(np.asarray(rootclad.root.load(tmp_path / "f32").parameters()), want)


def test_weights_of_another_type_are_refused_naming_the_tensor(stem, tmp_path):
    _, s = stem
    _rewrite_weights(f"{s}.root", tmp_path / "i32.root", np.int32)
    m = rootclad.root.load(s)
    before = np.asarray(m.parameters()).copy()
    with pytest.raises(Exception, match=r"i32.root: tensor '0.weight' is stored as Int_t "
                                        r"\(values\[2048\]\); expected double"):  # fmt: skip
        m.load(str(tmp_path / "i32.root"))
    assert np.array_equal(np.asarray(m.parameters()), before)


def _rewrite_optimizer(src, dst, state, field="state"):
    """`src` (written by Model::save with an optimizer) with the optimizer's ``field`` (state,
    config) replaced by ``state(its values)``."""
    with uproot.open(src) as f:
        meta = str(f["rootclad_metadata"])
        arrays = {k.split(";")[0]: f[k].arrays(library="np") for k in f.keys()
                  if k.split(";")[0] != "rootclad_metadata"}  # fmt: skip
    with uproot.recreate(dst) as f:
        for name, cols in arrays.items():
            if name == "rootclad_optimizer":
                cols = dict(cols, **{field: state(cols[field])})
            types = {k: np.dtype((v.dtype, v.shape[1:])) for k, v in cols.items()}
            f.mktree(name, types).extend(cols)
        f["rootclad_metadata"] = meta


def _set(index, value):
    def change(values):
        values = values.copy()
        values[0, index] = value
        return values

    return change


@pytest.mark.parametrize(
    "field, state, message",
    [
        ("state", lambda v: v.astype(np.int64), "the optimizer's state is stored as Long64_t"),
        ("state", _set(3, np.nan),
         r"the optimizer's state holds a non-finite value \(nan\) at index 3"),
        # OptimConfig: kind, lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps
        ("config", _set(6, 1.0), "the optimizer's config: invalid beta1: 1.0"),
        ("config", _set(1, -0.1), "the optimizer's config: invalid learning rate: -0.1"),
    ],
    ids=["int64", "nan", "beta1-one", "negative-lr"],
)  # fmt: skip
def test_optimizer_state_of_another_type_or_not_finite_is_refused_changing_nothing(
    stem, tmp_path, field, state, message
):
    """A refused optimizer state leaves the model's parameters as they were too."""
    _, s = stem
    m = rootclad.root.load(s)
    opt = ROOT.rootclad.Adam(m, 1e-3)
    m.train_step(np.ones((4, N)), np.ones((4, 1)), 4, opt)
    m.save(str(tmp_path / "ckpt.root"), opt)
    _rewrite_optimizer(tmp_path / "ckpt.root", tmp_path / "bad.root", state, field)
    fresh = rootclad.root.load(s)
    before = np.asarray(fresh.parameters()).copy()
    assert not np.array_equal(before, np.asarray(m.parameters()))
    fresh_opt = ROOT.rootclad.Adam(fresh, 0.5)
    with pytest.raises(Exception, match="bad.root: " + message):
        fresh.load(str(tmp_path / "bad.root"), fresh_opt)
    assert np.array_equal(np.asarray(fresh.parameters()), before)
    assert fresh_opt.step == 0 and fresh_opt.config.lr == 0.5


# ---- item 12: null arrays ---------------------------------------------------------------------

_NULLS = """
import sys, ROOT, rootclad.root
m = rootclad.root.load(sys.argv[1])
opt = ROOT.rootclad.Adam(m, 1e-3)
# rootclad.Model's Python methods refuse a null array before C++ sees it
# (test_root_hardening_cling.py); this reaches the C++ checks behind them
ROOT.gInterpreter.Declare('''
#include <stdexcept>
#include <string>
#include <vector>
std::string rootclad_test_null_call(rootclad::Model& m, rootclad::Optimizer& opt, int which) {
  std::vector<double> x(4 * 8), y(4);
  const double* none = nullptr;
  double* out = nullptr;
  try {
    switch (which) {
    case 0: m.predict(none, out, 4); break;
    case 1: m.predict(x.data(), out, 4); break;
    case 2: m.input_grad(x.data(), out, 4); break;
    case 3: m.loss(x.data(), none, 4); break;
    case 4: m.loss_and_grad(none, y.data(), 4); break;
    case 5: m.train_step(x.data(), none, 4, opt); break;
    }
  } catch (const std::invalid_argument& e) {
    return std::string("invalid_argument: ") + e.what();
  }
  return "returned";
}
''')
names = ["predict x", "predict out", "input_grad", "loss", "loss_and_grad", "train_step"]
for which, name in enumerate(names):
    print(name, "raised", ROOT.rootclad_test_null_call(m, opt, which))
"""

_NULLS_MACRO = """
#include "rootclad/model.h"
void nulls(const char* stem) {
  rootclad::Model m(stem);
  std::vector<float> x(4 * 8), y(4);
  try { m.train_step(x.data(), (const float*)nullptr, 4, *new rootclad::SGD(m)); }
  catch (const std::invalid_argument& e) { printf("raised: %s\\n", e.what()); }
  try { m.predict((const float*)nullptr, y.data(), 4); }
  catch (const std::invalid_argument& e) { printf("raised: %s\\n", e.what()); }
}
"""


def test_null_arrays_are_refused_by_every_entry_point(stem, tmp_path):
    """(In subprocesses: before, predict(nullptr, nullptr, 4) killed the process.)"""
    _, s = stem
    proc = subprocess.run([sys.executable, "-c", _NULLS, str(s)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    want = {"predict x": "predict: x", "predict out": "predict: out",
            "input_grad": "input_grad: dx", "loss": "loss: y", "loss_and_grad": "loss_and_grad: x",
            "train_step": "train_step: y"}  # fmt: skip
    for name, what in want.items():
        assert f"{name} raised invalid_argument: rootclad::Model::{what} is null" in proc.stdout, (
            proc.stdout
        )
    if shutil.which("root") is None:
        return
    (tmp_path / "nulls.C").write_text(_NULLS_MACRO)
    inc = rootclad.get_include()
    proc = subprocess.run(["root", "-l", "-b", "-q", "-e", f'gInterpreter->AddIncludePath("{inc}")',
                           f'{tmp_path / "nulls.C"}("{s}")'], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert "raised: rootclad::Model::train_step: y is null" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    assert "raised: rootclad::Model::predict: x is null" in proc.stdout, proc.stdout + proc.stderr


# ---- the macros write through the same helper --------------------------------------------------


def _root_macro(call: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(["root", "-l", "-b", "-q", call], cwd=cwd, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.mark.skipif(shutil.which("root") is None, reason="root.exe not on PATH")
def test_macros_on_a_full_disk_fail_naming_the_file_and_keep_the_old_weights(stem, full_disk):
    """train_gw.C saves back to STEM.root; score_gw.C writes OUT.root and OUT.png."""
    _, s = stem
    disk, fill = full_disk
    for ext in (".so", ".root", ".h"):
        shutil.copyfile(f"{s}{ext}", disk / f"mlp{ext}")
    gw = s.parent / "gw.root"
    x = np.random.default_rng(2).standard_normal((200, N)).astype(np.float32)
    with uproot.recreate(gw) as f:
        f.mktree("events", {"strain": np.dtype((np.float32, (N,))), "label": np.int32}).extend(
            {"strain": x, "label": np.arange(200, dtype=np.int32) % 2}
        )
    fill()
    before = _contents(disk)
    repo = Path(__file__).resolve().parents[2]
    out = _root_macro(f'macros/train_gw.C("{gw}", "{disk / "mlp"}", 1, 32)', repo)
    assert f"train_gw: rootclad: cannot write {disk / 'mlp.root'}: No space left on device" in (
        out.stderr
    ), out.stdout + out.stderr
    assert "(int) 1" in out.stdout
    assert _contents(disk) == before
    fill(0)
    before = _contents(disk)
    out = _root_macro(f'macros/score_gw.C("{gw}", "{s}", "{disk / "scores"}")', repo)
    assert f"score_gw: rootclad: cannot write {disk / 'scores.root'}: No space left on device" in (
        out.stderr
    ), out.stdout + out.stderr
    assert _contents(disk) == before


_TRAINER_NULLS = """
import sys, ROOT
from rootclad.data.cling import add_include_path, declare, include_dir
from rootclad.torch.libtorch import build_trainer
assert ROOT.gSystem.Load(str(build_trainer())) >= 0
add_include_path(include_dir())
declare('#include "rootclad/libtorch_trainer.h"\\n#include "rootclad/model.h"\\n')
m = ROOT.rootclad.Model(sys.argv[1])
p = m.parameters()
prefix = str(m.api().prefix)
x = ROOT.std.vector["float"](4 * 8, 0.0)
null = ROOT.nullptr
calls = {
    "params": lambda: ROOT.rootclad.LibTorchTrainer(sys.argv[1] + ".so", prefix, null,
                                                    m.n_params(), "adam", 1e-3),
    "predict": lambda: t.predict(x.data(), null, 4),
    "train_step": lambda: t.train_step(null, x.data(), 4),
    "parameters": lambda: t.parameters(null),
}
t = ROOT.rootclad.LibTorchTrainer(sys.argv[1] + ".so", prefix, p.data(), m.n_params(), "adam", 1e-3)
for name, call in calls.items():
    try:
        call()
        print(name, "returned")
    except Exception as err:
        print(name, "raised", str(err).splitlines()[-1].strip())
"""


def test_null_arrays_are_refused_by_the_libtorch_trainer(stem):
    _, s = stem
    proc = subprocess.run([sys.executable, "-c", _TRAINER_NULLS, str(s)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    want = {"params": "LibTorchTrainer: params", "predict": "predict: out",
            "train_step": "train_step: x", "parameters": "parameters: out"}  # fmt: skip
    for name, what in want.items():
        assert f"{name} raised invalid_argument: rootclad::LibTorchTrainer::{what} is null" in (
            proc.stdout
        ), proc.stdout + proc.stderr[-3000:]
