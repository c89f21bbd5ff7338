"""``DeviceModel``: a compiled model whose every step runs as device kernels on a GPU.

``rootclad.compile(net, example_input=x.cuda())`` (or ``cm.to("cuda")``) builds the model's
device program (rootclad/codegen/device.py) with nvcc and runs it on torch's current stream:
the parameters, the optimizer's state, the activations and their adjoints live in device
memory, and a training step (forward, BCE-with-logits gradient, backward, optimizer update)
copies nothing between host and device; its loss stays a device tensor until read.

``device="cpu"`` compiles the same source with the C++ compiler, each kernel then a loop on
the calling thread (dev::Host): the reference the GPU build is checked against, and what the
tests run on machines without a GPU. (For speed on the CPU use :class:`CompiledModel`.)

The backward is the built-in sweep over rootclad's hand-written device pullbacks (engine
``"pullback"``); the device programs multiply matrices with cuBLAS (from GEMM_MIN_ROWS rows on),
run every other op as their own kernels, and have a flat layout.
A parameter whose ``requires_grad`` is False is frozen, as in :class:`CompiledModel`.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import hashlib
import itertools
import math
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import torch

import rootclad
from rootclad.codegen.device import emit_device
from rootclad.ir.from_torch import graph_from_module
from rootclad.ir.graph import CLASS_INDEX_LOSSES
from rootclad.toolchain import (
    CompileError,
    ToolchainError,
    build_library,
    find_cublas,
    find_cxx,
    find_nvcc,
    load_library,
)
from rootclad.torch.model import _ArenaParameter, refuse_non_finite
from rootclad.torch.step_graph import StepGraph

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_TORCH = {v: k for k, v in _DTYPES.items()}


class _Work(NamedTuple):
    """A batch size's act and d_act, and their addresses for the C calls."""

    act: torch.Tensor
    d_act: torch.Tensor
    act_ptr: int
    d_act_ptr: int
    inputs: list  # the inputs' places in act, (B, *shape) each


def build_cuda_library(source: str, name: str, arch: str | None = None, rebuild: bool = False):
    """nvcc's shared library of a device program for ``arch`` (default: the current GPU's,
    ``sm_XY``); a toolkit too old for it is named in the error. ``rebuild``: as
    :func:`build_library`'s."""
    if arch is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    if int(arch.removeprefix("sm_").rstrip("af")) < 60:  # atomicAdd on double
        raise ToolchainError(f"device programs need a GPU of compute capability 6.0 (Pascal) or "
                             f"newer; this one is {arch}")  # fmt: skip
    nvcc, version = find_nvcc()
    cublas = find_cublas()
    if cublas is None:
        raise ToolchainError(
            "device='cuda' multiplies matrices with cuBLAS and found none: install the CUDA "
            "toolkit's, or `pip install nvidia-cublas` (torch's CUDA wheels bring it along)"
        )
    lib = Path(cublas)
    flags = ["-O3", "-std=c++17", "--extended-lambda", f"-arch={arch}",
             f"-I{rootclad.get_include()}"]  # fmt: skip
    if lib.is_absolute():
        if (lib.parent.parent / "include" / "cublas_v2.h").is_file():  # the wheel's header
            flags.append(f"-I{lib.parent.parent / 'include'}")
        # by path (a wheel has libcublas.so.13, no libcublas.so), found again at run time
        link = ["-Xlinker", str(lib), "-Xlinker", "-rpath", "-Xlinker", str(lib.parent)]
    else:  # a name the dynamic loader knows (a system package's)
        link = ["-Xlinker", f"-l:{lib.name}"]
    try:
        return build_library(source, name=name, cxx=nvcc, flags=flags, link_flags=link,
                             suffix=".cu", rebuild=rebuild)  # fmt: skip
    except CompileError as exc:
        log = exc.log_path.read_text() if exc.log_path.is_file() else str(exc)
        if "Unsupported gpu architecture" in log:
            raise ToolchainError(
                f"nvcc {version} ({nvcc}) cannot compile for this GPU's architecture {arch}: it "
                f"is older than the GPU; install a CUDA toolkit that lists {arch} in "
                "`nvcc --list-gpu-arch` and point ROOTCLAD_NVCC at its nvcc"
            ) from exc
        raise


def _check_device(device) -> torch.device:
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


class _InputGrad(torch.autograd.Function):
    """``apply(model, seed, *xs)``: the output, differentiable with respect to the inputs (the
    parameters' gradients come from loss_and_grad / train_step); the backward draws the
    forward's dropout masks again from its seed."""

    @staticmethod
    def forward(ctx, model, seed, *xs):
        ctx.model, ctx.seed = model, seed
        ctx.save_for_backward(*xs)
        return model._predict(xs, seed)

    @staticmethod
    def backward(ctx, d_out):
        # the forward again, its running statistics not updated twice
        grads = ctx.model._input_grad(ctx.saved_tensors, d_out, ctx.seed, again=True)
        return None, None, *grads


class DeviceModel:
    """A model's forward pass, loss gradient and optimizer step as device kernels.

    Build one with ``rootclad.compile(net, example_input=x.cuda())``, ``cm.to("cuda")`` or
    :meth:`from_module`. The API is :class:`CompiledModel`'s for what the device program
    has: ``model(x)``, :meth:`predict`, :meth:`input_grad`, :meth:`loss_and_grad`,
    :meth:`train_step` with a ``rootclad.optim`` optimizer, ``state_dict`` and ``to``."""

    engine = "pullback"
    pullbacks = True
    # train_step as one CUDA graph per batch size and optimizer (rootclad/torch/step_graph.py);
    # off by default until a GPU run has weighed it (benchmarks/cuda/bench_train_step.py)
    cuda_graphs = False

    def __init__(self, graph, loss: str = "bce_with_logits", device="cuda", seed: int = 0):
        self.device = _check_device(device)
        graph.validate()
        self.graph, self.loss = graph, loss
        self.dtype = _TORCH[graph.dtype]
        self.input_shapes = [tuple(s) for s in graph.input_shapes]
        self.input_shape = self.input_shapes[0]
        self.output_shape = tuple(graph.output_shape)
        self.training = True
        # dropout's masks: a seed per call, the same sequence as CompiledModel's
        self._seed, self._calls = int(seed), itertools.count(1)
        name = "rcd_" + hashlib.sha256(graph.fingerprint().encode()).hexdigest()[:12]
        source = emit_device(graph, name, loss)
        if self.device.type == "cuda":
            build = functools.partial(build_cuda_library, source, name)
        else:
            build = functools.partial(build_library, source, name=name, cxx=find_cxx()[0],
                                      flags=["-O2", "-std=c++17", f"-I{rootclad.get_include()}"])  # fmt: skip
        lib, self.library_path, _ = load_library(build)
        self._lib = lib
        self._fn = {k: getattr(lib, f"{name}_{k}") for k in
                    ("n_params", "n_buffers", "act_size", "d_act_size", "d_act_store_size",
                     "output_offset", "forward", "loss_and_grad", "input_grad", "optim_step",
                     "optim_step_in_memory", "optim_constants_size", "error_text")}  # fmt: skip
        self._fn["error_text"].restype = ctypes.c_char_p
        for k in ("n_params", "n_buffers", "act_size", "d_act_size", "d_act_store_size",
                  "output_offset", "optim_constants_size"):  # fmt: skip
            self._fn[k].restype = ctypes.c_long
        self._fn["optim_step"].argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long] * 3
        self._fn["optim_step_in_memory"].argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_long] * 2
        tail = [ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong]  # B, training, seed
        for k, n_ptrs in (("forward", 4), ("loss_and_grad", 8), ("input_grad", 6)):
            self._fn[k].argtypes = [ctypes.c_void_p] * n_ptrs + tail
        n = self._fn["n_params"]()
        self.n_param_values = n
        self._params = torch.zeros(n, dtype=self.dtype, device=self.device)
        self._grads = torch.zeros_like(self._params)
        # parameters as CompiledModel's: requires_grad=False freezes one
        self._views: OrderedDict[str, torch.nn.Parameter] = OrderedDict()
        self._grad_views: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._offsets: list[tuple[int, int]] = []  # (offset, size) of each parameter tensor
        off = 0
        for p in graph.params:
            self._views[p.name] = _ArenaParameter(self._params[off : off + p.numel].view(p.shape))
            self._offsets.append((off, p.numel))
            self._grad_views[p.name] = self._grads[off : off + p.numel].view(p.shape)
            off += p.numel
        assert off == n, (off, n)
        # BatchNorm's running statistics and batch count (in the model's dtype, as on the CPU)
        self._buffer_store = torch.zeros(self._fn["n_buffers"](), dtype=self.dtype,
                                         device=self.device)  # fmt: skip
        self._buffer_views: OrderedDict[str, torch.Tensor] = OrderedDict()
        off = 0
        for p in graph.buffers:
            self._buffer_views[p.name] = self._buffer_store[off : off + p.numel].view(p.shape)
            off += p.numel
        self._loss = torch.zeros(1, dtype=self.dtype, device=self.device)
        # act and d_act: one store each, grown to the largest batch size seen; per batch size
        # the views into them and the pointers of the C calls (until the stores grow)
        self._act_store: torch.Tensor | None = None
        self._d_act_store: torch.Tensor | None = None
        self._work: dict[int, _Work] = {}
        self._ptr = {"params": self._params.data_ptr(), "grads": self._grads.data_ptr(),
                     "buffers": self._buffer_store.data_ptr(), "loss": self._loss.data_ptr()}  # fmt: skip
        self._input_names = (["input"] if len(self.input_shapes) == 1 else
                             [f"input {i}" for i in range(len(self.input_shapes))])  # fmt: skip
        self._on_cuda = self.device.type == "cuda"
        self._cuda_index = self._on_cuda and self.device.index is not None
        self._loss_value = self._loss[0]
        # train_step's CUDA graphs (cuda_graphs), by (B, training, optimizer, its state,
        # targets' shape); False: seen once, captured at the next step
        self._step_graphs: dict[tuple, StepGraph | bool] = {}
        self._dropout = any(node.op == "dropout" for node in graph.nodes)

    @classmethod
    def from_module(cls, net: torch.nn.Module, example_input, device="cuda",
                    loss: str = "bce_with_logits", dtype=None, seed: int = 0) -> DeviceModel:  # fmt: skip
        """The device model of ``net`` with its current parameters (``net`` stays as it is);
        ``example_input``: a tensor, or a tuple of one per input of ``net.forward``."""
        several = isinstance(example_input, (tuple, list))
        examples = tuple(example_input) if several else (example_input,)
        dtype = dtype or examples[0].dtype
        if dtype not in _DTYPES:
            raise TypeError(f"dtype {dtype} is not supported; use torch.float32 or torch.float64")
        device = _check_device(device)
        if any(t.device.type != "cpu" for t in (*net.parameters(), *net.buffers())):
            net = copy.deepcopy(net).cpu()  # traced on the CPU; the caller's stays where it is
        example = tuple(t.detach().cpu().to(dtype) for t in examples)
        graph = graph_from_module(net, example if several else example[0], _DTYPES[dtype])
        model = cls(graph, loss, device, seed)
        buffers = {n: b for n, b in net.named_buffers() if n in model._buffer_views}
        model.load_state_dict({**dict(net.named_parameters()), **buffers})
        for name, p in net.named_parameters():  # frozen stays frozen
            model._views[name].requires_grad_(p.requires_grad)
        model.train(net.training)
        return model

    # -- parameters ---------------------------------------------------------------------------
    def named_parameters(self):
        """``(name, tensor)`` named as in the torch module, viewing the device parameters."""
        return iter(self._views.items())

    def parameters(self):
        return iter(self._views.values())

    def named_buffers(self):
        """``(name, tensor)`` of BatchNorm's running statistics and batch count (in the model's
        dtype), viewing the device's."""
        return iter(self._buffer_views.items())

    def state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """The parameters, then the buffers (a batch count as an integer, as torch's)."""
        out = OrderedDict(self._views)
        for k, v in self._buffer_views.items():
            out[k] = v.to(torch.long).clone() if k.endswith("num_batches_tracked") else v
        return out

    def load_state_dict(self, state_dict, strict: bool = True) -> None:
        """Copy values in (to this model's device and dtype); names and shapes as the module's."""
        own = {**self._views, **self._buffer_views}
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        with torch.no_grad():
            for name, view in own.items():
                if name not in state_dict:
                    continue
                value = torch.as_tensor(state_dict[name])
                if tuple(value.shape) != tuple(view.shape):
                    raise ValueError(f"load_state_dict: {name!r} has shape {tuple(value.shape)}, "
                                     f"expected {tuple(view.shape)}")  # fmt: skip
                view.copy_(value.detach().to(self.device, self.dtype))

    def train(self, mode: bool = True) -> DeviceModel:
        self.training = bool(mode)  # BatchNorm: the batch's statistics (or the running ones)
        return self

    def eval(self) -> DeviceModel:
        return self.train(False)

    def to(self, device):
        """This model on ``device``: itself, another device model (parameters copied), or for
        ``"cpu"`` a :class:`CompiledModel` built from the same graph."""
        device = torch.device(device)
        if device == self.device or (device.type == self.device.type == "cuda" and
                                     device.index is None):  # fmt: skip
            return self
        if device.type == "cpu":
            from rootclad.compiler import compile_graph

            cm = compile_graph(self.graph, self.loss, engine="auto", seed=self._seed)
        else:
            cm = DeviceModel(self.graph, self.loss, device, self._seed)
        cm.load_state_dict(self.state_dict())
        for name, p in self._views.items():
            cm._views[name].requires_grad_(p.requires_grad)
        return cm.train(self.training)

    # -- checking -----------------------------------------------------------------------------
    def _check(self, t, what: str, shapes: list[tuple], dtype=None) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != self.device and not (
            t.device.type == self.device.type == "cuda" and self.device.index is None
        ):
            raise ValueError(f"{what} is on {t.device}; this model runs on {self.device} "
                             f"(move it with .to({str(self.device)!r}))")  # fmt: skip
        if t.dtype != (dtype or self.dtype):
            raise TypeError(f"{what} dtype is {t.dtype}, expected {dtype or self.dtype}")
        if tuple(t.shape) not in shapes:
            raise ValueError(f"{what} has shape {tuple(t.shape)}, expected "
                             f"{' or '.join(map(str, shapes))}")  # fmt: skip
        return t.contiguous()

    def _stream(self):
        if not self._on_cuda:
            return None
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def _inputs(self, x) -> tuple:
        """The model inputs as a tuple: a tensor, or a tuple/list of one tensor per input."""
        xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
        if len(xs) != len(self.input_shapes):
            raise TypeError(f"this model takes {len(self.input_shapes)} inputs, got {len(xs)} "
                            f"(per-sample shapes {self.input_shapes})")  # fmt: skip
        return xs

    def _buffers(self, x) -> tuple[int, _Work]:
        """Checks the inputs and copies them into act, one after the other (the program's
        layout); returns the batch size and its act and d_act."""
        xs = self._inputs(x)
        first, shape = xs[0], self.input_shapes[0]
        if not isinstance(first, torch.Tensor):
            raise TypeError(f"{self._input_names[0]} must be a torch.Tensor, got "
                            f"{type(first).__name__}")  # fmt: skip
        if first.dim() != len(shape) + 1 or first.shape[0] < 1:  # per sample: in _check
            raise ValueError(f"{self._input_names[0]} has shape {tuple(first.shape)}, expected "
                             f"(B, {', '.join(map(str, shape))})")  # fmt: skip
        B = int(first.shape[0])
        work = self._work.get(B) or self._allocate(B)
        for what, t, shape, place in zip(self._input_names, xs, self.input_shapes, work.inputs,
                                         strict=True):  # fmt: skip
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t = t.detach()
            t = self._check(t, what, [(B, *shape)])
            place.copy_(t)  # on the same stream as the kernels
        return B, work

    def _allocate(self, B: int) -> _Work:
        """act and d_act for a batch of B: views of the stores, which grow (reallocated, and
        every batch size's views and CUDA graphs dropped) when they are too small."""
        n, n_d = self._fn["act_size"](B), self._fn["d_act_size"](B)
        store, d_store = self._act_store, self._d_act_store
        if store is None or n > store.numel() or n_d > d_store.numel():
            # d_act for any batch up to B (d_act_size is not monotonic), so that a smaller
            # batch never grows it
            n_store = self._fn["d_act_store_size"](B)
            if store is not None and self._on_cuda:  # earlier calls, perhaps on another
                torch.cuda.synchronize(self.device)  # stream, may still use the old stores
            # the graphs hold the old stores' addresses; free those before allocating anew
            self._work, self._step_graphs = {}, {}
            self._act_store = self._d_act_store = store = d_store = None
            try:
                store = torch.empty(n, dtype=self.dtype, device=self.device)
                d_store = torch.empty(n_store, dtype=self.dtype, device=self.device)
            except RuntimeError as exc:  # torch.OutOfMemoryError on a GPU
                store = None  # not held by the traceback while the caller recovers
                size = (n + n_store) * self._params.element_size() / 2**20
                raise MemoryError(
                    f"a batch of {B} needs {size:.0f} MiB on {self.device} for the activations "
                    f"and scratch ({n} values) and their adjoints ({n_store}), which could not be "
                    f"allocated ({str(exc).splitlines()[0]}); use smaller batches"
                ) from exc
            self._act_store, self._d_act_store = store, d_store
        act, d_act = store[:n], d_store[:n_d]
        inputs, at = [], 0
        for shape in self.input_shapes:
            n = B * math.prod(shape)
            inputs.append(act[at : at + n].view(B, *shape))
            at += n
        self._work[B] = work = _Work(act, d_act, act.data_ptr(), d_act.data_ptr(), inputs)
        return work

    def _next_seed(self) -> int:
        return (self._seed * 0x9E3779B97F4A7C15 + next(self._calls)) & 0xFFFFFFFFFFFFFFFF

    def _run(self, fn: str, *args) -> None:
        """The program's ``fn`` on the current stream; raises on a CUDA error its launches met
        (a kernel's fault may show at a later call: CUDA reports errors asynchronously)."""
        if self._cuda_index:
            with torch.cuda.device(self.device):  # the kernels and cuBLAS use the current GPU
                code = self._fn[fn](self._stream(), *args)
        else:
            code = self._fn[fn](self._stream(), *args)
        if code:
            text = self._fn["error_text"](code).decode()
            hint = ""
            if code == 209:  # cudaErrorNoKernelImageForDevice
                hint = (f"; the library ({self.library_path}) holds no code for this GPU: it was "
                        "built for another architecture")  # fmt: skip
            raise RuntimeError(f"CUDA error {code} in the device program's {fn}: {text}{hint}")

    # -- running ------------------------------------------------------------------------------
    def __call__(self, *x: torch.Tensor) -> torch.Tensor:
        """The output, differentiable by torch autograd with respect to the inputs (several
        in order, ``model(x, theta)``, or as one tuple)."""
        xs = self._inputs(x[0] if len(x) == 1 else x)
        return _InputGrad.apply(self, self._next_seed(), *xs)

    def predict(self, *x: torch.Tensor) -> torch.Tensor:
        """The output (B, *output_shape), a fresh device tensor."""
        return self._predict(x, self._next_seed())

    forward = predict

    def _predict(self, xs, seed: int) -> torch.Tensor:
        B, work = self._buffers(xs[0] if len(xs) == 1 else xs)
        ptr = self._ptr
        self._run("forward", ptr["params"], ptr["buffers"], work.act_ptr, B, int(self.training),
                  seed)  # fmt: skip
        at = self._fn["output_offset"](B)
        n = B * math.prod(self.output_shape)
        return work.act[at : at + n].view(B, *self.output_shape).clone()

    def input_grad(self, *x: torch.Tensor, d_out: torch.Tensor | None = None):
        """d(sum of output x d_out) / d input (``d_out`` defaults to ones: each sample's
        saliency for a one-output model); no parameter gradient is formed. One tensor per
        model input (a tuple when there are several)."""
        grads = self._input_grad(x, d_out, self._next_seed())
        return grads[0] if len(grads) == 1 else grads

    def _input_grad(self, xs, d_out, seed: int, again=False) -> tuple[torch.Tensor, ...]:
        """``again``: the forward pass was run already (for autograd); in training mode
        BatchNorm then uses the batch's statistics without updating the running ones."""
        B, work = self._buffers(xs[0] if len(xs) == 1 else xs)
        out_shape = (B, *self.output_shape)
        if d_out is None:
            d_out = torch.ones(out_shape, dtype=self.dtype, device=self.device)
        d_out = self._check(d_out.detach(), "d_out", [out_shape])
        ptr = self._ptr
        self._run("input_grad", ptr["params"], ptr["buffers"], work.act_ptr, d_out.data_ptr(),
                  work.d_act_ptr, B, 2 if again and self.training else int(self.training),
                  seed)  # fmt: skip
        grads, at = [], 0
        for shape in self.input_shapes:
            n = B * math.prod(shape)
            grads.append(work.d_act[at : at + n].view(B, *shape).clone())
            at += n
        return tuple(grads)

    def _targets(self, y, B: int) -> torch.Tensor:
        """As torch's losses take them (cross_entropy and nll: (B,) integer class indices,
        checked without waiting for the GPU), in the model's dtype for the kernels."""
        if self.loss not in CLASS_INDEX_LOSSES:
            shapes = [(B, *self.output_shape)] + ([(B,)] if self.output_shape == (1,) else [])
            return self._check(y, "targets", shapes)
        if not isinstance(y, torch.Tensor) or y.dtype.is_floating_point or tuple(y.shape) != (B,):
            raise ValueError(f"{self.loss} targets must be {B} integer class indices, shape "
                             f"({B},), got {getattr(y, 'dtype', type(y).__name__)} of shape "
                             f"{tuple(getattr(y, 'shape', ()))}")  # fmt: skip
        y = self._check(y, "targets", [(B,)], y.dtype)
        nc = self.output_shape[0]
        inside = ((y >= 0) & (y < nc)).all()
        if self.device.type == "cuda":  # raised at the next synchronisation, not waited for
            torch._assert_async(inside, f"{self.loss} targets must lie in [0, {nc})")
        elif not bool(inside):
            raise ValueError(f"{self.loss} targets must lie in [0, {nc}), got "
                             f"[{int(y.min())}, {int(y.max())}]")  # fmt: skip
        return y.to(self.dtype)

    def _loss_and_grad(self, x, y) -> torch.Tensor:
        B, work = self._buffers(x)
        self._run_loss_and_grad(B, work, self._targets(y, B), self._next_seed())
        return self._loss_value.clone()

    def _run_loss_and_grad(self, B: int, work: _Work, y: torch.Tensor, seed: int) -> None:
        ptr = self._ptr
        self._run("loss_and_grad", ptr["params"], ptr["buffers"], work.act_ptr, y.data_ptr(),
                  ptr["loss"], ptr["grads"], work.d_act_ptr, B, int(self.training), seed)  # fmt: skip

    def loss_and_grad(self, x, y) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The batch's mean loss (a 0-d device tensor) and every trainable parameter's gradient
        (fresh device tensors), as :meth:`CompiledModel.loss_and_grad`."""
        loss = self._loss_and_grad(x, y)
        return loss, {k: v.clone() for k, v in self._grad_views.items()
                      if self._views[k].requires_grad}  # fmt: skip

    def train_step(self, x, y, opt, *, check_finite=True) -> torch.Tensor:
        """Forward, backward and ``opt``'s update (a ``rootclad.optim`` optimizer made for this
        model), all on the device. Returns the loss as a 0-d device tensor: reading it
        (``float(loss)``) waits for the step.

        As :meth:`CompiledModel.train_step`, a non-finite input or target, and an optimizer whose
        state holds one, is refused before anything changes; that check waits for the device
        once per step (one reduction over the batch and the state): ``check_finite=False``
        skips it, so that a loop that does not read the loss never waits."""
        if opt.model is not self:
            raise ValueError("this optimizer was created for another model")
        B, work = self._buffers(x)
        y = self._targets(y, B)
        if check_finite:
            y_checked = None if self.loss in CLASS_INDEX_LOSSES else y
            refuse_non_finite(tuple(work.inputs), y_checked, B, opt, scan_state=True)
        seed = self._next_seed()
        counts = (opt.step_count, None if opt._steps is None else list(opt._steps))
        step, per_tensor = opt._advance(self._trainable())
        try:
            graph = self._step_graph(B, y, opt, per_tensor)
            if graph is not None:
                try:
                    graph.run(work, y, opt, step)
                    return self._loss_value.clone()
                except RuntimeError as exc:
                    if graph.graph is not None or not self._on_cuda:
                        raise  # not the capture: the step itself failed
                    self.cuda_graphs = False  # nothing ran; the step goes on as plain launches
                    warnings.warn(f"train_step: capturing a CUDA graph failed ({exc}); the "
                                  "steps run as plain launches", RuntimeWarning, stacklevel=2)  # fmt: skip
            self._run_loss_and_grad(B, work, y, seed)
            self._run_optimizer(opt, step, per_tensor)
        except BaseException:  # the step did not happen: the optimizer does not count it
            opt.step_count, opt._steps = counts
            raise
        return self._loss_value.clone()

    def _step_graph(self, B: int, y: torch.Tensor, opt, per_tensor) -> StepGraph | None:
        """The CUDA graph of this step (cuda_graphs), or None for plain launches: a model
        with dropout, a frozen parameter, the first step of its kind."""
        if not self.cuda_graphs or per_tensor is not None or self._dropout:
            return None
        key = (B, int(self.training), id(opt), opt._state.data_ptr(), tuple(y.shape))
        graph = self._step_graphs.get(key)
        if graph is None:  # the first step of its kind: plain launches (cuBLAS's handle)
            self._step_graphs[key] = False
            return None
        if graph is False:
            graph = self._step_graphs[key] = StepGraph(self, B, y, opt)
        return graph

    def _run_optimizer(self, opt, step: int, per_tensor) -> None:
        if per_tensor is None:  # every tensor at `step`: one launch
            runs = [(0, self.n_param_values, step)]
        else:  # frozen ones skipped; neighbours at the same step share a launch
            runs = []
            for (off, n), t in zip(self._offsets, opt._call_steps, strict=False):
                if t <= 0:
                    continue
                if runs and runs[-1][2] == t and sum(runs[-1][:2]) == off:
                    runs[-1] = (runs[-1][0], runs[-1][1] + n, t)
                else:
                    runs.append((off, n, t))
        ptr, state, cfg = self._ptr, opt._state.data_ptr(), ctypes.addressof(opt._cfg)
        for begin, count, t in runs:
            self._run("optim_step", ptr["params"], ptr["grads"], state, cfg, t, begin, count)

    def _trainable(self) -> list[bool]:
        return [v.requires_grad for v in self._views.values()]

    def __repr__(self) -> str:
        return (f"DeviceModel(device={str(self.device)!r}, engine='pullback', dtype={self.dtype}, "
                f"loss={self.loss!r}, input=(B, {', '.join(map(str, self.input_shape))}), "
                f"params={self.n_param_values}, library={str(self.library_path)!r})")  # fmt: skip
