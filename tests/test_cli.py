"""The rootclad command line."""

import os
import subprocess
import sys

import pytest


def _doctor(env=None):
    out = subprocess.run([sys.executable, "-m", "rootclad", "doctor"], capture_output=True,
                         text=True, env={**os.environ, **(env or {})}, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_doctor_lists_engines_and_tools():
    text = _doctor()
    for needle in ("pullback", "clad", "torch autograd", "BLAS", "ROOT", "nvcc", "cuBLAS",
                   "CUDA driver", "CUDA device", "cache"):  # fmt: skip
        assert needle in text, (needle, text)


def test_doctor_says_where_it_looked_for_clad():
    text = _doctor({"ROOTCLAD_CLAD_PLUGIN": "/nonexistent/clad.so"})
    clad_line = next(ln for ln in text.splitlines() if ln.strip().startswith("clad "))
    assert "unavailable" in clad_line and "/nonexistent/clad.so" in clad_line, clad_line


def test_doctor_says_how_to_enable_clad_where_it_is_missing():
    text = _doctor({"ROOTCLAD_CLAD_PLUGIN": "/nonexistent/clad.so"})
    needles = ("export ROOTCLAD_CLAD_PLUGIN=", "ROOTCLAD_CLAD_INCLUDE=", "ROOTCLAD_CXX=")
    for needle in (*needles, "docs/install.md"):
        assert needle in text, (needle, text)


def test_version_and_a_help_without_markup():
    from rootclad import __version__

    out = _rootclad("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"rootclad {__version__}", out
    out = _rootclad("--help")
    assert out.returncode == 0 and "``" not in out.stdout and "gw run" in out.stdout, out.stdout
    text = " ".join(_rootclad("gw", "run", "--help").stdout.split())
    assert "default: rootclad-gw-run" in text and "the default preset's 24576" in text, text


def test_doctor_reports_rootclad_s_own_thread_count():
    line = next(ln for ln in _doctor({"ROOTCLAD_NUM_THREADS": "3"}).splitlines()
                if "rootclad threads" in ln)  # fmt: skip
    assert line.split()[2:] == ["3", "(ROOTCLAD_NUM_THREADS)"], line
    line = next(ln for ln in _doctor({"ROOTCLAD_NUM_THREADS": "many"}).splitlines()
                if "rootclad threads" in ln)  # fmt: skip
    assert "refused" in line and "many" in line, line


@pytest.mark.parametrize("command", ["run", "background"])
def test_gw_run_help_explains_every_option_without_format_escapes(command):
    """argparse %-formats help strings but not descriptions: a description's "50%%" was shown
    as such; RST's double backticks do not belong in a terminal either."""
    out = _rootclad("gw", command, "--help")
    assert out.returncode == 0, out.stderr
    assert "%%" not in out.stdout and "``" not in out.stdout, out.stdout
    options = out.stdout[out.stdout.index("options:") :].splitlines()[1:]
    for i, line in enumerate(options):  # an option alone on its line has its help below
        if line.startswith("  -") and len(line.split("  ")) < 3 and not line.strip().endswith("]"):
            follows = options[i + 1] if i + 1 < len(options) else ""
            assert follows.startswith(" " * 10) and not follows.strip().startswith("-"), line


def _rootclad(*args):
    return subprocess.run([sys.executable, "-m", "rootclad", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_ordinary_mistakes_get_one_line_not_a_traceback(tmp_path):
    cases = [
        (["gw", "simulate", str(tmp_path / "x.root"), "-n", "5", "--sample-rate", "1000"],
         "power of two"),
        (["gw", "info", str(tmp_path / "missing.root")], "No such file"),
        (["gw", "simulate", str(tmp_path / "no" / "dir" / "x.root"), "-n", "5"],
         "no such directory"),
        (["gw", "simulate", str(tmp_path / "x.root"), "-n", "5", "--snr", "5,inf"], "finite"),
        (["gw", "simulate", str(tmp_path / "x.root"), "-n", "5", "--chunk-size", "0"],
         "chunk_size"),
    ]  # fmt: skip
    for args, words in cases:
        out = _rootclad(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("rootclad gw ") and words in out.stderr, out.stderr
    assert not any(tmp_path.iterdir())


def test_gw_run_is_the_main_job_and_reports_bad_config_in_one_line(tmp_path):
    out = _rootclad("gw", "--help")
    assert "run" in out.stdout and "the main job" in " ".join(out.stdout.split())
    (tmp_path / "run.toml").write_text("epochs = 0\n")
    for args, words in [
        (["--config", str(tmp_path / "run.toml")], "epochs must be at least 1"),
        (["--config", str(tmp_path / "none.toml")], "no such configuration file"),
        (["--events", "0", "--out", str(tmp_path / "o")], "train_events must be at least 1"),
    ]:
        out = _rootclad("gw", "run", *args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("rootclad gw run: error:") and words in out.stderr, out.stderr
    assert not (tmp_path / "o").exists()


_MODELS = """
import torch
def make_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.LazyLinear(1))
def not_a_model():
    return 3
"""


def _build_and_check(args, stem, net, cwd):
    """`rootclad build ARGS -o STEM` writes the three files, the weights equal ``net``'s."""
    import numpy as np
    import uproot

    out = subprocess.run([sys.executable, "-m", "rootclad", "build", *args, "--engine",
                          "pullback", "-o", str(stem)], cwd=cwd, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in stem.parent.iterdir()) == ["net.h", "net.root", "net.so"]
    with uproot.open(f"{stem}.root") as f:
        for name, p in net.state_dict().items():
            got = f[name]["values"].array(library="np")[0]
            np.testing.assert_allclose(got, p.reshape(-1).detach().numpy(), rtol=1e-7)


def test_build_compiles_and_exports_a_model_with_its_weights(tmp_path):
    import torch

    (tmp_path / "mymodels.py").write_text(_MODELS)
    ns: dict = {}
    exec(_MODELS, ns)
    net = ns["make_net"]()
    net(torch.zeros(1, 1, 10))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)  # weights that differ from the callable's own
    torch.save(net.state_dict(), tmp_path / "state.pt")
    stem = tmp_path / "out" / "net"
    stem.parent.mkdir()
    _build_and_check(["mymodels:make_net", "--weights", "state.pt", "--input-shape", "1,10"],
                     stem, net, tmp_path)  # fmt: skip
    state = net.state_dict()
    next(iter(state.values())).view(-1)[0] = float("nan")
    torch.save(state, tmp_path / "nan.pt")
    for args, words in (
        (["mymodels:make_net", "--weights", "nan.pt", "--input-shape", "1,10"], "nan at [0"),
        (["mymodels:not_a_model", "--input-shape", "1,10"], "not a torch.nn.Module"),
        (["mymodels", "--input-shape", "1,10"], "module:callable"),
        (["nomodule:x", "--input-shape", "1,10"], "cannot load nomodule:x"),
    ):
        bad = subprocess.run([sys.executable, "-m", "rootclad", "build", *args, "-o",
                              str(tmp_path / "x")], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr


def test_build_exports_an_onnx_file_with_its_weights(tmp_path):
    import warnings

    import torch

    onnx = pytest.importorskip("onnx")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), torch.zeros(2, 5), str(tmp_path / "net.onnx"), dynamo=False,
                          input_names=["x"], dynamic_axes={"x": {0: "B"}})  # fmt: skip
    assert onnx.load(str(tmp_path / "net.onnx")).graph.node
    stem = tmp_path / "out" / "net"
    stem.parent.mkdir()
    _build_and_check(["net.onnx"], stem, net, tmp_path)
    bad = subprocess.run([sys.executable, "-m", "rootclad", "build", "net.onnx", "--input-shape",
                          "5", "-o", str(tmp_path / "x")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "drop --weights and --input-shape" in bad.stderr, bad.stderr


def test_outputs_that_are_an_input_are_refused_before_writing(tmp_path, capsys):
    """emit -o over its source, or its header and weights on one file (also through a link or
    a second name of the source); build -o whose STEM.root is the weights it reads."""
    from rootclad.cli import main

    src = tmp_path / "net.onnx"
    src.write_bytes(b"not read: refused first")
    (tmp_path / "link.dat").symlink_to(src)
    os.link(src, tmp_path / "hard.dat")
    weights = tmp_path / "w.root"
    weights.write_bytes(b"weights")
    cases = [
        (["emit", str(src), "-o", str(src)], "over the input"),
        (["emit", str(src), "-o", str(tmp_path / "net.dat")], "written twice"),
        (["emit", str(src), "-o", str(tmp_path / "link.hxx")], "over the input"),
        (["emit", str(src), "-o", str(tmp_path / "hard.hxx")], "over the input"),
        (
            [
                "build",
                "mod:fn",
                "-o",
                str(tmp_path / "w"),
                "--weights",
                str(weights),
                "--input-shape",
                "3",
            ],
            "over the input",
        ),
    ]
    before = sorted(tmp_path.iterdir())
    for args, words in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"rootclad {args[0]}: error: ") and words in err, err
    assert sorted(tmp_path.iterdir()) == before
    assert src.read_bytes() == b"not read: refused first" and weights.read_bytes() == b"weights"
