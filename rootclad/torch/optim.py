"""Optimizers whose update runs in C++ inside :meth:`CompiledModel.train_step` (and as a
device kernel inside :meth:`DeviceModel.train_step`, with the state in device memory).

Hyperparameters follow ``torch.optim`` (same names, same defaults, same update order), so a
rootclad run and a torch run of the same model and data track each other.
"""

from __future__ import annotations

import ctypes
import math
import numbers
from collections import OrderedDict, defaultdict
from collections.abc import Mapping, MutableMapping

import torch

from rootclad.torch.base import ModelBase, first_non_finite

# must match rootclad::OptimConfig in rootclad/optim.h
_FIELDS = (
    "kind",
    "lr",
    "momentum",
    "dampening",
    "weight_decay",
    "nesterov",
    "beta1",
    "beta2",
    "eps",
)


def _check(name: str, value, low: float, high: float = math.inf, high_open: bool = False):
    """``value`` as a float in [low, high] ([low, high) with ``high_open``); torch.optim's
    checks, which also refuse NaN and, here, infinities (they turn every parameter NaN)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    ok = math.isfinite(v) and low <= v and (v < high if high_open else v <= high)
    if not ok:
        span = (
            f"[{low:g}, {high:g}{')' if high_open else ']'}" if high < math.inf else f">= {low:g}"
        )
        raise ValueError(f"invalid {name}: {value!r} (must be finite and {span})")
    return v


class _ParamGroup(MutableMapping):
    """The one param group of a rootclad optimizer, as ``torch.optim.lr_scheduler`` reads and
    writes it: its hyperparameters ("lr", "weight_decay", SGD's "momentum", "dampening",
    "nesterov", Adam's "betas", "eps") are the optimizer's configuration, the numbers the C++
    update reads at the next step (checked as the constructor checks them); other keys are
    kept, as torch keeps them, when they are what ``load_state_dict`` takes back (a
    scheduler's "initial_lr", a "name" of one's own: :func:`_check_group_entry`); "params"
    lists the model's parameters."""

    def __init__(self, opt: Optimizer):
        self._opt = opt
        self._extra: dict = {"params": list(opt.model.parameters())}

    def _keys(self) -> tuple:
        return tuple(self._opt.defaults)

    def __getitem__(self, key):
        if key in self._keys():
            return self._opt._hyper(key)
        return self._extra[key]

    def __setitem__(self, key, value) -> None:
        if key in self._keys():
            self._opt._set_hyper(key, value)
        else:  # what state_dict() saves must load back
            if key != "params":
                _check_group_entry(f"param_groups[0][{key!r}]", key, value)
            self._extra[key] = value

    def __delitem__(self, key) -> None:
        if key in self._keys() or key == "params":
            raise KeyError(f"{key!r} belongs to the optimizer: it cannot be removed")
        del self._extra[key]

    def __iter__(self):
        yield from self._extra
        yield from self._keys()

    def __len__(self) -> int:
        return len(self._extra) + len(self._keys())

    def __repr__(self) -> str:
        return repr({k: self[k] for k in self if k != "params"})


class Optimizer(torch.optim.Optimizer):
    """The update of every parameter of one compiled model, run inside ``train_step``.

    Each optimizer keeps its own state (momentum or Adam's moments) and its own step count per
    parameter tensor, so two optimizers on one model never share or reset each other's
    state. A parameter with ``requires_grad=False`` is skipped, as torch.optim skips a
    parameter without a gradient.

    It is a ``torch.optim.Optimizer`` to torch's learning-rate schedulers: ``param_groups``
    holds one group whose ``"lr"`` (and other hyperparameters) are this optimizer's, so
    ``StepLR``, ``CosineAnnealingLR``, ``ReduceLROnPlateau`` and the others change the rate
    the next ``train_step`` uses, exactly as they change a torch optimizer's (tested). Its
    ``step()`` is not torch's: the update runs inside ``cm.train_step(x, y, opt)``."""

    kind = -1
    # each hyperparameter's rule, as the constructor checks it: (name, low, high, high_open)
    rules: dict = {}
    moments = ("momentum", "unused")  # what the two halves of the state hold

    def __init__(self, model, lr: float, **hyper):
        if not isinstance(model, ModelBase):
            raise TypeError(
                f"{type(self).__name__} takes a rootclad CompiledModel or DeviceModel, got "
                f"{type(model).__name__}; for torch modules use torch.optim"
            )
        layout = model.param_layout()
        n, tensors, device = model.n_param_values, len(layout), model.device
        where = [(name, off) for name, off, _ in layout]
        self.model = model
        self._where = where  # (name, offset) of each parameter tensor, in the state's order
        self.step_count = 0  # train_step calls made with this optimizer
        values = {"kind": self.kind, "lr": _check("learning rate", lr, 0.0), **hyper}
        self._cfg = (ctypes.c_double * len(_FIELDS))(*[float(values.get(f, 0.0)) for f in _FIELDS])
        self._state = torch.zeros(2 * max(n, 1), dtype=model.dtype, device=device)
        # per parameter tensor, kept once some tensor skipped a step (None: all at step_count)
        self._steps: list[int] | None = None
        self._call_steps = (ctypes.c_long * max(tensors, 1))()
        # a step whose loss was not finite may have poisoned the state: train_step scans it
        # before the next step (see rootclad.torch.model.refuse_non_finite)
        self._suspect = False
        # what torch.optim.Optimizer's constructor sets (it is not called: its param groups
        # would be plain dicts, whose "lr" the C++ update never reads)
        self.defaults = {f: self._hyper(f) for f in self._group_keys}
        self.state = defaultdict(dict)
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                      "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                      "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):  # fmt: skip
            setattr(self, hooks, OrderedDict())
        self._zero_grad_profile_name = f"Optimizer.zero_grad#{type(self).__name__}.zero_grad"
        self.param_groups = [_ParamGroup(self)]

    # the param group's keys, as torch.optim names them
    _group_keys: tuple = ("lr", "weight_decay")

    def _hyper(self, key: str):
        """A hyperparameter under torch.optim's name (Adam's "betas" is a pair)."""
        if key == "betas":
            return (self._cfg[_FIELDS.index("beta1")], self._cfg[_FIELDS.index("beta2")])
        if key == "nesterov":
            return bool(self._cfg[_FIELDS.index("nesterov")])
        return self._cfg[_FIELDS.index(key)]

    def _set_hyper(self, key: str, value) -> None:
        """Set a hyperparameter by torch.optim's name, checked as the constructor checks it."""
        if key == "betas":
            if len(value) != 2:
                raise ValueError(f"betas must be two numbers, got {value!r}")
            pairs = list(zip(("beta1", "beta2"), value, strict=True))
        else:
            pairs = [(key, float(bool(value)) if key == "nesterov" else value)]
        checked = [(f, _check(self.rules[f][0], v, *self.rules[f][1:])) for f, v in pairs]
        cfg = {f: self._cfg[_FIELDS.index(f)] for f in _FIELDS}
        cfg.update(checked)
        if cfg["nesterov"] and (cfg["momentum"] <= 0 or cfg["dampening"] != 0) and self.kind == 0:
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        for f, v in checked:
            self._cfg[_FIELDS.index(f)] = v

    def __getstate__(self):
        # torch.optim.Optimizer's would keep neither the C++ configuration nor the state block
        raise TypeError(f"a {type(self).__name__} cannot be copied or pickled: save "
                        "opt.state_dict() and load it into a new optimizer of the model")  # fmt: skip

    def step(self, closure=None):
        """Not torch's: a rootclad optimizer updates the parameters inside
        ``cm.train_step(x, y, opt)`` (forward, backward and update in one C++ call)."""
        raise RuntimeError(f"{type(self).__name__} updates the parameters inside "
                           "cm.train_step(x, y, opt); it has no step() of its own")  # fmt: skip

    def add_param_group(self, param_group) -> None:
        raise ValueError(f"{type(self).__name__} has one param group, the whole model (freeze "
                         "a parameter with p.requires_grad_(False))")  # fmt: skip

    def _advance(self, trainable: list[bool]):
        """Count one step for each trainable tensor; ``(step, tensor_steps or None)`` for the
        C call: None while every tensor has trained at every step (the common case)."""
        self.step_count += 1
        self._opt_called = True  # a scheduler's check that the optimizer stepped before it
        if self._steps is None:
            if all(trainable):
                return self.step_count, None
            self._steps = [self.step_count - 1] * len(trainable)
        for i, t in enumerate(trainable):
            self._steps[i] += t
            self._call_steps[i] = self._steps[i] if t else 0  # 0: frozen, not updated
        return self.step_count, ctypes.addressof(self._call_steps)

    @property
    def lr(self) -> float:
        return self._cfg[1]

    @lr.setter
    def lr(self, value: float) -> None:
        self._set_hyper("lr", value)

    def hyperparameters(self) -> dict[str, float]:
        return {f: self._cfg[i] for i, f in enumerate(_FIELDS) if f != "kind"}

    def state_dict(self) -> dict:
        """Hyperparameters, step counts and state (copies), for a checkpoint; ``"group"``: what
        a scheduler added to the param group (its ``"initial_lr"``), as torch's state_dict
        keeps it."""
        group = {k: v for k, v in self.param_groups[0]._extra.items() if k != "params"}
        return {"kind": self.kind, "config": list(self._cfg), "step_count": self.step_count,
                "steps": None if self._steps is None else list(self._steps),
                "state": self._state.clone(), "group": group}  # fmt: skip

    def reset(self) -> None:
        """Start afresh, as a new optimizer with the same hyperparameters: the state (momentum,
        moments) zeroed and every step count at 0."""
        self._state.zero_()
        self.step_count = 0
        self._steps = None
        self._suspect = False

    def check_finite(self, state: torch.Tensor | None = None) -> None:
        """Refuse (ValueError naming the parameter) a state (this optimizer's, by default)
        that holds NaN or infinity: a step with one leaves that parameter NaN, even after its
        values were loaded back."""
        bad = self._non_finite(self._state if state is None else state)
        if bad is not None:
            raise ValueError(
                f"{type(self).__name__}: the state holds {bad}: a step poisoned it; load a "
                "saved state (opt.load_state_dict) or start afresh (opt.reset())"
            )

    def _non_finite(self, state: torch.Tensor) -> str | None:
        """Where the moments ``state`` hold their first NaN or infinity, in words; None."""
        bad = first_non_finite(state)
        if bad is None:
            return None
        half, i = divmod(bad[0], len(state) // 2)
        name, off = next((k, off) for k, off in reversed(self._where) if off <= i)
        return (
            f"a non-finite value ({bad[1]}) in the {self.moments[half]} of {name!r} "
            f"(value {i - off})"
        )

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (of an optimizer of the same kind, for a
        model with the same parameters): training then continues exactly. The state is data
        from a file and is checked whole before anything changes (:meth:`check_state_dict`); a
        refused one raises naming the key and leaves this optimizer as it was. ``"group"``
        (what a scheduler or the user kept in the param group) replaces the group's, as in
        torch."""
        values, config, step_count, steps, group = self._checked_state(state)
        self._state.copy_(values)
        self._cfg[:] = config
        self.step_count, self._steps = step_count, steps
        self._suspect = False  # checked
        if group is not None:
            extra = self.param_groups[0]._extra
            self.param_groups[0]._extra = {"params": extra["params"], **group}

    def check_state_dict(self, state, *, where: str | None = None) -> None:
        """Raise what :meth:`load_state_dict` would for ``state`` (ValueError or TypeError
        naming the key), changing nothing. ``where``: what the messages call the state, for a
        caller that read it from somewhere (``"the checkpoint's 'optimizer'"``: ``the
        checkpoint's 'optimizer'['config'][1] (lr) must be a number ...``)."""
        self._checked_state(state, where)

    def _checked_state(self, state, where: str | None = None) -> tuple:
        """``(moments in this optimizer's dtype, config, step_count, steps, group or None)``
        of a state (from a file) that passed every check, changing nothing. Refused, naming
        the key: a missing or unknown key; another kind; moments that are not a floating-point
        tensor of this optimizer's size or hold NaN or infinity; a config that is not numbers,
        names another kind, has a hyperparameter outside its constructor's range, or a field
        this kind does not use other than the 0 its constructor leaves there; step counts that
        are not whole numbers a C long holds; in the group, the hyperparameters (the config's)
        and "params" (the model's), or what :func:`_check_group_entry` refuses. ``where``: what
        the messages call the state (None: "the state")."""
        name, subject = type(self).__name__, where or "the state"
        if not isinstance(state, Mapping):
            head = f"{name}.load_state_dict takes" if where is None else f"{where} must be"
            raise TypeError(f"{head} a dict (opt.state_dict()), got {type(state).__name__}")
        for k in STATE_KEYS[:-1]:
            if k not in state:
                torch_s = " (a torch.optim optimizer's?)" if "param_groups" in state else ""
                raise ValueError(
                    f"{subject} has no {k!r}{torch_s}: a {name}'s state_dict() holds "
                    f"{', '.join(STATE_KEYS)}"
                )
        for k in state:
            if k not in STATE_KEYS:
                raise ValueError(
                    f"{_key(where, k)} is not a key of a {name}'s state_dict() "
                    f"({', '.join(STATE_KEYS)})"
                )
        kind = state["kind"]
        if isinstance(kind, bool) or not isinstance(kind, numbers.Integral):
            raise TypeError(
                f"{_key(where, 'kind')} must be a whole number (0 SGD, 1 Adam, 2 AdamW), "
                f"got {kind!r}"
            )
        if kind != self.kind:
            raise ValueError(
                f"{subject} is of another kind of optimizer ({kind}), this is {name} ({self.kind})"
            )
        values = state["state"]
        if not isinstance(values, torch.Tensor) or not values.is_floating_point():
            got = values.dtype if isinstance(values, torch.Tensor) else type(values).__name__
            raise TypeError(
                f"{_key(where, 'state')} must be a floating-point tensor (the moments), got {got}"
            )
        if values.shape != self._state.shape:
            raise ValueError(
                f"{_key(where, 'state')} holds {values.numel()} values; this model's optimizer "
                f"needs {self._state.numel()}"
            )
        values = values.detach().to(self._state.device, self._state.dtype)
        config = state["config"]
        if not isinstance(config, (list, tuple)):
            raise TypeError(
                f"{_key(where, 'config')} must be a list of {len(_FIELDS)} numbers "
                f"({', '.join(_FIELDS)}), got {type(config).__name__}"
            )
        if len(config) != len(_FIELDS):
            raise ValueError(
                f"{_key(where, 'config')} holds {len(config)} values, expected "
                f"{len(_FIELDS)} ({', '.join(_FIELDS)})"
            )
        at = [_key(where, "config", f"[{i}] ({f})") for i, f in enumerate(_FIELDS)]
        config = [_number(a, v) for a, v in zip(at, config, strict=True)]
        if config[0] != self.kind:
            raise ValueError(f"{at[0]} is {config[0]!r}, this is {name} ({self.kind})")
        for f, rule in self.rules.items():
            in_what = f"{rule[0]} in {where or 'the loaded state'}"
            _check(in_what, config[_FIELDS.index(f)], *rule[1:])
        cfg = dict(zip(_FIELDS, config, strict=True))
        for i, f in enumerate(_FIELDS[1:], 1):
            if f not in self.rules and cfg[f] != 0:
                raise ValueError(f"{at[i]} is {cfg[f]!r}; {name} does not use it and holds 0 there")
        if cfg["nesterov"] not in (0.0, 1.0):
            raise ValueError(f"{at[5]} is {cfg['nesterov']!r}, must be 0 or 1")
        if self.kind == 0 and cfg["nesterov"] and (cfg["momentum"] <= 0 or cfg["dampening"] != 0):
            raise ValueError(
                f"{where or 'the loaded state'} asks for Nesterov momentum without a momentum "
                "or with dampening (torch.optim.SGD refuses it)"
            )
        bad = self._non_finite(values)
        if bad is not None:
            raise ValueError(f"{_key(where, 'state')} holds {bad}")
        step_count, steps = _step_counts(state, len(self._where), where)
        return values, config, step_count, steps, self._checked_group(state.get("group"), where)

    def _checked_group(self, group, where: str | None) -> dict | None:
        """A loaded state's param group, but for the hyperparameters and "params" (None:
        absent), as torch keeps it."""
        if group is None:
            return None
        if not isinstance(group, Mapping):
            raise TypeError(
                f"{_key(where, 'group')} must be a dict of what a scheduler or the user kept "
                f"in the param group, got {type(group).__name__}"
            )
        for k, v in group.items():
            if k == "params" or k in self._group_keys:
                what = "the model's parameters" if k == "params" else "a hyperparameter"
                raise ValueError(
                    f"{_key(where, 'group')} holds {k!r}, {what} of the optimizer itself "
                    "(its config), never loaded from the group"
                )
            _check_group_entry(_key(where, "group", f"[{k!r}]"), k, v)
        return dict(group)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v:g}" for k, v in self.hyperparameters().items())
        return f"rootclad.optim.{type(self).__name__}({args})"


# what a state_dict() holds; "group" may be absent (states saved before it was kept)
STATE_KEYS = ("kind", "config", "step_count", "steps", "state", "group")
# the numbers torch's learning-rate schedulers (and swa_utils' SWALR) keep in a param group
SCHEDULER_KEYS = ("initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum", "swa_lr")
_GROUP_ITEMS = 16  # the most values a list of one's own in a param group holds


def _key(where: str | None, key: str, rest: str = "") -> str:
    """A state's ``key`` as the messages name it: ``the state's 'config'[1]``, or within what
    a caller calls the state (``the checkpoint's 'optimizer'['config'][1]``)."""
    return f"the state's {key!r}{rest}" if where is None else f"{where}[{key!r}]{rest}"


def _float(v) -> float:
    """A real number as a float; an integer too large for one as an infinity (refused)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _number(at: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{at} must be a number, got {v!r}")
    return _float(v)


def _check_group_entry(at: str, key, value) -> None:
    """A param-group entry other than the optimizer's hyperparameters and "params", named
    ``at``: a scheduler's number (:data:`SCHEDULER_KEYS`: finite, >= 0) or, as torch keeps
    any, plain data of one's own (a string, a bool, None, a finite number, or a list or
    tuple of at most 16 of those), which state_dict() saves and load_state_dict() takes
    back; keys are strings."""
    if not isinstance(key, str):
        raise TypeError(f"{at}: a param group's keys are strings, got {type(key).__name__}")
    if key in SCHEDULER_KEYS:
        if not (math.isfinite(_number(at, value)) and value >= 0):
            raise ValueError(f"{at} is {value!r}, must be a finite number >= 0")
        return
    items = value if isinstance(value, (list, tuple)) else (value,)
    if len(items) > _GROUP_ITEMS:
        raise ValueError(
            f"{at} holds {len(items)} values; a list in a param group holds at most {_GROUP_ITEMS}"
        )
    for v in items:
        if not (v is None or isinstance(v, (str, bool, int, float))):
            raise TypeError(
                f"{at} holds a {type(v).__name__}; a param group keeps strings, bools, None, "
                f"finite numbers and lists or tuples of at most {_GROUP_ITEMS} of those"
            )
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{at} holds {v!r}, not a finite number")


def _step_counts(state, tensors: int, where: str | None) -> tuple[int, list[int] | None]:
    """A loaded state's step counts, checked: Adam divides by 1 - beta**step, so a step count
    below 1 at the next step (or a tensor's above the optimizer's) would make every parameter
    NaN or skip its bias correction; the C update takes them as C longs."""

    def count(value, at: str) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{at} must be a whole number >= 0, got {value!r}")
        if value > 2**63 - 1:
            raise ValueError(f"{at} is {value}, more than a C long holds")
        return int(value)

    def label(key: str, plain: str, rest: str = "") -> str:  # plain: where is None
        return plain if where is None else _key(where, key, rest)

    step_count = count(state["step_count"], label("step_count", "the state's step_count"))
    steps = state["steps"]
    if steps is None:
        return step_count, None
    if not isinstance(steps, (list, tuple)):
        raise TypeError(
            f"{_key(where, 'steps')} must be None or a list of per-tensor step counts, "
            f"got {type(steps).__name__}"
        )
    steps = [
        count(v, label("steps", "the state's per-tensor step count", f"[{i}]"))
        for i, v in enumerate(steps)
    ]
    if len(steps) != tensors:
        raise ValueError(
            f"{where or 'the state'} counts steps for {len(steps)} parameter tensors; this "
            f"model has {tensors}"
        )
    if max(steps, default=0) > step_count:
        raise ValueError(
            f"{label('steps', '', ': ')}a parameter tensor's step count ({max(steps)}) "
            f"exceeds the optimizer's ({step_count})"
        )
    return step_count, steps


class SGD(Optimizer):
    kind = 0
    _group_keys = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
    rules = {"lr": ("learning rate", 0.0), "momentum": ("momentum", 0.0),
             "dampening": ("dampening", -math.inf), "weight_decay": ("weight_decay", 0.0),
             "nesterov": ("nesterov", 0.0, 1.0)}  # fmt: skip

    def __init__(
        self,
        model,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        momentum = _check("momentum", momentum, 0.0)
        dampening = _check("dampening", dampening, -math.inf)
        weight_decay = _check("weight_decay", weight_decay, 0.0)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(
            model,
            lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=float(nesterov),
        )


class Adam(Optimizer):
    kind = 1
    rules = {"lr": ("learning rate", 0.0),
             "beta1": ("beta parameter at index 0", 0.0, 1.0, True),
             "beta2": ("beta parameter at index 1", 0.0, 1.0, True),
             "eps": ("epsilon value", 0.0), "weight_decay": ("weight_decay", 0.0)}  # fmt: skip
    moments = ("exp_avg", "exp_avg_sq")
    _group_keys = ("lr", "betas", "eps", "weight_decay")

    def __init__(
        self,
        model,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if len(betas) != 2:
            raise ValueError(f"betas must be two numbers, got {betas!r}")
        super().__init__(
            model,
            lr,
            beta1=_check("beta parameter at index 0", betas[0], 0.0, 1.0, high_open=True),
            beta2=_check("beta parameter at index 1", betas[1], 0.0, 1.0, high_open=True),
            eps=_check("epsilon value", eps, 0.0),
            weight_decay=_check("weight_decay", weight_decay, 0.0),
        )


class AdamW(Adam):
    kind = 2

    def __init__(
        self,
        model,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ):
        super().__init__(model, lr, betas=betas, eps=eps, weight_decay=weight_decay)
