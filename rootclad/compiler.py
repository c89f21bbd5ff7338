"""The pipeline: a torch module or a model file -> IR -> C++ -> a built library -> a model.

``rootclad.compile`` and ``rootclad.load`` (and ``rootclad.onnx.load``) are here; so are the
device programs (:func:`compile_device`) and the standalone headers of ``rootclad emit``
(:func:`emit_header`, :func:`emit_file`). This is the one place that builds: the runtimes
(:class:`rootclad.torch.CompiledModel`, :class:`rootclad.torch.DeviceModel`) receive a built
library, and move between devices through :func:`retarget`.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import torch

from rootclad.codegen.cpu import emit_model
from rootclad.codegen.cuda import emit_device
from rootclad.codegen.standalone import write_header
from rootclad.frontends.aten import graph_from_export
from rootclad.frontends.aten.modules import parameter_aliases
from rootclad.frontends.onnx import to_module
from rootclad.frontends.onnx.limits import EXAMPLE_BATCH
from rootclad.frontends.programs import program_module
from rootclad.ir.graph import IRError
from rootclad.paths import check_outputs
from rootclad.toolchain import (
    CompileError,
    ToolchainError,
    find_clad,
    find_cxx,
    find_nvcc,
    load_library,
)
from rootclad.toolchain.recipes import cpu_library, cuda_device_program, host_device_program
from rootclad.torch.device_model import DeviceModel
from rootclad.torch.model import CompiledModel

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}
MAX_THREADS = 256  # must match rootclad/parallel.h


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


def _examples(example_input, dtype=None, model=None) -> tuple[tuple, torch.dtype, torch.device]:
    """(the example inputs, the dtype (by default the first floating example's, not a mask's
    or indices'; for a model of indices only, its parameters', else float32), its device)."""
    examples = tuple(example_input) if isinstance(example_input, (tuple, list)) else (
        example_input,)  # fmt: skip
    floats = [t for t in examples if isinstance(t, torch.Tensor) and t.is_floating_point()]
    first = floats[0] if floats else examples[0]  # (masks and indices: the model's own type)
    own = next((p.dtype for p in model.parameters() if p.is_floating_point()),
               torch.float32) if model is not None else torch.float32  # fmt: skip
    dtype = dtype or (first.dtype if floats else own)
    if dtype not in _DTYPE_NAMES:
        raise TypeError(f"dtype {dtype} is not supported; use torch.float32 or torch.float64")
    return examples, dtype, torch.device(getattr(first, "device", "cpu"))


def _module_graph(model: torch.nn.Module, examples: tuple, dtype, several: bool):
    """(the module on the CPU, the example it was captured with, its graph): traced on the
    CPU (the caller's module stays where it is)."""
    if any(t.device.type != "cpu" for t in (*model.parameters(), *model.buffers())):
        import copy

        model = copy.deepcopy(model).cpu()
    example = tuple(t.detach().cpu().to(dtype if t.dtype.is_floating_point else t.dtype)
                    for t in examples)  # fmt: skip
    example = example if several else example[0]
    return model, example, graph_from_export(model, example, _DTYPE_NAMES[dtype])


def choose_loss_output(graph, loss_output) -> None:
    """Point the loss at the output ``loss_output`` names: its place among the model's
    outputs, or its dict key."""
    if not graph.parts:
        if loss_output not in (0, None):
            raise ValueError(f"loss_output={loss_output!r}: the model returns one tensor")
        return
    keys = [key for key, _ in graph.parts]
    if isinstance(loss_output, str) and graph.container == "dict" and loss_output in keys:
        graph.loss_part = keys.index(loss_output)
    elif isinstance(loss_output, int) and -len(keys) <= loss_output < len(keys):
        graph.loss_part = loss_output % len(keys)
    else:
        raise ValueError(f"loss_output={loss_output!r} is none of the model's outputs "
                         f"{keys if graph.container == 'dict' else list(range(len(keys)))}")  # fmt: skip
    graph.validate()


def _take_state(model, module: torch.nn.Module, example):
    """The compiled ``model`` with ``module``'s parameters, buffers, frozen flags and mode (and
    the check of the other mode where the module's layers read it: :func:`_other_mode`)."""
    buffers = {n: b for n, b in module.named_buffers() if n in model._buffer_views}
    # the user's own module as it is: weights from a file are checked where rootclad reads
    # them (cm.load_state_dict, rootclad build --weights, the ONNX import)
    model.load_state_dict({**dict(module.named_parameters()), **buffers}, check_finite=False)
    for name, p in module.named_parameters():  # frozen stays frozen
        model._views[name].requires_grad_(p.requires_grad)
    from rootclad.data.standardize import Standardize

    # preprocessing stages, named in an export's metadata (their constants are parameters)
    model._stages = [n for n, m in module.named_modules() if isinstance(m, Standardize)]
    model.train(module.training)  # an eval-mode module must not predict with dropout on
    if model.graph.mode_reads:
        model._mode_check = _other_mode(module, example, model.graph)
    return model


def _other_mode(module: torch.nn.Module, example, graph):
    """``cm.train(mode)``'s check of a model whose layers read ``self.training`` in the
    capture (frontends/aten/modes.py): on the first switch to the other mode, ``module``
    captured in that mode must lower to the same graph, else the switch is refused (the
    compiled model would compute the captured mode's branch). Holds ``module``, and captures
    it as it is at that switch."""
    from rootclad.frontends.aten.modes import canonical

    def check(mode: bool) -> None:
        if mode == graph.training_mode or check.same:
            return
        modes = [(m, m.training) for m in module.modules()]
        try:
            module.train(mode)
            other = graph_from_export(module, example, graph.dtype)
        except IRError as exc:
            differs = f"its capture in that mode is refused ({exc})"
        else:
            same = canonical(other) == canonical(graph)
            differs = "" if same else "it computes otherwise in that mode"
        finally:
            for m, training in modes:
                m.training = training
        if not differs:
            check.same = True
            return
        was, want = ("training", "eval") if graph.training_mode else ("eval", "training")
        layers = ", ".join(repr(p) for p in graph.mode_reads)
        raise RuntimeError(
            f"this model was compiled in {was} mode, and the forward of {layers} reads "
            f"self.training: {differs}. Compile the model again after "
            f"net.{'train' if mode else 'eval'}() for {want} mode"
        )

    check.same = False
    return check


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
    loss_output: int | str = 0,
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
    :class:`rootclad.torch.DeviceModel`, whose kernels nvcc builds once for the GPU (the
    device runtime library) and whose program the C++ compiler builds.
    A model may return a tuple, list or dict of tensors: ``cm(x)`` returns the same, and the
    loss reads the one ``loss_output`` names (its place, or its dict key; the first by
    default).
    The model is captured by ``torch.export`` and lowered from PyTorch's core ATen ops
    (:mod:`rootclad.frontends.aten`); what it cannot lower is refused naming the op and module.
    """
    examples, dtype, example_device = _examples(example_input, dtype, model)
    device = torch.device(device if device is not None else example_device)
    if device.type == "cuda":
        _device_engine(engine, pullbacks)
        settings = dict(loss=loss, dtype=dtype, seed=seed, loss_output=loss_output)
        return compile_device(model, example_input, device, **settings)
    if device.type != "cpu":
        raise ValueError(f"device {str(device)!r}: rootclad compiles for 'cpu' and 'cuda'")
    t0 = time.perf_counter()
    several = isinstance(example_input, (tuple, list))
    graph = graph_from_export(model, example_input if several else examples[0], _DTYPE_NAMES[dtype])
    choose_loss_output(graph, loss_output)
    cm = compile_graph(graph, loss, engine=engine, pullbacks=pullbacks, seed=seed, t0=t0,
                       aliases=parameter_aliases(model),
                       # buffers of layers forward() never calls: accepted by load_state_dict
                       ignored=[n for n, _ in model.named_buffers()])  # fmt: skip
    return _take_state(cm, model, example_input if several else examples[0])


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

    With ``engine="auto"``, a clad build that runs past its timeout, out of memory or crashes
    is followed by the pullback engine's, with a warning naming the reason."""
    t0 = time.perf_counter() if t0 is None else t0
    num_threads()
    requested = engine
    engine, cxx, engine_flags = _choose_engine(engine, pullbacks)
    emitted = emit_model(graph, loss, engine, pullbacks)
    build = cpu_library(emitted.source, emitted.prefix, cxx, engine_flags, pullbacks)
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
        retarget=retarget,
        self_contained=lambda: cpu_library(
            emitted.source, emitted.prefix, cxx, engine_flags, pullbacks, self_contained=True
        )()[0],
    )


# -- device programs ------------------------------------------------------------------------
def check_device(device) -> torch.device:
    """``device`` as a torch.device a device program can run on ('cuda' or, as host loops,
    'cpu'), with what is missing for 'cuda' said."""
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(device)!r}: a device model runs on 'cuda' or 'cpu'")
    if device.type == "cuda":
        if find_nvcc() is None:
            raise ToolchainError(
                "device='cuda' needs nvcc (the CUDA toolkit) to build the kernels and found "
                "none: put nvcc on PATH or set ROOTCLAD_NVCC"
            )
        if not torch.cuda.is_available():
            raise RuntimeError(
                "device='cuda' but torch sees no CUDA device on this machine (a CPU-only "
                "torch, no GPU, or no driver); compile for the CPU instead"
            )
    return device


def device_program(graph, loss: str = "bce_with_logits", device="cuda", *, seed: int = 0,
                   aliases=None, ignored=(), arch: str | None = None) -> DeviceModel:  # fmt: skip
    """The :class:`DeviceModel` of a validated graph (zero parameters): its device program,
    linked to the device runtime library that nvcc builds for ``device="cuda"`` (for ``arch``,
    by default the current GPU's) or the C++ compiler as host loops for ``device="cpu"``."""
    import hashlib

    device = check_device(device)
    graph.validate()
    name = "rcd_" + hashlib.sha256(graph.fingerprint().encode()).hexdigest()[:12]
    source = emit_device(graph, name, loss)
    if device.type == "cuda":
        if arch is None:
            major, minor = torch.cuda.get_device_capability(device)
            arch = f"sm_{major}{minor}"
        build = cuda_device_program(source, name, arch)
    else:
        build = host_device_program(source, name)
    lib, path, _ = load_library(build)
    return DeviceModel(graph, loss, device, lib, path, name, seed=seed, aliases=aliases,
                       ignored=ignored, retarget=retarget)  # fmt: skip


def compile_device(
    model: torch.nn.Module,
    example_input,
    device="cuda",
    loss: str = "bce_with_logits",
    dtype=None,
    seed: int = 0,
    loss_output: int | str = 0,
) -> DeviceModel:
    """The device model of ``model`` with its current parameters (``model`` stays as it is):
    on a GPU (``device="cuda"``), or its kernels as loops on the CPU (``device="cpu"``, the
    reference the GPU build is checked against). ``example_input``: a tensor, or a tuple of
    one per input of ``model.forward``."""
    several = isinstance(example_input, (tuple, list))
    examples, dtype, _ = _examples(example_input, dtype, model)
    device = check_device(device)
    module, example, graph = _module_graph(model, examples, dtype, several)
    choose_loss_output(graph, loss_output)
    dm = device_program(graph, loss, device, seed=seed, aliases=parameter_aliases(module),
                        ignored=[n for n, _ in module.named_buffers()])  # fmt: skip
    dm._ignored -= set(dm._buffer_views)
    return _take_state(dm, module, example)


def retarget(model, device: torch.device):
    """``model`` (its graph, loss, seed and names) built for ``device``: the CPU library for
    'cpu', a device program for 'cuda' (zero parameters: ``ModelBase.to`` copies them)."""
    kw = dict(seed=model._seed, aliases=model._aliases, ignored=sorted(model._ignored))
    if device.type == "cpu":
        return compile_graph(model.graph, model.loss, engine="auto", **kw)
    return device_program(model.graph, model.loss, device, **kw)


# -- model files ----------------------------------------------------------------------------
def _compile_module(
    module, shapes, graph_dtype, loss, engine, pullbacks, dtype, seed, loss_output=0
):
    dtype = dtype or graph_dtype
    kinds = getattr(module, "input_dtypes", None) or [None] * len(shapes)  # indices: integers
    examples = tuple(
        torch.zeros(EXAMPLE_BATCH, *s, dtype=k or dtype) for s, k in zip(shapes, kinds, strict=True)
    )
    example = examples[0] if len(examples) == 1 else examples
    settings = dict(engine=engine, pullbacks=pullbacks, dtype=dtype, seed=seed)
    return compile(module.to(dtype), example, loss, loss_output=loss_output, **settings)


def load(
    path,
    loss: str = "bce_with_logits",
    *,
    example_input=None,
    engine: str = "auto",
    pullbacks: bool = True,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    trusted: bool = False,
    loss_output: int | str = 0,
):
    """Compile the model in ``path``: an ONNX file (``.onnx``), a ``torch.export`` program
    (``.pt2``, saved with ``torch.export.save``) or a TorchScript module (``.pt``, saved with
    ``torch.jit.save``; give ``example_input``, a batch of the input, since the file does not
    record its shape). Returns a :class:`rootclad.torch.CompiledModel`, as
    :func:`rootclad.compile` does. ``.pt2`` and ``.pt`` files need ``trusted=True``: torch's
    loaders for them run code the file holds, so never pass it for a file you were sent. The
    file reaches the IR as :func:`load_onnx` reads an ONNX file."""
    module, shapes, graph_dtype = program_module(path, example_input, trusted=trusted)
    settings = (loss, engine, pullbacks, dtype, seed, loss_output)
    return _compile_module(module, shapes, graph_dtype, *settings)


def load_onnx(
    model,
    loss: str = "bce_with_logits",
    *,
    engine: str = "auto",
    pullbacks: bool = True,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    loss_output: int | str = 0,
):
    """Compile an ONNX file (or ``ModelProto``) into a :class:`rootclad.torch.CompiledModel`:
    the same API as :func:`rootclad.compile` (``cm(x)``, ``input_grad``, ``loss_and_grad``,
    ``train_step``). The first input axis is the batch; the others must be fixed. dtype
    defaults to the graph's (float64 if an input is float64, else float32). The file's nodes
    run through one table of ONNX ops (rootclad/frontends/onnx/replay.py), which the export
    front-end lowers."""
    module, shapes, graph_dtype = to_module(model)
    return _compile_module(
        module, shapes, graph_dtype, loss, engine, pullbacks, dtype, seed, loss_output
    )


# -- standalone headers ---------------------------------------------------------------------
def emit_header(
    module: torch.nn.Module,
    example_input: torch.Tensor,
    out: Path,
    name: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict:
    """Write ``out`` (the header) and ``out`` with suffix ``.dat`` (the weights) for ``module``
    (rootclad/codegen/standalone.py); returns their paths. ``name`` (default: the header's
    stem) is the C++ namespace."""
    module = module.to(dtype).eval()
    graph = graph_from_export(module, example_input.to(dtype), _DTYPE_NAMES[dtype])
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    state.update(graph.constants)  # (the export front-end's: arange, masks, a Constant's)
    return write_header(graph, state, Path(out), name)


def emit_file(
    source,
    out: Path,
    name: str | None = None,
    dtype: torch.dtype | None = None,
    example_input=None,
    trusted: bool = False,
) -> dict:
    """``rootclad emit``: an ONNX file, a torch.export program or a TorchScript module (as
    :func:`load` reads them, ``trusted`` too) as a standalone header and weights. A header or
    weights file that would be the source (or each other) is refused before anything is read."""
    out = Path(out)
    check_outputs([source], [out, out.with_suffix(".dat")])
    module, shapes, graph_dtype = program_module(source, example_input, trusted=trusted)
    if len(shapes) != 1:
        raise ValueError(
            f"{source}: a header takes single-input models; this one has {len(shapes)}"
        )
    dtype = dtype or graph_dtype
    example = torch.zeros(EXAMPLE_BATCH, *shapes[0])
    return emit_header(module, example, out, name, dtype)
