"""Optimizers whose update runs in C++ inside :meth:`CompiledModel.train_step`.

Hyperparameters follow ``torch.optim`` (same names, same defaults, same update order), so a
rootclad run and a torch run of the same model and data track each other.
"""

from __future__ import annotations

import ctypes

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


class Optimizer:
    kind = -1

    def __init__(self, model, lr: float, **hyper):
        from rootclad.torch.model import CompiledModel

        if not isinstance(model, CompiledModel):
            raise TypeError(
                f"{type(self).__name__} takes a rootclad CompiledModel, got "
                f"{type(model).__name__}; for torch modules use torch.optim"
            )
        if lr < 0:
            raise ValueError(f"invalid learning rate {lr}")
        self.model = model
        self.step_count = 0
        values = {"kind": self.kind, "lr": lr, **hyper}
        self._cfg = (ctypes.c_double * len(_FIELDS))(*[float(values.get(f, 0.0)) for f in _FIELDS])
        model._reset_optimizer_state()

    @property
    def lr(self) -> float:
        return self._cfg[1]

    @lr.setter
    def lr(self, value: float) -> None:
        self._cfg[1] = float(value)

    def hyperparameters(self) -> dict[str, float]:
        return {f: self._cfg[i] for i, f in enumerate(_FIELDS) if f != "kind"}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v:g}" for k, v in self.hyperparameters().items())
        return f"rootclad.optim.{type(self).__name__}({args})"


class SGD(Optimizer):
    kind = 0

    def __init__(
        self,
        model,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
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

    def __init__(
        self,
        model,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(
            model, lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay
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
