"""The intermediate representation: a validated chain of ops with static shapes."""

from rootclad.ir.graph import SUPPORTED_OPS, Graph, IRError, Node, Param

__all__ = ["SUPPORTED_OPS", "Graph", "IRError", "Node", "Param"]
