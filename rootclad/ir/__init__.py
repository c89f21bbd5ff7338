"""The intermediate representation: a validated dataflow graph with static shapes, and the op
registry that every front-end and the emitter read."""

from rootclad.ir.graph import Graph, IRError, Node, Param
from rootclad.ir.ops import OPS

__all__ = ["OPS", "Graph", "IRError", "Node", "Param"]
