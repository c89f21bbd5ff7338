"""What the ONNX importer's parts share: folded constants, a node's attributes, and a node seen
with another output name."""

from __future__ import annotations

BATCH = "B"  # the batch axis in a folded shape


class Const:
    """A value known when the file is read: an initializer, a Constant, or shape arithmetic
    (an int array in which BATCH stands for the batch size)."""

    def __init__(self, value):
        self.value = value


def attributes(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def text(value) -> str:
    """A string attribute (onnx gives bytes)."""
    return value.decode() if isinstance(value, bytes) else value


class Renamed:
    """A node seen with another output name (a MatMul that takes its Add's output)."""

    def __init__(self, node, output: str):
        self.name, self.op_type, self.input, self.output = (
            node.name,
            node.op_type,
            node.input,
            [output],
        )
