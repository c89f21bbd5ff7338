"""Names from a file or a module never become code.

An ONNX file's node, value and initializer names, its graph name, doc strings and metadata, and
a torch module's layer, parameter and buffer names hold hostile text here (a newline and a
``#define``, a comment's end, a trailing backslash, a trigraph, Python source). The C++ of every
emitter (both CPU engines, the device program, ``rootclad emit``'s header) is the same token
for token as that of the same model with plain names, once comments and string literals are
set aside; the hostile models compile, compute what the plain ones compute, and run nothing
the names say."""

from __future__ import annotations

import copy
import os
import re
import subprocess

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import rootclad
from rootclad.codegen.cpu import emit_model
from rootclad.codegen.cuda import emit_device
from rootclad.codegen.cxx import comment_text, string_literal
from rootclad.codegen.standalone import write_header
from rootclad.frontends.aten import graph_from_export
from rootclad.frontends.onnx import to_module
from rootclad.ir.graph import Param
from rootclad.toolchain import find_cxx

MARK = f"/tmp/rootclad-hostile-name-ran-{os.getpid()}"
HOSTILE = [
    'fc")\n#define linear_forward(a,b,c,d,e,f,g) linear_forward(a,b,c,d,e,f,g); '
    f'if (::system("touch {MARK}")) {{}}\n#pragma x',
    f'")\nimport os; os.system("touch {MARK}")\n#',
    "end */ int injected = 1; /* start",
    "trailing backslash \\",
    "trigraph ??/",
    "line\r\nseparator\u2028and ｆｕｌｌｗｉｄｔｈ",
]
# what a torch module's names may hold (anything but a dot): quotes, a line break, a
# backslash, a trigraph, non-ASCII
HOSTILE_TORCH = [
    'end */ int injected = 1; /* start"\n#define B 0',
    "#define B 0 ??/ back\\slash",
    "a_x0 ｆｃ",
    "params); system(0); (",
]


def cpp_tokens(source: str) -> list[str]:
    """What the compiler sees of ``source``, comments and string literals set aside: line
    splices (a backslash at a line's end, also as the trigraph ??/) joined first, as in C++'s
    translation phases, then comments dropped and every string or character literal read as
    "" (string_literal escapes names; a literal a name could close is then code); the model's
    content hash (rc_<hash>) as one word."""
    source = re.sub(r"(\\|\?\?/)\n", "", source)
    lexed = re.sub(
        r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|//[^\n]*|/\*.*?\*/',
        lambda m: '""' if m[0][0] in "\"'" else " ",
        source,
        flags=re.S,
    )
    return re.sub(r"\brc_[0-9a-f]{12}", "rc_HASH", lexed).split()


def test_cpp_tokens_sees_code_that_a_name_smuggles_in():
    """The comparison fails where a name's text would become code."""
    plain = "// fc: linear\nint a = 1;\n"
    assert cpp_tokens(plain) == cpp_tokens("// other words\nint a = 1;\n")
    assert cpp_tokens(plain) != cpp_tokens("// fc\n#define a b\n: linear\nint a = 1;\n")
    assert cpp_tokens(plain) != cpp_tokens("// fc \\\nint a = 1;\n")  # spliced into the comment
    assert cpp_tokens(plain) != cpp_tokens("// fc ??/\nint a = 1;\n")
    assert cpp_tokens('f("a");') != cpp_tokens('f("a"); g("b");')
    assert cpp_tokens('f("a");') != cpp_tokens('f("a") + x;')


# (ids without the process's number: pytest-xdist's workers must collect the same tests)
@pytest.mark.parametrize(
    "text",
    [*HOSTILE, "\x00\x7f\udcff /*/ **/", "\\", "?" * 5],
    ids=lambda text: text.replace(MARK, "MARK"),
)
def test_comments_and_literals_hold_any_text(text):
    comment = comment_text(text)
    assert re.fullmatch(r"[ -~]*", comment)  # one line of printable ASCII
    assert not re.search(r"\\$|\?\?|\*/|/\*", comment)
    body = string_literal(text)[1:-1]
    assert re.fullmatch(r"(?:[ -!#->@-\[\]-~]|\\[0-7]{3})*", body)  # no ", \ or ? unescaped
    decoded = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), body.encode("ascii"))
    assert decoded == text.encode("utf-8", "surrogateescape")


# -- an ONNX file ------------------------------------------------------------------------------
def onnx_file(name) -> onnx.ModelProto:
    """Conv1d (1 -> 2, k3), Relu, Flatten, Gemm (12 -> 1) on x (B, 1, 8); every name, the doc
    strings and the metadata are ``name(i)``; the layers' initializers ``name(i).weight`` and
    ``name(i).bias``, as torch's exporter names them."""
    rng = np.random.default_rng(0)
    w = [rng.standard_normal(s).astype(np.float32) for s in ((2, 1, 3), (2,), (1, 12), (1,))]
    names = [f"{name(12 + i // 2)}.{'bias' if i % 2 else 'weight'}" for i in range(4)]
    inits = [numpy_helper.from_array(a, n) for a, n in zip(w, names, strict=True)]
    x, c, r, f, y = (name(i) for i in range(5))
    nodes = [
        helper.make_node("Conv", [x, inits[0].name, inits[1].name], [c], name(5)),
        helper.make_node("Relu", [c], [r], name(6), doc_string=name(20)),
        helper.make_node("Flatten", [r], [f], name(7)),
        helper.make_node("Gemm", [f, inits[2].name, inits[3].name], [y], name(8), transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        name(9),
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["B", 1, 8])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["B", 1])],
        inits,
        doc_string=name(21),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.doc_string, model.producer_name = name(22), name(23)
    helper.set_model_props(model, {name(24): name(25)})
    onnx.checker.check_model(model)
    return model


def hostile(i: int) -> str:
    return f"{HOSTILE[i % len(HOSTILE)]}{i}"


def plain(i: int) -> str:
    return f"n{i}"


def onnx_graph(model):
    module, shapes, dtype = to_module(model)
    graph = graph_from_export(module, torch.zeros(2, *shapes[0]), "float32")
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return graph, {**state, **graph.constants}


@pytest.fixture(scope="module")
def onnx_graphs():
    return onnx_graph(onnx_file(hostile)), onnx_graph(onnx_file(plain))


def renamed(graph, state, name):
    """``graph`` with every value, node, parameter and buffer named ``name(i)``, as no
    front-end would leave them: the emitters alone meet the text."""
    g = copy.deepcopy(graph)
    values = {v: name(i) for i, v in enumerate([*g.inputs, *(n.output for n in g.nodes)])}
    tensors = {p.name: f"{name(100 + i)}.w" for i, p in enumerate(g.params + g.buffers)}
    g.inputs, g.output = [values[v] for v in g.inputs], values[g.output]
    for i, n in enumerate(g.nodes):
        n.name, n.output, n.inputs = name(50 + i), values[n.output], [values[v] for v in n.inputs]
        n.params = {r: tensors[t] for r, t in n.params.items()}
        n.buffers = {r: tensors[t] for r, t in n.buffers.items()}
    g.params = [Param(tensors[p.name], p.shape, p.persistent) for p in g.params]
    g.buffers = [Param(tensors[p.name], p.shape, p.persistent) for p in g.buffers]
    g.validate()
    return g, {tensors[k]: v for k, v in state.items() if k in tensors}


@pytest.fixture(scope="module")
def ir_graphs(onnx_graphs):
    """The plain file's graph, renamed in the IR with hostile text."""
    graph, state = onnx_graphs[1]
    return renamed(graph, state, hostile), (graph, state)


# -- a torch module ----------------------------------------------------------------------------
class Named(nn.Module):
    """A convolution and a linear layer in a ModuleDict, a parameter and a buffer read
    directly, each under a name of ``names``."""

    def __init__(self, names):
        super().__init__()
        torch.manual_seed(0)
        self.keys, self.p, self.b = names[0], names[2], names[3]
        self.blocks = nn.ModuleDict({names[0]: nn.Conv1d(1, 2, 3), names[1]: nn.Linear(12, 1)})
        self.register_parameter(names[2], nn.Parameter(torch.full((12,), 0.5)))
        self.register_buffer(names[3], torch.full((1,), 0.25))
        self.lin = names[1]

    def forward(self, x):
        h = torch.relu(self.blocks[self.keys](x)).flatten(1) * getattr(self, self.p)
        return self.blocks[self.lin](h) + getattr(self, self.b)


@pytest.fixture(scope="module")
def torch_graphs():
    x = torch.zeros(2, 1, 8)
    nets = Named(HOSTILE_TORCH), Named("abcd")
    return [(graph_from_export(net, x, "float32"), net.state_dict()) for net in nets]


class NamedLayers(nn.Module):
    """A convolution and a linear layer in a ModuleDict under names of ``names``."""

    def __init__(self, names):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.lin = names[0], names[1]
        self.blocks = nn.ModuleDict({names[0]: nn.Conv1d(1, 2, 3), names[1]: nn.Linear(12, 1)})

    def forward(self, x):
        return self.blocks[self.lin](torch.relu(self.blocks[self.conv](x)).flatten(1))


@pytest.fixture(scope="module")
def export_graphs():
    x = torch.zeros(2, 1, 8)
    nets = NamedLayers(HOSTILE_TORCH), NamedLayers("abcd")
    return [(graph_from_export(net, x, "float32"), net.state_dict()) for net in nets]


def cpu_sources(graph) -> dict[str, str]:
    return {
        f"{engine}{'' if pullbacks else '-nopullbacks'}": emit_model(
            graph, "mse", engine, pullbacks
        ).source
        for engine, pullbacks in (("pullback", True), ("clad", True), ("clad", False))
    }


@pytest.mark.parametrize("kind", ["onnx", "torch", "export", "ir"])
def test_the_emitters_write_names_only_as_comments_and_literals(kind, request, tmp_path):
    (bad, bad_state), (good, good_state) = request.getfixturevalue(f"{kind}_graphs")
    sources = {name: [src] for name, src in cpu_sources(bad).items()}
    for name, src in cpu_sources(good).items():
        sources[name].append(src)
    sources["device"] = [emit_device(g, "devnet", "mse") for g in (bad, good)]
    sources["emit"] = [
        write_header(g, state, tmp_path / f"{k}.hxx", "net")["header"].read_text()
        for k, g, state in (("bad", bad, bad_state), ("good", good, good_state))
    ]
    for name, (bad_src, good_src) in sources.items():
        # the names reached the emitter (the device program names no parameter, and a
        # module's nodes are named by their ATen ops); an ONNX file's reach none (the replay
        # holds initializers at plain names, its nodes are ATen ops)
        if kind == "onnx":
            assert "injected" not in bad_src, name
        else:
            assert "injected" in bad_src or kind in ("torch", "export") and name == "device", name
        assert cpp_tokens(bad_src) == cpp_tokens(good_src), name


@pytest.fixture(scope="module")
def compiled_hostile(tmp_path_factory):
    """The hostile ONNX file on the pullback engine; onnxruntime's forward of the plain one."""
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path_factory.mktemp("hostile") / "net.onnx"
    onnx.save(onnx_file(hostile), path)
    x = np.random.default_rng(1).standard_normal((5, 1, 8)).astype(np.float32)
    sess = ort.InferenceSession(onnx_file(plain).SerializeToString())
    return path, x, sess.run(None, {"n0": x})[0]


def _check_runs(cm, x, expected):
    out = cm(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    loss, grads = cm.loss_and_grad(torch.from_numpy(x), torch.zeros(5, 1))
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
    assert not os.path.exists(MARK)


def test_a_hostile_onnx_file_compiles_and_computes(compiled_hostile):
    path, x, expected = compiled_hostile
    _check_runs(rootclad.onnx.load(path, loss="mse", engine="pullback"), x, expected)


@pytest.mark.clad
def test_a_hostile_onnx_file_compiles_with_clad(compiled_hostile, clad):
    path, x, expected = compiled_hostile
    for pullbacks in (True, False):
        cm = rootclad.onnx.load(path, loss="mse", engine="clad", pullbacks=pullbacks)
        _check_runs(cm, x, expected)


def test_a_hostile_header_compiles(onnx_graphs, tmp_path):
    (graph, state), _ = onnx_graphs
    header = write_header(graph, state, tmp_path / "net.hxx", "net")["header"]
    cxx, _ = find_cxx()
    command = [cxx, "-std=c++17", "-fsyntax-only", "-x", "c++", str(header)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_torch_module_with_hostile_names_trains_as_with_plain_ones():
    x = torch.randn(4, 1, 8)
    bad, good = Named(HOSTILE_TORCH), Named("abcd")
    cm = rootclad.compile(bad, example_input=x, loss="mse", engine="pullback")
    np.testing.assert_allclose(cm(x).detach(), bad(x).detach(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bad(x).detach(), good(x).detach())  # the same weights
    assert set(cm.state_dict()) == set(bad.state_dict())
