"""The PyTorch side of a compiled model: arena views, autograd Function, optimizers."""

from rootclad.torch.device_model import DeviceModel
from rootclad.torch.model import CompiledModel
from rootclad.torch.optim import SGD, Adam, AdamW

__all__ = ["SGD", "Adam", "AdamW", "CompiledModel", "DeviceModel"]
