"""ONNX models in: :func:`load` compiles an ONNX file into a rootclad model (see importer)."""

from rootclad.onnx.importer import SUPPORTED, load, to_module

__all__ = ["SUPPORTED", "load", "to_module"]
