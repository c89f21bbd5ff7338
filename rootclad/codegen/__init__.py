"""IR -> C++ source for one compiled model."""

from rootclad.codegen.emit import EmittedModel, emit_model

__all__ = ["EmittedModel", "emit_model"]
