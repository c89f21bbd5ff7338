"""What an imported graph may ask for, checked before anything is allocated: a file of a few
hundred bytes can declare an input of a billion values per sample, a constant of any shape or
a chain of layers whose values fill any memory. The defaults fit a workstation; the
environment overrides each (a whole number of elements or bytes, ``0`` for no limit)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from rootclad.ir.graph import IRError

# the examples rootclad runs through a graph hold this many samples (compiler._compile_module)
EXAMPLE_BATCH = 2
_DEFAULTS = {
    # one value (an input, a layer's output, a constant) of one sample
    "ROOTCLAD_MAX_SAMPLE_ELEMENTS": 1 << 28,
    # the initializers and constants of the file, together
    "ROOTCLAD_MAX_PARAMETER_BYTES": 8 << 30,
    # every value the graph computes, at the example batch
    "ROOTCLAD_MAX_ACTIVATION_BYTES": 16 << 30,
}


@dataclass(frozen=True)
class Limits:
    sample_elements: int
    parameter_bytes: int
    activation_bytes: int

    @classmethod
    def from_environment(cls) -> Limits:
        values = []
        for var, default in _DEFAULTS.items():
            text = os.environ.get(var, "").strip()
            try:
                n = int(text) if text else default
            except ValueError:
                n = -1
            if n < 0:
                raise ValueError(f"{var}={text!r}: must be a whole number >= 0 (0: no limit)")
            values.append(n or math.inf)
        return cls(*values)


class Budget:
    """The limits of one import, and what the graph has asked for so far."""

    def __init__(self, where: str):
        self.where = where
        self.limits = Limits.from_environment()
        self.activation_bytes = 0
        self.parameter_bytes = 0  # the file's tensors

    def _refuse(self, what: str, asked: float, limit: float, var: str, unit: str) -> IRError:
        return IRError(
            f"{self.where}: {what} asks for {asked:,.0f} {unit}, over rootclad's limit of "
            f"{limit:,.0f} for an imported model ({var}=N raises it; 0: no limit)"
        )

    def parameters(self, tensors) -> None:
        """The initializers' and constants' bytes, from their declared dims and types (an
        external file's data not read yet)."""
        import onnx

        total = 0
        for t in tensors:
            try:
                itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            except (KeyError, TypeError, ValueError):
                raise IRError(
                    f"{self.where}: tensor {t.name!r} has data type {t.data_type}, which ONNX "
                    "does not define"
                ) from None
            if any(d < 0 for d in t.dims):
                raise IRError(f"{self.where}: tensor {t.name!r} has dims {list(t.dims)}")
            total += math.prod(t.dims) * itemsize
        self.parameter_bytes = total
        if total > self.limits.parameter_bytes:
            raise self._refuse(
                "its initializers and constants together",
                total,
                self.limits.parameter_bytes,
                "ROOTCLAD_MAX_PARAMETER_BYTES",
                "bytes",
            )

    def external(self, tensors, base) -> None:
        """Before an initializer's external data is read: its file lies under the model's
        directory and holds exactly the bytes its dims and type declare at its offset (onnx
        would read a missing ``length`` as the rest of the file)."""
        import onnx

        for t in tensors:
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in t.external_data}
            size = (
                math.prod(t.dims)
                * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            )
            where = f"{self.where}: initializer {t.name!r}"
            path = (base / info.get("location", "")).resolve()
            if not info.get("location") or not path.is_relative_to(base.resolve()):
                raise IRError(
                    f"{where}: its data file {info.get('location')!r} is not in the model's directory"
                )
            try:
                offset = int(info.get("offset", 0))
                length = int(info.get("length", size))
            except ValueError:
                raise IRError(f"{where}: offset or length of its data is not a number") from None
            if length != size or offset < 0:
                raise IRError(
                    f"{where}: its data is declared as {length} bytes at offset {offset}; its "
                    f"shape {list(t.dims)} holds {size}"
                )
            if not path.is_file():
                raise IRError(f"{where}: cannot read the ONNX file's external data: no file {path}")
            if path.stat().st_size < offset + size:
                raise IRError(f"{where}: {path} does not hold {size} bytes at offset {offset}")
            if "length" not in info:
                t.external_data.add(key="length", value=str(size))

    def value(self, what: str, shape, itemsize: int) -> None:
        """A value computed per sample (an input, a layer's output), before any is made."""
        n = math.prod(shape)
        if n > self.limits.sample_elements:
            raise self._refuse(
                f"{what} of per-sample shape {tuple(shape)}",
                n,
                self.limits.sample_elements,
                "ROOTCLAD_MAX_SAMPLE_ELEMENTS",
                "elements per sample",
            )
        self.activation_bytes += n * itemsize * EXAMPLE_BATCH
        if self.activation_bytes > self.limits.activation_bytes:
            raise self._refuse(
                f"with {what}, the graph's values at a batch of {EXAMPLE_BATCH}",
                self.activation_bytes,
                self.limits.activation_bytes,
                "ROOTCLAD_MAX_ACTIVATION_BYTES",
                "bytes",
            )
