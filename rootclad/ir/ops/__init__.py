"""The op registry's families; importing this package registers every op
(:mod:`rootclad.ir.registry`)."""

from rootclad.ir.ops import binary, conv, dense, elementwise, norm, pool, shape  # noqa: F401
from rootclad.ir.registry import OPS, OpSpec, supported_modules, supported_ops

__all__ = ["OPS", "OpSpec", "supported_modules", "supported_ops"]
