"""The ONNX nodes that are shape arithmetic and layout: constants and the Shape / Gather /
Slice / Concat / Cast arithmetic torch's exporter writes for a flatten (folded, the batch axis
kept symbolic), and reshapes, transposes, concatenations, constant padding, identities."""

from __future__ import annotations

import math

import numpy as np
import torch

from rootclad.frontends.onnx.common import BATCH, Const
from rootclad.ir.ops.shape import MAX_PERMUTE_AXES, merged_permutation

# the attributes each handler reads (opset 13 and later): any other is refused by name
ATTRIBUTES = {
    "Flatten": {"axis"},
    "Reshape": {"allowzero"},
    "Transpose": {"perm"},
    "Concat": {"axis"},
    "Dropout": {"seed"},  # no effect in inference
    "Constant": {"value"},
    "Shape": {"start", "end"},
    "Gather": {"axis"},
    "Slice": set(),
    "Split": {"axis", "num_outputs"},
    "Cast": {"to", "saturate"},  # saturate: float8 targets only, which are refused
    "Sqrt": set(),
    "Mod": {"fmod"},
    "Pad": {"mode"},
}


class ShapeOps:
    """Handlers of the ONNX builder (builder.py) for the shape and layout ops."""

    def fold(self, node, value) -> None:
        """Keep ``value`` as the constant ``node`` computes; every constant folded counts
        against the import's limits (limits.py: its ops check a result that grows before
        they make it)."""
        self.budget.folded(f"node {node.name!r} ({node.op_type})", np.asarray(value))
        self.consts[node.output[0]] = Const(value)

    def op_Constant(self, node, a):
        import onnx

        if "value" not in a:
            raise self.fail(node, "only the 'value' form of Constant is supported")
        # counted with the initializers when the file was read (limits.Budget.parameters)
        self.consts[node.output[0]] = Const(np.array(onnx.numpy_helper.to_array(a["value"])))

    def op_Shape(self, node, a):
        x = node.input[0]
        if x in self.consts:
            shape = list(np.shape(self.consts[x].value))
        else:
            self.tensor(node)
            shape = [BATCH, *self.shapes[x]]
        start, end = a.get("start", 0), a.get("end", len(shape))
        self.fold(node, np.array(shape[start:end], dtype=object))

    def op_Gather(self, node, a):
        if node.input[0] in self.initializers and node.input[1] in self.shapes:
            return self.embedding(node, a)  # rows of a weight by indices the model computes
        if node.input[0] not in self.consts:  # one constant index of a per-sample axis
            x, idx = self.tensor(node), self.const(node, 1, "indices")
            shape, rank = list(self.shapes[x]), len(self.shapes[x]) + 1
            axis = a.get("axis", 0) % rank
            if axis == 0 or np.ndim(idx) != 0:
                raise self.fail(node, "Gather of a tensor takes one index of a per-sample axis")
            n = shape[axis - 1]
            if not -n <= int(idx) < n:
                raise self.fail(node, f"index {int(idx)} is out of range for an axis of {n}")
            i = int(idx) % n
            index = (slice(None),) * axis + (i,)
            out = shape[: axis - 1] + shape[axis:]
            return self.emit(node.output, lambda env, root, x=x, i=index: env[x][i], out)
        data, idx = self.const(node, 0, "data"), self.const(node, 1, "indices")
        if a.get("axis", 0) != 0 or np.ndim(data) != 1:
            raise self.fail(node, "Gather is supported on shape vectors only")
        self.fold(node, np.asarray(data, dtype=object)[np.asarray(idx, dtype=np.int64)])

    def op_Unsqueeze(self, node, a):
        axes = self.axes(node, a)
        if node.input[0] in self.consts:
            v = np.asarray(self.consts[node.input[0]].value)
            return self.fold(node, np.expand_dims(v, tuple(axes)))
        shape = list(self.shapes[self.tensor(node)])
        rank = len(shape) + 1 + len(axes)
        for ax in sorted(ax % rank for ax in axes):
            if ax == 0:
                raise self.fail(node, "unsqueezing the batch axis is not supported")
            shape.insert(ax - 1, 1)
        self.reshape_step(node, shape)

    def op_Squeeze(self, node, a):
        axes = self.axes(node, a)
        if node.input[0] in self.consts:
            v = np.asarray(self.consts[node.input[0]].value)
            return self.fold(node, np.squeeze(v, tuple(axes) if axes else None))
        shape = list(self.shapes[self.tensor(node)])
        rank = len(shape) + 1
        axes = (
            [ax % rank for ax in axes] if axes else [i + 1 for i, d in enumerate(shape) if d == 1]
        )
        if 0 in axes or any(shape[ax - 1] != 1 for ax in axes):
            raise self.fail(node, f"axes {axes} must be per-sample axes of size 1 of {shape}")
        self.reshape_step(node, [d for i, d in enumerate(shape) if i + 1 not in axes])

    def axes(self, node, a):
        if len(node.input) > 1 and node.input[1]:
            return [int(v) for v in np.ravel(self.const(node, 1, "axes"))]
        return list(a.get("axes", []))

    def op_Concat(self, node, a):
        if all(n in self.consts for n in node.input):
            parts = [np.atleast_1d(np.asarray(self.consts[n].value)) for n in node.input]
            self.budget.constant(f"node {node.name!r} (Concat)", (sum(np.size(v) for v in parts),))
            parts = [v.astype(object) for v in parts]
            return self.fold(node, np.concatenate(parts, axis=a["axis"]))
        xs = [self.tensor(node, i) for i in range(len(node.input))]
        rank = len(self.shapes[xs[0]]) + 1
        axis = a["axis"] % rank
        if axis == 0:
            raise self.fail(node, "concatenating along the batch axis is not supported")
        shape = list(self.shapes[xs[0]])
        shape[axis - 1] = sum(self.shapes[x][axis - 1] for x in xs)
        self.emit(
            node.output, lambda env, root, xs=xs, d=axis: torch.cat([env[x] for x in xs], d), shape
        )

    def op_Cast(self, node, a):
        import onnx

        if node.input[0] not in self.consts:
            return self.cast_step(node, a)
        v = np.asarray(self.consts[node.input[0]].value)
        if v.dtype.kind in "biuf":  # shape arithmetic, where BATCH stands, is integer already
            v = v.astype(onnx.helper.tensor_dtype_to_np_dtype(a["to"]))
        self.fold(node, v)

    def op_Slice(self, node, a):
        if node.input[0] not in self.consts:
            return self.slice_step(node)
        data = self.const(node, 0, "data")
        starts, ends = self.const(node, 1, "starts"), self.const(node, 2, "ends")
        axes, steps = self.const(node, 3, "axes"), self.const(node, 4, "steps")
        if _integers(data) and not any(v is BATCH for v in data.ravel()):  # F.pad's counts
            return self.fold(node, self.slice_integers(node, data))
        if (np.ndim(data) != 1 or (axes is not None and list(np.ravel(axes)) not in ([0], [-1]))
                or (steps is not None and list(np.ravel(steps)) != [1])):  # fmt: skip
            raise self.fail(node, "Slice is supported on shape vectors only")
        self.fold(node, np.asarray(data, dtype=object)[int(starts[0]) : int(ends[0])])

    def slice_integers(self, node, data):
        """ONNX Slice of an integer constant, clamped as the operator's definition says."""
        ints = [self.const_ints(node, i, w) if i < len(node.input) and node.input[i] else None
                for i, w in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps"))]  # fmt: skip
        starts, ends = ints[0], ints[1]
        axes = ints[2] if ints[2] is not None else list(range(len(starts)))
        steps = ints[3] if ints[3] is not None else [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise self.fail(node, "starts, ends, axes and steps differ in length")
        for ax, start, end, step in zip(axes, starts, ends, steps, strict=True):
            if not -data.ndim <= ax < data.ndim or step == 0:
                raise self.fail(node, f"axis {ax} or step {step} out of range for a constant "
                                f"of shape {data.shape}")  # fmt: skip
            n = data.shape[ax]
            start, end = (v + n if v < 0 else v for v in (start, end))
            low, high = (0, n) if step > 0 else (-1, n - 1)
            start = min(max(start, 0), n if step > 0 else n - 1)
            end = min(max(end, low), high)
            data = np.take(data, list(range(start, end, step)), axis=ax % data.ndim)
        return data

    def op_Mod(self, node, a):
        """Of integer constants (torchvision's window padding: ``W % window``); ``fmod=0`` is
        Python's sign convention, ``fmod=1`` C's."""
        values = [self.const(node, i, w) for i, w in ((0, "dividend"), (1, "divisor"))]
        if any(v.dtype == object and any(e is BATCH for e in v.ravel()) for v in values):
            raise self.fail(node, "Mod of a value that depends on the batch size")
        p, q = (v.astype(np.int64) if v.dtype == object else v for v in values)
        self.budget.constant(f"node {node.name!r} (Mod)", np.broadcast_shapes(p.shape, q.shape))
        self.fold(node, np.fmod(p, q) if a.get("fmod", 0) else np.mod(p, q))

    def op_Sqrt(self, node, a):
        if node.input[0] not in self.consts:  # of a tensor: torch.sqrt; of a constant, folded
            x = self.tensor(node)
            return self.emit(node.output, lambda env, root, x=x: torch.sqrt(env[x]), self.shapes[x])
        v = np.asarray(self.consts[node.input[0]].value)
        if v.dtype == object and any(e is BATCH for e in v.ravel()):
            raise self.fail(node, "Sqrt of a value that depends on the batch size")
        self.fold(node, np.sqrt(v.astype(np.float64) if v.dtype == object else v))

    def slice_step(self, node) -> None:
        """Slice of a tensor by constant starts, ends, axes and steps along per-sample axes."""
        x = self.tensor(node)
        shape, rank = self.shapes[x], len(self.shapes[x]) + 1
        starts = [int(v) for v in np.ravel(self.const(node, 1, "starts"))]
        ends = [int(v) for v in np.ravel(self.const(node, 2, "ends"))]
        axes, steps = self.const(node, 3, "axes"), self.const(node, 4, "steps")
        axes = list(range(len(starts))) if axes is None else [int(v) for v in np.ravel(axes)]
        steps = [1] * len(starts) if steps is None else [int(v) for v in np.ravel(steps)]
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise self.fail(node, "starts, ends, axes and steps differ in length")
        if any(not -rank <= ax < rank for ax in axes):
            raise self.fail(node, f"axes {axes} out of range for a tensor of {rank} axes")
        axes = [ax % rank for ax in axes]
        index = [slice(None)] * rank
        for ax, start, end, step in zip(axes, starts, ends, steps, strict=True):
            if ax == 0:
                if (start, step) != (0, 1) or end < 2**31 - 1:
                    raise self.fail(node, "slicing the batch axis is not supported")
                continue
            if step < 1:
                raise self.fail(node, f"step {step} on axis {ax}: only positive steps")
            index[ax] = slice(start, end, step)
        out = [len(range(*index[i + 1].indices(n))) for i, n in enumerate(shape)]
        if 0 in out:
            raise self.fail(node, f"the slice of per-sample shape {shape} is empty")
        self.emit(node.output, lambda env, root, x=x, i=tuple(index): env[x][i], out)

    def op_Pad(self, node, a):
        """Constant padding of per-sample axes (torch's F.pad and ConstantPad layers)."""
        x = self.tensor(node)
        shape, rank = self.shapes[x], len(self.shapes[x]) + 1
        mode = a.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "constant":
            raise self.fail(node, f"mode {mode!r}; rootclad pads with a constant only")
        pads = self.const_ints(node, 1, "pads")
        value = self.const(node, 2, "constant_value")
        value = 0.0 if value is None or np.size(value) == 0 else float(np.ravel(value)[0])
        axes = self.const_ints(node, 3, "axes") if len(node.input) > 3 and node.input[3] else None
        axes = list(range(rank)) if axes is None else [ax % rank for ax in axes]
        if len(pads) != 2 * len(axes):
            raise self.fail(node, f"pads {pads} for axes {axes}: two counts per axis")
        pairs = dict(zip(axes, zip(pads[: len(axes)], pads[len(axes) :], strict=True), strict=True))
        if pairs.pop(0, (0, 0)) != (0, 0):
            raise self.fail(node, "padding the batch axis is not supported")
        flat = []  # F.pad's order: the last axis first
        for ax in range(rank - 1, 0, -1):
            flat += pairs.get(ax, (0, 0))
        out = [n + sum(pairs.get(i + 1, (0, 0))) for i, n in enumerate(shape)]
        if min(out) < 1:
            raise self.fail(node, f"pads {pads} leave nothing of per-sample shape {shape}")
        self.emit(node.output, lambda env, root, x=x, f=tuple(flat), v=value:
                  torch.nn.functional.pad(env[x], f, value=v), out)  # fmt: skip

    def op_Split(self, node, a):
        x = self.tensor(node)
        shape, rank = list(self.shapes[x]), len(self.shapes[x]) + 1
        axis = a.get("axis", 0) % rank
        if axis == 0:
            raise self.fail(node, "splitting along the batch axis is not supported")
        n = shape[axis - 1]
        sizes = self.const(node, 1, "split")
        if sizes is None and "num_outputs" not in a and n % len(node.output):
            raise self.fail(node, f"an axis of {n} does not split evenly into "
                            f"{len(node.output)} outputs")  # fmt: skip
        if sizes is None:  # equal parts (num_outputs: the last smaller where they do not divide)
            k = a.get("num_outputs", len(node.output))
            size = -(-n // k)
            sizes = [min(size, n - i * size) for i in range(k)]
        sizes = [int(v) for v in np.ravel(sizes)]
        if sum(sizes) != n or len(sizes) != len(node.output) or min(sizes) < 1:
            raise self.fail(node, f"parts {sizes} do not split axis {axis} of {n} into "
                            f"{len(node.output)} outputs")  # fmt: skip
        start = 0
        for out, size in zip(node.output, sizes, strict=True):
            index = (slice(None),) * axis + (slice(start, start + size),)
            part = shape[: axis - 1] + [size] + shape[axis:]
            self.emit([out], lambda env, root, x=x, i=index: env[x][i], part)
            start += size

    def reshape_step(self, node, shape) -> None:
        x = self.tensor(node)
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != math.prod(self.shapes[x]):
            raise self.fail(node, f"cannot reshape per-sample shape {self.shapes[x]} to {shape}")
        self.emit(node.output, lambda env, root, x=x, s=shape: env[x].reshape(-1, *s), shape)

    def op_Reshape(self, node, a):
        if node.input[0] in self.consts:  # shape arithmetic (expand's sizes)
            shape = self.const_ints(node, 1, "shape")
            v = np.asarray(self.consts[node.input[0]].value)
            if a.get("allowzero", 0) and 0 in shape:
                raise self.fail(node, "allowzero=1 with a 0 in the shape is not supported")
            shape = [v.shape[i] if d == 0 else d for i, d in enumerate(shape)]  # ONNX's 0: kept
            try:
                return self.fold(node, v.reshape(shape))
            except ValueError as exc:
                raise self.fail(
                    node, f"cannot reshape a constant of shape {v.shape} to {shape}"
                ) from exc
        x = self.tensor(node)
        spec = list(np.asarray(self.const(node, 1, "shape"), dtype=object).ravel())
        # allowzero=1 (torch's dynamo exporter writes it on every view) changes only what a 0
        # means: an empty axis instead of the input's size, which no model here has
        if a.get("allowzero", 0) and any(not isinstance(d, str) and d == 0 for d in spec):
            raise self.fail(node, "allowzero=1 with a 0 in the shape: an empty axis")
        n = math.prod(self.shapes[x])
        head, rest = spec[0], spec[1:]
        rest = [self.shapes[x][i] if d == 0 else d for i, d in enumerate(rest)]
        if -1 in rest:
            known = math.prod(int(d) for d in rest if d != -1)
            rest[rest.index(-1)] = n // known if known else 0
        if head not in (BATCH, 0, -1) or math.prod(int(d) for d in rest) != n:
            raise self.fail(node, f"shape {spec} does not keep the batch axis first and whole "
                            f"(input per-sample shape {self.shapes[x]})")  # fmt: skip
        self.reshape_step(node, rest)

    def op_Flatten(self, node, a):
        x = self.tensor(node)
        if a.get("axis", 1) % (len(self.shapes[x]) + 1) != 1:
            raise self.fail(node, f"axis={a['axis']}: only axis 1 (keep the batch) is supported")
        self.reshape_step(node, [math.prod(self.shapes[x])])

    def op_Transpose(self, node, a):
        v = self.consts.get(node.input[0])
        if v is not None and _integers(np.asarray(v.value)):  # F.pad's counts, reordered
            return self.fold(node, np.asarray(v.value).transpose(a.get("perm")))
        x = self.tensor(node)
        rank = len(self.shapes[x]) + 1
        perm = list(a.get("perm", range(rank - 1, -1, -1)))
        if perm[0] != 0:
            raise self.fail(node, f"perm={perm} moves the batch axis")
        merged, _ = merged_permutation(self.shapes[x], [p - 1 for p in perm[1:]])
        if len(merged) > MAX_PERMUTE_AXES:
            why = (
                f"perm={perm} of {tuple(self.shapes[x])}: at most {MAX_PERMUTE_AXES} "
                "per-sample axes can be permuted (after merging neighbours)"
            )
            raise self.fail(node, why)
        shape = [self.shapes[x][p - 1] for p in perm[1:]]
        self.emit(node.output, lambda env, root, x=x, p=perm: env[x].permute(*p), shape)

    def op_Identity(self, node, a):
        if node.input[0] in self.consts:
            return self.fold(node, self.consts[node.input[0]].value)
        x = self.tensor(node)
        self.identity_of[node.output[0]] = self.identity_of.get(x, x)
        self.emit(node.output, lambda env, root, x=x: env[x], self.shapes[x])

    def op_Dropout(self, node, a):
        if (
            len(node.input) > 2
            and node.input[2]
            and bool(np.ravel(self.const(node, 2, "training_mode"))[0])
        ):
            raise self.fail(node, "training_mode=True is not supported (an inference graph)")
        if len(node.output) > 1 and node.output[1]:
            raise self.fail(node, "the mask output is not supported")
        self.op_Identity(node, a)


def _integers(v) -> bool:
    """Shape arithmetic and counts (integers, or objects holding BATCH), never a float weight,
    which stays an initializer so that it trains and ties as the file's own parameter."""
    return v.dtype.kind in "iu" or (v.dtype == object and all(
        isinstance(e, (int, np.integer, str)) for e in v.ravel()))  # fmt: skip
