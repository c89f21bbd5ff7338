"""An ONNX file read and checked before any of it runs: its sizes bounded
(:mod:`rootclad.frontends.onnx.limits`) before its external data is read, onnx's checker, its
opset."""

from __future__ import annotations

from pathlib import Path

from rootclad.frontends.onnx.limits import Budget
from rootclad.ir.graph import IRError

MIN_OPSET = 13


def read(model):
    """(the checked ``ModelProto``, where it is from, its :class:`Budget`) of a ModelProto, a
    path or a file's bytes: its sizes bounded before its external data is read."""
    import onnx

    where = "ONNX model"
    if isinstance(model, (bytes, bytearray)):  # a file's contents (torch.onnx.export to BytesIO)
        try:
            model = onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise IRError(f"{where}: cannot read the ONNX bytes: {exc}") from exc
    base = None
    if isinstance(model, (str, Path)):
        where, base = str(model), Path(model).parent
        if not Path(model).is_file():
            raise FileNotFoundError(f"{where}: no such ONNX file")
        try:  # its external data (if any) once its size is known to be within the limits
            model = onnx.load(str(model), load_external_data=False)
        except Exception as exc:  # protobuf's DecodeError, ...
            raise IRError(f"{where}: cannot read the ONNX file: {exc}") from exc
    budget = Budget(where)
    budget.parameters(_tensors(model.graph))
    if base is not None:
        budget.external(model.graph.initializer, base)
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(base))
        except Exception as exc:  # a missing or unsafe external-data file, ...
            raise IRError(f"{where}: cannot read the ONNX file's external data: {exc}") from exc
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise IRError(f"{where}: not a valid ONNX model: {exc}") from exc
    return model, where, budget


def opset(model, where: str) -> int:
    """The model's ONNX opset, refused where rootclad or the installed onnx cannot read it."""
    import onnx

    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    newest = onnx.defs.onnx_opset_version()
    if version is not None and version > newest:
        raise IRError(
            f"{where}: ONNX opset {version} is newer than the installed onnx package knows "
            f"({newest}); upgrade onnx or export with an older opset"
        )
    if version is None or version < MIN_OPSET:
        raise IRError(
            f"{where}: ONNX opset {version} is not supported; rootclad reads opset "
            f"{MIN_OPSET} and later (re-export with opset_version={MIN_OPSET} or newer)"
        )
    return version


def _tensors(graph) -> list:
    """The tensors a graph holds: its initializers, its Constant nodes' values, and an
    initializer again for each Identity of it (each is a parameter of its own: replay.py)."""
    held = {t.name: t for t in graph.initializer}
    copies = []
    for node in graph.node:
        if node.op_type == "Identity" and node.input and node.input[0] in held:
            held[node.output[0]] = held[node.input[0]]
            copies.append(held[node.input[0]])
    constants = [
        a.t
        for node in graph.node
        if node.op_type == "Constant"
        for a in node.attribute
        if a.name == "value"
    ]
    return [*graph.initializer, *constants, *copies]
