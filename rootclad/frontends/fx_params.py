"""Parameters a traced model reads directly (fx ``get_attr``): a layer scale of shape (C, 1, 1),
a class token or position embedding of shape (1, N, D), a LayerNorm's weight passed to
``F.layer_norm``.

A parameter read as a value becomes the IR's ``parameter`` op: the same value for every
sample, whose gradient sums over the batch. torch broadcasts it against the batch from the
right; its per-sample shape is its own, without a leading axis of 1 (which meets the batch
axis, or prepends nothing). Where it meets an activation of more axes, it is reshaped with
leading 1s, as torch's broadcasting does. ``p.expand(B, -1, ...)`` of such a value to the batch
is the value itself. A parameter passed to ``F.layer_norm`` is the layer's weight or bias.

Buffers and tensor constants read directly are refused.
"""

from __future__ import annotations

import types

import torch
from torch.nn import functional as F

from rootclad.frontends import fx_constants, fx_functional, fx_slicing, fx_values, fx_windows
from rootclad.ir.graph import IRError, Node


def _is_layer_norm(node) -> bool:
    return node.op == "call_function" and node.target is F.layer_norm


def _meets_data(low, n) -> bool:
    """Every reader of ``n`` (but its size queries) also reads the input's values (x + pe),
    none as a mask."""
    users = [u for u in n.users if not fx_values.is_static(u)]
    return bool(users) and all(
        any(a.meta.get("rc_data") for a in u.all_input_nodes)
        and n not in fx_constants.mask_arguments(low, u)
        for u in users
    )


def _is_block(n) -> bool:
    """A getitem of a parameter or buffer read directly (pe[:, :L])."""
    return fx_slicing.is_getitem(n) and getattr(n.args[0], "op", None) == "get_attr"


def lower_buffer(low, fx_node) -> bool:
    """A float buffer read as data (a position encoding registered as a buffer: x + pe), and a
    contiguous block of a parameter or such a buffer (pe[:, :x.size(1)]): the IR's
    ``parameter`` op over the tensor or the block, the same for every sample (a buffer has no
    gradient). A buffer read as a mask stays a constant (fx_constants.py); False where
    ``fx_node`` is none of these."""
    if fx_node.op == "get_attr" and _float_buffer(low, fx_node.target) is not None:
        users = [u for u in fx_node.users if not fx_values.is_static(u)]  # not pe.size(-1)
        blocks = [u for u in users if _is_block(u)]
        if (
            not users
            or not all(_meets_data(low, u) for u in blocks)
            or not all(u in blocks or _meets_data(low, fx_node) for u in users)
        ):
            return False
        if len(blocks) < len(users):
            _emit(low, fx_node, fx_node.target, tuple(_float_buffer(low, fx_node.target).shape))
        return True
    if not _is_block(fx_node):
        return False
    src = fx_node.args[0]
    tensor = _float_buffer(low, src.target)
    if tensor is None:
        tensor = dict(low.traced.named_parameters(remove_duplicate=False)).get(src.target)
    elif not _meets_data(low, fx_node):
        return False
    if tensor is None:
        return False
    where = f"fx node {fx_node.name!r} (getitem of {src.target!r})"
    spec = fx_values.substitute(fx_node.args[1])
    parts = spec if isinstance(spec, tuple) else (spec,)
    if any(isinstance(p, torch.fx.Node) or (isinstance(p, slice) and any(
            isinstance(v, torch.fx.Node) for v in (p.start, p.stop, p.step))) for p in parts):  # fmt: skip
        raise IRError(f"{where}: a slice that depends on the batch size or on values")
    flat = torch.arange(tensor.numel()).view(tensor.shape)[spec].reshape(-1)
    start = int(flat[0]) if flat.numel() else 0
    if not flat.numel() or not torch.equal(flat, torch.arange(start, start + flat.numel())):
        raise IRError(f"{where}: rootclad reads a contiguous block of a parameter or buffer "
                      f"(pe[:, :L]), not {spec!r}")  # fmt: skip
    _emit(low, fx_node, src.target, tuple(low.shape(fx_node)), start)
    return True


# calls that keep a value as it is (a buffer's or a parameter's, read directly): a position
# encoding written pe[:, :L].detach(), .clone(), .to(x.device), .type_as(x), .to(x.dtype)
KEEP = ("detach", "detach_", "clone", "contiguous", "requires_grad_", "to", "type_as", "float",
        "double", "type")  # fmt: skip
STOPS_GRADIENT = ("detach", "detach_", "requires_grad_")


def drop_kept_values(low) -> None:
    """Remove the calls of KEEP on a float buffer or parameter read directly (or a block of
    one): the value they give is the value itself, in a floating type at least as wide (a
    buffer of float32 cast to the model's float64: exact). A parameter's detach() is kept (it
    stops the gradient), and so is a cast that would round."""
    graph = low.traced.graph
    for n in list(graph.nodes):
        if n.op != "call_method" or n.target not in KEEP or not n.args:
            continue
        src = n.args[0]
        root = src.args[0] if _is_block(src) else src
        if getattr(root, "op", None) != "get_attr":
            continue
        buffer = _float_buffer(low, root.target) is not None
        param = root.target in dict(low.traced.named_parameters(remove_duplicate=False))
        if not (buffer or (param and n.target not in STOPS_GRADIENT)):
            continue
        a, b = src.meta.get("tensor_meta"), n.meta.get("tensor_meta")
        if a is None or b is None or tuple(a.shape) != tuple(b.shape):
            continue
        if not (b.dtype == a.dtype or (a.dtype, b.dtype) in ((torch.float16, torch.float32),
                (torch.float16, torch.float64), (torch.float32, torch.float64))):  # fmt: skip
            continue
        n.replace_all_uses_with(src)
        args = [a for a in n.all_input_nodes if a is not src]
        graph.erase_node(n)
        for a in args:  # x.device, x.dtype: read for this call alone
            if not a.users and a.op == "call_function" and a.target is getattr:
                graph.erase_node(a)


def _float_buffer(low, target):
    b = dict(low.traced.named_buffers()).get(target)
    return b if b is not None and b.is_floating_point() else None


def _emit(low, fx_node, target, shape, start=None) -> None:
    """A parameter node of ``target`` (a parameter, or a buffer), broadcast against the batch
    as torch broadcasts it: a leading axis of 1 is the batch's."""
    per_sample = (shape[1:] if len(shape) >= 2 and shape[0] == 1 else shape) or (1,)
    low.param_shapes[fx_node.name] = per_sample
    buffer = _float_buffer(low, target) is not None
    attrs = {"shape": per_sample, **({} if start is None else {"start": start})}
    low.nodes.append(Node(fx_node.name, "parameter", [], fx_node.name, attrs,
                          {} if buffer else {"weight": target},
                          {"value": target} if buffer else {}))  # fmt: skip


def lower_get_attr(low, fx_node) -> None:
    """A parameter as a value (a ``parameter`` node), unless every reader is F.layer_norm's
    weight or bias, which names the parameter itself."""
    params = dict(low.traced.named_parameters(remove_duplicate=False))
    if fx_node.target not in params:
        raise IRError(
            f"fx node {fx_node.name!r} reads attribute {fx_node.target!r} directly; rootclad "
            "compiles parameters read directly (nn.Parameter), float buffers where they meet the "
            "input (x + pe), and constant masks; not integer buffers or other tensor constants"
        )
    low.attr_params[fx_node.name] = fx_node.target
    if all((_is_layer_norm(u) and u.args[0] is not fx_node)
           or fx_functional.names_parameter(u, fx_node) or _is_block(u)
           for u in fx_node.users):  # fmt: skip
        return
    _emit(low, fx_node, fx_node.target, tuple(params[fx_node.target].shape))


def check_batch_axes(low) -> None:
    """Every tensor the trace computes depends on the model's input, and so carries the batch
    axis; a parameter read directly is the one exception (the same value for every sample). A
    value computed from parameters alone (``self.fc(self.p)``, ``torch.tanh(self.p)``, a model
    returning ``self.p``) would get a batch axis torch's has not."""
    from_input = set()
    for n in low.traced.graph.nodes:
        if n.op == "placeholder" or any(a in from_input for a in n.all_input_nodes):
            from_input.add(n)
    for n in low.traced.graph.nodes:
        meta = n.meta.get("tensor_meta")
        if n.op == "output":
            bad = [a for a in n.all_input_nodes if a not in from_input]
        else:
            bad = (
                [n]
                if hasattr(meta, "shape")
                and n.op != "get_attr"
                and n not in from_input
                and not fx_constants.is_constant(n)  # a causal mask: fx_constants.py
                and not fx_windows.is_bias(n)  # Swin's relative position bias
                and not _is_block(n)  # pe[:, :L] of a parameter: lower_buffer
                else []
            )
        if bad:
            raise IRError(
                f"fx node {bad[0].name!r} ({fx_values.target_name(bad[0])}) is computed from "
                "parameters alone, without the batch axis; rootclad reads a parameter "
                "directly only where it meets the input (x * p, x + p, torch.cat with "
                "p.expand(x.size(0), ...))"
            )


def sample_shape(low, x) -> tuple[int, ...]:
    """The per-sample shape of a tensor value in the IR."""
    if isinstance(x, types.SimpleNamespace):  # a parameter reshaped by align
        return x.sample
    if x.name in low.param_shapes:
        return low.param_shapes[x.name]
    return tuple(low.shape(x)[1:])


def align(low, fx_node, a, b):
    """Operands of an elementwise op with a parameter value among them: the one of fewer axes
    reshaped with leading 1s when it is a parameter (torch's broadcasting); otherwise as
    they are."""
    ra, rb = len(sample_shape(low, a)), len(sample_shape(low, b))
    if ra == rb:
        return a, b
    low_one = a if ra < rb else b
    if low_one.name not in low.param_shapes:
        return a, b
    shape = (1,) * abs(ra - rb) + sample_shape(low, low_one)
    name = f"{fx_node.name}__{low_one.name}"
    low.nodes.append(Node(name, "reshape", [low_one.name], name, {"shape": shape}))
    value = types.SimpleNamespace(name=name, sample=shape)
    return (value, b) if low_one is a else (a, value)


def lower_expand(low, fx_node, args, where) -> None:
    """``p.expand(B, -1, ...)`` of a parameter value (or of any value, to its own shape)."""
    x, sizes = args[0], args[1:]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = list(sizes[0])
    shape = low.shape(x)
    own = list(shape) if x.name not in low.param_shapes else [None, *low.param_shapes[x.name]]
    ok = len(sizes) == len(own) and all(
        s == -1 or s == d for s, d in zip(sizes[1:], own[1:], strict=True)
    )
    batch = sizes[0] if sizes else None
    if x.name in low.param_shapes:
        ok = ok and (batch == -1 or (isinstance(batch, torch.fx.Node)
                                     and fx_values.batch_dependent(batch)))  # fmt: skip
    else:
        ok = ok and (batch == -1 or isinstance(batch, torch.fx.Node))
    if not ok:
        raise IRError(f"{where}: expand to {tuple(sizes)} of shape {tuple(shape)}: only a "
                      "parameter's expand to the batch (p.expand(x.size(0), -1, ...)) is "
                      "supported")  # fmt: skip
    low.nodes.append(Node(fx_node.name, "identity", [x.name], fx_node.name))


def lower_layer_norm(low, fx_node, args, kw, where) -> None:
    """F.layer_norm(x, normalized_shape, weight, bias, eps) with weight and bias parameters
    read directly (torchvision's LayerNorm2d)."""
    x = args[0]
    shape = args[1] if len(args) > 1 else kw["normalized_shape"]
    eps = args[4] if len(args) > 4 else kw.get("eps", 1e-5)
    params = {}
    for i, role in ((2, "weight"), (3, "bias")):
        value = args[i] if len(args) > i else kw.get(role)
        if value is None:
            continue
        if not isinstance(value, torch.fx.Node) or value.name not in low.attr_params:
            raise IRError(f"{where}: its {role} must be a parameter of the model")
        params[role] = low.attr_params[value.name]
    attrs = {"normalized_shape": tuple(shape) if isinstance(shape, (tuple, list)) else (shape,),
             "eps": float(eps)}  # fmt: skip
    low.nodes.append(Node(fx_node.name, "layer_norm", [x.name], fx_node.name, attrs, params))
