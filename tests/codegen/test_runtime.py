"""The runtime library (include/rootclad/runtime.cpp): every kernel a model's code may call is
declared in its family's header and instantiated in the library, every functor of the op
registry is too, and its builds are cached like a model's (one good copy, rebuilt when damaged,
another key for another compiler or CPU)."""

from __future__ import annotations

import multiprocessing
import re
from pathlib import Path

import pytest

from rootclad.ir.registry import OPS
from rootclad.paths import get_include
from rootclad.toolchain import build, find_cxx
from rootclad.toolchain.build import build_library, link_library

INCLUDE = Path(get_include()) / "rootclad"
FAMILIES = sorted(p for p in (INCLUDE / "ops").glob("*_impl.h"))


def declared_kernels(header: str) -> dict[str, str]:
    """The function templates a family header declares in namespace rootclad: name -> its
    template parameters."""
    ns = header[header.index("namespace rootclad {") : header.index("} // namespace rootclad")]
    found = re.findall(r"template <([^>]*)>\s*(?:inline )?[\w:]+\s+(\w+)\(([^)]*)\);", ns)
    return {name: params for params, name, _ in found}


def runtime_list(text: str, macro: str) -> set[str]:
    body = text[text.index(f"#define {macro}") :]
    body = body[: re.search(r"[^\\]\n", body).end()]
    return set(re.findall(r"X\((\w+)\)", body))


def missing_from_runtime(headers: dict[str, str], runtime: str) -> list[str]:
    """The kernels some header declares that the runtime library does not instantiate."""
    kept = runtime_list(runtime, "ROOTCLAD_KERNELS")
    functor = {"unary_forward", "unary_backward", "parametric_forward", "parametric_backward"}
    return sorted(
        f"{path}: {name}"
        for path, text in headers.items()
        for name in declared_kernels(text)
        if name not in kept and name not in functor
    )


def test_every_declared_kernel_is_in_the_runtime_library():
    headers = {
        p.name: (INCLUDE / "ops" / p.name.replace("_impl", "")).read_text() for p in FAMILIES
    }
    headers["linear_update.h"] = (INCLUDE / "linear_update.h").read_text()
    headers["optim.h"] = (INCLUDE / "optim.h").read_text()
    runtime = (INCLUDE / "runtime.cpp").read_text()
    assert sum(len(declared_kernels(t)) for t in headers.values()) > 80
    assert missing_from_runtime(headers, runtime) == []
    # the check finds a kernel the list lacks
    lacking = runtime.replace("X(linear_backward)", "", 1)
    assert missing_from_runtime(headers, lacking) == ["dense_impl.h: linear_backward"]


def test_every_functor_of_the_registry_is_instantiated():
    text = (INCLUDE / "ops" / "activations.h").read_text()
    unary = runtime_list(text, "ROOTCLAD_UNARY_FUNCTORS")
    parametric = runtime_list(text, "ROOTCLAD_PARAMETRIC_FUNCTORS")
    functors = {spec.functor: bool(spec.params) for spec in OPS.values() if spec.functor}
    assert len(functors) > 10
    for name, has_params in functors.items():
        assert name in (parametric if has_params else unary), name
    assert set(functors) >= unary | parametric  # and no functor listed that no op uses


SRC = "int f() { return 1; }\n"


def _link_at_once(args):
    obj, cache = args
    import os

    os.environ["ROOTCLAD_CACHE_DIR"] = cache
    path, built = link_library([Path(obj)], name="rc_once", cxx=find_cxx()[0])
    return str(path), built


def test_a_link_is_cached_made_once_and_made_again_when_damaged(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOTCLAD_CACHE_DIR", str(tmp_path))
    obj, _ = build_library(SRC, name="rc_obj", cxx=find_cxx()[0], flags=["-O0"], kind="object")
    assert obj.suffix == ".o" and obj.is_file()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:  # two processes at once: one library, built once
        results = pool.map(_link_at_once, [(str(obj), str(tmp_path))] * 2)
    assert results[0][0] == results[1][0]
    assert sorted(built for _, built in results) == [False, True]  # the other waited, then used it
    lib = Path(results[0][0])
    assert len(list(tmp_path.glob("rc_once-*.build"))) == 0  # links leave no compile record
    again, built = link_library([obj], name="rc_once", cxx=find_cxx()[0])
    assert again == lib and not built
    lib.write_bytes(lib.read_bytes()[:100])  # a half-written library is never used
    again, built = link_library([obj], name="rc_once", cxx=find_cxx()[0])
    assert built and again.stat().st_size > 100
    archive, _ = link_library([obj], name="rc_once", cxx=find_cxx()[0], archive=True)
    assert archive.suffix == ".a" and archive.read_bytes().startswith(b"!<arch>")


@pytest.mark.parametrize("what", ["compiler", "cpu"])
def test_another_compiler_or_cpu_gets_another_runtime(monkeypatch, what):
    flags = ["-O3", "-march=native"]
    key = build.source_key(SRC, "g++", flags, [])
    if what == "compiler":
        monkeypatch.setattr(build, "_version", lambda cxx: "another g++")
    else:
        monkeypatch.setattr(build, "_cpu_tag", lambda: "flags: avx2 (another CPU)")
    assert build.source_key(SRC, "g++", flags, []) != key
