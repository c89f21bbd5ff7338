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
from dataclasses import dataclass

import torch
from torch import nn

from rootclad.frontends import fx_slicing
from rootclad.frontends.fx_attention import Emit, own_forward
from rootclad.ir.graph import IRError


@dataclass
class Swapped:
    """A tensor whose batch axis is torch's axis 1: per sample, ``n`` rows of shape
    ``sample``, as one value (n, *sample) or as one (1, *sample) value per row, whichever was
    made; the other is made (once) when asked for."""

    n: int
    sample: tuple
    whole: str | None = None
    rows: list | None = None

    def value(self, emit) -> str:
        if self.whole is None:
            self.whole = (self.rows[0] if self.n == 1 else
                          emit("cat", self.rows, {"axis": 0}))  # fmt: skip
        return self.whole

    def row(self, emit, i: int) -> str:
        """Row ``i`` as (1, *sample)."""
        if self.rows is None:
            self.rows = [None] * self.n
        if self.rows[i] is None:
            self.rows[i] = emit("slice", [self.whole],
                                {"axis": 0, "start": i, "stop": i + 1, "step": 1})  # fmt: skip
        return self.rows[i]


def sw_rank(sw: Swapped) -> int:
    """torch's rank of a Swapped tensor (its axis, the batch, the per-sample ones)."""
    return 2 + len(sw.sample)


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def _swaps(fx_node) -> bool:
    """transpose(0, 1) / permute(1, 0, ...): the batch axis and the next exchanged."""
    name = _name(fx_node.target)
    args = list(fx_node.args)
    meta = fx_node.meta.get("tensor_meta")
    rank = len(meta.shape) if hasattr(meta, "shape") else 0
    if rank < 2 or name not in ("transpose", "permute") or fx_node.kwargs:
        return False
    if name == "transpose":
        perm = list(range(rank))
        if len(args) != 3 or not all(isinstance(d, int) for d in args[1:]):
            return False
        a, b = (d % rank for d in args[1:])
        perm[a], perm[b] = perm[b], perm[a]
    else:
        perm = args[1:] if len(args) > 2 or not isinstance(args[1], (tuple, list)) else args[1]
        if not all(isinstance(p, int) for p in perm):
            return False
        perm = [p % rank for p in perm]
    if perm != [1, 0, *range(2, rank)]:
        return False
    # a permute whose pieces are only taken (timm's qkv) is fx_slicing's; a transpose is ours
    return name == "transpose" or not fx_slicing.takes_moved_pieces(fx_node, perm)


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
        if held and not isinstance(low.traced.get_submodule(fx_node.target), (nn.LSTM, nn.GRU)):
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
        if sw is not None and _swaps(fx_node):  # back to batch-first
            emit("identity", [sw.value(emit)], name=fx_node.name)
            return True
        if sw is not None and fx_node.target is operator.getitem and isinstance(args[1], int):
            i = args[1] + sw.n if args[1] < 0 else args[1]
            if not 0 <= i < sw.n:
                raise IRError(f"{where}: index {args[1]} of an axis of {sw.n}")
            emit("reshape", [sw.row(emit, i)], {"shape": sw.sample}, name=fx_node.name)
            return True
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
    if _swaps(fx_node) and low.is_tensor(args[0]) and low.shape(args[0])[0] == low.batch:
        shape = tuple(low.shape(args[0])[1:])
        low.swapped[fx_node.name] = Swapped(shape[0], shape[1:], whole=args[0].name)
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
