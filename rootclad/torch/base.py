"""What every compiled model has, wherever its library runs: parameters as views of one block,
``state_dict`` / ``load_state_dict``, train and eval modes, the checks of inputs, targets,
weights and batches, the per-call seed, and ``to(device)``.

:class:`rootclad.torch.CompiledModel` (the CPU library) and :class:`rootclad.torch.DeviceModel`
(a device program, on a GPU or as host loops) differ only in where their library runs and
how they call it. Both receive a built library from :mod:`rootclad.compiler` and never
compile; ``to(device)`` asks the compiler's ``retarget`` for the model elsewhere.
"""

from __future__ import annotations

import ctypes
import itertools
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch

from rootclad.ir.graph import CLASS_INDEX_LOSSES

TORCH_DTYPE = {"float32": torch.float32, "float64": torch.float64}
_NOT_LOADED = "; nothing was loaded"


def _key(where: str | None, key: str) -> str:
    """A state dict's ``key`` as the messages name it: ``load_state_dict: 'fc.bias'``, or
    within what a caller calls the state dict (``the checkpoint's 'model'['fc.bias']``)."""
    return f"load_state_dict: {key!r}" if where is None else f"{where}[{key!r}]"


class ArenaParameter(torch.nn.Parameter):
    """A parameter that views the compiled model's parameter block.

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


def flat_index_text(shape, i: int) -> str:
    """The flat index ``i`` of a tensor of ``shape`` as ``[a, b]`` (empty for a 0-d tensor)."""
    if not tuple(shape):
        return ""
    return "[" + ", ".join(str(int(a)) for a in np.unravel_index(i, tuple(shape))) + "]"


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` did not find and did not know (as torch's module returns)."""

    missing_keys: list
    unexpected_keys: list


def check_indices(which: str, t: torch.Tensor, rows: tuple[int, ...], limits: dict) -> None:
    """An input of Embedding indices: an integer type, each index in [0, the rows of the
    Embeddings reading its position) (``rows``: per position of a sample, 0 for one no
    Embedding reads, -n for one compared with numbers only, which must be below n in size;
    ``limits``: the model's cache of them as arrays, by device). On the CPU
    numpy scans it on one thread and a bad index is named; on a GPU the check is queued
    (torch._assert_async), so that a loop never waits for it."""
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{which} holds the indices of an Embedding: the model was compiled with "
                        f"an integer tensor there, got {t.dtype}")  # fmt: skip
    if t.numel() == 0 or t.dim() < 1 or t[0].numel() != len(rows):
        return  # (the shape check names a wrong shape)
    key = (rows, t.device)
    if key not in limits:
        limit = np.asarray(rows, dtype=np.int64)
        limits[key] = limit if t.is_cpu else torch.as_tensor(limit, device=t.device)
    limit = limits[key]
    if not t.is_cpu:
        flat = t.reshape(t.shape[0], -1)
        ok = (((flat >= 0) & ((flat < limit) | (limit == 0))) | (limit < 0)) & (
            (limit >= 0) | (flat.abs() < -limit)
        )
        torch._assert_async(
            ok.all(),
            f"{which}: an index outside the rows of the Embedding "
            "reading it, or an integer compared beyond what the model holds",
        )
        return
    flat = t.detach().reshape(t.shape[0], -1).numpy()
    bad = ((flat < 0) | (flat >= limit)) & (limit > 0) | (limit < 0) & (np.abs(flat) >= -limit)
    if bad.any():
        b, i = (int(v) for v in np.argwhere(bad)[0])
        at = np.unravel_index(i, tuple(t.shape[1:]))
        where = ", ".join(str(v) for v in (b, *(int(a) for a in at)))
        if rows[i] < 0:  # compared with numbers only (the export front-end)
            raise ValueError(
                f"{which}[{where}] = {int(flat[b, i])}: the model compares it "
                f"in a type that holds integers exactly below {-rows[i]} in size"
            )
        raise ValueError(f"{which}[{where}] = {int(flat[b, i])}: the Embedding reading it has "
                         f"{rows[i]} rows; indices must lie in [0, {rows[i]})")  # fmt: skip


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


def call_seed(seed: int, call: int) -> int:
    """The seed of a model's ``call``-th call (Dropout's masks): the same formula in every host
    (rootclad::Model and the LibTorch function use dropout_mask.h's call_seed)."""
    return (seed * 0x9E3779B97F4A7C15 + call) & 0xFFFFFFFFFFFFFFFF


class ModelBase:
    """A compiled model's state and checks; subclasses add how their library runs."""

    device: torch.device

    def __init__(self, graph, loss: str, *, seed: int = 0, aliases=None, ignored=(),
                 retarget=None):  # fmt: skip
        self.graph = graph
        self.loss = loss
        self.dtype = TORCH_DTYPE[graph.dtype]
        self.input_shapes = [tuple(s) for s in graph.input_shapes]
        self.input_shape = self.input_shapes[0]
        self.output_shape = tuple(graph.output_shape)  # several outputs: concatenated
        self.loss_shape = tuple(graph.loss_columns[1])  # the output the loss reads
        self.training = True
        self._seed = int(seed)
        self._stages: list[str] = []  # rootclad.data.Standardize modules (compiler._take_state)
        self._calls = itertools.count(1)  # next() is atomic: no two threads share a seed
        # a parameter's other names in the module (a layer used twice), listed by state_dict
        self._aliases = dict(aliases or {})
        self._ignored = set(ignored)  # the module's unused buffers (see load_state_dict)
        self._retarget = retarget  # (model, device) -> this model for another device
        self._mode_check = lambda mode: None  # compiler._other_mode: layers read the mode
        self._views: OrderedDict[str, torch.nn.Parameter] = OrderedDict()
        self._grad_views: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._buffer_views: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._input_names = (["input"] if len(self.input_shapes) == 1 else
                             [f"input {i}" for i in range(len(self.input_shapes))])  # fmt: skip
        self._index_limits: dict = {}  # Embedding indices' row counts, by device (check_indices)

    # -- parameters ---------------------------------------------------------------------
    def _view_parameters(self, params, grads, buffers) -> None:
        """The parameters' views of ``params`` (their gradients' of ``grads``) and the
        buffers' of ``buffers``, each block in the graph's order."""
        off = 0
        for p in self.graph.params:
            self._views[p.name] = ArenaParameter(params[off : off + p.numel].view(p.shape))
            self._grad_views[p.name] = grads[off : off + p.numel].view(p.shape)
            off += p.numel
        off = 0
        for b in self.graph.buffers:
            self._buffer_views[b.name] = buffers[off : off + b.numel].view(b.shape)
            if b.name in self.graph.constants:  # a constant of the model's own (not loaded)
                self._buffer_views[b.name].copy_(self.graph.constants[b.name].reshape(b.shape))
            off += b.numel

    @property
    def n_param_values(self) -> int:
        return sum(p.numel for p in self.graph.params)

    def param_layout(self) -> list[tuple[str, int, int]]:
        """(name, offset, numel) of each parameter tensor in the parameter block."""
        out, off = [], 0
        for p in self.graph.params:
            out.append((p.name, off, p.numel))
            off += p.numel
        return out

    def named_parameters(self):
        """``(name, tensor)`` pairs named as in the torch module; the tensors view the
        model's parameter block (on its device)."""
        return iter(self._views.items())

    def parameters(self):
        return iter(self._views.values())

    def named_buffers(self):
        """``(name, tensor)`` of the state that is not trained (BatchNorm's running mean and
        variance, and its batch count, here in the model's dtype), viewing the model's."""
        return iter(self._buffer_views.items())

    def state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """The parameters, then the buffers (a batch count as an integer, as torch's)."""
        out = OrderedDict((k, v.detach()) for k, v in self._views.items())
        transient = {b.name for b in self.graph.buffers if not b.persistent}  # as torch's
        for k, v in self._buffer_views.items():
            if k not in transient:
                out[k] = v.to(torch.long).clone() if k.endswith("num_batches_tracked") else v
        return out

    def load_state_dict(self, state_dict, strict: bool = True, *, check_finite: bool = True):
        """Copy values in (to this model's device and dtype); names and shapes must match the
        torch module's. A parameter the module uses under several names (a layer used twice)
        may come under any of them, as in the module's own ``state_dict()``; buffers of layers
        ``forward`` never calls are accepted and dropped. ``strict=False``: keys may be missing
        or unknown, as in torch; returns ``(missing_keys, unexpected_keys)``.

        A state dict is data from a file: every entry is checked before any is copied, so a
        refused one leaves the model as it was (:meth:`check_state_dict` says what). NaN and
        infinities are refused (a constant buffer may hold an infinity: an additive mask);
        ``check_finite=False`` loads them anyway."""
        copies, keys = self._checked_state(state_dict, strict, check_finite)
        with torch.no_grad():
            for view, value in copies:
                view.copy_(value)
        return keys

    def check_state_dict(
        self,
        state_dict,
        strict: bool = True,
        *,
        check_finite: bool = True,
        where: str | None = None,
    ):
        """Raise what :meth:`load_state_dict` would (``TypeError``, ``ValueError`` naming the
        key; ``KeyError`` for missing or unknown keys under ``strict``) and change nothing:
        every entry a tensor of real numbers of its shape (under each of its names, all
        equal), finite in this model's dtype, running variances >= 0, batch counts whole
        numbers >= 0. Returns ``(missing_keys, unexpected_keys)``.

        ``where``: what the messages call the state dict, for a caller that read it from
        somewhere (``"the checkpoint's 'model'"``: ``the checkpoint's 'model'['2.bias'] holds
        nan at [0]: ...``); such a caller's users cannot pass ``check_finite``, so its
        messages do not offer it."""
        return self._checked_state(state_dict, strict, check_finite, where)[1]

    def _checked_state(self, state_dict, strict: bool, check_finite: bool, where=None):
        """``([(view, value in this model's dtype)], IncompatibleKeys)`` of a state dict that
        passed every check of :meth:`check_state_dict`."""
        if not isinstance(state_dict, Mapping):
            head = "load_state_dict takes" if where is None else f"{where} must be"
            raise TypeError(
                f"{head} a dict of tensors by name (as state_dict() returns), got "
                f"{type(state_dict).__name__}"
            )
        own = {**self._views, **self._buffer_views}
        found = {k: [k] for k in own if k in state_dict}
        for alias, name in self._aliases.items():
            if alias in state_dict:
                found.setdefault(name, []).append(alias)
        transient = {b.name for b in self.graph.buffers if not b.persistent}
        missing = [k for k in own if k not in found and k not in transient]
        unknown = [k for k in state_dict if k not in own and k not in self._aliases]
        unexpected = [k for k in unknown if k not in self._ignored]
        if strict and (missing or unexpected):
            raise KeyError(
                f"{where or 'load_state_dict'}: missing keys {missing}, unexpected keys "
                f"{unexpected}{_NOT_LOADED}"
            )
        for k in unknown:  # an unused layer's buffers are dropped, but must be tensors too
            if k in self._ignored and not isinstance(state_dict[k], torch.Tensor):
                raise TypeError(
                    f"{_key(where, k)} must be a tensor, got "
                    f"{type(state_dict[k]).__name__}{_NOT_LOADED}"
                )
        roles = {name: role for n in self.graph.nodes for role, name in n.buffers.items()}
        copies = []
        for name, keys in found.items():
            view, role = own[name], roles.get(name)
            values = [
                self._checked_value(k, name, view, state_dict[k], role, check_finite, where)
                for k in keys
            ]
            for k, v in zip(keys[1:], values[1:], strict=True):
                a, b = values[0], v.to(values[0].device)
                if not bool(((a == b) | (a.isnan() & b.isnan())).all()):
                    raise ValueError(
                        f"{_key(where, k)} and {keys[0]!r} name one tensor "
                        f"of the model and hold different values{_NOT_LOADED}"
                    )
            copies.append((view, values[0]))
        return copies, IncompatibleKeys(missing, unexpected)

    def _checked_value(self, key: str, name: str, view, value, role, check_finite: bool, where):
        """``value`` for the model's tensor ``name`` (``view``; given under ``key``, in what
        ``where`` names), checked, in the model's dtype. ``role``: a buffer's (BatchNorm's
        "running_var" and "num_batches_tracked"; "value": a constant read as a value, which may
        mask with an infinity, x + mask; NaN is never meant)."""
        at = _key(where, key) + (f" (another name of {name!r})" if key != name else "")
        hint = " (check_finite=False loads it anyway)" if where is None else ""
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{at} must be a tensor, got {type(value).__name__}{_NOT_LOADED}")
        if value.is_complex() or value.dtype == torch.bool or value.layout != torch.strided:
            raise TypeError(
                f"{at} is a {value.dtype} tensor ({value.layout}); the model holds "
                f"real numbers ({self.dtype}){_NOT_LOADED}"
            )
        if tuple(value.shape) != tuple(view.shape):
            raise ValueError(
                f"{at} has shape {tuple(value.shape)}, expected {tuple(view.shape)}{_NOT_LOADED}"
            )
        value = value.detach()
        whole = not value.is_floating_point() or bool((value == value.round()).all())
        if role == "num_batches_tracked" and not (whole and bool((value >= 0).all())):
            raise ValueError(
                f"{at} is a batch count: it must hold a whole number >= 0, got "
                f"{value.tolist()}{_NOT_LOADED}"
            )
        out = value.to(self.dtype)
        masked = out.nan_to_num(nan=math.nan, posinf=0, neginf=0) if role == "value" else out
        bad = first_non_finite(masked) if check_finite else None
        if bad is not None:
            was, index = float(value.reshape(-1)[bad[0]]), flat_index_text(view.shape, bad[0])
            why = (
                f"holds {was!r} at {index}, beyond {str(self.dtype)[6:]}'s range"
                if math.isfinite(was)
                else f"holds {bad[1]} at {index}: not a finite number"
            )
            raise ValueError(f"{at} {why}{_NOT_LOADED}{hint}")
        if role == "running_var" and bool((out < 0).any()):
            i = int((out.reshape(-1) < 0).nonzero()[0])
            raise ValueError(
                f"{at} is a running variance and holds a negative value, "
                f"{float(out.reshape(-1)[i])!r} at "
                f"{flat_index_text(view.shape, i)}{_NOT_LOADED}"
            )
        return out

    def train(self, mode: bool = True):
        self._mode_check(bool(mode))  # (a layer of the model's own that reads the mode)
        self.training = bool(mode)  # BatchNorm: the batch's statistics (or the running ones)
        return self

    def eval(self):
        return self.train(False)

    def to(self, device):
        """This model on ``device`` (``"cpu"``: the CPU library; ``"cuda"``: a device program
        on the GPU): itself when it is there already, else a new model with a copy of the
        parameters, buffers, frozen flags and mode."""
        device = torch.device(device)
        if self._on(device):
            return self
        if self._retarget is None:
            raise RuntimeError("this model was not made by rootclad.compile: it cannot move")
        other = self._retarget(self, device)
        other.load_state_dict(self.state_dict(), check_finite=False)  # the model as it is
        for name, p in self._views.items():  # frozen stays frozen
            other._views[name].requires_grad_(p.requires_grad)
        other._stages = list(self._stages)
        other._mode_check = self._mode_check
        return other.train(self.training)

    def _on(self, device: torch.device) -> bool:
        return device == self.device

    def _trainable(self) -> list[bool]:
        return [v.requires_grad for v in self._views.values()]

    # -- checks ---------------------------------------------------------------------------
    def _next_seed(self) -> int:
        return call_seed(self._seed, next(self._calls))

    def _calls_made(self) -> int:
        """How many calls drew a seed (Dropout's masks follow it): a checkpoint records it, so
        that a resumed fit draws the masks an uninterrupted one would."""
        n = next(self._calls)
        self._calls = itertools.count(n)
        return n - 1

    def _set_calls_made(self, n: int) -> None:
        self._calls = itertools.count(int(n) + 1)

    def _inputs(self, x) -> tuple:
        """The model inputs as a tuple: a tensor, or a tuple/list of one tensor per input; a
        mask (an input the model took as torch.bool) as 0s and 1s of the model's dtype."""
        xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
        if len(xs) != len(self.input_shapes):
            raise TypeError(
                f"this model takes {len(self.input_shapes)} inputs, got {len(xs)} "
                f"(per-sample shapes {self.input_shapes})"
            )
        masks, indices = self.graph.masks, self.graph.indices
        if not masks and not indices:  # (every call: a model of float inputs does no more)
            return xs
        masks = masks or (False,) * len(xs)
        indices = indices or ((),) * len(xs)
        for which, t, mask, rows in zip(self._input_names, xs, masks, indices, strict=True):
            if mask and isinstance(t, torch.Tensor) and t.dtype != torch.bool:
                raise TypeError(f"{which} is a mask: the model was compiled with a torch.bool "
                                f"tensor there, got {t.dtype}")  # fmt: skip
            if rows and isinstance(t, torch.Tensor):
                check_indices(which, t, rows, self._index_limits)
        return tuple(t.to(self.dtype) if mask or rows else t
                     for t, mask, rows in zip(xs, masks, indices, strict=True))  # fmt: skip

    def _without_masks(self, grads) -> tuple:
        """Input gradients with None for the masks and the indices (which have none)."""
        masks = self.graph.masks or (False,) * len(grads)
        indices = self.graph.indices or (0,) * len(grads)
        return tuple(None if m or i else g
                     for g, m, i in zip(grads, masks, indices, strict=True))  # fmt: skip

    def _device_error(self, which: str, t: torch.Tensor) -> Exception | None:
        """The error for an input on another device than this model's, or None."""
        if t.device == self.device or (
            t.device.type == self.device.type == "cuda" and self.device.index is None
        ):
            return None
        return ValueError(f"{which} is on {t.device}; this model runs on {self.device} "
                          f"(move it with .to({str(self.device)!r}))")  # fmt: skip

    def _check_inputs(self, xs: tuple) -> int:
        """Check every input's type, device, dtype and shape; returns the batch size."""
        batches = set()
        for which, t, shape in zip(self._input_names, xs, self.input_shapes, strict=True):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"expected a torch.Tensor {which}, got {type(t).__name__}")
            if (err := self._device_error(which, t)) is not None:
                raise err
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
        return batches.pop()

    # -- several outputs: the model's tuple, list or dict, concatenated per sample ---------
    @property
    def output_parts(self) -> tuple:
        """(key, per-sample shape) of each output of a model that returns several (its
        place in the tuple or list, or its dict key); () for a model that returns one."""
        return self.graph.parts

    def _split(self, out: torch.Tensor):
        """The concatenated output (B, n) as the model returns it: a tuple, list or dict of
        (B, *shape) tensors (differentiable, for torch autograd); one output as it is."""
        if not self.graph.parts:
            return out
        pieces, col = [], 0
        for key, shape in self.graph.parts:
            n = math.prod(shape)
            pieces.append((key, out[:, col : col + n].reshape(out.shape[0], *shape)))
            col += n
        if self.graph.container == "dict":
            return dict(pieces)
        values = [p for _, p in pieces]
        return tuple(values) if self.graph.container == "tuple" else values

    def _joined_d_out(self, d_out, B: int):
        """input_grad's ``d_out`` as one (B, n) tensor: for a model with several outputs,
        given as the model returns them (each (B, *shape)), or None: ones on the output the
        loss reads, zeros on the others (its saliency)."""
        parts = self.graph.parts
        if not parts:
            return d_out
        if d_out is None:
            d_out = [(torch.ones if i == self.graph.loss_part else torch.zeros)(
                (B, *shape), dtype=self.dtype, device=self.device)
                for i, (_, shape) in enumerate(parts)]  # fmt: skip
        elif isinstance(d_out, dict) and self.graph.container == "dict":
            if set(d_out) != {k for k, _ in parts}:
                raise ValueError(f"d_out has keys {sorted(d_out)}, expected "
                                 f"{[k for k, _ in parts]}")  # fmt: skip
            d_out = [d_out[k] for k, _ in parts]
        elif not isinstance(d_out, (tuple, list)) or len(d_out) != len(parts):
            raise ValueError(f"d_out must be given as the model returns its outputs: a "
                             f"{self.graph.container} of {len(parts)} tensors")  # fmt: skip
        for (key, shape), d in zip(parts, d_out, strict=True):
            if not isinstance(d, torch.Tensor) or tuple(d.shape) != (B, *shape):
                got = tuple(d.shape) if isinstance(d, torch.Tensor) else type(d).__name__
                raise ValueError(f"d_out for output {key!r} has shape {got}, expected "
                                 f"{(B, *shape)}")  # fmt: skip
        return torch.cat([d.detach().to(self.dtype).reshape(B, -1) for d in d_out], dim=1)

    def _target_shapes(self, B: int) -> list[tuple]:
        shapes = [(B, *self.loss_shape)]
        if math.prod(self.loss_shape) == 1:
            shapes.append((B,))
        return shapes

    def _check_y(self, y, B: int) -> torch.Tensor:
        """Targets as torch's losses take them, on this model's device and in its dtype, flat:
        cross_entropy and nll (B,) class indices, the others the output's shape (B, ...); a
        model with one output per sample also takes (B,)."""
        if not isinstance(y, torch.Tensor):
            y = torch.as_tensor(y, device=self.device)
        if (err := self._device_error("targets", y)) is not None:
            raise err
        if self.loss in CLASS_INDEX_LOSSES:
            if y.dtype.is_floating_point or tuple(y.shape) != (B,):
                raise ValueError(
                    f"{self.loss} targets must be {B} integer class indices, shape ({B},), got "
                    f"{y.dtype} of shape {tuple(y.shape)}"
                )
            self._check_classes(y, self.loss_shape[0])
        elif tuple(y.shape) not in (shapes := self._target_shapes(B)):
            raise ValueError(
                f"{self.loss} targets have shape {tuple(y.shape)}, expected "
                f"{' or '.join(map(str, shapes))} (the shape of the model output the loss "
                "reads)"
            )
        return y.reshape(-1).to(self.dtype).contiguous()

    def _check_classes(self, y: torch.Tensor, nc: int) -> None:
        """Class indices in [0, nc) (a device model checks them without waiting)."""
        if int(y.min()) < 0 or int(y.max()) >= nc:
            raise ValueError(
                f"{self.loss} targets must lie in [0, {nc}), got [{int(y.min())}, {int(y.max())}]"
            )

    def _check_weight(self, weight, B: int, weight_norm: str = "mean"):
        """Per-sample loss weights (B,) in the model's dtype on its device, or None; a
        non-finite weight is refused. ``weight_norm="sum_w"`` scales them by B / sum(w), so
        that the loss is sum_b w[b] loss_b / sum_b w[b] (HEP fits' normalisation)."""
        if weight_norm not in ("mean", "sum_w"):
            raise ValueError(f'weight_norm={weight_norm!r}; expected "mean" or "sum_w"')
        if weight is None:
            return None
        w = torch.as_tensor(weight, device=self.device)
        if tuple(w.shape) != (B,) or w.is_complex() or w.dtype == torch.bool:
            raise ValueError(f"weight must hold one number per sample, shape ({B},), got "
                             f"{w.dtype} of shape {tuple(w.shape)}")  # fmt: skip
        if (err := self._device_error("weight", w)) is not None:
            raise err
        w = w.to(self.dtype).contiguous()
        bad = first_non_finite(w)
        if bad is not None:
            raise ValueError(f"weight: non-finite value ({bad[1]}) in sample {bad[0]}")
        if weight_norm == "sum_w":
            total = float(w.double().sum())  # a device model waits for this one reduction
            if total == 0:
                raise ValueError("weight_norm='sum_w': the batch's weights sum to 0")
            w = w * (B / total)
        return w

    def _check_optimizer(self, opt) -> None:
        if opt.model is not self:
            raise ValueError("this optimizer was created for another model")
