"""``rootclad.compile``: torch module -> IR -> C++ -> shared library -> CompiledModel."""

from __future__ import annotations

import functools
import os
import time
import warnings
from pathlib import Path

import torch

from rootclad.codegen import emit_model
from rootclad.ir.from_torch import graph_from_module, parameter_aliases
from rootclad.toolchain import (
    CompileError,
    ToolchainError,
    blas_flags,
    build_library,
    find_clad,
    find_cxx,
    load_library,
)

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}
# -fvisibility=hidden and the linker's version script (exports.map): a model library exports
# its C API only (emit.py), nothing of the header-only runtime or of libstdc++'s templates,
# whose inline functions and statics were otherwise shared between the model libraries of one
# process: one library's ThreadPool::run met another's gemm and a training step deadlocked
OPT_FLAGS = ["-O3", "-march=native", "-std=c++17", "-fno-math-errno", "-fopenmp-simd",
             "-fvisibility=hidden"]  # fmt: skip
EXPORTS_MAP = Path(__file__).resolve().parent / "toolchain" / "exports.map"


def engines_available() -> dict[str, str]:
    """Which engines can run here, each with a line saying why (or why not)."""
    out = {}
    try:
        cxx, ver = find_cxx()
        out["pullback"] = f"available ({cxx}: {ver})"
    except ToolchainError as exc:
        out["pullback"] = f"unavailable: {exc}"
    try:
        clad, why = find_clad()
    except ToolchainError as exc:
        clad, why = None, str(exc)
    out["clad"] = (
        f"available (Clad {clad.version}, plugin {clad.plugin}, {clad.cxx})"
        if clad
        else f"unavailable: {why}"
    )
    return out


MAX_THREADS = 256  # must match rootclad/parallel.h


def num_threads() -> int | None:
    """``ROOTCLAD_NUM_THREADS`` as a count (None when unset); an error naming it when it is
    not a whole number from 1 to MAX_THREADS. The C++ pool reads the variable itself, and
    there a bad value can only be ignored, so it is checked here first."""
    value = os.environ.get("ROOTCLAD_NUM_THREADS")
    if value is None or not value.strip():
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(
            f"ROOTCLAD_NUM_THREADS={value!r}: must be a whole number from 1 to {MAX_THREADS}"
        )
    return n


def _choose_engine(engine: str, pullbacks: bool):
    clad, why = find_clad() if engine in ("auto", "clad") else (None, "")
    if engine == "auto":
        engine = "clad" if clad else "pullback"
    if engine == "clad":
        if clad is None:
            raise ToolchainError(
                "engine='clad' was asked for, but no Clad was found: " + why + ". Install Clad "
                "and set ROOTCLAD_CLAD_PLUGIN=/path/to/clad.so, ROOTCLAD_CLAD_INCLUDE=/path/to/"
                "include and ROOTCLAD_CXX=/path/to/matching/clang++, or use engine='pullback'."
            )
        return engine, clad.cxx, clad.flags()
    if engine == "pullback":
        if not pullbacks:
            raise ValueError(
                "pullbacks=False needs engine='clad' (Clad differentiates the plain "
                "kernels); the pullback engine is made of the pullbacks"
            )
        cxx, _ = find_cxx()
        return engine, cxx, []
    raise ValueError(f"engine must be 'auto', 'clad' or 'pullback', got {engine!r}")


def compile(
    model: torch.nn.Module,
    example_input: torch.Tensor,
    loss: str = "bce_with_logits",
    *,
    engine: str = "auto",
    pullbacks: bool = True,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
):
    """Compile ``model`` into a :class:`rootclad.torch.CompiledModel`.

    ``example_input`` fixes the per-sample input shape (the batch size stays free); a model
    whose ``forward`` takes several tensors gets a tuple, one example per input.
    ``loss`` is ``"bce_with_logits"``, ``"cross_entropy"`` (class indices), ``"nll"`` (after
    LogSoftmax; class indices), ``"mse"`` or ``"huber"`` (delta 1).
    ``engine``: ``"clad"`` (needs an installed Clad), ``"pullback"`` (rootclad's own reverse
    sweep over the same hand-written pullbacks) or ``"auto"`` (clad when found; the pullback
    engine, with a warning, when the clad build runs past its timeout or out of memory).
    ``pullbacks=False`` (clad only) lets Clad differentiate the plain kernel loops itself.
    ``dtype`` defaults to the example input's (float32 or float64). The model's current
    parameters, which of them are frozen (``requires_grad``) and its training mode
    (``model.training``) are copied into the compiled model.
    ``device`` defaults to the example input's: a CUDA example (or ``device="cuda"``) gives a
    :class:`rootclad.torch.DeviceModel`, whose kernels nvcc builds for the GPU.
    """
    first = example_input[0] if isinstance(example_input, (tuple, list)) else example_input
    dtype = dtype or getattr(first, "dtype", None)
    if dtype not in _DTYPE_NAMES:
        raise TypeError(f"dtype {dtype} is not supported; use torch.float32 or torch.float64")
    device = torch.device(device if device is not None else getattr(first, "device", "cpu"))
    if device.type == "cuda":
        from rootclad.torch.device_model import DeviceModel

        _device_engine(engine, pullbacks)
        return DeviceModel.from_module(model, example_input, device=device, loss=loss,
                                       dtype=dtype, seed=seed)  # fmt: skip
    if device.type != "cpu":
        raise ValueError(f"device {str(device)!r}: rootclad compiles for 'cpu' and 'cuda'")
    t0 = time.perf_counter()
    graph = graph_from_module(model, example_input, _DTYPE_NAMES[dtype])
    cm = compile_graph(graph, loss, engine=engine, pullbacks=pullbacks, seed=seed, t0=t0,
                       aliases=parameter_aliases(model),
                       # buffers of layers forward() never calls: accepted by load_state_dict
                       ignored=[n for n, _ in model.named_buffers()])  # fmt: skip
    buffers = {n: b for n, b in model.named_buffers() if n in cm._em.buffer_offsets}
    cm.load_state_dict({**dict(model.named_parameters()), **buffers})
    for name, p in model.named_parameters():  # frozen stays frozen (see CompiledModel)
        cm._views[name].requires_grad_(p.requires_grad)
    cm.train(model.training)  # an eval-mode module must not predict with dropout on
    return cm


def _device_engine(engine: str, pullbacks: bool) -> None:
    """The engines of a CUDA model: the built-in sweep over the hand-written device pullbacks."""
    if engine not in ("auto", "pullback", "clad"):
        raise ValueError(f"engine must be 'auto', 'clad' or 'pullback', got {engine!r}")
    if engine == "clad" or not pullbacks:
        raise ToolchainError(
            "engine='clad' is not available on CUDA yet: a CUDA model's backward is the built-in "
            "sweep over rootclad's hand-written device pullbacks; Clad's CUDA mode (kernels "
            "without shared memory) is not wired into the device programs. Use engine='auto' "
            "or 'pullback' on CUDA, or the clad engine on the CPU."
        )


def compile_graph(graph, loss: str = "bce_with_logits", *, engine: str = "auto",
                  pullbacks: bool = True, seed: int = 0, t0: float | None = None,
                  aliases: dict | None = None, ignored=()):  # fmt: skip
    """A :class:`CompiledModel` of a validated graph (zero parameters; load them with
    ``load_state_dict``). ``ignored``: buffer names load_state_dict accepts and drops.

    With ``engine="auto"``, a clad build that runs past its timeout or out of memory (Clad's
    cost grows faster with the model than the pullback engine's) is followed by the pullback
    engine's, with a warning naming the reason."""
    from rootclad import get_include
    from rootclad.torch.model import CompiledModel

    t0 = time.perf_counter() if t0 is None else t0
    num_threads()
    requested = engine
    engine, cxx, engine_flags = _choose_engine(engine, pullbacks)
    emitted = emit_model(graph, loss, engine, pullbacks)
    flags = [*OPT_FLAGS, f"-I{get_include()}", *engine_flags]
    link = [f"-Wl,--version-script={EXPORTS_MAP}"]
    if pullbacks:
        bc, bl, _ = blas_flags()
        flags += bc
        link += bl
    else:
        flags.append("-DROOTCLAD_NO_PULLBACKS")
    build = functools.partial(
        build_library, emitted.source, name=emitted.prefix, cxx=cxx, flags=flags, link_flags=link
    )
    try:
        _, lib, built = load_library(build)  # CompiledModel opens the same, loaded library
    except CompileError as exc:
        if engine != "clad" or exc.cause == "error":  # wrong code: a bug to see, not to hide
            raise
        if requested != "auto" or not pullbacks:
            raise CompileError(
                f"the clad engine's build failed: {exc}; engine='pullback' (or 'auto', which "
                "falls back to it) builds the same model without Clad",
                exc.log_path,
                exc.cause,
            ) from exc
        warnings.warn(
            f"the clad engine's build failed ({exc.cause}: {exc}); falling back to the pullback "
            "engine (engine='pullback' skips the clad attempt)",
            stacklevel=2,
        )
        return compile_graph(graph, loss, engine="pullback", seed=seed, t0=t0, aliases=aliases,
                             ignored=ignored)  # fmt: skip
    return CompiledModel(
        emitted,
        graph,
        lib,
        loss,
        compile_seconds=time.perf_counter() - t0,
        built_now=built,
        seed=seed,
        aliases=aliases,
        ignored=[n for n in ignored if n not in emitted.buffer_offsets],
    )
