"""The ONNX LSTM and GRU nodes, rebuilt as ``nn.LSTM`` / ``nn.GRU`` (one layer each, forward
or bidirectional; a mixin of the builder, builder.py), and the values around them whose batch
axis is not the first, as torch's exporter writes them:

- a sequence ``(seq, B, F)`` (``Transpose(x, [1, 0, 2])`` of a batch-first input, a layer's
  output squeezed or reshaped): held as the batch-first value it transposes (``time``), and
  batch-first again at ``Transpose(.., [1, 0, 2])``;
- a layer's output ``Y`` ``(seq, D, B, H)`` and its ``Transpose(.., [0, 2, 1, 3])``
  ``(seq, B, D, H)``: torch's output ``(B, seq, D*H)``, reshaped or squeezed back to a
  sequence;
- final and initial states ``(n, B, H)``: one batch-first ``(B, H)`` value per row; taken by
  ``Gather(axis=0)``, ``Slice`` and ``Squeeze`` of axis 0, ``Concat`` along it, and as a
  layer's initial state; zeros (``ConstantOfShape`` of a shape holding the batch size) start
  a layer from no state.

``Shape`` of such a value gives its ONNX shape. Anything else that reads one is refused (it is
no tensor of the batch-first kind the rest of the import handles), naming the node. ONNX's
gate orders (LSTM: i, o, f, c; GRU: z, r, h) become torch's (i, f, g, o; r, z, n); a GRU must
have linear_before_reset=1 (torch's form); peepholes, clip, sequence lengths, other
activations, ``layout=1`` and ``reverse`` direction are refused.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rootclad.frontends.onnx.common import BATCH, attributes, text

ATTRIBUTES = {
    "LSTM": {"hidden_size", "direction", "activations", "input_forget", "layout"},
    "GRU": {"hidden_size", "direction", "activations", "linear_before_reset", "layout"},
}
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}
# torch's gate order as indices into ONNX's
_GATES = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}
_SEQUENCE_READERS = ("LSTM", "GRU", "Shape")


class RecurrentOps:
    """Handlers of the ONNX builder for LSTM, GRU, and the values with the batch axis second."""

    def follow_layout(self, node) -> bool:
        """Handle ``node`` where it makes or reads a value of this module's layouts (True)."""
        held = [i for i in node.input if i in self.layouts]
        op = node.op_type
        if op == "Transpose" and not held and node.input[0] in self.shapes:
            perm = list(attributes(node).get("perm", []))
            readers = [n.op_type for n in self.nodes if node.output[0] in n.input]
            if (len(perm) == 3 and perm[1] == 0 and readers
                    and all(r in _SEQUENCE_READERS for r in readers)):  # fmt: skip
                x = node.input[0]  # (B, a, b) to (seq, B, F): the batch-first (B, seq, F) is
                if perm[0] == 2:  # x itself, or x with its two axes exchanged
                    shape = tuple(self.shapes[x][::-1])
                    self.emit([f"{x}__bf"], lambda env, root, x=x: env[x].transpose(1, 2), shape)
                    x = f"{x}__bf"
                self.layouts[node.output[0]] = ("time", x)
                return True
            return False
        if op == "ConstantOfShape" and node.input[0] in self.consts:
            shape = list(np.ravel(np.asarray(self.consts[node.input[0]].value, dtype=object)))
            value = attributes(node).get("value")
            zero = value is None or not np.any(_array(value))
            if len(shape) == 3 and isinstance(shape[1], str) and shape[1] == BATCH and zero:
                self.layouts[node.output[0]] = ("zeros", int(shape[0]), int(shape[2]))
                return True
            return False
        if not held or op in ("LSTM", "GRU"):
            return False
        if node.input[0] not in self.layouts and op != "Concat":
            raise self.fail(node, f"reads {held[0]!r}, whose batch axis is not the first (a "
                            "recurrent layer's sequence or state), beside other values")  # fmt: skip
        return self._layout_step(node, self.layouts[held[0]], op)

    def _layout_step(self, node, lay, op) -> bool:
        a = attributes(node)
        out = node.output[0]
        kind = lay[0]
        if op == "Shape":
            self.fold(
                node,
                np.array(self._onnx_shape(lay), dtype=object)[a.get("start", 0) : a.get("end")],
            )
            return True
        if kind == "time" and op == "Transpose" and list(a.get("perm", [])) == [1, 0, 2]:
            x = lay[1]
            self.emit([out], lambda env, root, x=x: env[x], self.shapes[x])
            return True
        if kind == "y" and op == "Squeeze" and self.axes(node, a) == [1] and lay[2] == 1:
            self.layouts[out] = ("time", lay[1])
            return True
        if kind == "y" and op == "Transpose" and list(a.get("perm", [])) == [0, 2, 1, 3]:
            self.layouts[out] = ("yd", *lay[1:])
            return True
        if kind == "yd" and op == "Reshape":
            spec = list(np.ravel(np.asarray(self.const(node, 1, "shape"), dtype=object)))
            seq, D, H = self.shapes[lay[1]][0], lay[2], lay[3]
            batch = spec[1:2] in ([0], [-1]) or (isinstance(spec[1], str) and spec[1] == BATCH)
            if len(spec) == 3 and spec[2] in (-1, D * H) and spec[0] in (0, seq) and batch:
                self.layouts[out] = ("time", lay[1])
                return True
        if kind in ("rows", "zeros"):
            return self._state_step(node, lay, op, a)
        raise self.fail(node, f"reads {node.input[0]!r}, whose batch axis is not the first "
                        "(a recurrent layer's sequence or state); rootclad follows it through "
                        "the transposes, squeezes and reshapes torch's exporter writes back to "
                        "batch-first only")  # fmt: skip

    def _state_step(self, node, lay, op, a) -> bool:
        """Rows of final states (n, B, H): one (B, H) value each, or zeros."""
        n = lay[1] if lay[0] == "zeros" else len(lay[1])
        if op == "Concat" and a.get("axis") == 0:
            parts = [self.layouts.get(i) for i in node.input]
            if all(p is not None and p[0] == "rows" for p in parts):
                self.layouts[node.output[0]] = ("rows", [r for p in parts for r in p[1]])
                return True
            if all(p is not None and p[0] == "zeros" for p in parts):
                self.layouts[node.output[0]] = ("zeros", sum(p[1] for p in parts), lay[2])
                return True
        if op == "Slice":
            starts, ends = self.const_ints(node, 1, "starts"), self.const_ints(node, 2, "ends")
            axes = (
                self.const_ints(node, 3, "axes") if len(node.input) > 3 and node.input[3] else [0]
            )
            steps = (
                self.const_ints(node, 4, "steps") if len(node.input) > 4 and node.input[4] else [1]
            )
            if axes == [0] and steps == [1]:
                rows = range(n)[starts[0] : ends[0]]
                self.layouts[node.output[0]] = (
                    ("zeros", len(rows), lay[2]) if lay[0] == "zeros" else
                    ("rows", [lay[1][i] for i in rows]))  # fmt: skip
                return True
        if lay[0] == "rows":
            row = None
            if (
                op == "Gather"
                and a.get("axis", 0) == 0
                and np.ndim(self.const(node, 1, "indices")) == 0
            ):
                row = int(self.const(node, 1, "indices"))
                if not -n <= row < n:
                    raise self.fail(node, f"index {row} of {n} states")
                row %= n
            elif op == "Squeeze" and self.axes(node, a) == [0] and n == 1:
                row = 0
            if row is not None:
                src = lay[1][row]
                self.emit(node.output, lambda env, root, s=src: env[s], self.shapes[src])
                return True
            if op == "Transpose" and list(a.get("perm", [])) == [1, 0, 2]:
                rows = lay[1]
                H = self.shapes[rows[0]][0]
                self.emit(node.output, lambda env, root, rs=tuple(rows): torch.cat(
                    [env[r].unsqueeze(1) for r in rs], 1), (n, H))  # fmt: skip
                return True
        raise self.fail(node, f"reads {node.input[0]!r}, recurrent states with the batch axis "
                        "second; rootclad takes their rows (Gather, Slice, Squeeze of axis 0), "
                        "Concat along axis 0 and Transpose(perm=[1, 0, 2])")  # fmt: skip

    def _onnx_shape(self, lay) -> list:
        kind = lay[0]
        if kind == "zeros":
            return [lay[1], BATCH, lay[2]]
        if kind == "rows":
            return [len(lay[1]), BATCH, self.shapes[lay[1][0]][0]]
        seq, F = self.shapes[lay[1]]
        if kind == "time":
            return [seq, BATCH, F]
        D, H = lay[2], lay[3]
        return [seq, D, BATCH, H] if kind == "y" else [seq, BATCH, D, H]

    # -- the layers ---------------------------------------------------------------------------
    def op_LSTM(self, node, a):
        self.recurrent(node, a, "LSTM")

    def op_GRU(self, node, a):
        self.recurrent(node, a, "GRU")

    def recurrent(self, node, a, kind):
        lay = self.layouts.get(node.input[0])
        if lay is None or lay[0] != "time":
            raise self.fail(node, f"its input {node.input[0]!r} is not a sequence (seq, B, F) "
                            "transposed from a batch-first value, as torch's exporter writes it")  # fmt: skip
        x = lay[1]
        direction = text(a.get("direction", b"forward"))
        if direction not in ("forward", "bidirectional"):
            raise self.fail(node, f"direction={direction!r} is not supported")
        D, H = (2 if direction == "bidirectional" else 1), int(a["hidden_size"])
        acts = [text(v) for v in a.get("activations", [])]
        if acts and acts != _DEFAULT_ACTS[kind] * D:
            raise self.fail(node, f"activations {acts}: torch's only ({_DEFAULT_ACTS[kind]})")
        if a.get("layout", 0) or a.get("input_forget", 0):
            raise self.fail(node, "layout=1 and input_forget=1 are not supported")
        if kind == "GRU" and a.get("linear_before_reset", 0) != 1:
            raise self.fail(node, "linear_before_reset=0 is not torch's GRU; only 1 is supported")
        extra = {4: "sequence_lens", 7: "P (peepholes)"}
        for i, what in extra.items():
            if len(node.input) > i and node.input[i]:
                raise self.fail(node, f"input {what} is not supported")
        for i in (1, 2, 3):
            name = node.input[i] if len(node.input) > i else ""
            if name and self.readers.get(name, 0) > 1:
                raise self.fail(node, f"its weight {name!r} is read by another node too; rootclad "
                                "makes each recurrent layer's weights its own")  # fmt: skip
        W, R = self.const(node, 1, "W"), self.const(node, 2, "R")
        B = self.const(node, 3, "B")
        n_gates = 4 if kind == "LSTM" else 3
        n_in = self.shapes[x][1]
        if W.shape != (D, n_gates * H, n_in) or R.shape != (D, n_gates * H, H):
            raise self.fail(node, f"W {W.shape} and R {R.shape} do not fit {D} directions, "
                            f"hidden_size {H} and inputs of {n_in}")  # fmt: skip
        cls = nn.LSTM if kind == "LSTM" else nn.GRU
        mod = cls(n_in, H, batch_first=True, bidirectional=D == 2, bias=B is not None,
                  dtype=torch.float64)  # fmt: skip
        order = _GATES[kind]

        def gates(m):  # ONNX's gate blocks in torch's order
            return np.concatenate([m[g * H : (g + 1) * H] for g in order])

        with torch.no_grad():
            for d in range(D):
                sfx = "_reverse" if d else ""
                getattr(mod, f"weight_ih_l0{sfx}").copy_(torch.from_numpy(gates(W[d]) * 1.0))
                getattr(mod, f"weight_hh_l0{sfx}").copy_(torch.from_numpy(gates(R[d]) * 1.0))
                if B is not None:
                    getattr(mod, f"bias_ih_l0{sfx}").copy_(
                        torch.from_numpy(gates(B[d][: n_gates * H]) * 1.0)
                    )
                    getattr(mod, f"bias_hh_l0{sfx}").copy_(
                        torch.from_numpy(gates(B[d][n_gates * H :]) * 1.0)
                    )
        for i in (1, 2, 3):
            if len(node.input) > i and node.input[i] and node.input[i] not in self.initializers:
                for p in mod.parameters():  # a Constant node's weights: frozen, as share() does
                    p.requires_grad_(False)
        path = self.place(node, mod, None)
        states = [self._initial(node, i, D, H) for i in ((5, 6) if kind == "LSTM" else (5,))]
        pair = f"{node.output[0] or node.name}__{kind.lower()}"
        given = all(s is not None for s in states)
        if any(s is not None for s in states) and not given:
            raise self.fail(node, "one initial state given and the other zero is not supported")

        def run(env, root, p=path, x=x, states=tuple(states), lstm=kind == "LSTM"):
            hx = None
            if given:
                hx = [torch.stack([env[r] for r in rows]) for rows in states]
                hx = tuple(hx) if lstm else hx[0]
            return root.get_submodule(p)(env[x], hx)

        self.steps.append((run, pair))
        self.shapes[pair] = ()
        seq = self.shapes[x][0]
        y = f"{pair}__y"
        self.emit([y], lambda env, root: env[pair][0], (seq, D * H))
        if node.output[0]:
            self.layouts[node.output[0]] = ("y", y, D, H)
        for k, out in enumerate(node.output[1:]):  # Y_h, Y_c: rows of the final states
            if not out:
                continue
            rows = []
            for d in range(D):
                row = f"{out}__row{d}"
                if kind == "LSTM":
                    fn = lambda env, root, k=k, d=d: env[pair][1][k][d]  # noqa: E731
                else:
                    fn = lambda env, root, d=d: env[pair][1][d]  # noqa: E731
                self.emit([row], fn, (H,))
                rows.append(row)
            self.layouts[out] = ("rows", rows)

    def _initial(self, node, i, D, H):
        """The rows of initial state input ``i``, or None for zeros (or none)."""
        name = node.input[i] if len(node.input) > i else ""
        if not name:
            return None
        lay = self.layouts.get(name)
        if lay is not None and lay[0] == "zeros" and lay[1:] == (D, H):
            return None
        if lay is not None and lay[0] == "rows" and len(lay[1]) == D:
            return lay[1]
        raise self.fail(node, f"its initial state {name!r} is neither zeros nor final states of "
                        f"shape ({D}, B, {H})")  # fmt: skip


def _array(value):
    import onnx

    return onnx.numpy_helper.to_array(value)
