"""Attention in a traced model, lowered to the IR's ``matmul`` (a product of two values,
batched over their leading axes) with the ops the rest of a model uses:

- ``a @ b``, ``torch.matmul``, ``torch.bmm`` (and their Tensor methods) of two values, or of a
  value and a parameter read directly: one ``matmul`` (a vector operand is made a matrix and
  back, as torch does);
- ``F.scaled_dot_product_attention(q, k, v)``: softmax(q k^T * scale) v, as ``permute``,
  ``matmul``, ``affine``, ``softmax``, ``matmul``;
- ``nn.MultiheadAttention(q, k, v)`` (``batch_first=True``): the packed input projection as a
  ``linear`` over ``in_proj_weight`` and a ``slice`` per query, key and value; the heads as
  ``reshape`` and ``permute``; the attention as above, with its dropout; the output projection;
- ``nn.TransformerEncoderLayer`` (``norm_first`` both ways, ReLU, GELU or a module as its
  activation) and ``nn.TransformerEncoder``: their blocks, layer by layer.

Masks are data: a model takes them as inputs of ``torch.bool`` (0s and 1s in the IR), or as
float inputs where torch adds them to the scores. ``key_padding_mask`` (``src_key_padding_mask``
of the encoders; True: a key no query attends to) and a boolean ``attn_mask`` of
``F.scaled_dot_product_attention`` (True: attends) become the IR's ``masked_fill`` of the
scores with -inf, float ones an ``add``; so do ``x.masked_fill(mask, float("-inf"))``, ``~mask``
and ``mask.float()`` of a mask. A causal mask is not data: ``is_causal=True`` of
``F.scaled_dot_product_attention``, or a constant mask built in ``forward`` or held as a buffer
(``attn_mask``, the encoders' ``src_mask`` / ``mask``, ``masked_fill``'s mask) that masks
exactly where key j > query i + some offset, becomes the IR's ``causal_fill``
(fx_constants.py). Other masks without the batch axis are refused, naming the call.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from rootclad.frontends import fx_constants
from rootclad.frontends.fx_slicing import Swapped
from rootclad.ir.graph import IRError, Node
from rootclad.ir.registry import OPS

MATMULS = ("matmul", "bmm", "__matmul__")


class Root(nn.Module):
    """A layer that lowers to several ops (an attention block, a GroupNorm, a recurrent layer)
    or reads indices (an Embedding), compiled on its own: traced as one call of it ("block");
    MultiheadAttention with one input attends to itself, or takes query, key and value; a
    recurrent layer gives its output sequence."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x, key=None, value=None):
        if isinstance(self.block, nn.MultiheadAttention):
            key = x if key is None else key
            return self.block(x, key, key if value is None else value, need_weights=False)[0]
        if isinstance(self.block, (nn.LSTM, nn.GRU)):
            return self.block(x)[0]
        return self.block(x)


MASK_CALLS = ("masked_fill", "invert", "__invert__", "logical_not", "float", "double", "to")


def handles(name: str) -> bool:
    return (name in MATMULS or name == "__rmatmul__" or name == "scaled_dot_product_attention"
            or name in MASK_CALLS)  # fmt: skip


def is_mask(x) -> bool:
    """A torch.bool value (a mask the model takes as an input, or computed from one)."""
    meta = x.meta.get("tensor_meta") if isinstance(x, torch.fx.Node) else None
    return getattr(meta, "dtype", None) == torch.bool


class Emit:
    """Appends the nodes of one decomposed call, each named after the call's output."""

    def __init__(self, low, out: str):
        self.low, self.out, self.count = low, out, 0

    def __call__(self, op, inputs, attrs=None, params=None, name=None) -> str:
        if name is None:
            self.count += 1
            name = f"{self.out}__{op}{self.count}"
        self.low.nodes.append(Node(name, op, list(inputs), name, dict(attrs or {}),
                                   {r: p for r, p in (params or {}).items() if p}))  # fmt: skip
        return name

    def module(self, module_node, path, mod, x, name=None) -> str:
        """A torch.nn layer (Linear, LayerNorm, Dropout, an activation) of the block."""
        own_forward(mod, f"module {path!r}")
        self.count += 1
        node = module_node(path, mod, name or f"{self.out}__{self.count}")
        node.inputs = [x]
        self.low.nodes.append(node)
        return node.output


def own_forward(mod, where: str) -> None:
    """A layer inside a block is lowered as torch's: a subclass with a forward of its own
    (which the block's call never traces) is refused."""
    torch_class = next((c for c in type(mod).__mro__ if c.__module__.startswith("torch.nn")),
                       None)  # fmt: skip
    if torch_class is None or type(mod).forward is not torch_class.forward:
        kind = type(mod)
        raise IRError(f"{where} ({kind.__module__}.{kind.__name__}) has a forward of its own "
                      "inside a torch block, which rootclad lowers as torch's layers; build the "
                      "block from your layers in a module of yours")  # fmt: skip


def _refuse_masks(bound: dict, where: str, allowed=(), constant=None) -> None:
    """Refuse the masks a call passes but ``allowed`` (inputs of the model) and ``constant``
    (a constant causal mask: fx_constants.py); is_causal=True only beside that constant (a
    hint torch's modules take), or for scaled_dot_product_attention (constant="is_causal")."""
    for what in ("attn_mask", "key_padding_mask", "src_mask", "src_key_padding_mask", "mask"):
        if bound.get(what) is not None and what not in allowed and what != constant:
            raise IRError(f"{where}: {what} is not supported; rootclad compiles attention "
                          f"with {' or '.join(allowed) or 'no masks'} (an input of the model)"
                          + (f" and {constant} as a constant causal mask" if constant else ""))  # fmt: skip
    if bound.get("is_causal") and constant != "is_causal" and bound.get(constant) is None:
        raise IRError(f"{where}: is_causal=True without a mask; pass the causal mask "
                      f"({constant or 'attn_mask'}) too, as torch asks")  # fmt: skip


def _constant_mask(low, bound, what, attends, scores, where):
    """The offset of the constant causal mask ``bound[what]`` (fx_constants.causal_offset),
    or None where the call passes no such constant."""
    mask = bound.get(what)
    if mask is None:
        return None
    if not (isinstance(mask, torch.fx.Node) and fx_constants.is_constant(mask)):
        raise IRError(f"{where}: {what} is not supported unless a constant causal mask (an "
                      "(L, S) tensor computed in forward without the inputs); give a padding "
                      "mask as key_padding_mask")  # fmt: skip
    boolean = mask.meta["rc_const"].dtype == torch.bool
    return fx_constants.causal_offset(low, mask, attends and boolean, scores, where)


def _mask_operand(low, mask, rank: int, what: str, where) -> tuple[str, bool]:
    """(the value, whether boolean) of a mask that meets scores of per-sample rank ``rank``:
    an input of the model (or computed from one), with the batch axis."""
    if not low.is_tensor(mask) or len(low.shape(mask)) == 0 or low.shape(mask)[0] != low.batch:
        raise IRError(f"{where}: {what} is not a value with the batch axis; rootclad takes masks "
                      "as inputs of the model (a constant mask, such as a causal one, is not "
                      "supported)")  # fmt: skip
    shape = tuple(low.shape(mask)[1:])
    if len(shape) != rank:
        raise IRError(f"{where}: {what} of per-sample shape {shape} meets scores of {rank} "
                      "per-sample axes; torch would line its batch axis up with another axis: "
                      "give it as many axes as the scores (1s where it broadcasts)")  # fmt: skip
    return mask.name, is_mask(mask)


def _lower_mask_call(low, fx_node, name, args, kw, where) -> None:
    x = args[0] if args else kw.get("input")
    if name != "masked_fill":
        if not (low.is_tensor(x) and is_mask(x)):
            raise low.unsupported(fx_node)
        if name in ("float", "double", "to"):  # 0s and 1s in the model's type already
            to = [a for a in (*args[1:], *kw.values()) if isinstance(a, torch.dtype)]
            if any(not (d.is_floating_point or d == torch.bool) for d in to):
                raise IRError(f"{where}: a mask converted to {to[0]}; rootclad converts masks to "
                              "floating types (or moves them: mask.to(x.device))")  # fmt: skip
            return low.add(fx_node.name, "identity", [x])
        return low.add(fx_node.name, "affine", [x], {"scale": -1.0, "shift": 1.0})
    mask = args[1] if len(args) > 1 else kw.get("mask")
    value = args[2] if len(args) > 2 else kw.get("value")
    if not isinstance(value, float) or value != -math.inf:
        raise IRError(f"{where}: masked_fill with {value!r}; rootclad fills masks with "
                      "float('-inf'), as attention does")  # fmt: skip
    if (low.is_tensor(x) and isinstance(mask, torch.fx.Node) and fx_constants.is_constant(mask)
            and mask.meta["rc_const"].dtype == torch.bool):  # fmt: skip
        off = fx_constants.causal_offset(low, mask, False, low.shape(x)[1:], where)
        return low.add(fx_node.name, "causal_fill", [x], {"offset": off})
    if not (low.is_tensor(x) and low.shape(x)[0] == low.batch and is_mask(mask)):
        raise IRError(f"{where}: masked_fill of a value by a torch.bool mask is supported")
    _mask_operand(low, mask, len(low.shape(x)) - 1, "the mask", where)
    low.add(fx_node.name, "masked_fill", [x, mask], {"keep": False})


# -- products -------------------------------------------------------------------------------
def lower_call(low, fx_node, name, args, kw, where) -> None:
    if name in MASK_CALLS:
        return _lower_mask_call(low, fx_node, name, args, kw, where)
    if name == "scaled_dot_product_attention":
        return _lower_sdpa(low, fx_node, args, kw, where)
    a, b = (args[1], args[0]) if name == "__rmatmul__" else (args[0], args[1])
    emit = Emit(low, fx_node.name)
    values = [t for t in (a, b) if low.is_tensor(t) and t.name not in low.param_shapes]
    rank = max((len(low.shape(t)) for t in values), default=0)  # a value's, batch axis counted
    (a, sa, pa), (b, sb, pb) = (_operand(low, emit, a, rank, where),
                                _operand(low, emit, b, rank, where))  # fmt: skip
    # torch lines whole shapes up from the right: a value's batch axis must meet nothing but
    # the batch axis. Two values: the same rank (bmm). A parameter (no batch axis): no more
    # axes than the value has per sample; a vector value only on the left of a matrix.
    if not pa and not pb and (len(sa) != len(sb) or len(sa) < 2):
        raise IRError(f"{where}: values of per-sample shapes {sa} and {sb}: torch would line "
                      "up one's batch axis with the other's axes (two values need the same "
                      "rank, at least 2)")  # fmt: skip
    for sv, sp, left in ((sa, sb, True), (sb, sa, False)):
        if pb if left else pa:  # a value (shape sv) and a parameter (sp)
            if (not left or len(sp) > 2) if len(sv) == 1 else len(sp) > len(sv):
                raise IRError(f"{where}: a value of per-sample shape {sv} times a parameter of "
                              f"shape {sp}: torch would multiply along the batch axis")  # fmt: skip
    out = (*_lead_of(sa, sb), *sa[-2:-1], *(sb[-1:] if len(sb) > 1 else ()))  # torch's
    if len(sa) == 1:  # a vector: a row, dropped again after the product
        a = emit("reshape", [a], {"shape": (1, *sa)})
    if len(sb) == 1:
        b = emit("reshape", [b], {"shape": (*sb, 1)})
    if len(sa) > 1 and len(sb) > 1:
        emit("matmul", [a, b], name=fx_node.name)
        return
    emit("reshape", [emit("matmul", [a, b])], {"shape": out}, name=fx_node.name)


def _lead_of(sa, sb) -> tuple:
    la, lb = sa[:-2], sb[:-2]
    return la if len(la) >= len(lb) else lb


def _operand(low, emit, x, rank: int, where):
    """(value name, its shape as the product reads it, whether a parameter): a parameter in
    its own shape ((1, N) is a matrix), but for a leading 1 that meets the batch axis of a
    value of full rank ``rank``."""
    if not isinstance(x, torch.fx.Node) or not (low.is_tensor(x) or x.name in low.param_shapes):
        raise IRError(f"{where}: a product of something other than two tensors")
    if x.name not in low.param_shapes:
        return x.name, tuple(low.shape(x)[1:]), False
    own = tuple(low.traced.get_parameter(low.attr_params[x.name]).shape)
    if len(own) == rank and own[0] == 1:
        own = own[1:]
    name = x.name
    if own != tuple(low.param_shapes[x.name]):
        name = emit("reshape", [x.name], {"shape": own})
    return name, own, True


def _attention(emit, q: str, k: str, v: str, scale: float, dropout: float, qk_rank: int,
               mask=None, safe=True, causal=None) -> str:  # fmt: skip
    """softmax(q k^T scale [+ mask]) v over the last two axes of (..., L, d) values; returns
    the name of its (..., L, dv) output. ``mask``: (value, how): "add" (a float mask), "keep"
    (True attends) or "fill" (True: -inf). ``safe``: torch's scaled_dot_product_attention
    (a query whose keys are all masked gets 0s); MultiheadAttention asked for its weights
    runs a plain softmax (NaN there). ``causal``: the offset of a causal mask (-inf where key
    j > query i + offset), or None."""
    perm = (*range(qk_rank - 2), qk_rank - 1, qk_rank - 2)
    kt = emit("permute", [k], {"perm": perm})
    scores = emit("matmul", [q, kt])
    scaled = emit("affine", [scores], {"scale": float(scale), "shift": 0.0})
    if causal is not None:
        scaled = emit("causal_fill", [scaled], {"offset": causal})
    if mask is not None:
        value, how = mask
        scaled = (emit("add", [scaled, value]) if how == "add" else
                  emit("masked_fill", [scaled, value], {"keep": how == "keep"}))  # fmt: skip
    weights = emit("safe_softmax" if safe else "softmax", [scaled], {"axis": qk_rank - 1})
    if dropout > 0:
        weights = emit("dropout", [weights], {"p": float(dropout)})
    return emit("matmul", [weights, v])


def _lower_sdpa(low, fx_node, args, kw, where) -> None:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    bound = dict(zip(names, args, strict=False)) | kw
    constant = bound.get("attn_mask")
    constant = constant is not None and fx_constants.is_constant(constant)
    _refuse_masks(bound, where, () if constant else ("attn_mask",),
                  "attn_mask" if constant else "is_causal")  # fmt: skip
    # (dropout_p > 0 drops even in eval mode: the trace check refuses its random output)
    if bound.get("enable_gqa"):
        raise IRError(f"{where}: enable_gqa=True is not supported")
    q, k, v = (bound.get(n) for n in names[:3])
    if not all(low.is_tensor(t) for t in (q, k, v)):
        raise IRError(f"{where}: query, key and value must be tensors")
    rank = len(low.shape(q)) - 1
    if rank < 2 or any(len(low.shape(t)) - 1 != rank for t in (k, v)):
        raise IRError(f"{where}: query, key and value of per-sample shapes "
                      f"{[tuple(low.shape(t)[1:]) for t in (q, k, v)]}; three values of the same "
                      "rank, (..., L, E), are supported")  # fmt: skip
    d = low.shape(q)[-1]
    scale = bound.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    emit = Emit(low, fx_node.name)
    mask, causal = None, 0 if bound.get("is_causal") else None
    scores = (*low.shape(q)[1:-1], low.shape(k)[-2])
    if constant:
        causal = _constant_mask(low, bound, "attn_mask", True, scores, where)
    elif bound.get("attn_mask") is not None:
        value, boolean = _mask_operand(low, bound["attn_mask"], rank, "attn_mask", where)
        mask = (value, "keep" if boolean else "add")
    out = _attention(emit, q.name, k.name, v.name, scale, 0.0, rank, mask, causal=causal)
    emit("identity", [out], name=fx_node.name)


# -- modules --------------------------------------------------------------------------------
def _bind(fx_node, names) -> dict:
    return dict(zip(names, fx_node.args, strict=False)) | dict(fx_node.kwargs)


def lower_module(low, fx_node, mod, module_node) -> None:
    """nn.MultiheadAttention (its output tuple: getitem 0 is the attention's output),
    nn.TransformerEncoderLayer, nn.TransformerEncoder."""
    path = fx_node.target
    kind = type(mod)
    where = f"module {path!r} ({kind.__module__}.{kind.__name__})"
    emit = Emit(low, fx_node.name)
    if isinstance(mod, nn.MultiheadAttention):
        names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
                 "average_attn_weights", "is_causal")  # fmt: skip
        bound = _bind(fx_node, names)
        _refuse_masks(bound, where, ("key_padding_mask",), "attn_mask")
        qkv = [_sequence(low, emit, bound.get(n), mod.batch_first, where) for n in names[:3]]
        scores = (qkv[0][1][0], qkv[1][1][0])
        causal = _constant_mask(low, bound, "attn_mask", False, scores, where)
        out = _mha(emit, path, mod, *qkv, where,
                   _padding(low, bound.get("key_padding_mask"), where),
                   safe=bound.get("need_weights", True) is False, causal=causal)  # fmt: skip
        low.tuples[fx_node.name] = [_result(mod, out, qkv[0][1]), None]
        return
    if isinstance(mod, nn.TransformerEncoderLayer):
        bound = _bind(fx_node, ("src", "src_mask", "src_key_padding_mask", "is_causal"))
        _refuse_masks(bound, where, ("src_key_padding_mask",), "src_mask")
        src, shape = _sequence(low, emit, bound["src"], mod.self_attn.batch_first, where)
        causal = _constant_mask(low, bound, "src_mask", False, (shape[0], shape[0]), where)
        padding = _padding(low, bound.get("src_key_padding_mask"), where)
        out = _encoder_layer(emit, path, mod, src, shape, where, module_node, padding, causal)
        first = mod.self_attn
    else:
        bound = _bind(fx_node, ("src", "mask", "src_key_padding_mask", "is_causal"))
        _refuse_masks(bound, where, ("src_key_padding_mask",), "mask")
        first = mod.layers[0].self_attn
        x, shape = _sequence(low, emit, bound["src"], first.batch_first, where)
        causal = _constant_mask(low, bound, "mask", False, (shape[0], shape[0]), where)
        padding = _padding(low, bound.get("src_key_padding_mask"), where)
        for i, layer in enumerate(mod.layers):
            own_forward(layer, f"{where}, layer {i}")
            x = _encoder_layer(emit, f"{path}.layers.{i}", layer, x, shape,
                               f"{where}, layer {i}", module_node, padding, causal)  # fmt: skip
        out = x if mod.norm is None else emit.module(module_node, f"{path}.norm", mod.norm, x)
    if first.batch_first:
        emit("identity", [out], name=fx_node.name)
    else:  # (sequence, batch, features), as its input
        low.swapped[fx_node.name] = _result(first, out, shape)


def _sequence(low, emit, x, batch_first: bool, where) -> tuple[str, tuple]:
    """(value, per-sample (sequence, features) shape) of an attention layer's input: a
    batch-first tensor, or with batch_first=False one whose batch axis is second (held per
    sample: fx_slicing.Swapped, made by x.transpose(0, 1) or x.permute(1, 0, 2))."""
    sw = low.swapped.get(getattr(x, "name", None))
    if batch_first:
        if sw is not None:
            raise IRError(f"{where}: batch_first=True takes (batch, sequence, features); its "
                          f"input {x.name!r} has the batch axis second: transpose(0, 1) it back, "
                          "or build the layer with batch_first=False")  # fmt: skip
        if not low.is_tensor(x):
            raise IRError(f"{where}: query, key and value must be tensors")
        return x.name, tuple(low.shape(x)[1:])
    if sw is None:
        raise IRError(f"{where}: batch_first=False takes (sequence, batch, features); rootclad "
                      "keeps the batch axis first: pass x.transpose(0, 1) of a batch-first "
                      "tensor, or build the layer with batch_first=True")  # fmt: skip
    return sw.value(emit), (sw.n, *sw.sample)


def _result(mod, out: str, shape):
    """A layer's output as torch gives it: batch-first, or with batch_first=False
    (sequence, batch, features), held per sample (fx_slicing.Swapped)."""
    if mod.batch_first:
        return out
    return Swapped(shape[0], tuple(shape[1:]), whole=out)


def _padding(low, mask, where):
    """A key padding mask (B, S): (value, boolean, per-sample shape), or None."""
    if mask is None:
        return None
    return (*_mask_operand(low, mask, 1, "the key padding mask", where), low.shape(mask)[1:])


def _mha(emit, path, mod, q, k, v, where, padding=None, safe=True, causal=None) -> str:
    """nn.MultiheadAttention on (name, per-sample shape) query, key and value, with a key
    padding mask (_padding's) or None; returns the name of its output."""
    if not mod._qkv_same_embed_dim:
        raise IRError(f"{where}: kdim/vdim other than embed_dim are not supported")
    if mod.bias_k is not None or mod.add_zero_attn:
        raise IRError(f"{where}: add_bias_kv and add_zero_attn are not supported")
    E, H = mod.embed_dim, mod.num_heads
    d = E // H
    for what, (_, shape) in (("query", q), ("key", k), ("value", v)):
        if len(shape) != 2:
            raise IRError(f"{where}: the {what} has per-sample shape {tuple(shape)}; "
                          "(sequence, embed_dim) needed")  # fmt: skip
    params = {"weight": f"{path}.in_proj_weight",
              "bias": f"{path}.in_proj_bias" if mod.in_proj_bias is not None else ""}  # fmt: skip
    projected: dict[str, str] = {}  # one projection per distinct input

    def project(t, part: int) -> str:
        name, (length, _) = t
        if name not in projected:
            projected[name] = emit("linear", [name], params=params)
        piece = emit("slice", [projected[name]],
                     {"axis": 1, "start": part * E, "stop": (part + 1) * E, "step": 1})  # fmt: skip
        heads = emit("reshape", [piece], {"shape": (length, H, d)})
        return emit("permute", [heads], {"perm": (1, 0, 2)})  # (H, length, d)

    L = q[1][0]
    qh, kh, vh = project(q, 0), project(k, 1), project(v, 2)
    mask = None
    if padding is not None:
        value, boolean, shape = padding
        if tuple(shape) != (k[1][0],):
            raise IRError(f"{where}: the key padding mask has per-sample shape {tuple(shape)}; "
                          f"({k[1][0]},), one per key, is needed")  # fmt: skip
        value = emit("reshape", [value], {"shape": (1, 1, k[1][0])})  # over heads and queries
        mask = (value, "fill" if boolean else "add")
    ctx = _attention(emit, qh, kh, vh, 1.0 / math.sqrt(d), float(mod.dropout), 3, mask, safe,
                     causal)  # fmt: skip
    ctx = emit("permute", [ctx], {"perm": (1, 0, 2)})  # (L, H, d)
    ctx = emit("reshape", [ctx], {"shape": (L, E)})
    out_bias = f"{path}.out_proj.bias" if mod.out_proj.bias is not None else ""
    return emit("linear", [ctx], params={"weight": f"{path}.out_proj.weight", "bias": out_bias})


def _activation(emit, module_node, path, act, x, where) -> str:
    if act is F.relu:
        return emit("relu", [x])
    if act is F.gelu:
        return emit("gelu", [x], OPS["gelu"].from_call((), {}, where))
    if isinstance(act, nn.Module):
        return emit.module(module_node, f"{path}.activation", act, x)
    raise IRError(f"{where}: activation {act!r} is not supported; give F.relu, F.gelu or a "
                  "torch.nn activation module")  # fmt: skip


def _encoder_layer(emit, path, mod, x: str, shape, where, module_node, padding=None,
                   causal=None) -> str:  # fmt: skip
    """One TransformerEncoderLayer on value ``x`` of per-sample ``shape`` with a key padding
    mask (or None); returns its output's name."""

    def sub(name, value):
        return emit.module(module_node, f"{path}.{name}", getattr(mod, name), value)

    def attention(h):
        own_forward(mod.self_attn, f"{where}, self_attn")
        a = _mha(emit, f"{path}.self_attn", mod.self_attn, *([(h, shape)] * 3),
                 f"{where}, self_attn", padding, causal=causal)  # fmt: skip
        return sub("dropout1", a)

    def feed_forward(h):
        h = sub("linear1", h)
        h = _activation(emit, module_node, path, mod.activation, h, where)
        h = sub("dropout", h)
        return sub("dropout2", sub("linear2", h))

    if mod.norm_first:
        x = emit("add", [x, attention(sub("norm1", x))])
        return emit("add", [x, feed_forward(sub("norm2", x))])
    x = sub("norm1", emit("add", [x, attention(x)]))
    return sub("norm2", emit("add", [x, feed_forward(x)]))


LAYERS = dict.fromkeys(
    (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder), lower_module
)
