"""User strings never become C++ source: stems, column names and file names given to Cling or
written into exported headers, and no ROOT call that can print runs without the GIL.

References: the compiled model's own ``cm.predict`` (checked against torch in tests/core) for
the scores; a subprocess for what used to crash the interpreter.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="rootclad.root needs ROOT (PyROOT)")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402
import rootclad.root  # noqa: E402

F64 = torch.float64

# Each was pasted into the C++ that Cling compiled: the quote ended the string literal (the
# last two ran `touch MARKER` in the current directory), the backslash and newline broke it.
HOSTILE_DIRS = [
    'a"b',
    "a\\b",
    "a\nb",
    '");system("touch MARKER',
    '"+std::to_string(system("touch MARKER"))+"',
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 3, dtype=F64), engine="pullback")
    cm.export(d / "tab")
    n = 20
    cols = {"pt": np.linspace(1, 50, n), "eta": np.linspace(-2, 2, n),
            "njet": (np.arange(n) % 4).astype(np.float64)}  # fmt: skip
    with uproot.recreate(d / "events.root") as f:
        f["t"] = cols
    x = torch.tensor(np.stack([cols["pt"], cols["eta"], cols["njet"]], 1), dtype=F64)
    return cm, d / "tab", d / "events.root", cm.predict(x).numpy()[:, 0]


@pytest.mark.parametrize("dirname", HOSTILE_DIRS)
def test_a_stem_in_any_directory_is_a_value_never_code(exported, tmp_path, monkeypatch, dirname):
    _, stem, events, ref = exported
    monkeypatch.chdir(tmp_path)
    d = tmp_path / dirname
    d.mkdir()
    for ext in (".so", ".root"):
        shutil.copyfile(f"{stem}{ext}", d / f"tab{ext}")
    df = ROOT.RDataFrame("t", str(events))
    df = rootclad.root.define_score(df, d / "tab", inputs=["pt", "eta", "njet"])
    df = rootclad.root.define_saliency(df, d / "tab", inputs=["pt", "eta", "njet"])
    got = df.AsNumpy(["score", "saliency"])
    assert not (tmp_path / "MARKER").exists()
    np.testing.assert_allclose(got["score"], ref, rtol=1e-12)
    assert len(got["saliency"]) == len(ref)


def _tree(path, cols):
    with uproot.recreate(path) as f:
        f.mktree("t", {k: v.dtype for k, v in cols.items()}).extend(cols)


def test_a_column_name_that_is_not_an_identifier_is_refused_by_name(exported, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    """RDataFrame finds the columns of a Define expression in its text: a column named like
    code ran that code (``system`` once per event) when pasted into the expression."""
    _, stem, _, _ = exported
    monkeypatch.chdir(tmp_path)
    hostile = 'njet+system("touch MARKER")'
    x = np.arange(4.0)
    _tree(tmp_path / "t.root", {"pt": x, "eta": x, "njet": x, hostile: x})
    df = ROOT.RDataFrame("t", str(tmp_path / "t.root"))
    for define in (rootclad.root.define_score, rootclad.root.define_saliency):
        with pytest.raises(ValueError, match=r"column 'njet\+system.*not a C\+\+ name"):
            define(df, stem, inputs=["pt", "eta", hostile]).AsNumpy()
    assert not (tmp_path / "MARKER").exists()


def test_dotted_and_keyword_column_names_still_work(exported, tmp_path):
    """RDataFrame replaces a column's name in the expression, so ``a.b`` and ``class`` (a C++
    keyword) are fine: only names that are not identifiers joined by dots are refused."""
    cm, stem, _, _ = exported
    x = np.linspace(-1, 1, 6)
    _tree(tmp_path / "t.root", {"a.b": x, "class": 2 * x, "c_3": 3 * x})
    df = ROOT.RDataFrame("t", str(tmp_path / "t.root"))
    got = rootclad.root.define_score(df, stem, inputs=["a.b", "class", "c_3"]).AsNumpy(["score"])
    ref = cm.predict(torch.tensor(np.stack([x, 2 * x, 3 * x], 1))).numpy()[:, 0]
    np.testing.assert_allclose(got["score"], ref, rtol=1e-12)


_WEIRD = 'we"i\\rd\nint injected = ;\n(x)'


def test_exported_header_names_files_on_one_line_and_finds_rootclad_anywhere(
    exported, tmp_path, monkeypatch
):
    """A file name with a newline wrote code into the header's ``//`` comment; an install path
    with ``)`` or a newline broke ``R__ADD_INCLUDE_PATH`` (the header now names no path: it
    holds rootclad's host inlined). The header still works in ROOT."""
    cm, _, events, ref = exported
    include = tmp_path / _WEIRD / "include"
    include.parent.mkdir()
    shutil.copytree(rootclad.get_include(), include)
    monkeypatch.setattr(rootclad, "get_include", lambda: str(include))
    (tmp_path / "out").mkdir()
    paths = cm.export(tmp_path / "out" / _WEIRD)  # ROOT reads no file name with '#' or '?'
    lines = paths[".h"].read_text().splitlines()
    assert [line[:2] for line in lines[:6]] == ["//"] * 4 + ["#i", "#d"]
    assert str(include) not in paths[".h"].read_text()
    assert 'we"i\\x5crd\\x0aint injected = ;\\x0a(x)' in lines[0]  # comment_text's escapes
    shutil.copyfile(paths[".h"], tmp_path / "hdr.h")
    script = (
        "import sys, ROOT\n"
        "ROOT.gInterpreter.AddIncludePath(sys.argv[1])\n"
        "assert ROOT.gInterpreter.Declare('#include \"' + sys.argv[2] + '\"')\n"
        "m = ROOT.rootclad.Model(sys.argv[3])\n"
        "print(m.input_size())\n"
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), "hdr.h", str(paths[".so"])[:-3]],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "3"


def test_standalone_header_names_files_on_one_line(tmp_path):
    from rootclad.compiler import emit_header

    net = nn.Sequential(nn.Linear(3, 2))
    out = tmp_path / "a\nb.hxx"
    emit_header(net, torch.zeros(2, 3), out, name="net")
    head = out.read_text().splitlines()[:3]
    assert head[0].startswith("// a\\x0ab.hxx: generated")
    assert head[1].startswith("// Weights: a\\x0ab.dat.")
    assert head[2].startswith("// define ROOTCLAD_USE_CBLAS")


# Run in a subprocess: ROOT's warnings reached PyROOT's handler without the GIL and killed the
# interpreter (SIGSEGV, ROOT's crash handler then exits with its own code).
_TRUNCATED = """
import sys
import rootclad.root
try:
    rootclad.root.score_tree(sys.argv[1], sys.argv[2], inputs="x", output=sys.argv[3])
except Exception as err:
    print("RAISED", type(err).__name__, err)
"""


def test_score_tree_on_a_truncated_file_raises_naming_it(exported, tmp_path):
    _, stem, _, _ = exported
    x = np.random.default_rng(0).standard_normal((5000, 3)).astype(np.float32)
    with uproot.recreate(tmp_path / "full.root") as f:
        f.mktree("events", {"x": np.dtype((np.float32, (3,)))}).extend({"x": x})
    data = (tmp_path / "full.root").read_bytes()
    (tmp_path / "cut.root").write_bytes(data[: len(data) * 2 // 3])
    proc = subprocess.run(
        [sys.executable, "-c", _TRUNCATED, str(tmp_path / "cut.root"), str(stem),
         str(tmp_path / "scores.root")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RAISED" in proc.stdout and str(tmp_path / "cut.root") in proc.stdout
    assert not (tmp_path / "scores.root").exists()


_WARN_WITHOUT_GIL = """
from rootclad.data.cling import declare, import_root
ROOT = import_root()
declare('inline void rootclad_test_warn() { ::Warning("rootclad_test_warn", "no GIL here"); }')
f = ROOT.rootclad_test_warn
f.__release_gil__ = True
f()
print("ALIVE")
"""


def test_a_root_warning_without_the_gil_is_printed_not_a_crash():
    proc = subprocess.run([sys.executable, "-c", _WARN_WITHOUT_GIL], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "ALIVE"
    assert "Warning in <rootclad_test_warn>: no GIL here" in proc.stderr


# Every call with a null array, in a subprocess: the null pointer reached the model's kernels
# (SIGSEGV). Prints one line per call: the exception, or what the call returned.
_NULLS = """
import sys
import numpy as np
import rootclad.root
from rootclad.data.cling import import_root

ROOT = import_root()
m = rootclad.root.load(sys.argv[1])
opt = ROOT.rootclad.Adam(m, 1e-2)
x, y, w, out = np.zeros((4, 3)), np.zeros((4, 1)), np.ones(4), np.zeros((4, 1))
calls = {
    "predict": [x, out], "input_grad": [x, np.zeros((4, 3))], "loss": [x, y],
    "loss_and_grad": [x, y, w], "train_step": [x, y, opt, w],
}
for method, args in calls.items():
    for i, arg in enumerate(args):
        if arg is opt:
            continue
        for null in (ROOT.nullptr, None, 0):
            given = [*args[:i], null, *args[i + 1 :]]
            try:
                r = getattr(m, method)(*given[:2], 4, *given[2:])
                print(method, i, "returned", r)
            except (ValueError, TypeError) as err:
                print(method, i, type(err).__name__, str(err).replace("\\n", " "))
try:
    m.predict(x, out[:1], np.int64(4))
    print("numpy batch size returned")
except ValueError as err:
    print("numpy batch size ValueError", err)
short = np.ones(1)
for method, extra in (("loss_and_grad", []), ("train_step", [opt])):
    try:
        getattr(m, method)(x, y, 4, *extra, short)
        print(method, "short weights", "returned")
    except ValueError as err:
        print(method, "short weights", "ValueError", err)
"""


def test_null_and_short_arrays_are_refused_by_name(exported, tmp_path):
    _, stem, _, _ = exported
    proc = subprocess.run([sys.executable, "-c", _NULLS, str(stem)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    names = {"predict": ["input", "output"], "input_grad": ["input", "input gradient"],
             "loss": ["input", "target"], "loss_and_grad": ["input", "target", "weight"],
             "train_step": ["input", "target", None, "weight"]}  # fmt: skip
    for method, args in names.items():
        for i, name in enumerate(args):
            got = [line for line in lines if line.startswith(f"{method} {i} ")]
            if name is None:
                assert got == []
            elif name == "weight":  # nullptr or 0: no weights; cppyy refuses None
                assert [line.split()[2] for line in got] == ["returned", "TypeError", "returned"]
            else:
                assert len(got) == 3, (method, i, lines)
                for line in got:
                    assert f"rootclad.Model.{method}: the {name} array is a null pointer" in line
    assert "a batch of 4 needs 4 output values, the array given holds 1" in lines[-3]
    for method in ("loss_and_grad", "train_step"):
        (line,) = [line for line in lines if line.startswith(f"{method} short weights")]
        assert "a batch of 4 needs 4 weight values, the array given holds 1" in line


@pytest.mark.parametrize(("file", "name"), [("export.hxx", None), ("net.hxx", "class"),
                                            ("net.hxx", "clad"), ("net.hxx", "std")])  # fmt: skip
def test_standalone_namespace_is_never_a_keyword_or_a_namespace_it_uses(tmp_path, file, name):
    """``namespace export {`` (the default name of ``export.hxx``) does not compile; ``clad``
    or ``std`` would merge into the namespaces the header itself opens."""
    from rootclad.compiler import emit_header

    with pytest.raises(ValueError, match=r"'(export|class|clad|std)' .*give --name"):
        emit_header(nn.Sequential(nn.Linear(3, 2)), torch.zeros(2, 3), tmp_path / file, name)
    assert not list(tmp_path.iterdir())
