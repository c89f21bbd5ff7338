"""The intermediate representation: a validated dataflow graph with static shapes, and the op
registry (by family, :mod:`rootclad.ir.ops`) that every front-end and backend reads."""

from rootclad.ir.graph import Graph, IRError, Node, Param
from rootclad.ir.ops import OPS

__all__ = ["OPS", "Graph", "IRError", "Node", "Param"]
