"""``DeviceModel``: a compiled model whose every step runs as device kernels on a GPU.

``rootclad.compile(net, example_input=x.cuda())`` (or ``cm.to("cuda")``) builds the model's
device program (rootclad/codegen/cuda.py: its launches, built by the host compiler in well under
a second) against the device runtime library (every kernel, built by nvcc once per GPU
architecture into the cache) and runs it on torch's current stream:
the parameters, the optimizer's state, the activations and their adjoints live in device
memory, and a training step (forward, loss gradient, backward, optimizer update) copies
nothing between host and device; its loss stays a device tensor until read.

A program built for ``device="cpu"`` (:func:`rootclad.compiler.compile_device`) runs each
kernel as a loop on the calling thread (dev::Host): the reference the GPU build is checked
against, and what the tests run on machines without a GPU. (For speed on the CPU use
:class:`CompiledModel`.)

The backward is the built-in sweep over rootclad's hand-written device pullbacks (engine
``"pullback"``); the device programs multiply matrices with cuBLAS (from GEMM_MIN_ROWS rows on),
run every other op as their own kernels, and plan their adjoints. Parameters, buffers, checks,
seeds and ``to`` are :class:`rootclad.torch.base.ModelBase`'s, as for :class:`CompiledModel`.
"""

from __future__ import annotations

import ctypes
import math
import warnings
from typing import NamedTuple

import torch

from rootclad.ir.graph import CLASS_INDEX_LOSSES
from rootclad.torch.base import ModelBase, refuse_non_finite
from rootclad.torch.function import CompiledFunction
from rootclad.torch.step_graph import StepGraph

# the device program's C API (codegen/cuda.py): (name, result, argument types)
_SIZES = ("n_params", "n_buffers", "act_size", "d_act_size", "d_act_store_size",
          "output_offset", "optim_constants_size")  # fmt: skip
_VP, _L, _I, _U64 = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_ulonglong
_CALLS = {
    "forward": [_VP] * 4 + [_I, _I, _U64],
    "loss_and_grad": [_VP] * 9 + [_I, _I, _U64],
    "input_grad": [_VP] * 6 + [_I, _I, _U64],
    "optim_step": [_VP] * 5 + [_L] * 3,
    "optim_step_in_memory": [_VP] * 7 + [_L] * 2,
}


class _Work(NamedTuple):
    """A batch size's act and d_act, and their addresses for the C calls."""

    act: torch.Tensor
    d_act: torch.Tensor
    act_ptr: int
    d_act_ptr: int
    inputs: list  # the inputs' places in act, (B, *shape) each


class DeviceModel(ModelBase):
    """A model's forward pass, loss gradient and optimizer step as device kernels.

    Build one with ``rootclad.compile(net, example_input=x.cuda())``, ``cm.to("cuda")`` or
    :func:`rootclad.compiler.compile_device`. The API is :class:`CompiledModel`'s:
    ``model(x)``, :meth:`predict`, :meth:`input_grad`, :meth:`loss_and_grad`,
    :meth:`train_step` with a ``rootclad.optim`` optimizer, event weights, ``state_dict``
    and ``to``."""

    engine = "pullback"
    pullbacks = True
    # train_step as one CUDA graph per batch size and optimizer (rootclad/torch/step_graph.py);
    # off by default until a GPU run has weighed it (benchmarks/cuda/bench_train_step.py)
    cuda_graphs = False

    def __init__(self, graph, loss: str, device, library, library_path, name: str, *,
                 seed: int = 0, aliases=None, ignored=(), retarget=None):  # fmt: skip
        """``library``: the device program ``name`` of ``graph`` (a loaded ctypes library)
        built for ``device`` by :mod:`rootclad.compiler`."""
        super().__init__(graph, loss, seed=seed, aliases=aliases, ignored=ignored,
                         retarget=retarget)  # fmt: skip
        self.device = torch.device(device)
        self.library_path = library_path
        self._lib = library
        self._fn = {k: getattr(library, f"{name}_{k}") for k in (*_SIZES, *_CALLS, "error_text")}
        self._fn["error_text"].restype = ctypes.c_char_p
        for k in _SIZES:
            self._fn[k].restype = ctypes.c_long
        for k, argtypes in _CALLS.items():
            self._fn[k].argtypes = argtypes
        n = self._fn["n_params"]()
        if n != self.n_param_values:
            raise RuntimeError(f"{library_path} holds {n} parameters, expected "
                               f"{self.n_param_values}: stale or foreign library")  # fmt: skip
        self._params = torch.zeros(n, dtype=self.dtype, device=self.device)
        self._grads = torch.zeros_like(self._params)
        # BatchNorm's running statistics and batch count (in the model's dtype, as on the CPU)
        self._buffer_store = torch.zeros(self._fn["n_buffers"](), dtype=self.dtype,
                                         device=self.device)  # fmt: skip
        self._view_parameters(self._params, self._grads, self._buffer_store)
        self._loss = torch.zeros(1, dtype=self.dtype, device=self.device)
        # act and d_act: one store each, grown to the largest batch size seen; per batch size
        # the views into them and the pointers of the C calls (until the stores grow)
        self._act_store: torch.Tensor | None = None
        self._d_act_store: torch.Tensor | None = None
        self._work: dict[int, _Work] = {}
        self._ptr = {"params": self._params.data_ptr(), "grads": self._grads.data_ptr(),
                     "buffers": self._buffer_store.data_ptr(), "loss": self._loss.data_ptr()}  # fmt: skip
        self._on_cuda = self.device.type == "cuda"
        self._cuda_index = self._on_cuda and self.device.index is not None
        self._loss_value = self._loss[0]
        # train_step's CUDA graphs (cuda_graphs), by (B, training, optimizer, its state,
        # targets' shape); False: seen once, captured at the next step
        self._step_graphs: dict[tuple, StepGraph | bool] = {}
        self._random = any(op.random for op in graph.ops())

    def _on(self, device: torch.device) -> bool:
        return device == self.device or (
            device.type == self.device.type == "cuda" and device.index is None
        )

    # -- checking -----------------------------------------------------------------------------
    def _stream(self):
        if not self._on_cuda:
            return None
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def _check_classes(self, y: torch.Tensor, nc: int) -> None:
        inside = ((y >= 0) & (y < nc)).all()
        if self.device.type == "cuda":  # raised at the next synchronisation, not waited for
            torch._assert_async(inside, f"{self.loss} targets must lie in [0, {nc})")
        elif not bool(inside):
            super()._check_classes(y, nc)

    def _buffers(self, x) -> tuple[int, _Work]:
        """Checks the inputs and copies them into act, one after the other (the program's
        layout); returns the batch size and its act and d_act."""
        xs = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in self._inputs(x))
        B = self._check_inputs(xs)
        work = self._work.get(B) or self._allocate(B)
        for t, place in zip(xs, work.inputs, strict=True):
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
                hint = (
                    f"; the device runtime library that {self.library_path} runs holds no code "
                    "for this GPU: it was built for another architecture"
                )
            raise RuntimeError(f"CUDA error {code} in the device program's {fn}: {text}{hint}")

    # -- running ------------------------------------------------------------------------------
    def __call__(self, *x: torch.Tensor) -> torch.Tensor:
        """The output, differentiable by torch autograd with respect to the inputs (several
        in order, ``model(x, theta)``, or as one tuple); the parameters' gradients come from
        :meth:`loss_and_grad` and :meth:`train_step`."""
        xs = tuple(x[0] if len(x) == 1 and isinstance(x[0], (tuple, list)) else x)
        self._inputs(xs)  # their number, and masks given as torch.bool (converted later)
        return self._split(CompiledFunction.apply(self, len(xs), False, *xs))

    def autograd_forward(self, xs: tuple) -> tuple[torch.Tensor, tuple]:
        """The output for torch autograd, and what :meth:`autograd_backward` needs: the inputs
        and the seed (the backward draws the forward's dropout masks again from it)."""
        seed = self._next_seed()
        return self._predict(xs, seed), (xs, seed)

    def autograd_backward(self, saved: tuple, d_out: torch.Tensor, need_x, need_params):
        xs, seed = saved
        # the forward again, its running statistics not updated twice
        grads = self._input_grad(xs, d_out, seed, again=True)
        return [g if n else None for g, n in zip(grads, need_x, strict=True)], []

    def predict(self, *x: torch.Tensor) -> torch.Tensor:
        """The output (B, *output_shape), a fresh device tensor (a model that returns several:
        as its module does)."""
        return self._split(self._predict(x, self._next_seed()))

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
        model input (a tuple when there are several). A model with several outputs takes
        ``d_out`` as it returns them (default: ones on the output the loss reads)."""
        xs = x[0] if len(x) == 1 and isinstance(x[0], (tuple, list)) else x
        d_out = self._joined_d_out(d_out, int(xs[0].shape[0]))
        grads = self._without_masks(self._input_grad(x, d_out, self._next_seed()))
        return grads[0] if len(grads) == 1 else grads

    def _input_grad(self, xs, d_out, seed: int, again=False) -> tuple[torch.Tensor, ...]:
        """``again``: the forward pass was run already (for autograd); in training mode
        BatchNorm then uses the batch's statistics without updating the running ones."""
        B, work = self._buffers(xs[0] if len(xs) == 1 else xs)
        out_shape = (B, *self.output_shape)
        if d_out is None:
            d_out = torch.ones(out_shape, dtype=self.dtype, device=self.device)
        d_out = d_out.detach()
        if (err := self._device_error("d_out", d_out)) is not None:
            raise err
        if tuple(d_out.shape) != out_shape:
            raise ValueError(f"d_out has shape {tuple(d_out.shape)}, expected {out_shape}")
        d_out = d_out.to(self.dtype).contiguous()
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

    def _run_loss_and_grad(self, B: int, work: _Work, y, w, seed: int) -> None:
        ptr = self._ptr
        self._run("loss_and_grad", ptr["params"], ptr["buffers"], work.act_ptr, y.data_ptr(),
                  None if w is None else w.data_ptr(), ptr["loss"], ptr["grads"],
                  work.d_act_ptr, B, int(self.training), seed)  # fmt: skip

    def loss_and_grad(
        self, x, y, weight=None, *, weight_norm: str = "mean"
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The batch's mean loss (a 0-d device tensor) and every trainable parameter's gradient
        (fresh device tensors), as :meth:`CompiledModel.loss_and_grad` (``weight``: per-sample
        loss weights)."""
        B, work = self._buffers(x)
        y, w = self._check_y(y, B), self._check_weight(weight, B, weight_norm)
        self._run_loss_and_grad(B, work, y, w, self._next_seed())
        grads = {k: v.clone() for k, v in self._grad_views.items() if self._views[k].requires_grad}
        return self._loss_value.clone(), grads

    def train_step(self, x, y, opt, weight=None, *, check_finite=True,
                   weight_norm: str = "mean") -> torch.Tensor:  # fmt: skip
        """Forward, backward and ``opt``'s update (a ``rootclad.optim`` optimizer made for this
        model), all on the device; ``weight``: per-sample loss weights. Returns the loss as a
        0-d device tensor: reading it (``float(loss)``) waits for the step.

        As :meth:`CompiledModel.train_step`, a non-finite input or target, and an optimizer whose
        state holds one, is refused before anything changes; that check waits for the device
        once per step (one reduction over the batch and the state): ``check_finite=False``
        skips it, so that a loop that does not read the loss never waits."""
        self._check_optimizer(opt)
        B, work = self._buffers(x)
        y, w = self._check_y(y, B), self._check_weight(weight, B, weight_norm)
        if check_finite:
            y_checked = None if self.loss in CLASS_INDEX_LOSSES else y
            refuse_non_finite(tuple(work.inputs), y_checked, B, opt, scan_state=True)
        seed = self._next_seed()
        counts = (opt.step_count, None if opt._steps is None else list(opt._steps))
        step, per_tensor = opt._advance(self._trainable())
        try:
            graph = self._step_graph(B, y, opt, per_tensor) if w is None else None
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
            self._run_loss_and_grad(B, work, y, w, seed)
            self._run_optimizer(opt, step, per_tensor)
        except BaseException:  # the step did not happen: the optimizer does not count it
            opt.step_count, opt._steps = counts
            raise
        return self._loss_value.clone()

    def _step_graph(self, B: int, y: torch.Tensor, opt, per_tensor) -> StepGraph | None:
        """The CUDA graph of this step (cuda_graphs), or None for plain launches: a model
        with dropout, a frozen parameter, the first step of its kind."""
        if not self.cuda_graphs or per_tensor is not None or self._random:
            return None
        key = (B, int(self.training), id(opt), opt._state.data_ptr(), tuple(y.shape))
        graph = self._step_graphs.get(key)
        if graph is None:  # the first step of its kind: plain launches (cuBLAS's handle)
            self._step_graphs[key] = False
            return None
        if graph is False:
            graph = self._step_graphs[key] = StepGraph(self, B, y, opt)
        return graph

    def _loss_into_grads(self, x, y, w) -> torch.Tensor:
        """The batch's loss (a 0-d device tensor; ``w``: raw weights or None), its gradient
        left in the gradient block: what a data-parallel step all-reduces (NCCL; untested
        here, see docs/distributed_training.md)."""
        B, work = self._buffers(x)
        y, w = self._check_y(y, B), self._check_weight(w, B)
        self._run_loss_and_grad(B, work, y, w, self._next_seed())
        return self._loss_value.clone()

    def apply_grads(self, opt) -> None:
        """``opt``'s update from the gradient block as it stands (train_step's last part)."""
        self._check_optimizer(opt)
        step, per_tensor = opt._advance(self._trainable())
        self._run_optimizer(opt, step, per_tensor)

    def _run_optimizer(self, opt, step: int, per_tensor) -> None:
        if per_tensor is None:  # every tensor at `step`: one launch
            runs = [(0, self.n_param_values, step)]
        else:  # frozen ones skipped; neighbours at the same step share a launch
            runs = []
            layout = self.param_layout()
            for (_, off, n), t in zip(layout, opt._call_steps, strict=False):
                if t <= 0:
                    continue
                if runs and runs[-1][2] == t and sum(runs[-1][:2]) == off:
                    runs[-1] = (runs[-1][0], runs[-1][1] + n, t)
                else:
                    runs.append((off, n, t))
        ptr, state, cfg = self._ptr, opt._state.data_ptr(), ctypes.addressof(opt._cfg)
        for begin, count, t in runs:
            self._run("optim_step", ptr["params"], ptr["grads"], state, cfg, t, begin, count)

    def __repr__(self) -> str:
        return (f"DeviceModel(device={str(self.device)!r}, engine='pullback', dtype={self.dtype}, "
                f"loss={self.loss!r}, input=(B, {', '.join(map(str, self.input_shape))}), "
                f"params={self.n_param_values}, library={str(self.library_path)!r})")  # fmt: skip
