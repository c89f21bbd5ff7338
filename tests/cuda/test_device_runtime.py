"""The device runtime library (include/rootclad/device_runtime.cpp): every kernel a device
program may call is declared in its family's header (device/*.h) and instantiated in the
library, for each executor: the kernels over (On, T), and those templated on more for what the
emitter can pass (codegen/cuda.py, cuda_ops.py): each elementwise functor of the registry, each
activation a producer can fuse (and the adjoint read through it), each elementwise loss. The
lists are checked against the registry and the emitter, and the built library's symbols against
them: a kernel or functor missing from the library fails here, by name. test_nvcc.py checks the
GPU's library likewise."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import torch
from torch import nn

from rootclad.codegen.cuda import LOSSES, emit_device, fused_activations
from rootclad.codegen.cuda_ops import DEVICE_OPS, fusable_functors
from rootclad.frontends.aten import graph_from_export
from rootclad.ir.registry import OPS
from rootclad.paths import get_include
from rootclad.toolchain import recipes

INCLUDE = Path(get_include()) / "rootclad"
RUNTIME = (INCLUDE / "device_runtime.cpp").read_text()
FUNCTOR_KERNELS = {
    "unary_forward": "unary",
    "unary_backward": "unary",
    "parametric_forward": "parametric",
    "parametric_backward_input": "parametric",
    "parametric_backward_param": "parametric",
}


def declared_kernels() -> dict[str, str]:
    """The kernels the family headers declare (what a program may call): name -> template
    parameters."""
    found = {}
    for path in sorted((INCLUDE / "device").glob("*.h")):
        if path.stem.endswith("_impl"):
            continue
        text = path.read_text()
        for params, name in re.findall(
            r"template <([^>]*)>\s*void (\w+)\((?:[^;{]|\{\})*\);", text
        ):
            found[name] = params
    return found


def runtime_list(text: str, macro: str) -> set[str]:
    """The X(...) entries of every ``#define {macro}...`` in the runtime source."""
    names = set()
    for m in re.finditer(rf"#define {macro}\w*\(X\)((?:.*\\\n)*.*)", text):
        names |= set(re.findall(r"X\((\w+)\)", m[1]))
    return names


def missing_from_runtime(kernels: dict[str, str], runtime: str) -> list[str]:
    """The declared kernels that the runtime source does not keep, by what they take."""
    plain = runtime_list(runtime, "ROOTCLAD_DEVICE_KERNELS_")
    fusing = runtime_list(runtime, "ROOTCLAD_DEVICE_FUSING_")
    missing = []
    for name, params in kernels.items():
        if "class Op" in params or "class L" in params:
            kept = f"&{name}<Executor" in runtime
        elif "class Act" in params:
            kept = name.removesuffix("_forward") in fusing
        elif "class DY" in params:
            kept = name.removesuffix("_backward") in fusing
        else:
            kept = name in plain
        if not kept:
            missing.append(name)
    return sorted(missing)


def test_every_declared_kernel_is_kept():
    kernels = declared_kernels()
    assert len(kernels) > 80
    assert missing_from_runtime(kernels, RUNTIME) == []
    # the check finds a kernel the lists lack, plain or fusing
    lacking = RUNTIME.replace("X(gather_backward)", "", 1).replace("X(conv2d)", "", 1)
    assert missing_from_runtime(kernels, lacking) == [
        "conv2d_backward",
        "conv2d_forward",
        "gather_backward",
    ]


class _Fusions(nn.Module):
    """Every op a device program fuses an activation into, each followed by one."""

    def __init__(self):
        super().__init__()
        self.conv2d, self.pool2d = nn.Conv2d(1, 2, 3, padding=1), nn.MaxPool2d(2)
        self.avg2d, self.conv1d = nn.AvgPool2d(1), nn.Conv1d(2, 2, 3, padding=1)
        self.pool1d, self.avg1d = nn.MaxPool1d(2), nn.AvgPool1d(1)
        self.linear, self.head = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):  # (B, 1, 4, 4)
        x = torch.sigmoid(self.avg2d(torch.tanh(self.pool2d(torch.relu(self.conv2d(x))))))
        x = torch.tanh(self.pool1d(x.reshape(x.shape[0], 2, 4)))  # (an activation before a
        x = torch.relu(self.avg1d(torch.sigmoid(self.conv1d(x))))  # max pool moves after it)
        h = torch.relu(self.linear(x.reshape(x.shape[0], 4)))
        h = torch.tanh(torch.sigmoid(h + h) - h)
        h = torch.exp(h - h) + torch.sqrt(h * h) + torch.rsqrt(h + h) + torch.reciprocal(h * h)
        return self.head(torch.relu(torch.tanh(h * h) / (h + 2)))


def emitted_fusions() -> tuple[set[str], set[str], set[str]]:
    """The ops _Fusions fuses an activation into, the activations fused, and the kernels
    called with one (forward) or through one (act_grad, backward) in its program."""
    graph = graph_from_export(_Fusions(), torch.zeros(2, 1, 4, 4), "float32")
    graph.validate()
    fused = fused_activations(graph)
    producers = {n.op for n in graph.nodes if n.output in fused}
    acts = {OPS[a.op].functor for a in fused.values()}
    source = emit_device(graph, "fusions")
    calls = set(re.findall(r"(\w+)\(on, [^;]*(?:::rootclad::\w+\{\}|act_grad\()", source))
    return producers, acts, calls


def test_the_fusing_kernels_are_kept_for_each_fusable_activation():
    producers, acts, calls = emitted_fusions()
    # the module covers every op that fuses and every activation that can be fused
    assert producers == {op for op, d in DEVICE_OPS.items() if d.fuses_activation}
    assert acts == fusable_functors() == runtime_list(RUNTIME, "ROOTCLAD_FUSABLE_ACTIVATIONS")
    fusing = runtime_list(RUNTIME, "ROOTCLAD_DEVICE_FUSING_")
    assert {re.sub(r"_(forward|backward)$", "", c) for c in calls} == fusing
    assert {f"{f}_{way}" for f in fusing for way in ("forward", "backward")} == calls


def test_every_functor_and_loss_is_kept():
    text = (INCLUDE / "ops" / "activations.h").read_text()
    unary = runtime_list(text, "ROOTCLAD_UNARY_FUNCTORS")
    parametric = runtime_list(text, "ROOTCLAD_PARAMETRIC_FUNCTORS")
    for spec in OPS.values():
        if spec.functor:
            assert spec.functor in (parametric if spec.params else unary), spec.functor
    assert "ROOTCLAD_UNARY_FUNCTORS(ROOTCLAD_KEEP_UNARY)" in RUNTIME
    assert "ROOTCLAD_PARAMETRIC_FUNCTORS(ROOTCLAD_KEEP_PARAMETRIC)" in RUNTIME
    losses = {functor for functor in LOSSES.values() if functor}
    assert runtime_list(RUNTIME, "ROOTCLAD_DEVICE_LOSSES") == losses


def expected_symbols(executor: str) -> set[str]:
    """What a device runtime for ``executor`` (Host or Cuda) must export, from the registry and
    the emitter, not from the runtime's lists: each declared kernel for float and double, with
    every functor, fusable activation and loss it can be passed (demangled, without spaces)."""
    on = f"rootclad::dev::{executor}"
    kernels = declared_kernels()
    fusing = {re.sub(r"_(forward|backward)$", "", c) for c in emitted_fusions()[2]}
    functors = {s.functor: bool(s.params) for s in OPS.values() if s.functor}
    acts = ["rootclad::dev::NoAct", *(f"rootclad::{a}" for a in fusable_functors())]
    losses = [f"rootclad::dev::{f}" for f in LOSSES.values() if f]
    out = {f"rootclad::dev::launch_status<{on}>", f"rootclad::dev::error_text<{on}>"}
    if executor == "Host":
        out.add(f"rootclad::dev::launch_count<{on}>")
    for T in ("float", "double"):
        for name, params in kernels.items():
            args: list[str] = []
            if name in FUNCTOR_KERNELS:
                want = FUNCTOR_KERNELS[name] == "parametric"
                dy = f"{T}*," if "class DY" in params else ""
                args = [f"{dy}rootclad::{f}" for f, p in functors.items() if p == want]
            elif "class L" in params:
                args = losses
            elif "class Act" in params:
                assert name.removesuffix("_forward") in fusing, name
                args = acts
            elif "class DY" in params:
                assert name.removesuffix("_backward") in fusing, name
                args = [f"{T}*"] + [f"rootclad::dev::ActGrad<{T},{a}>" for a in acts[1:]]
            out |= {f"rootclad::dev::{name}<{on},{T}{',' + a if a else ''}>" for a in args or [""]}
    return {s.replace(" ", "") for s in out}


def exported(library: Path) -> set[str]:
    """The library's exported functions, demangled, arguments and spaces dropped."""
    nm = subprocess.run(
        ["nm", "-DC", "--defined-only", str(library)], capture_output=True, text=True, check=True
    )
    names = set()
    for line in nm.stdout.splitlines():
        m = re.search(r" (?:void|int|long|char const\*) (rootclad::dev::[^(]*)\(", line)
        if m:
            names.add(m[1].replace(" ", ""))
    return names


def missing_symbols(want: set[str], library: Path) -> list[str]:
    return sorted(want - exported(library))


def test_the_host_library_exports_every_kernel_the_programs_may_call():
    library = recipes.device_runtime()
    want = expected_symbols("Host")
    assert len(want) > 300
    assert missing_symbols(want, library) == []
    # the check names what a library lacks
    one = "rootclad::dev::gather_backward<rootclad::dev::Host,float>"
    assert missing_symbols(want | {one + "x"}, library) == [one + "x"]
