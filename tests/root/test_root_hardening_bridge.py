"""The ROOT bridge against its own outputs and names (issue 42): an output that is its input,
a column name that would be read as a leaf list, an export replaced while it is open, and
rootclad's C++ errors as rootclad's Python errors.

References: the compiled models' own ``cm.predict`` (checked against torch in tests/core) and
the bytes of the files before the call. The two models are the architectures of
test_root_hardening_cling.py and test_root_hardening_cpp.py, whose libraries the session's
compile cache then holds once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="rootclad.root needs ROOT (PyROOT)")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402
import rootclad.data  # noqa: E402
import rootclad.root  # noqa: E402

F64 = torch.float64
N = 200  # events


def _compile(seed: int, n_in: int, hidden: int):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, 1)).double()
    return rootclad.compile(net, example_input=torch.zeros(1, n_in, dtype=F64), engine="pullback")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two exports of different architectures (so their libraries differ in prefix too), and a
    file of N events with a float[3] branch ``x`` that the first one scores."""
    d = tmp_path_factory.mktemp("bridge")
    cm_a, cm_b = _compile(1, 3, 5), _compile(0, 8, 256)
    cm_a.export(d / "a")
    cm_b.export(d / "b")
    x = np.random.default_rng(2).standard_normal((N, 3)).astype(np.float32)
    with uproot.recreate(d / "events.root") as f:
        f.mktree("events", {"x": np.dtype((np.float32, (3,)))}).extend({"x": x})
    ref = cm_a.predict(torch.from_numpy(x).double()).numpy()[:, 0]
    return SimpleNamespace(
        a=d / "a", b=d / "b", events=d / "events.root", x=x, ref=ref, cm_a=cm_a, cm_b=cm_b
    )


def _scores(path, column="score"):
    return uproot.open(path)["scores"][column].array(library="np")


# -- an output that is the input ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["the same path", "a symbolic link", "a hard link"])
def test_score_tree_refuses_an_output_that_is_its_input(models, tmp_path, how):
    """score_tree(f, stem, output=f) replaced the input with its scores and returned normally.
    Refused before anything is written, from Python and from C++ (macros), however the output
    names the input."""
    f = tmp_path / "in.root"
    shutil.copyfile(models.events, f)
    before = f.read_bytes()
    out = {
        "the same path": f,
        "a symbolic link": tmp_path / "link.root",
        "a hard link": tmp_path / "hard.root",
    }[how]
    if how == "a symbolic link":
        out.symlink_to(f)
    elif how == "a hard link":
        os.link(f, out)
    with pytest.raises(ValueError, match=rf"output {re.escape(str(out))} is the input"):
        rootclad.root.score_tree(f, models.a, inputs="x", output=out)
    m = rootclad.root.load(models.a)
    with pytest.raises(Exception, match=rf"output {re.escape(str(out))} is the input"):
        ROOT.rootclad.score_tree(m, str(f), "events", "x", str(out))
    assert f.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"in.root", out.name})


def test_score_tree_refuses_to_write_over_the_models_own_files(models, tmp_path):
    for ext in (".so", ".root", ".h"):
        shutil.copyfile(f"{models.a}{ext}", tmp_path / f"a{ext}")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for ext in (".so", ".root"):
        with pytest.raises(ValueError, match=r"is the model's own"):
            rootclad.root.score_tree(
                models.events, tmp_path / "a", inputs="x", output=tmp_path / f"a{ext}"
            )
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# -- names that reach a leaf list --------------------------------------------------------------
# Each was pasted into the leaf list "<column>/F" over one float: s[64] wrote 63 floats of stack
# memory into the file, s[4000000] crashed Python, x/D wrote garbage doubles, a:b:c added leaves.
BAD_COLUMNS = ["s[64]", "x/D", "a:b:c", "", "1st", "a.b", "s[4000000]"]


@pytest.mark.parametrize("column", BAD_COLUMNS)
def test_a_score_column_must_be_an_identifier(models, tmp_path, column):
    out = tmp_path / "s.root"
    with pytest.raises(ValueError, match=rf"score_tree: column {re.escape(repr(column))} is not"):
        rootclad.root.score_tree(models.events, models.a, inputs="x", output=out, column=column)
    m = rootclad.root.load(models.a)
    with pytest.raises(Exception, match=r"rootclad::score_tree: column .* is not an identifier"):
        ROOT.rootclad.score_tree(m, str(models.events), "events", "x", str(out), "scores", column)
    assert not out.exists()
    df = ROOT.RDataFrame("events", str(models.events))
    for define in (rootclad.root.define_score, rootclad.root.define_saliency):
        with pytest.raises(ValueError, match=rf"column {re.escape(repr(column))} is not"):
            define(df, models.a, inputs="x", column=column)


def test_a_score_column_that_is_an_identifier_holds_one_float_per_entry(models, tmp_path):
    out = rootclad.root.score_tree(
        models.events, models.a, inputs="x", output=tmp_path / "s.root", column="nn_score_2"
    )
    branch = uproot.open(out)["scores"]["nn_score_2"]
    assert branch.typename == "float" and list(uproot.open(out)["scores"].keys()) == ["nn_score_2"]
    np.testing.assert_allclose(branch.array(library="np"), models.ref, rtol=1e-6)


def test_from_rdataframe_refuses_column_names_that_are_not_names(models, tmp_path):
    """RDataFrame's Snapshot writes a column named s[64] with the leaf list "s[64]/F": the
    reader then held 64 values per entry, 63 of them memory beyond the one float."""
    n = 20
    with uproot.recreate(tmp_path / "w.root") as f:
        f.mktree("t", {"s[64]": np.float32, "y": np.float32}).extend(
            {"s[64]": np.ones(n, np.float32), "y": np.zeros(n, np.float32)}
        )
    df = ROOT.RDataFrame("t", str(tmp_path / "w.root"))
    with pytest.raises(ValueError, match=r"feature 's\[64\]' is not a C\+\+ name"):
        rootclad.data.from_rdataframe(df, features=["s[64]"], target="y")
    with pytest.raises(ValueError, match=r"target 's\[64\]' is not a C\+\+ name"):
        rootclad.data.from_rdataframe(df, features=["y"], target="s[64]")


# -- an export replaced while it is open --------------------------------------------------------
_REPLACED = """
import json, os, shutil, sys
import numpy as np
import ROOT

a, b, stem, include = sys.argv[1:5]
ROOT.gInterpreter.AddIncludePath(include)  # no rootclad import: this test is the C++ loader's
assert ROOT.gInterpreter.Declare('#include "rootclad/model.h"')
load = ROOT.rootclad.Model
x3 = np.linspace(-1, 1, 6).reshape(2, 3)
x8 = np.linspace(-1, 1, 16).reshape(2, 8)


def run(m, x):
    out = np.zeros((2, 1))
    m.predict(x, out, 2)
    return [m.input_size(), out[:, 0].tolist()]


def in_place(src):  # as cp does: the same file, its bytes rewritten
    for ext in (".so", ".root"):
        shutil.copyfile(src + ext, stem + ext)


def by_rename(src):  # as cm.export does: a new file under the old name
    for ext in (".so", ".root"):
        shutil.copyfile(src + ext, stem + ext + ".new")
        os.replace(stem + ext + ".new", stem + ext)


got = {}
in_place(a)
first = load(stem)
got["a"] = run(first, x3)
in_place(b)
got["a after cp"] = run(first, x3)
got["b"] = run(load(stem), x8)
by_rename(a)
got["a again"] = run(load(stem), x3)
by_rename(b)
got["b again"] = run(load(stem), x8)
print(json.dumps(got))
"""


def test_an_export_replaced_while_open_is_the_new_model_and_the_old_keeps_running(models, tmp_path):
    """Replaced by rename, dlopen returned the library already open under that path (the hash
    check had passed on the new file): "has no symbol" for another prefix, the old code for
    the same one. Replaced in place (cp), the open model's code changed under it (SIGSEGV).
    Each library now runs from a copy named by its hash. (In a subprocess: the old code
    crashed the interpreter.)"""
    x3 = np.linspace(-1, 1, 6).reshape(2, 3)
    x8 = np.linspace(-1, 1, 16).reshape(2, 8)
    ref_a = models.cm_a.predict(torch.from_numpy(x3)).numpy()[:, 0]
    ref_b = models.cm_b.predict(torch.from_numpy(x8)).numpy()[:, 0]
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _REPLACED,
            str(models.a),
            str(models.b),
            str(tmp_path / "m"),
            rootclad.get_include(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    for key, n_in, ref in (
        ("a", 3, ref_a),
        ("a after cp", 3, ref_a),
        ("b", 8, ref_b),
        ("a again", 3, ref_a),
        ("b again", 8, ref_b),
    ):
        assert got[key][0] == n_in, (key, got)
        np.testing.assert_allclose(got[key][1], ref, rtol=1e-12, err_msg=key)


def test_the_loaded_copy_is_private_and_named_by_its_hash(models, tmp_path, monkeypatch):
    """The copy sits in the cache directory's ``exports`` (0700, as the compile cache), named
    by the MD5 the weights record; a directory others can write to is refused, naming it."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(cache))
    m = rootclad.root.load(models.a)
    assert m.input_size() == 3
    md5 = json.loads(str(uproot.open(f"{models.a}.root")["rootclad_metadata"]))["library_md5"]
    copy = cache / "exports" / f"{md5}.so"
    assert copy.read_bytes() == Path(f"{models.a}.so").read_bytes()
    assert sorted(p.name for p in copy.parent.iterdir()) == [copy.name]
    for d in (cache, copy.parent, copy):  # the copy too, whatever the umask
        assert d.stat().st_mode & 0o777 == 0o700, d
    os.chmod(copy.parent, 0o777)
    try:
        with pytest.raises(
            rootclad.root.ExportError,
            match=rf"{re.escape(str(copy.parent))} is writable by group and "
            r"others \(mode 777\)",
        ):
            rootclad.root.load(models.a)
    finally:
        os.chmod(copy.parent, 0o700)


def test_the_models_of_one_export_copy_and_check_its_library_once(models, tmp_path, monkeypatch):
    """Each rootclad::Model copied and hashed the whole library, so SlotModels (one Model per
    slot) made one copy per slot. Now a process checks a library file once: the copy keeps its
    inode however many Models open it. A library rewritten in a later second (even with the
    same bytes; the key holds TSystem's modification time, in seconds) is copied and checked
    again, and a stale one is still refused."""
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path / "cache"))
    stem = tmp_path / "m"
    for ext in (".so", ".root"):
        shutil.copyfile(f"{models.a}{ext}", f"{stem}{ext}")
    md5 = json.loads(str(uproot.open(f"{stem}.root")["rootclad_metadata"]))["library_md5"]
    copy = tmp_path / "cache" / "exports" / f"{md5}.so"
    first_mtime = os.stat(f"{stem}.so").st_mtime
    assert rootclad.root.load(stem).input_size() == 3
    first = copy.stat().st_ino
    slots = ROOT.rootclad.SlotModels(str(stem), 4)
    assert slots.size() == 4 and all(slots[i].input_size() == 3 for i in range(4))
    assert copy.stat().st_ino == first
    shutil.copyfile(f"{models.a}.so", f"{stem}.so")  # in place, as cp does: checked again
    later = os.stat(f"{stem}.so").st_mtime + 2
    os.utime(f"{stem}.so", (later, later))
    assert rootclad.root.load(stem).input_size() == 3
    assert copy.stat().st_ino != first
    shutil.copyfile(f"{models.b}.so", f"{stem}.so")  # a stale library under the same weights,
    os.utime(f"{stem}.so", (first_mtime, first_mtime))  # as it was at the first check: refused
    with pytest.raises(rootclad.root.ExportError, match=r"m\.so is not the library"):
        rootclad.root.load(stem)
    del slots


# -- rootclad's errors -------------------------------------------------------------------------
def test_a_stale_or_damaged_export_raises_export_error_with_rootclads_message_first(
    models, tmp_path
):
    """cppyy raised its own exception (a TypeError when several overloads were tried), its
    message the C++ signatures with rootclad's line buried inside."""
    shutil.copyfile(f"{models.a}.so", tmp_path / "stale.so")
    shutil.copyfile(f"{models.b}.root", tmp_path / "stale.root")
    shutil.copyfile(f"{models.a}.so", tmp_path / "cut.so")
    data = Path(f"{models.a}.root").read_bytes()
    (tmp_path / "cut.root").write_bytes(data[:200])
    stale = rf"^rootclad: {re.escape(str(tmp_path / 'stale.so'))} is not the library"
    for call in (
        lambda: rootclad.root.load(tmp_path / "stale"),
        lambda: ROOT.rootclad.Model(str(tmp_path / "stale")),
        lambda: rootclad.root.score_tree(
            models.events, tmp_path / "stale", inputs="x", output=tmp_path / "s.root"
        ),
    ):
        with pytest.raises(rootclad.root.ExportError, match=stale) as err:
            call()
        assert isinstance(err.value, RuntimeError) and "overload" not in str(err.value)
    with pytest.raises(rootclad.root.ExportError, match=r"^rootclad: .*cut\.root"):
        rootclad.root.load(tmp_path / "cut")
    with pytest.raises(TypeError):  # a call C++ has no overload for stays cppyy's TypeError
        ROOT.rootclad.Model(5)
    assert not (tmp_path / "s.root").exists()


def test_a_bad_input_tree_raises_scoring_error_naming_file_and_branch(models, tmp_path):
    with pytest.raises(
        rootclad.root.ScoringError,
        match=rf"^{re.escape(str(models.events))}: tree 'events', branch 'nope': "
        "no such branch",
    ):
        rootclad.root.score_tree(models.events, models.a, inputs="nope", output=tmp_path / "s.root")
