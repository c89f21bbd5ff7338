"""ONNX files in: an ONNX graph rebuilt as a ``torch.nn`` module (:func:`to_module`), which the
torch front-end then lowers like any module, so an imported model gets the same IR, checks,
engines and hosts. ``builder.py`` reads the graph and places the layers, ``folding.py`` folds
the shape arithmetic, ``layers.py`` maps each computing node to its torch layer."""

from rootclad.frontends.onnx.builder import MIN_OPSET, to_module
from rootclad.frontends.onnx.layers import SUPPORTED

__all__ = ["MIN_OPSET", "SUPPORTED", "to_module"]
