"""``rootclad.load``: a model file (ONNX, a ``torch.export`` program, TorchScript) compiled;
the front-end is rootclad/frontends/programs.py, the pipeline rootclad/compiler.py."""

from rootclad.compiler import load
from rootclad.frontends.programs import FORMATS, program_module

__all__ = ["FORMATS", "load", "program_module"]
