"""``CompiledModel``: a torch model compiled to C++, with its parameters in one arena.

The arena is one torch tensor ``[params | grads]``; the tensors returned by
:meth:`CompiledModel.named_parameters` are views into it, so the C++ code, torch optimizers and
the user all see the same numbers (each rootclad optimizer keeps its own state). A parameter
whose ``requires_grad`` is False is frozen: ``train_step`` leaves it unchanged and
``loss_and_grad`` reports no gradient for it, as torch would. Activations and their adjoints
live in a second workspace that grows to the largest batch seen and is then reused, so
``train_step`` allocates nothing after its first call at a given batch size.

Threads: ctypes releases the GIL during the C++ calls. Each Python thread has its own
workspace, so ``predict`` and ``cm(x)`` run side by side; ``loss_and_grad`` and ``train_step``
write the model's gradient block and parameters, so on one model they take a lock and run one
at a time.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from rootclad.ir.graph import CLASS_INDEX_LOSSES

_TORCH_DTYPE = {"float32": torch.float32, "float64": torch.float64}
_C_REAL = {"float32": ctypes.c_float, "float64": ctypes.c_double}
_VP, _I, _U64, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_long


class _Library:
    """The C API of one compiled model, bound with ctypes."""

    def __init__(self, path: Path, prefix: str, dtype: str):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        real = _C_REAL[dtype]

        def bind(name, restype, *argtypes):
            fn = getattr(self.lib, f"{prefix}_{name}")
            fn.restype, fn.argtypes = restype, list(argtypes)
            return fn

        self.n_params = bind("n_params", _L)
        self.act_size = bind("act_size", _L, _I)
        self.d_act_size = bind("d_act_size", _L, _I)
        self.engine = bind("engine", ctypes.c_char_p)
        self.forward = bind("forward", None, _VP, _VP, _I, _I, _U64)
        self.loss_value = bind("loss_value", real, _VP, _VP, _I)
        self.loss_and_grad = bind(
            "loss_and_grad", real, _VP, _VP, _VP, _VP, _VP, _I, _I, _U64, _I, _VP
        )
        self.vjp = bind("vjp", None, _VP, _VP, _VP, _VP, _VP, _I, _I, _U64, _I)
        self.train_step = bind(
            "train_step", real, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _L, _I, _U64, _VP, _VP
        )


class _ArenaParameter(torch.nn.Parameter):
    """A parameter that views the compiled model's arena.

    ``p.data = t`` would point it at other memory, which the compiled code never reads: the
    model would silently go on with the old values. That assignment is refused."""

    @property
    def data(self):
        return torch._C.TensorBase.data.__get__(self, type(self))

    @data.setter
    def data(self, value):
        raise RuntimeError(
            "a compiled model's parameter views its arena: assigning .data would detach it "
            "from the compiled code; copy the values in instead (with torch.no_grad(): "
            "p.copy_(value)) or use cm.load_state_dict()"
        )


def fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """A new tensor equal to the contiguous CPU tensor ``t``, filled by one memcpy. torch's
    clone() of a large tensor runs on its OpenMP threads, which then contend with rootclad's
    pool for the cores: an MLP's batch-256 input gradient took 4.4 ms with clone(), 2.4 ms
    without."""
    out = torch.empty(t.shape, dtype=t.dtype)
    ctypes.memmove(out.data_ptr(), t.data_ptr(), t.numel() * t.element_size())
    return out


def first_non_finite(t: torch.Tensor) -> tuple[int, float] | None:
    """(flat index, value) of the first NaN or infinity in ``t``, or None. On the CPU numpy
    scans it on one thread (torch's isfinite starts its OpenMP threads: see fresh_copy)."""
    if t.is_cpu:
        a = t.detach().resolve_neg().reshape(-1).numpy()
        ok = np.isfinite(a)
        i = int(np.argmin(ok))
        return None if ok[i] else (i, float(a[i]))
    ok = torch.isfinite(t.detach().reshape(-1))
    if bool(ok.all()):
        return None
    i = int((~ok).nonzero()[0])
    return i, float(t.reshape(-1)[i])


def refuse_non_finite(xs: tuple, y: torch.Tensor | None, B: int, opt, scan_state=False) -> None:
    """train_step's rule, rootclad::Model's too (model.h): one non-finite input or target
    (``y``: None for class indices, which are integers and checked) would turn every parameter
    and the optimizer's state NaN for good, so the step is refused before anything changes. An
    optimizer whose state an earlier step may have poisoned is refused too (loading the
    parameters back would not cure it). Its state is scanned only after a step whose loss was
    not finite (a large model's state is long), or with ``scan_state`` (a device model, whose
    loss stays on the device: the batch and the state in one reduction, one wait)."""
    named = [(f"input {i}" if len(xs) > 1 else "input", t) for i, t in enumerate(xs)]
    if y is not None:
        named.append(("target", y))
    if scan_state:
        tensors = [t for _, t in named] + [opt._state]
        if bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
            return
        opt._suspect = True
    for name, t in named:
        bad = first_non_finite(t)
        if bad is not None:
            per = t.numel() // B
            raise ValueError(
                f"train_step: non-finite {name} ({bad[1]}) in sample {bad[0] // per}, "
                f"value {bad[0] % per}; the model and its optimizer were not updated "
                "(check_finite=False skips this check)"
            )
    if opt._suspect:
        opt.check_finite()
        opt._suspect = False


class CompiledModel:
    """A compiled model. Build one with :func:`rootclad.compile`.

    Call it like the torch module (``out = cm(x)``, differentiable through torch autograd),
    or use the fused C++ paths: :meth:`loss_and_grad` and :meth:`train_step`.
    """

    def __init__(
        self,
        emitted,
        graph,
        library_path: Path,
        loss: str,
        *,
        compile_seconds: float,
        built_now: bool,
        seed: int = 0,
        aliases: dict[str, str] | None = None,
        ignored: list[str] | None = None,
    ):
        self._em = emitted
        self.graph = graph
        self.loss = loss
        self.engine = "clad" if emitted.engine == "clad" else "pullback"
        self.pullbacks = emitted.pullbacks
        self.dtype = _TORCH_DTYPE[graph.dtype]
        self.library_path = Path(library_path)
        self.source_path = self.library_path.with_suffix(".cpp")
        self.compile_seconds = compile_seconds
        self.built_now = built_now
        self.training = True
        self.device = torch.device("cpu")
        self._seed = int(seed)
        # other names of a parameter in the torch module (a layer used twice): its state_dict
        # lists each; named_parameters() and this model list the first only
        self._aliases = dict(aliases or {})
        self._ignored = set(ignored or ())  # the module's unused buffers (see load_state_dict)
        self._calls = itertools.count(1)  # next() is atomic: no two threads share a seed
        self._lib = _Library(self.library_path, emitted.prefix, graph.dtype)
        P = emitted.n_params
        if self._lib.n_params() != P:
            raise RuntimeError(
                f"{self.library_path} holds {self._lib.n_params()} parameters, "
                f"expected {P}: stale or foreign library"
            )
        # [params | buffers | gradients | room for the buffers' (never written)]: the C++
        # code finds a buffer at params + N_PARAMS + offset (BatchNorm's running statistics),
        # so the parameter pointer passed is the arena's (an empty _params may have none)
        n = P + emitted.n_buffers
        self._arena = torch.zeros(2 * max(n, 1), dtype=self.dtype)
        self._params = self._arena[:P]
        self._buffers = self._arena[P:n]
        self._grads = self._arena[n : 2 * n]
        self._views: OrderedDict[str, torch.nn.Parameter] = OrderedDict()
        self._grad_views: OrderedDict[str, torch.Tensor] = OrderedDict()
        for name, (off, shape) in emitted.param_offsets.items():
            n = math.prod(shape)
            self._views[name] = _ArenaParameter(self._params[off : off + n].view(shape))
            self._grad_views[name] = self._grads[off : off + n].view(shape)
        self._buffer_views: OrderedDict[str, torch.Tensor] = OrderedDict()
        for name, (off, shape) in emitted.buffer_offsets.items():
            self._buffer_views[name] = self._buffers[off : off + math.prod(shape)].view(shape)
        self._local = threading.local()  # per-thread workspace: see _workspace
        self._lock = threading.Lock()  # loss_and_grad and train_step: one at a time
        self._largest_region = max(r.size for r in emitted.regions)
        self.input_shapes = [tuple(shape) for shape in graph.input_shapes]
        self.input_shape = self.input_shapes[0]
        self.output_shape = tuple(emitted.output_shape)

    # -- parameters ---------------------------------------------------------------------
    def named_parameters(self):
        """``(name, tensor)`` pairs named as in the torch module; the tensors view the arena."""
        return iter(self._views.items())

    def parameters(self):
        return iter(self._views.values())

    def named_buffers(self):
        """``(name, tensor)`` of the state that is not trained (BatchNorm's running mean and
        variance, and its batch count, here in the model's dtype), viewing the arena."""
        return iter(self._buffer_views.items())

    def state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """The parameters, then the buffers (a batch count as an integer, as torch's)."""
        out = OrderedDict((k, v.detach()) for k, v in self._views.items())
        for k, v in self._buffer_views.items():
            out[k] = v.to(torch.long).clone() if k.endswith("num_batches_tracked") else v
        return out

    def load_state_dict(self, state_dict, strict: bool = True) -> None:
        """Copy values in (converting dtype); names and shapes must match the torch module's.

        A parameter the module uses under several names (a layer used twice) may come under
        any of them, as in the module's own ``state_dict()``."""
        own = {**self._views, **self._buffer_views}
        found = {k: k for k in own if k in state_dict}
        for alias, name in self._aliases.items():
            if alias in state_dict:
                found.setdefault(name, alias)
        missing = [k for k in own if k not in found]
        unexpected = [
            k
            for k in state_dict
            if k not in own and k not in self._aliases and k not in self._ignored
        ]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        with torch.no_grad():
            for name, view in own.items():
                if name not in found:
                    continue
                value = torch.as_tensor(state_dict[found[name]])
                if tuple(value.shape) != tuple(view.shape):
                    raise ValueError(
                        f"load_state_dict: {name!r} has shape {tuple(value.shape)}, "
                        f"expected {tuple(view.shape)}"
                    )
                view.copy_(value.to(self.dtype))

    def train(self, mode: bool = True) -> CompiledModel:
        self.training = bool(mode)
        return self

    def eval(self) -> CompiledModel:
        return self.train(False)

    def to(self, device):
        """This model on ``device``: itself for ``"cpu"``; for ``"cuda"`` a
        :class:`rootclad.torch.DeviceModel` with a copy of the parameters, whose forward,
        backward and optimizer step run on the GPU (the ops and losses it has so far)."""
        device = torch.device(device)
        if device.type == "cpu":
            return self
        from rootclad.torch.device_model import DeviceModel

        dm = DeviceModel(self.graph, self.loss, device, self._seed)
        dm.load_state_dict(self.state_dict())
        for name, p in self._views.items():  # frozen stays frozen
            dm._views[name].requires_grad_(p.requires_grad)
        return dm.train(self.training)

    # -- checking inputs ----------------------------------------------------------------
    def _inputs(self, x) -> tuple:
        """The model inputs as a tuple: a tensor, or a tuple/list of one tensor per input."""
        xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
        if len(xs) != len(self.input_shapes):
            raise TypeError(
                f"this model takes {len(self.input_shapes)} inputs, got {len(xs)} "
                f"(per-sample shapes {self.input_shapes})"
            )
        return xs

    def _check_x(self, x) -> int:
        """Check every input (a tensor, or one per model input); returns the batch size."""
        if type(x) is torch.Tensor and len(self.input_shapes) == 1:  # the common case, fast
            B = x.shape[0] if x.dim() == len(self.input_shapes[0]) + 1 else 0
            if (
                B > 0
                and x.is_cpu
                and x.dtype == self.dtype
                and x.shape[1:] == self.input_shapes[0]
                and B * self._largest_region < 2**31
            ):
                return B
        xs = self._inputs(x)
        batches = set()
        for i, (t, shape) in enumerate(zip(xs, self.input_shapes, strict=True)):
            which = f"input {i}" if len(xs) > 1 else "input"
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"expected a torch.Tensor {which}, got {type(t).__name__}")
            if t.device.type != "cpu":
                raise ValueError(
                    f"{which} is on {t.device}; this compiled model runs on the CPU "
                    f"(cm.to({str(t.device)!r}) gives one for that device)"
                )
            if t.dtype != self.dtype:
                raise TypeError(
                    f"{which} dtype is {t.dtype}, expected {self.dtype} (the model was "
                    f"compiled for {self.dtype}; convert with x.to({self.dtype}))"
                )
            if t.dim() != len(shape) + 1 or tuple(t.shape[1:]) != shape:
                raise ValueError(
                    f"{which} shape is {tuple(t.shape)}, expected (B, {', '.join(map(str, shape))})"
                )
            if t.shape[0] < 1:
                raise ValueError(f"{which} batch is empty")
            batches.add(int(t.shape[0]))
        if len(batches) > 1:
            raise ValueError(f"the inputs have different batch sizes {sorted(batches)}")
        B = batches.pop()
        largest = self._largest_region
        if B * largest >= 2**31:  # the kernels count a layer's elements in an int
            raise ValueError(
                f"batch of {B} is too large for one call: a layer would hold {B * largest} "
                f"values (limit {2**31 - 1}); use batches of at most {(2**31 - 1) // largest}"
            )
        return B

    def _check_y(self, y, B: int) -> torch.Tensor:
        """Targets as torch's losses take them: cross_entropy and nll (B,) class indices, the others
        the output's shape (B, ...); a model with one output per sample also takes (B,)."""
        if not isinstance(y, torch.Tensor):
            y = torch.as_tensor(y)
        if self.loss in CLASS_INDEX_LOSSES:
            if y.dtype.is_floating_point or tuple(y.shape) != (B,):
                raise ValueError(
                    f"{self.loss} targets must be {B} integer class indices, shape ({B},), got "
                    f"{y.dtype} of shape {tuple(y.shape)}"
                )
            nc = self.output_shape[0]
            if B and (int(y.min()) < 0 or int(y.max()) >= nc):
                raise ValueError(
                    f"{self.loss} targets must lie in [0, {nc}), got "
                    f"[{int(y.min())}, {int(y.max())}]"
                )
        else:
            shapes = [(B, *self.output_shape)]
            if math.prod(self.output_shape) == 1:
                shapes.append((B,))
            if tuple(y.shape) not in shapes:
                raise ValueError(
                    f"{self.loss} targets have shape {tuple(y.shape)}, expected "
                    f"{' or '.join(map(str, shapes))} (the model output's shape)"
                )
        return y.reshape(-1).to(self.dtype).contiguous()

    def _workspace(self, B: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This thread's act and d_act for batch B, reusing the largest buffer it has had."""
        w = self._views_for(B)
        return w[0], w[1]

    def _views_for(self, B: int) -> tuple:
        """(act, d_act, act's address) for batch B on this thread, cached per batch size: a
        batch-1 call spends microseconds, and slicing and asking the library for sizes took
        a sixth of them."""
        local = self._local
        cached = getattr(local, "views", None)
        if cached is not None and B in cached:
            return cached[B]
        n, nd = self._lib.act_size(B), self._lib.d_act_size(B)
        if B > getattr(local, "batch", 0):
            local.work = torch.empty(n + nd, dtype=self.dtype)
            local.batch = B
            local.views = cached = {}  # views of the old buffer are stale
        act = local.work[:n]
        entry = cached[B] = (act, local.work[n : n + nd], act.data_ptr())
        return entry

    def _load_input(self, act: torch.Tensor, x, B: int) -> None:
        """Copy the model input(s) into their regions at the start of ``act``."""
        for t, r in zip(self._inputs(x), self._em.input_regions, strict=True):
            if t.is_cpu and t.dtype == self.dtype and t.is_contiguous() and not t.is_neg():
                # a plain memcpy: torch's copy_ would start its OpenMP threads, which then
                # compete with rootclad's own for the cores during the step
                size = act.element_size()
                ctypes.memmove(act.data_ptr() + B * r.offset * size, t.data_ptr(), t.numel() * size)
                continue
            # detached: a copy that autograd records would turn the shared workspace into a
            # graph node, and predict()'s output would then carry a silently zero gradient
            act[B * r.offset : B * (r.offset + r.size)].view_as(t).copy_(t.detach())

    def _output(self, act: torch.Tensor, B: int) -> torch.Tensor:
        r = self._em.output_region
        return act[B * r.offset : B * (r.offset + r.size)].view(B, *self.output_shape)

    def _next_seed(self) -> int:
        return (self._seed * 0x9E3779B97F4A7C15 + next(self._calls)) & 0xFFFFFFFFFFFFFFFF

    # -- running ------------------------------------------------------------------------
    def __call__(self, *x: torch.Tensor) -> torch.Tensor:
        """The model output, differentiable w.r.t. the input(s) and the parameters via torch
        autograd. A model with several inputs takes them in order: ``cm(x, theta)``."""
        from rootclad.torch.function import CompiledFunction

        xs = x[0] if len(x) == 1 and isinstance(x[0], (tuple, list)) else x
        self._check_x(xs)
        return CompiledFunction.apply(self, len(xs), *xs, *self._views.values())

    forward = __call__

    def _check_weight(self, weight, B: int):
        """Per-sample loss weights as the model's dtype (B,), or None."""
        if weight is None:
            return None
        w = torch.as_tensor(weight)
        if tuple(w.shape) != (B,) or w.is_complex() or w.dtype == torch.bool:
            raise ValueError(f"weight must hold one number per sample, shape ({B},), got "
                             f"{w.dtype} of shape {tuple(w.shape)}")  # fmt: skip
        w = w.to(self.dtype).contiguous()
        bad = first_non_finite(w)
        if bad is not None:
            raise ValueError(f"weight: non-finite value ({bad[1]}) in sample {bad[0]}")
        return w

    def _refuse_non_finite(self, x, y: torch.Tensor, B: int, opt) -> None:
        refuse_non_finite(self._inputs(x), None if self.loss in CLASS_INDEX_LOSSES else y, B, opt)

    def loss_and_grad(
        self, x: torch.Tensor, y, weight=None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of a batch and the gradient of every parameter (fresh tensors). ``x``: the
        input, or a tuple of one tensor per input for a model with several.

        ``weight`` (B,): per-sample weights (HEP event weights). The loss is then the mean over
        elements of ``weight[b] * loss_element``, as ``(F.<loss>(out, y, reduction="none") *
        weight[:, None]).mean()`` in torch."""
        B = self._check_x(x)
        y = self._check_y(y, B)
        w = self._check_weight(weight, B)
        act, d_act = self._workspace(B)
        self._load_input(act, x, B)
        with self._lock:
            loss = self._lib.loss_and_grad(
                self._arena.data_ptr(),
                act.data_ptr(),
                y.data_ptr(),
                self._grads.data_ptr(),
                d_act.data_ptr(),
                B,
                int(self.training),
                self._next_seed(),
                0,
                None if w is None else w.data_ptr(),
            )
            grads = {
                k: fresh_copy(v)
                for k, v in self._grad_views.items()
                if self._views[k].requires_grad
            }
        return torch.tensor(loss, dtype=self.dtype), grads

    def train_step(self, x: torch.Tensor, y, opt, weight=None, *, check_finite=True) -> float:
        """Forward, backward and ``opt``'s update in one C++ call; returns the loss.

        Parameters with ``requires_grad=False`` are not updated (nor is their optimizer
        state); each parameter counts its own steps, as torch.optim's do. ``weight``: per-sample
        loss weights, as in :meth:`loss_and_grad`.

        A non-finite input, target or weight is refused (ValueError naming the tensor and the
        sample) before anything changes, and so is an optimizer whose state holds one (see
        :meth:`rootclad.optim.Optimizer.reset`). ``check_finite=False`` skips the scan of
        inputs, targets and state for speed; weights are always checked."""
        if opt.model is not self:
            raise ValueError("this optimizer was created for another compiled model")
        if self._em.n_buffers and not self.training:
            raise ValueError(
                "train_step runs BatchNorm on the batch's statistics (training mode); this "
                "model is in eval mode: call cm.train() first, or use loss_and_grad and "
                "step an optimizer yourself to train on the running statistics"
            )
        B = self._check_x(x)
        y = self._check_y(y, B)
        w = self._check_weight(weight, B)
        if check_finite:
            self._refuse_non_finite(x, y, B, opt)
        act, d_act = self._workspace(B)
        self._load_input(act, x, B)
        with self._lock:
            step, tensor_steps = opt._advance([v.requires_grad for v in self._views.values()])
            loss = self._lib.train_step(
                self._arena.data_ptr(),
                act.data_ptr(),
                y.data_ptr(),
                self._grads.data_ptr(),
                d_act.data_ptr(),
                opt._state.data_ptr(),
                ctypes.addressof(opt._cfg),
                step,
                B,
                self._next_seed(),
                tensor_steps,
                None if w is None else w.data_ptr(),
            )
        if not math.isfinite(loss):  # the state may hold NaN now: the next step scans it
            opt._suspect = True
        return loss

    def predict(self, *x: torch.Tensor) -> torch.Tensor:
        """The output without autograd bookkeeping (eval-mode dropout unless training)."""
        x = x[0] if len(x) == 1 else x
        B = self._check_x(x)
        act, _, act_ptr = self._views_for(B)
        self._load_input(act, x, B)
        self._lib.forward(self._arena.data_ptr(), act_ptr, B, int(self.training), self._next_seed())
        return fresh_copy(self._output(act, B))

    def input_grad(self, *x: torch.Tensor, d_out: torch.Tensor | None = None):
        """d(sum of output x d_out) / d input, through the compiled backward, without autograd
        bookkeeping; ``d_out`` defaults to ones (for a one-output model: each sample's
        d output / d input, its saliency). Returns one tensor per model input (a tuple when
        there are several); the parameters' gradient is left alone."""
        x = x[0] if len(x) == 1 else x
        B = self._check_x(x)
        out_shape = (B, *self.output_shape)
        if d_out is None:
            d_out = torch.ones(out_shape, dtype=self.dtype)
        elif tuple(d_out.shape) != out_shape:
            raise ValueError(f"d_out has shape {tuple(d_out.shape)}, expected {out_shape}")
        d_out = d_out.detach().to(self.dtype).contiguous()
        act, d_act, act_ptr = self._views_for(B)
        self._load_input(act, x, B)
        seed = self._next_seed()
        # the parameters' adjoint, which the pullback engine leaves alone here and the clad
        # engine fills and this drops: one per thread, kept (a fresh one cost as much as a
        # batch-1 forward of the MLP)
        local = self._local
        if getattr(local, "d_params", None) is None:
            local.d_params = torch.empty_like(self._grads)
        self._lib.forward(self._arena.data_ptr(), act_ptr, B, int(self.training), seed)
        # need_dx = 3: the inputs' gradient alone (emit.py: NO_PARAM_GRADIENT)
        self._lib.vjp(self._arena.data_ptr(), act_ptr, local.d_params.data_ptr(),
                      d_act.data_ptr(), d_out.data_ptr(), B, int(self.training), seed, 3)  # fmt: skip
        grads = tuple(
            fresh_copy(d_act[B * r.d_offset : B * (r.d_offset + r.size)].view(B, *shape))
            for r, shape in zip(self._em.input_regions, self.input_shapes, strict=True)
        )
        return grads[0] if len(grads) == 1 else grads

    def export(self, stem, optimizer=None):
        """Write ``STEM.so``, ``STEM.root`` (the parameters, and ``optimizer``'s state if
        given) and ``STEM.h``, for ROOT macros, compiled C++ programs and
        :func:`rootclad.root.load`; see rootclad/root/export.py."""
        from rootclad.root.export import export

        return export(self, stem, optimizer)

    def __repr__(self) -> str:
        return (
            f"CompiledModel(engine={self.engine!r}, pullbacks={self.pullbacks}, "
            f"dtype={self.dtype}, loss={self.loss!r}, input=(B, "
            f"{', '.join(map(str, self.input_shape))}), params={self._em.n_params}, "
            f"library={str(self.library_path)!r})"
        )
