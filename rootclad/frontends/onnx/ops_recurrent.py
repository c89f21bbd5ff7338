"""The ONNX table's recurrent layers (see ops.py): LSTM and GRU, their cells written out step
by step."""

from __future__ import annotations

import torch

from rootclad.frontends.onnx.common import text
from rootclad.frontends.onnx.ops import onnx_op

MAX_STEPS = 4096  # the cell steps a recurrent node is written out as, both directions together


def _recurrent_inputs(node, ins, gates: int):
    """(x as (T, B, F), W, R, bias of W, bias of R, hidden size, directions, initial states
    as (D, B, H)) of an LSTM or GRU node, what it does not take refused."""
    if node.attr("clip") is not None or (len(ins) > 4 and ins[4] is not None):
        raise node.refuse("a clip or sequence lengths")
    acts = [text(a) for a in node.attr("activations") or []]
    default = ["Sigmoid", "Tanh", "Tanh"] if gates == 4 else ["Sigmoid", "Tanh"]
    if acts and acts != (default * 2)[: len(acts)]:
        raise node.refuse(f"activations {acts}")
    x, w, r = ins[:3]
    if node.attr("layout", 0):  # batch first: (B, T, F), initial states (B, D, H)
        x = x.transpose(0, 1)
        ins = [s.transpose(0, 1) if i >= 5 and s is not None else s for i, s in enumerate(ins)]
    if x.shape[0] * w.shape[0] > MAX_STEPS:
        raise node.refuse(f"{x.shape[0]} steps each way (rootclad writes out {MAX_STEPS})")
    hidden = r.shape[-1]
    b = ins[3] if len(ins) > 3 and ins[3] is not None else None
    wb = b[:, : gates * hidden] if b is not None else None
    rb = b[:, gates * hidden :] if b is not None else None
    direction = text(node.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise node.refuse(f"direction {direction!r}")
    order = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    states = (list(ins[5:7]) + [None, None])[:2]
    return x, w, r, wb, rb, hidden, order, states


def _run(node, x, order, step, states):
    """Each direction's steps over x (T, B, F): (Y (T, D, B, H), final states (D, B, H)...)."""
    outs, finals = [], []
    for d, backwards in enumerate(order):
        state = [s[d] if s is not None else None for s in states]
        ys = [None] * x.shape[0]
        steps = range(x.shape[0] - 1, -1, -1) if backwards else range(x.shape[0])
        for t in steps:
            state = step(d, x[t], state)
            ys[t] = state[0]
        outs.append(torch.stack(ys))
        finals.append(state)
    y = torch.stack(outs, 1)
    return [y, *(torch.stack([f[i] for f in finals]) for i in range(len(states)))]


@onnx_op("LSTM")
def _lstm(node, ins):
    if len(ins) > 7 and ins[7] is not None or node.attr("input_forget", 0):
        raise node.refuse("peepholes or coupled input and forget gates")
    x, w, r, wb, rb, hidden, order, (h0, c0) = _recurrent_inputs(node, ins, 4)

    def step(d, xt, state):
        h, c = state  # None: zeros (no initial state), whose products are left out
        g = xt @ w[d].t() if h is None else xt @ w[d].t() + h @ r[d].t()
        if wb is not None:
            g = g + wb[d] + rb[d]
        i, o, f, cand = g.chunk(4, -1)  # ONNX's order: input, output, forget, cell
        c = torch.sigmoid(i) * torch.tanh(cand) + (0 if c is None else torch.sigmoid(f) * c)
        return [torch.sigmoid(o) * torch.tanh(c), c]

    return _laid_out(node, _run(node, x, order, step, [h0, c0]))


@onnx_op("GRU")
def _gru(node, ins):
    x, w, r, wb, rb, hidden, order, (h0, _) = _recurrent_inputs(node, ins, 3)
    before = bool(node.attr("linear_before_reset", 0))

    def step(d, xt, state):
        h = state[0]  # None: zeros (no initial state), whose products are left out
        gx = xt @ w[d].t() + (wb[d] if wb is not None else 0)
        (zx, rx, nx), (zr, rr, nr) = gx.chunk(3, -1), r[d].chunk(3, 0)
        rbz, rbr, rbn = rb[d].chunk(3, -1) if rb is not None else (0, 0, 0)
        if h is None:
            z = torch.sigmoid(zx + rbz)
            n = torch.tanh(nx + (torch.sigmoid(rx + rbr) * rbn if before else rbn))
            return [(1 - z) * n]
        z = torch.sigmoid(zx + h @ zr.t() + rbz)
        reset = torch.sigmoid(rx + h @ rr.t() + rbr)
        if before:  # torch's form: the reset gate scales the recurrent product
            n = torch.tanh(nx + reset * (h @ nr.t() + rbn))
        else:
            n = torch.tanh(nx + (reset * h) @ nr.t() + rbn)
        return [(1 - z) * n + z * h]

    return _laid_out(node, _run(node, x, order, step, [h0]))


def _laid_out(node, results):
    """Y (T, D, B, H) and the final states (D, B, H), batch first where layout=1: (B, T, D,
    H) and (B, D, H)."""
    if not node.attr("layout", 0):
        return results
    y, *states = results
    return [y.permute(2, 0, 1, 3), *(s.transpose(0, 1) for s in states)]
