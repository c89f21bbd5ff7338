"""Recurrent layers in a traced model: ``nn.LSTM`` and ``nn.GRU`` unrolled over the sequence
the model was compiled for, into the ops the rest of a model uses (``linear``, ``slice``,
``sigmoid``, ``tanh``, ``mul``, ``add``, ``cat``). Their backward is the reverse sweep over
those ops: full backpropagation through time, truncated nowhere.

Per layer and direction: one ``linear`` of the whole input sequence by ``weight_ih`` (a
GEMM over every step of every sample), then per step the hidden state's ``linear`` by
``weight_hh`` (the same parameter at every step: its gradient sums over the steps) and the
gates, in torch's order (LSTM: i, f, g, o; GRU: r, z, n). A zero initial state (none given)
starts from the biases alone. Several layers (with dropout between them in training),
bidirectional, ``bias=False``, ``batch_first`` both ways.

torch puts the batch on axis 1 of a sequence with ``batch_first=False`` and of the final
states ``h_n``/``c_n`` (layers x directions, batch, hidden). rootclad keeps the batch axis
first, so such a tensor is held as its per-sample value (:class:`Swapped`) and lowered where
it is used: ``transpose(0, 1)`` / ``permute(1, 0, ...)`` back to batch-first, ``[i]`` (the
last layer's state: ``h_n[-1]``), ``squeeze(0)`` of one layer, and as the input or the
initial state of another recurrent layer. ``x.transpose(0, 1)`` of a batch-first value,
``z.unsqueeze(0)`` and ``torch.stack(values)`` (an initial state per layer) make one. Any
other use is refused, naming the node.
"""

from __future__ import annotations

import operator

import torch
from torch import nn

from rootclad.frontends import fx_slicing
from rootclad.frontends.fx_attention import Emit, own_forward
from rootclad.frontends.fx_slicing import Swapped
from rootclad.ir.graph import IRError


def sw_rank(sw: Swapped) -> int:
    """torch's rank of a Swapped tensor (its axis, the batch, the per-sample ones)."""
    return 2 + len(sw.sample)


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def _perm(fx_node):
    """torch's full permutation of a transpose / permute node (None for any other)."""
    name = _name(fx_node.target)
    args = list(fx_node.args)
    meta = fx_node.meta.get("tensor_meta")
    rank = len(meta.shape) if hasattr(meta, "shape") else 0
    if rank < 2 or name not in ("transpose", "permute") or fx_node.kwargs:
        return None
    if name == "transpose":
        perm = list(range(rank))
        if len(args) != 3 or not all(isinstance(d, int) for d in args[1:]):
            return None
        a, b = (d % rank for d in args[1:])
        perm[a], perm[b] = perm[b], perm[a]
    else:
        perm = args[1:] if len(args) > 2 or not isinstance(args[1], (tuple, list)) else args[1]
        if not all(isinstance(p, int) for p in perm):
            return None
        perm = [p % rank for p in perm]
    return perm if sorted(perm) == list(range(rank)) else None


# layers acting on the last axis alone (or elementwise): the same on a tensor whose batch axis
# is second as on its per-sample value
ROW_WISE = (nn.Linear, nn.LayerNorm, nn.Dropout, nn.Identity, nn.ReLU, nn.GELU, nn.SiLU,
            nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU)  # fmt: skip
_ARITH = {"add": "add", "iadd": "add", "__add__": "add", "__radd__": "add", "sub": "sub",
          "__sub__": "sub", "mul": "mul", "__mul__": "mul", "__rmul__": "mul",
          "truediv": "div", "__truediv__": "div"}  # fmt: skip


def _row_wise(low, fx_node, mod) -> bool:
    """A layer of ROW_WISE on a tensor whose batch axis is second: on its per-sample value."""
    sw = low.swapped[fx_node.args[0].name]
    if not sw.sample:  # (n, B): torch's last axis is the batch
        raise IRError(f"module {fx_node.target!r} takes {fx_node.args[0].name!r}, whose last "
                      "axis is the batch; rootclad keeps the batch axis first")  # fmt: skip
    if isinstance(mod, nn.LayerNorm) and len(mod.normalized_shape) != 1:
        raise IRError(f"module {fx_node.target!r}: a LayerNorm over several axes of a tensor "
                      "whose batch axis is second would mix the batch; normalise the last one")  # fmt: skip
    emit = Emit(low, fx_node.name)
    out = emit.module(low.module_node, fx_node.target, mod, sw.value(emit))
    shape = tuple(low.shape(fx_node))
    low.swapped[fx_node.name] = Swapped(shape[0], shape[2:], whole=out)
    return True


def _arithmetic(low, fx_node, op, args, emit, where) -> bool:
    """+ - * / of tensors whose batch axis is second (of the same shape), or of one and a
    number: on their per-sample values."""
    tensors = [a for a in args if isinstance(a, torch.fx.Node)]
    held = [low.swapped.get(a.name) for a in tensors]
    shape = tuple(low.shape(fx_node))
    if None in held or any(tuple(low.shape(a)) != shape for a in tensors) or len(args) != 2:
        raise IRError(f"{where}: arithmetic of a tensor whose batch axis is second with "
                      "another of a different shape or layout; rootclad computes it between "
                      "two such tensors of one shape, or with a number")  # fmt: skip
    if len(tensors) == 2:
        out = emit(op, [h.value(emit) for h in held])
    else:
        c = float(args[1] if isinstance(args[0], torch.fx.Node) else args[0])
        if op == "div" and not isinstance(args[0], torch.fx.Node):
            raise IRError(f"{where}: a number divided by a tensor is not supported")
        scale, shift = {"add": (1.0, c), "sub": (1.0, -c) if isinstance(args[0], torch.fx.Node)
                        else (-1.0, c), "mul": (c, 0.0), "div": (1.0 / c, 0.0)}[op]  # fmt: skip
        out = emit("affine", [held[0].value(emit)], {"scale": scale, "shift": shift})
    low.swapped[fx_node.name] = Swapped(shape[0], shape[2:], whole=out)
    return True


def _to_second(fx_node):
    """A transpose / permute of a batch-first value that puts the batch axis second
    (``x.transpose(0, 1)``, weaver's ``x.permute(2, 0, 1)``): its permutation, or None; a
    permute whose pieces are only taken (timm's qkv) is fx_slicing's."""
    perm = _perm(fx_node)
    if perm is None or perm[1] != 0:
        return None
    if _name(fx_node.target) == "permute" and fx_slicing.takes_moved_pieces(fx_node, perm):
        return None
    return perm


def _to_first(fx_node):
    """A transpose / permute of a tensor whose batch axis is second that puts it first again
    (``transpose(0, 1)``, ``permute(1, 2, 0)``): its permutation, or None."""
    perm = _perm(fx_node)
    return perm if perm is not None and perm[0] == 1 else None


ZEROS = (torch.zeros, torch.zeros_like)


def _zero_state(low, fx_node) -> bool:
    """torch.zeros(layers, x.size(0), hidden) (or zeros_like, x.new_zeros, and .to(...) of
    one) used as the initial state of recurrent layers only: no state given."""
    name = _name(fx_node.target)
    if fx_node.target in ZEROS or name == "new_zeros":
        made = True
    elif name in ("to", "type_as", "contiguous"):
        made = getattr(fx_node.args[0], "name", None) in low.zero_states
    else:
        return False

    def for_states(user, src) -> bool:
        if user.op == "call_module":  # as the state (hx), not the input
            return (isinstance(low.traced.get_submodule(user.target), (nn.LSTM, nn.GRU))
                    and (user.args[:1] or [None])[0] is not src)  # fmt: skip
        if user.target in ZEROS or _name(user.target) in ("new_zeros", "to", "type_as",
                                                          "contiguous"):  # fmt: skip
            return all(for_states(u, user) for u in user.users)
        return False

    if not made:
        return False
    if not all(for_states(u, fx_node) for u in fx_node.users):
        if fx_node.target in ZEROS or name == "new_zeros":
            raise IRError(f"fx node {fx_node.name!r} ({name}): rootclad compiles zeros only as "
                          "the initial state of a recurrent layer (no state: a model computes "
                          "from its inputs)")  # fmt: skip
        return False
    return True


def lower(low, fx_node) -> bool:
    """Lower ``fx_node`` where it makes or uses a :class:`Swapped` tensor or a zero initial
    state; False where it is none of this module's."""
    held = [a.name for a in fx_node.all_input_nodes
            if a.name in low.swapped or a.name in low.zero_states]  # fmt: skip
    if fx_node.op == "output" and held:
        raise IRError(f"the model returns {held[0]!r}, whose batch axis is the second; "
                      "return its transpose(0, 1) (or h_n[-1])")  # fmt: skip
    if fx_node.op == "call_module":
        mod = low.traced.get_submodule(fx_node.target)
        time_first = (nn.LSTM, nn.GRU, nn.MultiheadAttention, nn.TransformerEncoderLayer,
                      nn.TransformerEncoder)  # fmt: skip
        if held and isinstance(mod, ROW_WISE) and len(fx_node.args) == 1 and not fx_node.kwargs:
            return _row_wise(low, fx_node, mod)
        if held and not isinstance(mod, time_first):
            raise IRError(f"module {fx_node.target!r} takes {held[0]!r}, whose batch axis is "
                          "the second; rootclad keeps the batch axis first: transpose(0, 1) it")  # fmt: skip
        return False
    if fx_node.op not in ("call_function", "call_method"):
        return False
    name = _name(fx_node.target)
    args = list(fx_node.args)
    where = f"fx node {fx_node.name!r} ({name})"
    emit = Emit(low, fx_node.name)
    if _zero_state(low, fx_node):
        low.zero_states.add(fx_node.name)
        return True
    if held:
        x = args[0] if args else None
        sw = low.swapped.get(getattr(x, "name", None))
        perm = _to_first(fx_node) if sw is not None else None
        if perm is not None:  # back to batch-first: torch's axis 0 is the value's first
            q = [0 if t == 0 else t - 1 for t in perm[1:]]
            op, attrs = ("identity", {}) if q == sorted(q) else ("permute", {"perm": tuple(q)})
            emit(op, [sw.value(emit)], attrs, name=fx_node.name)
            return True
        if sw is not None and fx_node.target is operator.getitem and isinstance(args[1], int):
            i = args[1] + sw.n if args[1] < 0 else args[1]
            if not 0 <= i < sw.n:
                raise IRError(f"{where}: index {args[1]} of an axis of {sw.n}")
            emit("reshape", [sw.row(emit, i)], {"shape": sw.sample}, name=fx_node.name)
            return True
        if name in _ARITH and not fx_node.kwargs:
            return _arithmetic(low, fx_node, _ARITH[name], args, emit, where)
        dims = tuple(args[1:]) or tuple(fx_node.kwargs.values())
        if sw is not None and name == "squeeze" and sw.n == 1 and dims in ((0,), (-sw_rank(sw),)):
            emit("reshape", [sw.row(emit, 0)], {"shape": sw.sample}, name=fx_node.name)
            return True
        raise IRError(
            f"{where}: uses a tensor whose batch axis is the second (a sequence with "
            "batch_first=False, or h_n / c_n of a recurrent layer); rootclad keeps the batch "
            "axis first and takes such a tensor by transpose(0, 1), [i] (h_n[-1]) or "
            "squeeze(0), or as a recurrent layer's input or initial state"
        )
    perm = _to_second(fx_node)
    if perm is not None and low.is_tensor(args[0]) and low.shape(args[0])[0] == low.batch:
        q = [p - 1 for p in [perm[0], *perm[2:]]]  # the value's axes, in torch's new order
        whole = args[0].name
        if q != sorted(q):
            whole = emit("permute", [whole], {"perm": tuple(q)})
        shape = tuple(low.shape(fx_node))
        low.swapped[fx_node.name] = Swapped(shape[0], shape[2:], whole=whole)
        return True
    dim = args[1] if len(args) > 1 else fx_node.kwargs.get("dim")
    if name == "unsqueeze" and dim == 0 and args and low.is_tensor(args[0]):
        shape = tuple(low.shape(args[0])[1:])
        row = emit("reshape", [args[0].name], {"shape": (1, *shape)})
        low.swapped[fx_node.name] = Swapped(1, shape, rows=[row])
        return True
    if fx_node.target is torch.stack:
        values = args[0] if args else fx_node.kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else fx_node.kwargs.get("dim", 0)
        if dim == 0 and all(low.is_tensor(v) for v in values):
            rows = [emit("reshape", [v.name], {"shape": (1, *low.shape(v)[1:])}) for v in values]
            low.swapped[fx_node.name] = Swapped(len(rows), tuple(low.shape(values[0])[1:]),
                                                rows=rows)  # fmt: skip
            return True
    return False


# -- the layers -----------------------------------------------------------------------------
def _sequence(low, x, batch_first: bool, where) -> Swapped:
    """The layer's input as (T, features) per sample."""
    if batch_first:
        held = getattr(x, "name", None)
        if held in low.swapped or held in low.zero_states:
            raise IRError(f"{where}: batch_first=True takes (batch, sequence, features); its input "
                          f"{held!r} has the batch axis second (or is zeros): transpose(0, 1) it "
                          "back, or build the layer with batch_first=False")  # fmt: skip
        if not low.is_tensor(x) or len(low.shape(x)) != 3:
            raise IRError(f"{where}: its input must be (batch, sequence, features); got "
                          f"{tuple(low.shape(x)) if low.is_tensor(x) else x!r}")  # fmt: skip
        shape = tuple(low.shape(x)[1:])
        return Swapped(shape[0], shape[1:], whole=x.name)
    if isinstance(x, torch.fx.Node) and x.name in low.swapped:
        return low.swapped[x.name]
    raise IRError(f"{where}: batch_first=False takes (sequence, batch, features); rootclad keeps "
                  "the batch axis first: pass x.transpose(0, 1) of a batch-first tensor, or "
                  "build the layer with batch_first=True")  # fmt: skip


def _state(low, value, layers: int, hidden: int, where, what: str):
    """An initial state given: its rows (1, hidden), one per layer and direction."""
    if value is None or getattr(value, "name", None) in low.zero_states:
        return None
    sw = low.swapped.get(getattr(value, "name", None))
    if sw is None:
        raise IRError(f"{where}: its initial {what} is not a (layers, batch, hidden) tensor "
                      "made from the input (z.unsqueeze(0), torch.stack([...]), or h_n of "
                      "another recurrent layer)")  # fmt: skip
    if sw.n != layers or sw.sample != (hidden,):
        raise IRError(f"{where}: its initial {what} is ({sw.n}, batch, {sw.sample}); "
                      f"({layers}, batch, {hidden}) needed")  # fmt: skip
    return sw


def lower_module(low, fx_node, mod, module_node) -> None:
    del module_node  # the layer's ops are written here
    path = fx_node.target
    kind = type(mod)
    where = f"module {path!r} ({kind.__module__}.{kind.__name__})"
    if getattr(mod, "proj_size", 0):
        raise IRError(f"{where}: proj_size > 0 is not supported")
    own_forward(mod, where)
    lstm = isinstance(mod, nn.LSTM)
    args = list(fx_node.args) + [fx_node.kwargs[k] for k in ("hx",) if k in fx_node.kwargs]
    if len(args) not in (1, 2) or set(fx_node.kwargs) - {"hx"}:
        raise IRError(f"{where} is called with {len(fx_node.args)} arguments "
                      f"{sorted(fx_node.kwargs)}; it takes the input and the initial state")  # fmt: skip
    x, hx = args[0], (args[1] if len(args) > 1 else None)
    D = 2 if mod.bidirectional else 1
    L, H = mod.num_layers, mod.hidden_size
    h0 = c0 = None
    if hx is not None:
        if lstm:
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise IRError(f"{where}: its initial state must be a tuple (h_0, c_0)")
            h0 = _state(low, hx[0], L * D, H, where, "h_0")
            c0 = _state(low, hx[1], L * D, H, where, "c_0")
        else:
            h0 = _state(low, hx, L * D, H, where, "h_0")
    emit = Emit(low, fx_node.name)
    seq = _sequence(low, x, mod.batch_first, where)
    if seq.sample != (mod.input_size,):
        raise IRError(f"{where}: input of {seq.sample} features per step; {mod.input_size} "
                      "expected")  # fmt: skip
    step = _lstm_step if lstm else _gru_step
    finals_h, finals_c = [], []
    for layer in range(L):
        outs = []
        for d in range(D):
            suffix = f"_l{layer}" + ("_reverse" if d else "")
            k = layer * D + d
            state = (h0.row(emit, k) if h0 else None, c0.row(emit, k) if c0 else None)
            hs, state = _direction(emit, mod, path, suffix, seq, step, state, reverse=d == 1)
            outs.append(hs)
            finals_h.append(state[0])
            finals_c.append(state[1])
        whole = outs[0] if D == 1 else emit("cat", outs, {"axis": 1})
        if layer < L - 1 and mod.dropout > 0:
            whole = emit("dropout", [whole], {"p": float(mod.dropout)})
        seq = Swapped(seq.n, (D * H,), whole=whole)
    output = seq.whole if mod.batch_first else seq
    h_n = Swapped(L * D, (H,), rows=finals_h)
    low.tuples[fx_node.name] = [output, [h_n, Swapped(L * D, (H,), rows=finals_c)] if lstm else h_n]


def _direction(emit, mod, path, suffix, seq, step, state, reverse):
    """One direction of one layer over the sequence ``seq``: the (T, H) value of its hidden
    states in the sequence's order, and its final (h, c)."""
    p = {r: f"{path}.{r}{suffix}" for r in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    if not mod.bias:
        p["bias_ih"] = p["bias_hh"] = ""
    xp = emit("linear", [seq.value(emit)], params={"weight": p["weight_ih"], "bias": p["bias_ih"]})
    T = seq.n
    hs = [None] * T
    for t in reversed(range(T)) if reverse else range(T):
        xt = xp if T == 1 else emit("slice", [xp], {"axis": 0, "start": t, "stop": t + 1,
                                                  "step": 1})  # fmt: skip
        h, c = state
        if h is not None:
            hp = emit("linear", [h], params={"weight": p["weight_hh"], "bias": p["bias_hh"]})
        elif p["bias_hh"]:  # a zero state: its product is the bias
            hp = emit("parameter", [], {"shape": (1, _gates_width(mod))}, {"weight": p["bias_hh"]})
        else:
            hp = None
        state = step(emit, mod.hidden_size, xt, hp, state)
        hs[t] = state[0]
    return (hs[0] if T == 1 else emit("cat", hs, {"axis": 0})), state


def _gates_width(mod) -> int:
    return (4 if isinstance(mod, nn.LSTM) else 3) * mod.hidden_size


def _piece(emit, x, i, H, n=1):
    return emit("slice", [x], {"axis": 1, "start": i * H, "stop": (i + n) * H, "step": 1})


def _lstm_step(emit, H, xt, hp, state):
    """i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh); c' = f c + i g; h' = o tanh(c')."""
    gates = xt if hp is None else emit("add", [xt, hp])
    i = emit("sigmoid", [_piece(emit, gates, 0, H)])
    g = emit("tanh", [_piece(emit, gates, 2, H)])
    o = emit("sigmoid", [_piece(emit, gates, 3, H)])
    c = state[1]
    ig = emit("mul", [i, g])
    if c is not None:
        f = emit("sigmoid", [_piece(emit, gates, 1, H)])
        ig = emit("add", [emit("mul", [f, c]), ig])
    return emit("mul", [o, emit("tanh", [ig])]), ig


def _gru_step(emit, H, xt, hp, state):
    """r, z = sigmoid(x_rz + h_rz); n = tanh(x_n + r (h W_hn^T + b_hn)); h' = n + z (h - n)."""
    h = state[0]
    rz = _piece(emit, xt, 0, H, 2)
    if hp is not None:
        rz = emit("add", [rz, _piece(emit, hp, 0, H, 2)])
    rz = emit("sigmoid", [rz])
    n = _piece(emit, xt, 2, H)
    if hp is not None:
        r = _piece(emit, rz, 0, H)
        n = emit("add", [n, emit("mul", [r, _piece(emit, hp, 2, H)])])
    n = emit("tanh", [n])
    z = _piece(emit, rz, 1, H)
    if h is None:  # h' = n - z n
        return emit("sub", [n, emit("mul", [z, n])]), None
    return emit("add", [n, emit("mul", [z, emit("sub", [h, n])])]), None


LAYERS = {nn.LSTM: lower_module, nn.GRU: lower_module}
