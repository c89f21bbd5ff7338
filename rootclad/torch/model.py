"""``CompiledModel``: a torch model compiled to C++ for the CPU, its parameters in one arena.

The arena is one torch tensor ``[params | buffers | grads]``; the tensors returned by
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
import math
import threading
from pathlib import Path

import torch

from rootclad.ir.graph import CLASS_INDEX_LOSSES
from rootclad.torch.base import ModelBase, fresh_copy, refuse_non_finite
from rootclad.torch.function import CompiledFunction

_C_REAL = {"float32": ctypes.c_float, "float64": ctypes.c_double}
_VP, _I, _U64, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_long
# need_dx of the C API (model_runtime.h): the inputs' gradient too; the inputs' alone
_WITH_INPUTS, _INPUTS_ALONE = 1, 3


class _Library:
    """The C API of one compiled model (rootclad/model_runtime.h), bound with ctypes."""

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
        try:  # (libraries built before the entry point existed lack it: apply_grads says so)
            self.optim_update = bind("optim_update", None, _VP, _VP, _VP, _VP, _L, _VP)
        except AttributeError:
            self.optim_update = None


class CompiledModel(ModelBase):
    """A model compiled for the CPU. Build one with :func:`rootclad.compile`.

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
        aliases=None,
        ignored=(),
        retarget=None,
        self_contained=None,
    ):
        super().__init__(graph, loss, seed=seed, aliases=aliases, ignored=ignored,
                         retarget=retarget)  # fmt: skip
        self._em = emitted
        self.engine = "clad" if emitted.engine == "clad" else "pullback"
        self.pullbacks = emitted.pullbacks
        self.library_path = Path(library_path)
        # the same model with the runtime linked in, built on first call (exports)
        self._self_contained = self_contained
        self.source_path = self.library_path.with_suffix(".cpp")
        self.compile_seconds = compile_seconds
        self.built_now = built_now
        self.device = torch.device("cpu")
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
        self._grads = self._arena[n : 2 * n]
        self._view_parameters(self._params, self._grads, self._arena[P:n])
        self._local = threading.local()  # per-thread workspace: see _views_for
        self._lock = threading.Lock()  # loss_and_grad and train_step: one at a time
        self._largest_region = max(r.size for r in emitted.regions)

    # -- checking inputs ----------------------------------------------------------------
    def _device_error(self, which: str, t: torch.Tensor):
        if t.device.type == "cpu":
            return None
        return ValueError(f"{which} is on {t.device}; this compiled model runs on the CPU "
                          f"(cm.to({str(t.device)!r}) gives one for that device)")  # fmt: skip

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
        B = self._check_inputs(self._inputs(x))
        largest = self._largest_region
        if B * largest >= 2**31:  # the kernels count a layer's elements in an int
            raise ValueError(
                f"batch of {B} is too large for one call: a layer would hold {B * largest} "
                f"values (limit {2**31 - 1}); use batches of at most {(2**31 - 1) // largest}"
            )
        return B

    def _views_for(self, B: int) -> tuple:
        """(act, d_act, act's address) for batch B on this thread, reusing the largest buffer
        it has had; cached per batch size: a batch-1 call spends microseconds, and slicing and
        asking the library for sizes took a sixth of them."""
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

    def _input_grads(self, d_act: torch.Tensor, B: int) -> list[torch.Tensor]:
        return [
            fresh_copy(d_act[B * r.d_offset : B * (r.d_offset + r.size)].view(B, *shape))
            for r, shape in zip(self._em.input_regions, self.input_shapes, strict=True)
        ]

    # -- running ------------------------------------------------------------------------
    def __call__(self, *x: torch.Tensor) -> torch.Tensor:
        """The model output, differentiable w.r.t. the input(s) and the parameters via torch
        autograd. A model with several inputs takes them in order: ``cm(x, theta)``; one
        that returns several tensors returns them as its module does (a tuple, list or dict)."""
        xs = x[0] if len(x) == 1 and isinstance(x[0], (tuple, list)) else x
        self._check_x(xs)
        return self._split(CompiledFunction.apply(self, len(xs), True, *xs,
                                                  *self._views.values()))  # fmt: skip

    forward = __call__

    def autograd_forward(self, xs: tuple) -> tuple[torch.Tensor, tuple]:
        """The output for torch autograd (:class:`rootclad.torch.function.CompiledFunction`)
        and what :meth:`autograd_backward` needs of this call: its own activations (so several
        calls may precede one backward), seed and mode."""
        B = int(xs[0].shape[0])
        act = torch.empty(self._lib.act_size(B), dtype=self.dtype)
        self._load_input(act, tuple(x.detach() for x in xs), B)
        seed = self._next_seed()
        self._lib.forward(self._arena.data_ptr(), act.data_ptr(), B, int(self.training), seed)
        return fresh_copy(self._output(act, B)), (act, B, seed, self.training)

    def autograd_backward(self, saved: tuple, d_out: torch.Tensor, need_x, need_params):
        """The vector-Jacobian product of the call ``saved`` for ``d_out``: (each input's
        gradient or None, each parameter's or None), as ``need_x`` / ``need_params`` ask."""
        act, B, seed, training = saved
        d_act = torch.empty(self._lib.d_act_size(B), dtype=self.dtype)
        d_params = torch.empty_like(self._grads)  # the parameters' and the buffers' slots
        d_out = d_out.to(self.dtype).contiguous()
        self._lib.vjp(self._arena.data_ptr(), act.data_ptr(), d_params.data_ptr(),
                      d_act.data_ptr(), d_out.data_ptr(), B, int(training), seed,
                      _WITH_INPUTS if any(need_x) else 0)  # fmt: skip
        d_xs = [d if n else None for d, n in zip(self._input_grads(d_act, B), need_x, strict=True)]
        grads = [
            d_params[off : off + numel].view(self._views[name].shape) if needed else None
            for (name, off, numel), needed in zip(self.param_layout(), need_params, strict=True)
        ]
        return d_xs, grads

    def loss_and_grad(
        self, x: torch.Tensor, y, weight=None, *, weight_norm: str = "mean"
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of a batch and the gradient of every parameter (fresh tensors). ``x``: the
        input, or a tuple of one tensor per input for a model with several.

        ``weight`` (B,): per-sample weights (HEP event weights). The loss is then the mean over
        elements of ``weight[b] * loss_element``, as ``(F.<loss>(out, y, reduction="none") *
        weight[:, None]).mean()`` in torch; with ``weight_norm="sum_w"``, the normalised
        ``sum_b weight[b] * loss_b / sum_b weight[b]`` (``loss_b`` the mean over the sample's
        elements) that HEP fits use."""
        B = self._check_x(x)
        y = self._check_y(y, B)
        w = self._check_weight(weight, B, weight_norm)
        act, d_act, act_ptr = self._views_for(B)
        self._load_input(act, x, B)
        with self._lock:
            loss = self._lib.loss_and_grad(
                self._arena.data_ptr(),
                act_ptr,
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

    def train_step(self, x: torch.Tensor, y, opt, weight=None, *, check_finite=True,
                   weight_norm: str = "mean") -> float:  # fmt: skip
        """Forward, backward and ``opt``'s update in one C++ call; returns the loss.

        Parameters with ``requires_grad=False`` are not updated (nor is their optimizer
        state); each parameter counts its own steps, as torch.optim's do. ``weight``: per-sample
        loss weights, as in :meth:`loss_and_grad`.

        A non-finite input, target or weight is refused (ValueError naming the tensor and the
        sample) before anything changes, and so is an optimizer whose state holds one (see
        :meth:`rootclad.optim.Optimizer.reset`). ``check_finite=False`` skips the scan of
        inputs and targets for speed; weights are always checked."""
        self._check_optimizer(opt)
        if self.graph.batch_statistics and not self.training:
            raise ValueError(
                "train_step runs BatchNorm on the batch's statistics (training mode); this "
                "model is in eval mode: call cm.train() first, or use loss_and_grad and "
                "step an optimizer yourself to train on the running statistics"
            )
        B = self._check_x(x)
        y = self._check_y(y, B)
        w = self._check_weight(weight, B, weight_norm)
        if check_finite:
            refuse_non_finite(self._inputs(x), None if self.loss in CLASS_INDEX_LOSSES else y,
                              B, opt)  # fmt: skip
        act, d_act, act_ptr = self._views_for(B)
        self._load_input(act, x, B)
        with self._lock:
            step, tensor_steps = opt._advance(self._trainable())
            loss = self._lib.train_step(
                self._arena.data_ptr(),
                act_ptr,
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

    def _loss_into_grads(self, x, y, w) -> float:
        """The batch's loss (``w``: raw per-sample weights or None, "mean" normalisation), its
        gradient left in the gradient block (``self._grads``, parameters first): what a
        data-parallel step all-reduces (rootclad/torch/distributed.py)."""
        B = self._check_x(x)
        y = self._check_y(y, B)
        w = self._check_weight(w, B)
        act, d_act, act_ptr = self._views_for(B)
        self._load_input(act, x, B)
        with self._lock:
            return self._lib.loss_and_grad(self._arena.data_ptr(), act_ptr, y.data_ptr(),
                                           self._grads.data_ptr(), d_act.data_ptr(), B,
                                           int(self.training), self._next_seed(), 0,
                                           None if w is None else w.data_ptr())  # fmt: skip

    def apply_grads(self, opt) -> None:
        """``opt``'s update of the parameters from the gradient block as it stands (what
        :meth:`loss_and_grad` last formed, or an all-reduced one): ``train_step``'s last part,
        frozen tensors skipped and each tensor's own step count kept as there."""
        self._check_optimizer(opt)
        if self._lib.optim_update is None:
            raise RuntimeError(f"{self.library_path} was built before rootclad exported "
                               "optim_update: compile the model again")  # fmt: skip
        if opt._suspect:  # an earlier step's loss was not finite: the state may hold NaN
            opt.check_finite()
            opt._suspect = False
        with self._lock:
            step, tensor_steps = opt._advance(self._trainable())
            self._lib.optim_update(self._arena.data_ptr(), self._grads.data_ptr(),
                                   opt._state.data_ptr(), ctypes.addressof(opt._cfg), step,
                                   tensor_steps)  # fmt: skip

    def predict(self, *x: torch.Tensor) -> torch.Tensor:
        """The output without autograd bookkeeping (eval-mode dropout unless training)."""
        x = x[0] if len(x) == 1 else x
        B = self._check_x(x)
        act, _, act_ptr = self._views_for(B)
        self._load_input(act, x, B)
        self._lib.forward(self._arena.data_ptr(), act_ptr, B, int(self.training), self._next_seed())
        return self._split(fresh_copy(self._output(act, B)))

    def input_grad(self, *x: torch.Tensor, d_out: torch.Tensor | None = None):
        """d(sum of output x d_out) / d input, through the compiled backward, without autograd
        bookkeeping; ``d_out`` defaults to ones (for a one-output model: each sample's
        d output / d input, its saliency). Returns one tensor per model input (a tuple when
        there are several); the parameters' gradient is left alone. A model with several
        outputs takes ``d_out`` as it returns them, and defaults to ones on the output the loss
        reads (zeros on the others)."""
        x = x[0] if len(x) == 1 else x
        B = self._check_x(x)
        d_out = self._joined_d_out(d_out, B)
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
        self._lib.vjp(self._arena.data_ptr(), act_ptr, local.d_params.data_ptr(),
                      d_act.data_ptr(), d_out.data_ptr(), B, int(self.training), seed,
                      _INPUTS_ALONE)  # fmt: skip
        grads = self._without_masks(self._input_grads(d_act, B))
        return grads[0] if len(grads) == 1 else grads

    def self_contained_library(self) -> Path:
        """This model's library with rootclad's runtime linked in (built once, cached): it
        needs nothing beside it, so an export may be copied anywhere."""
        if self._self_contained is None:
            raise RuntimeError("this model was not made by rootclad.compile: no library to export")
        return Path(self._self_contained())

    def export(self, stem, optimizer=None, schema=None):
        """Write ``STEM.so``, ``STEM.root`` (the parameters, and ``optimizer``'s state if
        given) and ``STEM.h``, for ROOT macros, compiled C++ programs and
        :func:`rootclad.root.load`; see rootclad/root/export.py. ``schema`` (a
        :class:`rootclad.data.Schema`, or a reader: its ``.schema``) stores the input columns,
        target, weight and class names with the model, for ``define_score(df, stem)``."""
        from rootclad.root.export import export

        return export(self, stem, optimizer, schema)

    def __repr__(self) -> str:
        return (
            f"CompiledModel(engine={self.engine!r}, pullbacks={self.pullbacks}, "
            f"dtype={self.dtype}, loss={self.loss!r}, input=(B, "
            f"{', '.join(map(str, self.input_shape))}), params={self._em.n_params}, "
            f"library={str(self.library_path)!r})"
        )
