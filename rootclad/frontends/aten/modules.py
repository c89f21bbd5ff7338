"""torch.nn layers as IR nodes, by the registry (each op lists the torch.nn classes it stands
for and the attrs a layer gives it), and the names of a module's parameters and buffers."""

from __future__ import annotations

from torch import nn

from rootclad.ir.graph import IRError, Node
from rootclad.ir.ops import OPS, supported_modules

# torch.nn class name -> the IR op that runs it
_MODULE_OPS = {m: name for name, spec in OPS.items() for m in spec.modules}


def module_node(path: str, mod: nn.Module, name: str) -> Node:
    """The node of a torch.nn layer, by the first class in its MRO the registry knows."""
    kind = type(mod)
    where = f"module {path!r} ({kind.__module__}.{kind.__name__})"
    op = next(
        (
            _MODULE_OPS[c.__name__]
            for c in kind.__mro__
            if c.__module__.startswith("torch.nn") and c.__name__ in _MODULE_OPS
        ),
        None,
    )
    if op is None:
        raise IRError(f"{where} is not supported; supported layers: {supported_modules()}")
    spec = OPS[op]
    attrs = spec.from_module(mod, where)
    prefix = f"{path}." if path else ""  # the root layer's parameters have no prefix
    roles = {r: prefix + r for r in spec.params if getattr(mod, r, None) is not None}
    buffers = {r: prefix + r for r in spec.buffers if getattr(mod, r, None) is not None}
    return Node(name, op, attrs=attrs, params=roles, buffers=buffers)


def parameter_aliases(module: nn.Module) -> dict[str, str]:
    """Every other name of a parameter or buffer (a layer held twice) -> its first name."""
    out = {}
    for named in (module.named_parameters, module.named_buffers):
        first = {id(p): n for n, p in named()}
        out.update({n: first[id(p)] for n, p in named(remove_duplicate=False) if first[id(p)] != n})
    return out


def persistent(module: nn.Module, name: str) -> bool:
    """Whether buffer ``name`` is in the module's state_dict."""
    owner, _, leaf = name.rpartition(".")
    return leaf not in module.get_submodule(owner)._non_persistent_buffers_set
