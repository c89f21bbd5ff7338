"""A ROOT user's session: macros run twice, an export moved to another directory, and an
exception nobody catches in ``root -b -q``.

Cling unloads a macro before running it again (``.x`` twice, ``gROOT->ProcessLine(".x ...")``
in a loop). rootclad's headers crashed ROOT there (a ``std::function`` made from a lambda;
``#pragma once``, whose state Cling keeps when it unloads the header's declarations); they now
survive it. ROOT 6.40's Cling still cannot run again a macro that instantiated standard or ROOT
templates itself (root-project/cling#428: "definitions missing on second invocation"): the
first test shows it with a macro of plain ROOT, and the supported ways (``.L`` once and call,
ACLiC's ``+``) are tested with rootclad's own macros.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("ROOT", reason="the macros need ROOT")
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("root") is None, reason="root.exe not on PATH"),
]

import rootclad  # noqa: E402
from rootclad.gw import simulate  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
INCLUDE = Path(rootclad.get_include()) / "rootclad"
N = 256


def _root(*lines: str, cwd: Path) -> subprocess.CompletedProcess:
    """``root -l -b -q`` on the given lines (-e each), ACLiC's builds in cwd."""
    cmd = ["root", "-l", "-b", "-q", "-e", f'gSystem->SetBuildDir("{cwd}/aclic", true);']
    for line in lines:
        cmd += ["-e", line]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def _crashed(out: subprocess.CompletedProcess) -> bool:
    return "*** Break ***" in out.stdout + out.stderr


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(1, 4, 8), nn.ReLU(), nn.MaxPool1d(4), nn.Flatten(),
                         nn.Linear(4 * 62, 1))  # fmt: skip


@pytest.fixture(scope="module")
def gw_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gw") / "gw.root"
    simulate(path, 200, seed=1, workers=1, progress=False, duration=N / 2048)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cm = rootclad.compile(_net(), example_input=torch.zeros(1, 1, N), engine="pullback")
    stem = tmp_path_factory.mktemp("export") / "gwnet"
    cm.export(stem)
    return cm, stem


def test_plain_root_cannot_run_a_macro_of_std_templates_twice(tmp_path):
    """ROOT's own limit, without rootclad: the second run of a three-line macro that fills a
    std::vector<float> misses the definitions its first run instantiated. When a ROOT release
    fixes it this test fails: then run rootclad's macros with .x twice below too."""
    (tmp_path / "fill.C").write_text(
        "#include <algorithm>\n#include <cstdio>\n#include <vector>\n"
        "int fill() { std::vector<float> v(3); std::fill(v.begin(), v.end(), 1.f);\n"
        '  std::printf("sum %g\\n", v[0] + v[1] + v[2]); return 0; }\n'
    )
    out = _root(".x fill.C", ".x fill.C", cwd=tmp_path)
    assert out.stdout.count("sum 3") == 1, out.stdout + out.stderr
    assert "unresolved while linking" in out.stdout + out.stderr


@pytest.mark.parametrize("header", ["model.h", "scoring.h", "tree_reader.h", "fit.h", "evaluate.h"])
def test_a_macro_including_rootclad_runs_again_without_crashing_root(tmp_path, header):
    """The headers alone (declarations, nothing instantiated by the macro): .x twice, and
    gROOT->ProcessLine(".x ...") in a loop. Before: *** Break *** illegal instruction."""
    (tmp_path / "inc.C").write_text(
        f'#include "{INCLUDE / header}"\n#include <cstdio>\n'
        'int inc() { std::printf("ran %d\\n", 1); return 0; }\n'
    )
    loop = 'for (int i = 0; i < 3; ++i) gROOT->ProcessLine(".x inc.C");'
    out = _root(".x inc.C", ".x inc.C", loop, cwd=tmp_path)
    assert not _crashed(out), out.stdout + out.stderr
    assert out.returncode == 0 and out.stdout.count("ran 1") == 5, out.stdout + out.stderr


def test_model_h_runs_again_wherever_its_text_falls(tmp_path):
    """Cling's second parse of a header it read as text went wrong or not depending on the
    length of what came before (CI: "#else after #else" in sys/stat.h, from a longer build
    directory). Three lengths of the line before (13 of 30 lengths failed then)."""
    (tmp_path / "inc.C").write_text(
        f'#include "{INCLUDE / "model.h"}"\n#include <cstdio>\n'
        'int inc() { std::printf("ran %d\\n", 1); return 0; }\n'
    )
    for pad in (1, 4, 7):
        first = f'gSystem->SetBuildDir("{tmp_path}/{"x" * pad}", true);'
        out = subprocess.run(
            ["root", "-l", "-b", "-q", "-e", first, "-e", ".x inc.C", "-e", ".x inc.C"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.stdout.count("ran 1") == 2, (pad, out.stdout + out.stderr)


@pytest.mark.slow
def test_the_macros_twice_in_one_session(gw_file, exported, tmp_path):
    """score_gw.C through ACLiC twice (the same AUC), read_gw_batches.C loaded twice and
    called twice, and run with .x three times in a ProcessLine loop."""
    _, stem = exported
    score = f'.x {REPO}/macros/score_gw.C+("{gw_file}", "{stem}", "{tmp_path}/s")'
    read = f"{REPO}/macros/read_gw_batches.C"
    call = f'read_gw_batches("{gw_file}", 64, 1)'
    loop = f'for (int i = 0; i < 3; ++i) gROOT->ProcessLine(".x {read}(\\"{gw_file}\\", 64, 1)");'
    out = _root(score, score, f".L {read}", f".L {read}", call, call, loop, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert not _crashed(out) and out.returncode == 0, text
    aucs = re.findall(r"AUC (\S+) on", out.stdout)
    assert len(aucs) == 2 and aucs[0] == aucs[1], text
    sums = re.findall(r"checksum (\S+)", out.stdout)
    assert len(sums) == 5 and len(set(sums)) == 1, text


def test_an_export_moved_elsewhere_works_from_cling_aclic_and_gpp(exported, tmp_path):
    """STEM.h names no path of the checkout: the three files copied to a new directory work
    with .x, ACLiC and a g++ program built with ROOT's flags alone (no rootclad include
    path); the relative stem is resolved against the working directory (dlopen alone would
    search the library path for "gwnet.so")."""
    cm, stem = exported
    moved = tmp_path / "moved"
    moved.mkdir()
    for ext in (".h", ".so", ".root"):
        shutil.copy(f"{stem}{ext}", moved)
    header = (moved / "gwnet.h").read_text()
    assert str(REPO) not in header and str(INCLUDE) not in header
    body = ('  rootclad::Model m("gwnet");\n  ROOT::RVec<float> x(256, 1.0f);\n'
            '  std::printf("score %.7f\\n", m.score(x));\n')  # fmt: skip
    (moved / "use.C").write_text(f'#include "gwnet.h"\n#include <cstdio>\nint use() {{\n{body}'
                                 "  return 0;\n}\n")  # fmt: skip
    (moved / "prog.cpp").write_text(f'#include "gwnet.h"\n#include <cstdio>\nint main() {{\n'
                                    f"{body}}}\n")  # fmt: skip
    want = cm.predict(torch.ones(1, 1, N)).item()
    out = _root(".x use.C", ".x use.C+", ".x use.C+", cwd=moved)
    scores = [float(s) for s in re.findall(r"score (\S+)", out.stdout)]
    assert len(scores) == 3 and max(abs(s - want) for s in scores) <= 1e-6, out.stdout + out.stderr
    from rootclad.root.flags import root_flags

    flags = [f for f in root_flags() if not f.startswith(f"-I{rootclad.get_include()}")]
    cxx = shutil.which("g++") or pytest.skip("no g++")
    subprocess.run([cxx, "-O1", "prog.cpp", "-o", "prog", *flags], cwd=moved, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    run = subprocess.run(["./prog"], cwd=moved, capture_output=True, text=True, timeout=60)
    assert abs(float(re.search(r"score (\S+)", run.stdout).group(1)) - want) <= 1e-6, run


@pytest.mark.parametrize("aclic", [False, True], ids=["cling", "aclic"])
def test_an_uncaught_exception_in_root_b_q_is_a_root_error_and_exit_code_1(tmp_path, aclic):
    """root -b -q has no handler: an exception leaving a macro aborted with "terminate called"
    (exit code 250). rootclad's hosts report it as a ROOT error and exit with 1, naming the
    file as resolved against the working directory."""
    (tmp_path / "bad.C").write_text(
        f'#include "{INCLUDE / "model.h"}"\n'
        'int bad() { rootclad::Model m("no_such_model"); return 0; }\n'
    )
    cmd = ["root", "-l", "-b", "-q", "-e", f'gSystem->SetBuildDir("{tmp_path}/aclic", true);',
           "bad.C+" if aclic else "bad.C"]  # fmt: skip
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "terminate called" not in text, text
    assert f"Error in <rootclad>: uncaught exception, the macro stopped: rootclad: cannot open " \
           f"{tmp_path}/no_such_model.root" in text, text  # fmt: skip


def test_the_handler_outlives_a_macro_until_it_is_unloaded(exported, tmp_path):
    """The handler a Model installed reports an exception of a later macro; once the code that
    installed it is unloaded (.U), C++'s own handler is back (before: a handler left in freed
    code, and the process ended silently with exit code 245)."""
    _, stem = exported
    (tmp_path / "ok.C").write_text(
        f'#include "{INCLUDE / "model.h"}"\nint ok() {{ rootclad::Model m("{stem}"); return 0; }}\n'
    )
    (tmp_path / "boom.C").write_text(
        '#include <stdexcept>\nint boom() { throw std::runtime_error("boom"); return 0; }\n'
    )
    out = _root(".x ok.C", ".x boom.C", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Error in <rootclad>: uncaught exception, the macro stopped: boom" in out.stderr
    out = _root(".x ok.C", ".U ok.C", ".x boom.C", cwd=tmp_path)
    assert out.returncode == 250 and "terminate called" in out.stderr, out.stdout + out.stderr


# what rootclad's headers for macros may include of the system's C headers: Cling parses these
# as text (they are in none of its modules), and a header it parsed as text can break on the
# macro's second run (above). With these three model.h ran again at each of 30 lengths of the
# line before; with <sys/stat.h> and <fcntl.h> too it failed at 13 of them (measured by hand).
# TSystem and <cstdio> do their work; <filesystem> is parsed as text as well.
C_HEADERS_FOR_MACROS = {"dlfcn.h", "pthread.h", "unistd.h", "cuda_runtime.h"}  # the last: nvcc only
MACRO_HEADERS = ["model.h", "scoring.h", "tree_reader.h", "fit.h"]


def _system_headers(include: Path, headers: list[str]) -> dict[str, str]:
    """The system C headers (and <filesystem>) that `headers` reach in `include`, each with the
    header that includes it."""
    seen, todo, found = set(), list(headers), {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in (include / name).read_text().splitlines():
            if m := re.match(r'\s*#\s*include\s*"([^"]+)"', line):
                todo.append(str(Path(name).parent / m.group(1)))
            elif m := re.match(r"\s*#\s*include\s*<([^>]+)>", line):
                inc = m.group(1)
                ours = inc.startswith(("T", "R")) and inc.endswith((".h", ".hxx"))  # ROOT's
                if (("." in inc or "/" in inc) and not ours) or inc == "filesystem":
                    found.setdefault(inc, name)
    return found


def test_headers_for_macros_include_no_other_system_c_header(tmp_path):
    found = _system_headers(INCLUDE, MACRO_HEADERS)
    extra = {inc: by for inc, by in found.items() if inc not in C_HEADERS_FOR_MACROS}
    assert not extra, f"system headers Cling parses as text, included by: {extra}"
    # the check finds one a header reaches through another
    (tmp_path / "a.h").write_text('#include <TFile.h>\n#include <vector>\n#include "b/c.h"\n')
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "c.h").write_text("#include <unistd.h>\n  #  include <sys/stat.h>\n")
    assert _system_headers(tmp_path, ["a.h"]) == {"unistd.h": "b/c.h", "sys/stat.h": "b/c.h"}
