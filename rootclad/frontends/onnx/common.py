"""What the ONNX table's parts share: a node's attributes, read as Python values."""

from __future__ import annotations


def attributes(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def text(value) -> str:
    """A string attribute (onnx gives bytes)."""
    return value.decode() if isinstance(value, bytes) else value
