"""ONNX models in: :func:`load` compiles an ONNX file into a rootclad model; :func:`to_module`
is the torch module that runs a file's nodes through rootclad's table (rootclad/frontends/onnx)."""

from rootclad.compiler import load_onnx as load
from rootclad.frontends.onnx import SUPPORTED, to_module

__all__ = ["SUPPORTED", "load", "to_module"]
