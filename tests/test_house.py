"""The house stays drawable: no import cycle among rootclad's modules, every import points down
the layers of docs/design.md, and no Python or C++ file grows past a size a reader can hold.

The imports are read from the source (every ``import``, at module level or inside a function),
not from a running interpreter, so a lazy import counts as much as any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rootclad"

# docs/design.md, "The house": a module may import its own layer and the ones below it. The
# front door (rootclad/__init__.py and the public facades) and the entry points sit on top.
LAYERS = [
    # 0: leaves that everything may use
    ["rootclad.paths", "rootclad.version"],
    # 1: what an op is
    ["rootclad.ir"],
    # 2: finding and running the compilers, the cache; C++ text helpers
    ["rootclad.toolchain"],
    # 3: IR -> C++ source; and the runtimes, which load a built library and run it
    ["rootclad.codegen", "rootclad.torch", "rootclad.root", "rootclad.data"],
    # 4: model files -> IR
    ["rootclad.frontends"],
    # 5: the pipeline: front-end, IR, C++, build, runtime
    ["rootclad.compiler"],
    # 6: users' entry points and the public facades
    ["rootclad", "rootclad.cli", "rootclad.doctor", "rootclad.gw", "rootclad.onnx",
     "rootclad.optim", "rootclad.nets", "rootclad.loading", "rootclad.__main__",
     "rootclad.distributed"],
]  # fmt: skip
# no module under ir/ may import these (the rule, stated on its own)
IR_MUST_NOT_IMPORT = ("rootclad.codegen", "rootclad.toolchain", "rootclad.torch",
                      "rootclad.root", "rootclad.data", "rootclad.frontends", "rootclad.compiler")  # fmt: skip

# files that are one cohesive thing although long: the reason is at their top
MAX_LINES = 600
LONG_ON_PURPOSE: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The rootclad modules that ``name`` imports (a ``from pkg import mod`` names pkg.mod)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from pkg import mod` names pkg.mod; `from pkg import name` names pkg
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("rootclad") and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def layer_of(name: str) -> int:
    best, depth = None, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = i, len(prefix)
    if best is None:
        raise AssertionError(f"{name} is in no layer of tests/test_house.py: add it")
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_point_down_the_layers():
    wrong = []
    for name, targets in sorted(import_graph().items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(name):
                wrong.append(f"{name} (layer {layer_of(name)}) imports {target} "
                             f"(layer {layer_of(target)})")  # fmt: skip
    assert not wrong, "imports that point up:\n" + "\n".join(wrong)


def test_ir_imports_no_backend_and_no_runtime():
    wrong = [
        f"{name} imports {target}"
        for name, targets in sorted(import_graph().items())
        if name.startswith("rootclad.ir")
        for target in sorted(targets)
        if target.startswith(IR_MUST_NOT_IMPORT)
    ]
    assert not wrong, "\n".join(wrong)


def test_no_backend_syntax_in_the_ir():
    """The registry says what an op is; C++ (a kernel's name, a call, a functor's braces) is
    written by codegen/ alone."""
    wrong = []
    for path in sorted((PACKAGE / "ir").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if any(s in line for s in ("_forward(", "_backward(", "(T*)", "nullptr", "{{")):
                wrong.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not wrong, "C++ in the IR:\n" + "\n".join(wrong)


@pytest.mark.parametrize("suffixes", [(".py",), (".h", ".hpp", ".cpp")], ids=["python", "cpp"])
def test_no_file_past_the_size_a_reader_can_hold(suffixes):
    long = []
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix not in suffixes:
            continue
        rel = str(path.relative_to(ROOT))
        n = len(path.read_text().splitlines())
        if n > MAX_LINES and rel not in LONG_ON_PURPOSE:
            long.append(f"{rel}: {n} lines")
    assert not long, f"files over {MAX_LINES} lines (split them, or say why at their top and " \
                     "list them in LONG_ON_PURPOSE):\n" + "\n".join(long)  # fmt: skip


def test_the_checks_find_what_they_look_for():
    """The cycle finder and the layer rule fail on a cycle and an upward import."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert layer_of("rootclad.ir.graph") < layer_of("rootclad.codegen.cpu")
    assert layer_of("rootclad.gw.run.pipeline") == len(LAYERS) - 1
    with pytest.raises(AssertionError, match="no layer"):
        layer_of("elsewhere.module")
