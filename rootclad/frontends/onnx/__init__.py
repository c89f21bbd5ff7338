"""ONNX files in: a file read and checked (``reading.py``, its sizes bounded by ``limits.py``),
then run node by node through one table of ONNX ops (``ops.py``, ``ops_shapes.py``,
``ops_math.py``, ``ops_attention.py``, ``ops_recurrent.py``: what torch computes for each) by a
torch module that holds the file's initializers (``replay.py``), which the export front-end
captures and lowers like any model: an imported model gets the same IR, checks, engines and
hosts."""

from rootclad.frontends.onnx.ops import OPS
from rootclad.frontends.onnx.reading import MIN_OPSET, read
from rootclad.frontends.onnx.replay import to_replay

SUPPORTED = tuple(sorted(OPS))


def to_module(model):
    """An ONNX ``ModelProto`` (or a path, or a file's bytes) as (torch module, per-sample input
    shapes, dtype): the module runs the file's nodes through the table. rootclad captures it
    with torch.export, on tensors without storage, where each node's result is bounded before
    anything is computed; run eagerly on data, a node's result is bounded once it is made."""
    return to_replay(*read(model))


__all__ = ["MIN_OPSET", "SUPPORTED", "to_module"]
