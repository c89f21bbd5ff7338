"""IR -> C++ source: the CPU emitter (:mod:`rootclad.codegen.cpu`) and the device programs
(:mod:`rootclad.codegen.cuda`), sharing the arena planner (:mod:`rootclad.codegen.arena`)."""

from rootclad.codegen.cpu import EmittedModel, emit_model

__all__ = ["EmittedModel", "emit_model"]
