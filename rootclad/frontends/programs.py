"""Model files in: an ONNX file, a ``torch.export`` program (``.pt2``) or a TorchScript module
(``.pt``) as a torch module for the torch front-end (``rootclad.load`` compiles it).

Exported torch programs reach the IR through ONNX: torch's TorchScript-based exporter writes
the program as an ONNX graph (in memory), which the ONNX front-end imports, so every format
shares one importer and its checks. Parameters keep their names from the program's
``state_dict`` where the graph lets them through (the exporter may fold some into constants).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch
from torch import nn

from rootclad.frontends.onnx import to_module

FORMATS = (".onnx", ".pt2", ".pt")
# Formats whose torch loader runs code the file holds: torch.export.load falls back to Python's
# unpickler (weights_only=False) on the file's parts, and a TorchScript file is code that torch
# compiles and runs. ONNX is a protobuf of data, read without running anything.
_RUNS_CODE = {".pt2": "a torch.export program (.pt2)", ".pt": "a TorchScript module (.pt)"}


class _Program(nn.Module):
    """A torch.export program, for the ONNX exporter: its parameters registered under their
    own names on plain containers (the program itself, a GraphModule, refuses ``train()``,
    which the exporter calls)."""

    def __init__(self, program):
        super().__init__()
        object.__setattr__(self, "program", program)
        for name, p in program.named_parameters():
            p.requires_grad_(False)
            *path, leaf = name.split(".")
            parent = self
            for part in path:
                if part not in parent._modules:
                    parent.add_module(part, nn.Module())
                parent = parent._modules[part]
            parent.register_parameter(leaf, p)

    def forward(self, *xs):
        return self.program(*xs)


def _to_onnx(program, examples: tuple, where: str):
    import onnx

    names = [f"input_{i}" for i in range(len(examples))]
    axes = {n: {0: "batch"} for n in [*names, "output"]}
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript-based exporter warns that it is legacy
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(program, examples, buf, dynamo=False, input_names=names,
                              output_names=["output"], dynamic_axes=axes, opset_version=17)  # fmt: skip
        except Exception as exc:  # the exporter's own errors name the op it cannot write
            raise ValueError(f"{where}: torch's ONNX exporter cannot write this program: "
                             f"{exc}") from exc  # fmt: skip
    model = onnx.load_from_string(buf.getvalue())
    if len(model.graph.output) != 1:  # the exporter names only the first: keys would be lost
        raise ValueError(f"{where}: the program returns {len(model.graph.output)} tensors; "
                         "rootclad loads programs that return one (a module that returns "
                         "several compiles with rootclad.compile, an ONNX file by its output "
                         "names)")  # fmt: skip
    return model


def program_module(path, example_input=None, *, trusted: bool = False):
    """The model in ``path`` as (torch module, per-sample input shapes, dtype), through the
    ONNX importer (:func:`rootclad.frontends.onnx.to_module`). ``.pt2`` and ``.pt`` files
    are read only with ``trusted=True``: torch's loaders for them run code the file holds."""
    path = Path(path)
    where = str(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"{where}: unknown model format {path.suffix!r}; rootclad loads "
                         f"{', '.join(FORMATS)}")  # fmt: skip
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no such file")
    if path.suffix in _RUNS_CODE and not trusted:
        raise ValueError(
            f"{where}: {_RUNS_CODE[path.suffix]} is read by torch's loader, which runs code the "
            "file holds (its pickled parts, its TorchScript): a file you were sent could run "
            "anything as you. Load only a file you made or trust, with trusted=True (rootclad "
            "emit --trusted), or ask for an ONNX file (torch.onnx.export), which holds no code"
        )
    if path.suffix == ".onnx":
        return to_module(path)
    if path.suffix == ".pt2":
        ep = torch.export.load(str(path))
        program = _Program(ep.module())
        examples = example_input if example_input is not None else ep.example_inputs[0]
    else:
        if example_input is None:
            raise ValueError(f"{where}: a TorchScript file does not record its input shape; "
                             "give example_input (a batch of the input)")  # fmt: skip
        program = torch.jit.load(str(path), map_location="cpu")  # the exporter takes it as is
        examples = example_input
    examples = tuple(examples) if isinstance(examples, (tuple, list)) else (examples,)
    return to_module(_to_onnx(program, examples, where))
