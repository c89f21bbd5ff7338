"""The ONNX nodes of copies and neighbours: Expand and Tile of size-1 axes (with the
ConstantOfShape / Equal / Where arithmetic torch's exporter writes for ``expand(-1, ...)``'s
shape, folded), TopK, and GatherElements by TopK's indices (torch.gather), lowered as
fx_neighbours.py lowers their torch forms. TopK's indices may reach a GatherElements only
through reshaping, slicing, transposing, expanding and tiling; any other reader is refused
naming the node."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from rootclad.frontends.onnx.common import BATCH

ATTRIBUTES = {
    "Expand": set(),
    "Tile": set(),
    "TopK": {"axis", "largest", "sorted"},
    "GatherElements": {"axis"},
    "ConstantOfShape": {"value"},
    "Equal": set(),
    "Trilu": {"upper"},
    "Not": set(),
    "Where": set(),
}
# what may come between a TopK and the GatherElements reading its indices
INDEX_LAYOUT = ("Unsqueeze", "Squeeze", "Reshape", "Flatten", "Slice", "Transpose", "Identity",
                "Expand", "Tile")  # fmt: skip


class IndexOps:
    """Handlers of the ONNX builder (builder.py) for copies, TopK and GatherElements."""

    def op_ConstantOfShape(self, node, a):
        import onnx

        shape = self.const_ints(node, 0, "shape")
        value = onnx.numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
        self.budget.constant(f"node {node.name!r} (ConstantOfShape)", shape)
        self.fold(node, np.full(shape, value.ravel()[0], dtype=value.dtype))

    def op_Equal(self, node, a):
        if node.input[0] in self.shapes:  # a mask: x == c (ids == PAD)
            x, c = self.tensor(node), self.number(node.input[1])
            if c is None:
                raise self.fail(node, "Equal of a tensor and anything but one number")
            self.masks.add(node.output[0])
            return self.emit(node.output, lambda env, root, x=x, c=c: env[x] == c, self.shapes[x])
        p, q = self.const(node, 0, "A"), self.const(node, 1, "B")
        self.budget.constant(f"node {node.name!r} (Equal)", np.broadcast_shapes(p.shape, q.shape))
        self.fold(node, np.asarray(p == q))

    def _order(self, node, compare):
        """Greater, Less and their OrEqual forms of a tensor and a number: a mask."""
        x, c = self.tensor(node), self.number(node.input[1])
        if c is None or node.input[0] not in self.shapes:
            raise self.fail(node, f"{node.op_type} of anything but a tensor and one number")
        self.masks.add(node.output[0])
        self.emit(node.output, lambda env, root, x=x, c=c: compare(env[x], c), self.shapes[x])

    def op_Greater(self, node, a):
        self._order(node, lambda t, c: t > c)

    def op_Less(self, node, a):
        self._order(node, lambda t, c: t < c)

    def op_GreaterOrEqual(self, node, a):
        self._order(node, lambda t, c: t >= c)

    def op_LessOrEqual(self, node, a):
        self._order(node, lambda t, c: t <= c)

    def op_Not(self, node, a):
        x = self.tensor(node)
        if x not in self.masks:
            raise self.fail(node, "Not of anything but a mask (Equal's output)")
        self.masks.add(node.output[0])
        self.emit(node.output, lambda env, root, x=x: ~env[x], self.shapes[x])

    def cast_step(self, node, a):
        """Cast of a tensor: a mask to a float type (1s and 0s), or a float type to another
        (the model computes in one type)."""
        import onnx

        x = self.tensor(node)
        to = onnx.helper.tensor_dtype_to_np_dtype(a["to"])
        own = np.float64 if self.dtype == torch.float64 else np.float32
        if to not in (np.float32, np.float64) or (to != own and x not in self.masks):
            raise self.fail(node, f"Cast of a tensor to {to}; the model computes in {own.__name__} "
                            "throughout (a mask may become 1s and 0s of it)")  # fmt: skip
        if x in self.masks:  # 1s and 0s (the torch front-end keeps them in the model's type)
            return self.emit(node.output, lambda env, root, x=x: env[x].float(), self.shapes[x])
        self.emit(node.output, lambda env, root, x=x: env[x], self.shapes[x])

    def op_Where(self, node, a):
        tensors = [i for i in (1, 2) if node.input[i] in self.shapes]
        if len(tensors) == 1 and node.input[0] in self.consts:  # masked_fill by a constant
            t = tensors[0]
            x, fill = self.tensor(node, t), self.number(node.input[3 - t])
            if fill != -np.inf:
                raise self.fail(node, f"Where filling a tensor with {fill}: with -inf only (a "
                                "constant attention mask)")  # fmt: skip
            cond = np.asarray(self.const(node, 0, "condition")).astype(bool)
            mask = torch.from_numpy(np.ascontiguousarray(cond if t == 2 else ~cond))
            return self.emit(node.output, lambda env, root, x=x, m=mask: env[x].masked_fill(
                m, float("-inf")), self.shapes[x])  # fmt: skip
        c, p, q = (self.const(node, i, w) for i, w in enumerate(("condition", "X", "Y")))
        shape = np.broadcast_shapes(c.shape, p.shape, q.shape)
        self.budget.constant(f"node {node.name!r} (Where)", shape)
        self.fold(node, np.where(c.astype(bool), p, q))

    def op_Trilu(self, node, a):
        v = np.asarray(self.const(node, 0, "input"))
        k = self.const_ints(node, 1, "k")[0] if len(node.input) > 1 and node.input[1] else 0
        self.fold(node, np.triu(v, k) if a.get("upper", 1) else np.tril(v, k))

    def expand_step(self, node, x, out) -> None:
        self.emit(node.output, lambda env, root, x=x, s=tuple(out): env[x].expand(-1, *s), out)

    def op_Expand(self, node, a):
        name = self.aliases.get(node.input[0], node.input[0])
        if name in self.initializers or node.input[0] in self.aliases:
            spec = list(np.asarray(self.const(node, 1, "shape"), dtype=object).ravel())
            value = np.asarray(self.consts[node.input[0]].value)
            if spec and spec[0] == BATCH and value.dtype.kind == "f":  # a class token
                return self.expand_parameter(node, spec)
        if node.input[0] in self.consts:  # a constant broadcast (is_causal's mask of ones)
            v = np.asarray(self.consts[node.input[0]].value)
            shape = np.broadcast_shapes(v.shape, self.const_ints(node, 1, "shape"))
            self.budget.constant(f"node {node.name!r} (Expand)", shape)
            return self.fold(node, np.broadcast_to(v, shape).copy())
        x = self.tensor(node)
        spec = list(np.asarray(self.const(node, 1, "shape"), dtype=object).ravel())
        shape = list(self.shapes[x])
        if (len(spec) != len(shape) + 1 or spec[0] not in (BATCH, 1, -1)
                or BATCH in spec[1:]):  # fmt: skip
            raise self.fail(node, f"shape {spec} for an input of per-sample shape {shape}: "
                            "the batch axis must stay first and whole")  # fmt: skip
        out = []
        for d, s in zip(shape, spec[1:], strict=True):
            s = int(s)
            if s not in (1, d) and d != 1:
                raise self.fail(node, f"cannot expand per-sample shape {shape} to {spec[1:]}")
            out.append(d if s == 1 else s)
        self.expand_step(node, x, out)

    def expand_parameter(self, node, spec) -> None:
        """A weight of leading axis 1 expanded to the batch (a class token: ``cls.expand(B, -1,
        -1)``), its other axes kept: the parameter read directly, the same for every sample."""
        v = np.asarray(self.consts[node.input[0]].value)
        full = [1] * (len(spec) - v.ndim) + list(v.shape)
        if (
            len(full) != len(spec)
            or full[0] != 1
            or any(
                isinstance(s, str) or int(s) not in (1, -1, d)
                for s, d in zip(spec[1:], full[1:], strict=True)
            )
        ):
            raise self.fail(node, f"weight {node.input[0]!r} of shape {v.shape} expanded to "
                            f"{spec}: to the batch along its first axis of 1 only, its other "
                            "axes kept")  # fmt: skip
        holder = nn.Module()
        holder.weight = nn.Parameter(torch.from_numpy(np.array(v, dtype=np.float64)))
        self.share(node, holder, {"weight": (node.input[0], f"as read, shape {v.shape}")})
        name = self.place_parameter(node, node.input[0], holder.weight)
        first = self.inputs[0].name

        if tuple(full) != v.shape:
            raise self.fail(node, f"weight {node.input[0]!r} of shape {v.shape} expanded to "
                            f"{spec}: its rank must be the result's")  # fmt: skip

        rank = len(full)

        def f(env, root, p=name, x=first, n=rank):
            w = functools.reduce(getattr, p.split("."), root)
            return w.expand(env[x].shape[0], *([-1] * (n - 1)))

        self.emit(node.output, f, full[1:])

    def op_Tile(self, node, a):
        x = self.tensor(node)
        reps = self.const_ints(node, 1, "repeats")
        shape = list(self.shapes[x])
        if (
            len(reps) != len(shape) + 1
            or reps[0] != 1
            or any(r != 1 and d != 1 for r, d in zip(reps[1:], shape, strict=True))
        ):
            raise self.fail(node, f"repeats {reps} of per-sample shape {shape}: only axes of "
                            "size 1 may be tiled, and the batch axis not")  # fmt: skip
        self.expand_step(node, x, [d * r for d, r in zip(shape, reps[1:], strict=True)])

    def op_TopK(self, node, a):
        x = self.tensor(node)
        k = self.const_ints(node, 1, "K")[0]
        shape, rank = list(self.shapes[x]), len(self.shapes[x]) + 1
        axis = a.get("axis", -1) % rank
        if axis == 0 or not 1 <= k <= shape[axis - 1]:
            raise self.fail(node, f"K={k} along axis {axis} of per-sample shape {shape}")
        largest = bool(a.get("largest", 1))
        pair = f"{node.output[0]}__topk"
        self.steps.append((lambda env, root, x=x: env[x].topk(k, axis, largest), pair))
        out = shape[: axis - 1] + [k] + shape[axis:]
        self.shapes[pair] = tuple(out)
        for i, name in enumerate(node.output):
            if name:
                self.emit([name], lambda env, root, i=i: env[pair][i], out)
        if len(node.output) > 1 and node.output[1]:
            self.topk_indices.add(node.output[1])

    def op_GatherElements(self, node, a):
        x, idx = self.tensor(node), self.tensor(node, 1)
        if idx not in self.topk_indices:
            raise self.fail(node, f"its indices {idx!r} are not computed by a TopK; rootclad "
                            "gathers by TopK's indices only")  # fmt: skip
        rank = len(self.shapes[x]) + 1
        axis = a.get("axis", 0) % rank
        if axis == 0:
            raise self.fail(node, "gathering along the batch axis is not supported")
        self.emit(node.output, lambda env, root, x=x, i=idx, d=axis: env[x].gather(d, env[i]),
                  self.shapes[idx])  # fmt: skip

    def check_topk_indices(self, node) -> None:
        """TopK's indices reach only a GatherElements (as its indices), through layout."""
        held = [i for i in node.input if i in self.topk_indices]
        if not held or node.op_type == "Shape":
            return
        if node.op_type == "GatherElements" and node.input[0] not in self.topk_indices:
            return
        if node.op_type in INDEX_LAYOUT and node.input[0] in held:
            self.topk_indices.update(node.output)
            return
        raise self.fail(node, f"reads {held[0]!r}, the indices of a TopK; rootclad reads them "
                        "only as the indices of a GatherElements")  # fmt: skip
