"""A model that knows its inputs: ``cm.export(stem, schema=...)`` stores the input columns, the
target, weight and class names; ``define_score`` / ``define_saliency`` / ``score_tree`` and
``rootclad::Model`` read them; a ``rootclad.data.Standardize`` stage is compiled into the
model, frozen (C++ training leaves it unchanged too).

References: the torch module itself (scores, saliency), numpy on the columns read by uproot,
rootclad.optim.Adam in Python (itself checked against torch.optim in tests/core), Python's json.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import uproot
from torch import nn

ROOT = pytest.importorskip("ROOT", reason="the schema is read by ROOT's rootclad::Model")
pytestmark = pytest.mark.root

import rootclad  # noqa: E402
from rootclad.data import Schema, Standardize, from_rdataframe  # noqa: E402
from rootclad.root.export import headers_id  # noqa: E402

N = 300


def write_toy(path: Path, n: int = N, seed: int = 1) -> dict:
    """Scalars of two types, a fixed array of 4, integer labels and weights, as a TTree."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n).astype(np.int32)
    data = {"pt": (rng.normal(50, 10, n) + 5 * label).astype(np.float32),
            "eta": rng.normal(0, 2, n), "jets": rng.normal(3, 1, (n, 4)).astype(np.float32),
            "label": label, "w": rng.uniform(0.5, 2, n)}  # fmt: skip
    types = {k: np.dtype((v.dtype, v.shape[1:])) if v.ndim > 1 else v.dtype
             for k, v in data.items()}  # fmt: skip
    with uproot.recreate(path) as f:
        f.mktree("t", types).extend(data)
    return data


def features(data) -> np.ndarray:
    return np.concatenate([data["pt"][:, None], data["eta"][:, None], data["jets"]], 1)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A toy file, a net with a Standardize fitted on it, exported with its schema."""
    d = tmp_path_factory.mktemp("schema")
    data = write_toy(d / "toy.root")
    it = from_rdataframe(ROOT.RDataFrame("t", str(d / "toy.root")),
                         features=["pt", "eta", "jets"], target="label", weight="w")  # fmt: skip
    torch.manual_seed(0)
    net = nn.Sequential(Standardize.fit(it), nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    cm = rootclad.compile(net, torch.zeros(1, 6), engine="pullback")
    classes = ['quoted "x", y\\z', "snow \u2603 \U0001d708"]
    cm.export(d / "net", schema=it.schema.replace(classes=classes))
    return d, data, net, cm, classes


def test_schema_stored_in_the_metadata_and_read_by_cpp(toy):
    d, data, net, cm, classes = toy
    with uproot.open(d / "net.root") as f:
        meta = json.loads(str(f["rootclad_metadata"]))
    assert meta["input_columns"] == ["pt", "eta", "jets"]
    assert meta["input_lengths"] == [1, 1, 4]
    assert (meta["target"], meta["weight"], meta["classes"]) == ("label", "w", classes)
    assert meta["frozen"] == ["0.mean", "0.std"]
    (stage,) = meta["preprocess"]
    x = features(data).astype(np.float64)
    assert stage["stage"] == "standardize" and stage["module"] == "0"
    np.testing.assert_allclose(stage["mean"], x.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stage["std"], x.std(0), rtol=1e-6)
    assert Schema.from_json(meta) == Schema({"pt": 1, "eta": 1, "jets": 4}, target="label",
                                            weight="w", classes=classes)  # fmt: skip

    m = rootclad.root.load(d / "net")
    assert [str(c) for c in m.input_columns()] == ["pt", "eta", "jets"]
    assert list(m.input_lengths()) == [1, 1, 4]
    assert (str(m.target_column()), str(m.weight_column())) == ("label", "w")
    # the C++ JSON reader: escapes, a BMP character and a surrogate pair, as UTF-8
    assert [bytes(c).decode() for c in m.class_names()] == classes


def test_cpp_json_array_reader_refuses_malformed_arrays():
    rootclad.root.load  # noqa: B018  (declares model.h)
    from rootclad.data.cling import declare_header

    declare_header("model.h")
    read = ROOT.rootclad.detail.json_array
    assert [str(v) for v in read('{"a": [1, 22], "b": null}', "a")] == ["1", "22"]
    assert list(read('{"b": null}', "b")) == [] and list(read("{}", "a")) == []
    for bad in ('{"a": ["x"', '{"a": ["x" "y"]}', '{"a": ["\\q"]}'):
        with pytest.raises(Exception, match="malformed metadata array"):
            read(bad, "a")


def test_cpp_json_array_reader_pairs_only_real_surrogates():
    from rootclad.data.cling import declare_header

    declare_header("model.h")
    read = ROOT.rootclad.detail.json_array
    text = json.dumps({"a": ["\ud83d\u00e9", "\U0001d708"]})  # a lone high surrogate, then é
    lone, pair = (bytes(v) for v in read(text, "a"))
    assert lone.endswith("é".encode()) and len(lone) == 5  # 3 bytes for the lone one, then é
    assert pair.decode() == "\U0001d708"
    with pytest.raises(Exception, match="malformed metadata array"):
        read('{"a": ["\\u00zz"]}', "a")


def test_define_score_and_saliency_need_no_inputs(toy):
    d, data, net, cm, _ = toy
    df = ROOT.RDataFrame("t", str(d / "toy.root"))
    df = rootclad.root.define_saliency(rootclad.root.define_score(df, d / "net"), d / "net")
    got = df.AsNumpy(["score", "saliency"])
    x = torch.tensor(features(data), dtype=torch.float32, requires_grad=True)
    ref = net(x)
    (grad,) = torch.autograd.grad(ref.sum(), x)
    np.testing.assert_allclose(got["score"], ref.detach().numpy()[:, 0], rtol=1e-5, atol=1e-6)
    # the Standardize stage is in the saliency: d score / d pt is w / std, not w
    sal = np.stack([np.asarray(v) for v in got["saliency"]])
    np.testing.assert_allclose(sal, grad.numpy(), rtol=1e-4, atol=1e-6)


def test_given_inputs_are_checked_against_the_schema(toy):
    d, *_ = toy
    df = ROOT.RDataFrame("t", str(d / "toy.root"))
    rootclad.root.define_score(df, d / "net", inputs=["pt", "eta", "jets"], column="s1")
    for fn in (rootclad.root.define_score, rootclad.root.define_saliency):
        with pytest.raises(ValueError, match=r"differ from the columns .* \['pt', 'eta', 'jets'\]"):
            fn(df, d / "net", inputs=["eta", "pt", "jets"])
    with pytest.raises(ValueError, match="differ from the columns"):
        rootclad.root.score_tree(d / "toy.root", d / "net", inputs="jets", tree="t")


def test_score_tree_reads_the_stored_columns(toy):
    d, data, net, _, _ = toy
    out = rootclad.root.score_tree(d / "toy.root", d / "net", tree="t", output=d / "s.root",
                                   batch_size=7)  # fmt: skip
    with uproot.open(out) as f:
        got = f["scores"]["score"].array(library="np")
    ref = net(torch.tensor(features(data), dtype=torch.float32)).detach().numpy()[:, 0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_score_tree_of_columns_names_a_wrong_total(tmp_path):
    write_toy(tmp_path / "toy.root", n=5)
    cm = rootclad.compile(nn.Linear(5, 1), torch.zeros(1, 5), engine="pullback")
    cm.export(tmp_path / "net")
    with pytest.raises(Exception, match=r"columns pt \(1\), jets \(4\), eta \(1\) hold 6 values"):
        rootclad.root.score_tree(tmp_path / "toy.root", tmp_path / "net", tree="t",
                                 inputs=["pt", "jets", "eta"])  # fmt: skip


def test_one_column_schemas_of_a_number_and_of_doubles(tmp_path):
    """A model of one scalar column, and one of a double[3] column: define_score and
    score_tree read them from the schema (the first was refused as 'not the whole input', the
    second read as floats only)."""
    n = 40
    rng = np.random.default_rng(2)
    data = {"pt": rng.normal(size=n).astype(np.float32), "v": rng.normal(size=(n, 3))}
    with uproot.recreate(tmp_path / "one.root") as f:
        f.mktree("t", {"pt": np.float32, "v": np.dtype((np.float64, (3,)))}).extend(data)
    for col, width in (("pt", 1), ("v", 3)):
        torch.manual_seed(0)
        net = nn.Linear(width, 1)
        cm = rootclad.compile(net, torch.zeros(1, width), engine="pullback")
        cm.export(tmp_path / col, schema=Schema({col: width}))
        x = torch.tensor(data[col].reshape(n, width), dtype=torch.float32)
        ref = net(x).detach().numpy()[:, 0]
        df = rootclad.root.define_score(ROOT.RDataFrame("t", str(tmp_path / "one.root")),
                                        tmp_path / col)  # fmt: skip
        np.testing.assert_allclose(df.AsNumpy(["score"])["score"], ref, rtol=1e-5, atol=1e-6)
        out = rootclad.root.score_tree(tmp_path / "one.root", tmp_path / col, tree="t",
                                       output=tmp_path / f"{col}_s.root")  # fmt: skip
        np.testing.assert_allclose(uproot.open(out)["scores"]["score"].array(library="np"), ref,
                                   rtol=1e-5, atol=1e-6)  # fmt: skip


def test_cpp_score_tree_checks_the_columns_against_the_export(toy):
    d, *_ = toy
    m = rootclad.root.load(d / "net")
    cols = ROOT.std.vector["std::string"]()
    for c in ("eta", "pt", "jets"):  # the same sizes in another order: wrong scores before
        cols.push_back(c)
    with pytest.raises(Exception, match="was exported reading the columns pt, eta, jets"):
        ROOT.rootclad.score_tree(m, str(d / "toy.root"), "t", cols, str(d / "x.root"))
    assert not (d / "x.root").exists()


def test_an_optimizer_of_a_model_with_a_frozen_stage_exports_and_resumes(toy, tmp_path):
    """Python's optimizer counts no steps for the frozen tensors; the export keeps the others'
    one count, and rootclad::Model::load(path, &opt) resumes: a third Adam step in C++ equals
    Python's third."""
    d, data, *_ = toy
    torch.manual_seed(4)
    x = torch.from_numpy(features(data)[:16].astype(np.float64))
    y = torch.from_numpy(data["label"][:16, None].astype(np.float64))
    net = nn.Sequential(Standardize.fit(x.numpy(), dtype=torch.float64), nn.Linear(6, 1)).double()
    cm = rootclad.compile(net, torch.zeros(1, 6, dtype=torch.float64), engine="pullback")
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    for _ in range(2):
        cm.train_step(x, y, opt)
    cm.export(tmp_path / "m", optimizer=opt)
    m = rootclad.root.load(tmp_path / "m")
    opt_cpp = ROOT.rootclad.Adam(m, 1.0)
    m.load(str(tmp_path / "m.root"), opt_cpp)
    lc = m.train_step(x.numpy().ravel(), y.numpy().ravel(), 16, opt_cpp)
    lp = cm.train_step(x, y, opt)
    assert abs(lc - lp) <= 1e-12 * abs(lp)
    ref = np.concatenate([p.detach().reshape(-1).numpy() for _, p in cm.named_parameters()])
    np.testing.assert_allclose(np.asarray(m.parameters()), ref, rtol=1e-12, atol=1e-14)


def test_export_refuses_class_names_the_output_does_not_have(tmp_path):
    cm = rootclad.compile(nn.Linear(2, 3), torch.zeros(1, 2), loss="cross_entropy",
                          engine="pullback")  # fmt: skip
    with pytest.raises(ValueError, match=r"2 class names .* output has 3 classes"):
        cm.export(tmp_path / "m", schema=Schema(["a", "b"], classes=["x", "y"]))
    cm.export(tmp_path / "m", schema=Schema(["a", "b"], classes=["x", "y", "z"]))


def test_export_without_schema_asks_for_inputs(tmp_path):
    write_toy(tmp_path / "toy.root", n=5)
    cm = rootclad.compile(nn.Linear(6, 1), torch.zeros(1, 6), engine="pullback")
    cm.export(tmp_path / "net")
    df = ROOT.RDataFrame("t", str(tmp_path / "toy.root"))
    with pytest.raises(ValueError, match="stores no input columns .* pass inputs="):
        rootclad.root.define_score(df, tmp_path / "net")
    # given, they are used as before
    s = rootclad.root.define_score(df, tmp_path / "net", inputs=["pt", "eta", "jets"])
    assert len(s.AsNumpy(["score"])["score"]) == 5


def test_export_refuses_a_schema_of_another_size(tmp_path):
    cm = rootclad.compile(nn.Linear(6, 1), torch.zeros(1, 6), engine="pullback")
    with pytest.raises(ValueError, match=r"pt \(1\), jets \(4\) hold 5 values .* takes 6"):
        cm.export(tmp_path / "net", schema=Schema({"pt": 1, "jets": 4}))
    assert not list(tmp_path.iterdir())  # nothing written


def test_cpp_training_leaves_the_frozen_stage_unchanged(toy):
    """rootclad::Model::train_step skips the tensors exported frozen, as Python's optimizers
    (and torch.optim) do: 3 Adam steps in float64 equal Python's, the Standardize constants
    untouched."""
    d, data, _, _, _ = toy
    it = from_rdataframe(ROOT.RDataFrame("t", str(d / "toy.root")),
                         features=["pt", "eta", "jets"], target="label")  # fmt: skip
    torch.manual_seed(3)
    net = nn.Sequential(Standardize.fit(it), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 1))
    net = net.double()
    cm = rootclad.compile(net, torch.zeros(1, 6, dtype=torch.float64), engine="pullback")
    cm.export(d / "f64", schema=it)
    m = rootclad.root.load(d / "f64")
    x = features(data)[:32].astype(np.float64)
    y = data["label"][:32, None].astype(np.float64)
    opt_cpp = ROOT.rootclad.Adam(m, 1e-2)
    opt = rootclad.optim.Adam(cm, lr=1e-2)
    for _ in range(3):
        lc = m.train_step(x.ravel(), y.ravel(), 32, opt_cpp)
        lp = cm.train_step(torch.from_numpy(x), torch.from_numpy(y), opt)
        assert abs(lc - lp) <= 1e-12 * abs(lp)
    flat = np.asarray(m.parameters())
    ref = np.concatenate([p.detach().reshape(-1).numpy() for _, p in cm.named_parameters()])
    np.testing.assert_allclose(flat, ref, rtol=1e-12, atol=1e-14)
    stage = net[0]
    np.testing.assert_array_equal(flat[:6], stage.mean.detach().numpy())
    np.testing.assert_array_equal(flat[6:12], stage.std.detach().numpy())


def test_headers_fingerprint_is_current():
    model_h = Path(rootclad.paths.get_include()) / "rootclad" / "model.h"
    stated = set(re.findall(r"ROOTCLAD_HEADERS_ID(?: \+ 0 !=)? (0x[0-9a-f]+)", model_h.read_text()))
    want = headers_id()
    assert stated == {want}, f"set ROOTCLAD_HEADERS_ID in rootclad/model.h to {want} (twice)"


@pytest.mark.slow
def test_stem_h_and_headers_of_another_version_stop_with_an_error(toy, tmp_path):
    """g++ on a program including an exported STEM.h and rootclad/model.h: the same version
    compiles; a STEM.h whose fingerprint differs (written by another rootclad) stops at the
    #error, either way round, instead of mixing the two versions' definitions."""
    from rootclad.root.flags import root_flags

    d = toy[0]
    stem_h = (d / "net.h").read_text()
    old = tmp_path / "old.h"
    old.write_text(re.sub(r"0x[0-9a-f]{7}", "0x1234567", stem_h))
    results = {}
    for name, first, second in (("same", d / "net.h", "rootclad/model.h"),
                                ("old first", old, "rootclad/model.h"),
                                ("old second", "rootclad/model.h", old)):  # fmt: skip
        src = tmp_path / "p.cpp"
        src.write_text(f'#include "{first}"\n#include "{second}"\nint main() {{ return 0; }}\n')
        run = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", str(src), *root_flags()],
                             capture_output=True, text=True)  # fmt: skip
        results[name] = (run.returncode, run.stderr)
    assert results["same"][0] == 0, results["same"][1][-2000:]
    for name in ("old first", "old second"):
        code, err = results[name]
        assert code != 0 and "STEM.h of another rootclad version" in err, (name, err[-2000:])


def write_ntuple(path: Path, data: dict) -> str:
    """The toy's columns as an RNTuple "t" (uproot), in clusters of 128 entries."""
    import awkward as ak

    table = ak.Array(data)
    with uproot.recreate(path) as f:
        out = f.mkrntuple("t", table.layout.form)
        for lo in range(0, len(table), 128):
            out.extend(table[lo : lo + 128])
    return str(path)


def test_score_tree_on_an_rntuple_writes_the_net_s_scores(toy):
    d, data, net, _, _ = toy
    src = write_ntuple(d / "toy_nt_scored.root", data)
    out = rootclad.root.score_tree(src, d / "net", tree="t", batch_size=7)
    ref = net(torch.tensor(features(data), dtype=torch.float32)).detach().numpy()[:, 0]
    with uproot.open(out) as f:  # an RNTuple in, an RNTuple out
        assert f.classname_of("scores") == "ROOT::RNTuple"
        got = f["scores"]["score"].array(library="np")
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    as_tree = rootclad.root.score_tree(
        src, d / "net", tree="t", output=d / "nt_tree.root", output_format="ttree", batch_size=7
    )
    with uproot.open(as_tree) as f:
        assert f.classname_of("scores") == "TTree"
        np.testing.assert_array_equal(f["scores"]["score"].array(library="np"), got)
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".")) == []  # no temporaries
    with pytest.raises(ValueError, match="output_format must be one of auto, ttree, rntuple"):
        rootclad.root.score_tree(src, d / "net", tree="t", output_format="parquet")


def test_rntuple_dataframes_score_and_train_as_trees(toy):
    d, data, net, _, _ = toy
    src = write_ntuple(d / "toy_nt_rdf.root", data)
    df = rootclad.root.define_score(ROOT.RDataFrame("t", src), d / "net")
    ref = net(torch.tensor(features(data), dtype=torch.float32)).detach().numpy()[:, 0]
    np.testing.assert_allclose(df.AsNumpy(["score"])["score"], ref, rtol=1e-5, atol=1e-6)
    kw = dict(features=["pt", "eta", "jets"], target="label", weight="w", batch_size=64, seed=1)
    a = list(from_rdataframe(ROOT.RDataFrame("t", src).Filter("pt > 45"), **kw))
    b = list(from_rdataframe(ROOT.RDataFrame("t", str(d / "toy.root")).Filter("pt > 45"), **kw))
    assert len(a) == len(b) > 1
    for xa, xb in zip(a, b, strict=True):
        for u, v in zip(xa, xb, strict=True):
            np.testing.assert_array_equal(u, v)


def test_entries_of_a_tree_an_rntuple_and_neither(toy):
    from rootclad.root.errors import ScoringError
    from rootclad.root.scale_out import _entries

    d, data, *_ = toy
    src = write_ntuple(d / "toy_nt_entries.root", data)
    assert _entries(str(d / "toy.root"), "t") == _entries(src, "t") == N
    with pytest.raises(ScoringError, match=r"toy_nt_entries.root: tree 'u': no such tree"):
        _entries(src, "u")
