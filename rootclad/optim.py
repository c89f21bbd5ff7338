"""Optimizers fused into :meth:`rootclad.torch.CompiledModel.train_step`."""

from rootclad.torch.optim import SGD, Adam, AdamW, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Optimizer"]
