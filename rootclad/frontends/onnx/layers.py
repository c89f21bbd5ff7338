"""The ONNX nodes that compute: arithmetic, products, activations, convolutions, pooling and
normalisations, each rebuilt as the torch layer that computes it (a Gemm is a ``Linear``
holding its initializers, a Conv a ``Conv1d``/``Conv2d``, ...)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rootclad.frontends import fx_einsum
from rootclad.frontends.onnx.common import BATCH, Renamed, text

# layers are built in float64 from the file's values and rounded once, to the graph's dtype, by
# the builder: a float64 file keeps its weights to the last bit
F64 = torch.float64

# Pow by a constant exponent: the ones with an op of their own
_POWERS = {2.0: lambda x: x * x, 0.5: torch.sqrt, -0.5: torch.rsqrt}

SUPPORTED = (
    "Gemm, MatMul (by a weight, with a following Add of a bias folded in; of two tensors), "
    "Einsum (of one or two tensors, the batch axis the first letter of each), "
    "ReduceSum and ReduceMean (over per-sample axes), ReduceMax and ReduceMin, Add, Sub, Mul, Div "
    "(two tensors with broadcasting, a tensor and a number, or a tensor and a constant tensor, "
    "which becomes a parameter), Pow (by a number), Exp, Erf, Log, Sqrt, Reciprocal, Sign, "
    "Abs, Neg, Equal, Greater, Less, GreaterOrEqual, LessOrEqual of a tensor and a number and Not "
    "of it (a mask), Cast of tensors to float "
    "types, Relu, LeakyRelu, Elu, "
    "Sigmoid, Tanh, Softplus, Gelu (and the Erf form exporters write), HardSwish, HardSigmoid, "
    "Clip, Mish, Selu, PRelu (one slope or one per channel), Softmax, LogSoftmax, Conv (1-d, "
    "2-d, 3-d), ConvTranspose (1-d, 2-d), Gather of a weight by integer inputs (an embedding), "
    "LSTM and GRU (one layer each, forward or bidirectional, as torch writes them), "
    "self-attention as torch writes nn.MultiheadAttention (the block of nodes read as that layer, "
    "checked by evaluation), "
    "MaxPool and AveragePool (1-d, 2-d, 3-d), GlobalAveragePool, GlobalMaxPool, BatchNormalization "
    "(inference), LayerNormalization, InstanceNormalization, Resize (nearest and linear as "
    "torch writes them), Flatten, Reshape, Transpose, Squeeze, Unsqueeze, Concat, "
    "Slice and Split (along per-sample axes), Pad (constant mode, per-sample axes), Expand and "
    "Tile (of size-1 axes), TopK, "
    "GatherElements (by TopK's indices), Dropout, Identity, Constant, and the "
    "Shape/Gather/Slice/Concat/Cast/ConstantOfShape/Equal/Where/Expand/Trilu arithmetic on "
    "constants (an attention mask of 0 and -inf added to scores: a causal one) and shapes "
    "that torch's exporter writes"
)
# the attributes each handler reads (opset 13 and later): any other is refused by name, so an
# attribute a newer opset adds (AveragePool's dilations, opset 19) cannot be ignored
ATTRIBUTES = {
    "Pow": set(),
    "Abs": set(),
    "Exp": set(),
    "Erf": set(),
    "Log": set(),
    "Sign": set(),
    "Reciprocal": set(),
    "Gemm": {"alpha", "beta", "transA", "transB"},
    "Einsum": {"equation"},
    "LeakyRelu": {"alpha"},
    "Elu": {"alpha"},
    "Gelu": {"approximate"},
    "HardSigmoid": {"alpha", "beta"},
    "Selu": {"alpha", "gamma"},
    "Softmax": {"axis"},
    "LogSoftmax": {"axis"},
    "ReduceSum": {"axes", "keepdims", "noop_with_empty_axes"},
    "ReduceMax": {"axes", "keepdims", "noop_with_empty_axes"},
    "ReduceMin": {"axes", "keepdims", "noop_with_empty_axes"},
    "ReduceMean": {"axes", "keepdims", "noop_with_empty_axes"},
    "Conv": {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
    "ConvTranspose": {"auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                      "output_shape", "pads", "strides"},
    # storage_order only orders the Indices output, which is refused
    "MaxPool": {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order",
                "strides"},
    "AveragePool": {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape",
                    "pads", "strides"},
    "BatchNormalization": {"epsilon", "momentum", "training_mode"},
    "LayerNormalization": {"axis", "epsilon", "stash_type"},
    "InstanceNormalization": {"epsilon"},
    "Resize": {"mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
               "exclude_outside", "antialias", "keep_aspect_ratio_policy",
               "extrapolation_value"},
}  # fmt: skip


class LayerOps:
    """Handlers of the ONNX builder (builder.py) for the ops that compute."""

    def binary(self, node, fn):
        a_name, b_name = node.input[0], node.input[1]
        if a_name in self.consts and b_name in self.consts:
            a_v, b_v = np.asarray(self.consts[a_name].value), np.asarray(self.consts[b_name].value)
            if any(isinstance(e, str) for v in (a_v, b_v) for e in v.ravel()):  # BATCH
                raise self.fail(node, "arithmetic on the batch size: the graph merges the batch "
                                "axis with another (a reshape to B * n rows)")  # fmt: skip
            shape = np.broadcast_shapes(a_v.shape, b_v.shape)
            self.budget.constant(f"node {node.name!r} ({node.op_type})", shape)
            return self.fold(node, fn(a_v, b_v))
        if a_name in self.shapes and b_name in self.shapes:
            sa, sb = self.shapes[a_name], self.shapes[b_name]
            if len(sa) != len(sb):
                raise self.fail(node, f"operands of per-sample shapes {sa} and {sb} have "
                                "different ranks")  # fmt: skip
            shape = tuple(max(p, q) for p, q in zip(sa, sb, strict=True))
            return self.emit(
                node.output, lambda env, root, a=a_name, b=b_name: fn(env[a], env[b]), shape
            )
        tensor_first = a_name in self.shapes
        c_name = b_name if tensor_first else a_name
        c = np.asarray(self.consts[c_name].value)
        x = a_name if tensor_first else b_name
        if c.ndim > len(self.shapes[x]) + 1 or (c.ndim == len(self.shapes[x]) + 1
                                                 and c.size > 1 and c.shape[0] != 1):  # fmt: skip
            raise self.fail(node, f"constant {c_name!r} of shape {c.shape} meets {x!r} (B, "
                            f"{', '.join(map(str, self.shapes[x]))}): broadcasting puts its "
                            "axes on the batch axis, which must stay the samples'")  # fmt: skip
        if (
            node.op_type == "Add"
            and c.ndim >= 2
            and len(self.shapes[x]) >= 2
            and c.shape[-2:] == tuple(self.shapes[x][-2:])
            and np.any(c == -np.inf)
            and np.all((c == 0) | (c == -np.inf))
        ):  # a constant mask of 0 and -inf on scores (L, S) (is_causal's): masked_fill by it
            mask = torch.from_numpy(np.ascontiguousarray(c == -np.inf))
            shape = torch.broadcast_shapes((2, *self.shapes[x]), c.shape)[1:]
            return self.emit(node.output, lambda env, root, x=x, m=mask: env[x].masked_fill(
                m, float("-inf")), shape)  # fmt: skip
        if c.size != 1:
            return self.tensor_operand(node, fn, x, c_name, c, tensor_first)
        c = float(c.reshape(()))  # c / x: fx lowers it as c times x's reciprocal
        f = (lambda env, root, x=x, c=c: fn(env[x], c)) if tensor_first else (
            lambda env, root, x=x, c=c: fn(c, env[x]))  # fmt: skip
        self.emit(node.output, f, self.shapes[x])

    def tensor_operand(self, node, fn, x, c_name, c, tensor_first) -> None:
        """A tensor constant meeting a tensor (a per-channel scale, a position embedding): a
        parameter of the model read directly, named as the initializer where it is a path
        (``gamma``, ``blocks.0.ls``), frozen when it is not an initializer."""
        holder = nn.Module()
        holder.weight = nn.Parameter(torch.from_numpy(np.array(c, dtype=np.float64)))
        self.share(node, holder, {"weight": (c_name, f"as read, shape {c.shape}")})
        name = self.place_parameter(node, c_name, holder.weight)
        shape = torch.broadcast_shapes((2, *self.shapes[x]), c.shape)[1:]

        def f(env, root, x=x, p=name):
            w = functools.reduce(getattr, p.split("."), root)  # (fx traces getattr)
            return fn(env[x], w) if tensor_first else fn(w, env[x])

        self.emit(node.output, f, shape)

    def op_Add(self, node, a):
        self.binary(node, lambda p, q: p + q)

    def op_Sub(self, node, a):
        self.binary(node, lambda p, q: p - q)

    def op_Mul(self, node, a):
        self.binary(node, lambda p, q: p * q)

    def op_Pow(self, node, a):
        x, p = self.tensor(node), self.number(node.input[1])
        rank = np.ndim(self.consts[node.input[1]].value) if p is not None else 0
        if p is None or not math.isfinite(p) or rank > len(self.shapes[x]) + 1:
            # (an exponent of more axes than x would broadcast x's batch axis away)
            raise self.fail(node, "an exponent that is not one finite number of x's rank or less")
        fn = _POWERS.get(p, lambda x, p=p: x**p)
        self.emit(node.output, lambda env, root, x=x, fn=fn: fn(env[x]), self.shapes[x])

    def op_Exp(self, node, a):
        self.unary(node, torch.exp)

    def op_Erf(self, node, a):
        self.unary(node, torch.erf)

    def op_Log(self, node, a):
        self.unary(node, torch.log)

    def op_Sign(self, node, a):
        self.unary(node, torch.sign)

    def op_Reciprocal(self, node, a):
        self.unary(node, torch.reciprocal)

    def unary(self, node, fn) -> None:
        x = self.tensor(node)
        self.emit(node.output, lambda env, root, x=x, fn=fn: fn(env[x]), self.shapes[x])

    def op_Abs(self, node, a):
        x = self.tensor(node)
        self.emit(node.output, lambda env, root, x=x: torch.abs(env[x]), self.shapes[x])

    def op_Neg(self, node, a):
        x = self.tensor(node)
        self.emit(node.output, lambda env, root, x=x: -env[x], self.shapes[x])

    def op_Div(self, node, a):
        if not self.erf_gelu(node):
            self.binary(node, lambda p, q: p / q)

    def erf_gelu(self, div) -> bool:
        """x * 0.5 * (1 + erf(x / sqrt(2))) (torch's exporter writes GELU so before opset 20):
        Div -> Erf -> Add 1 -> Mul x -> Mul 0.5 (the last two in either order) becomes one
        exact GELU."""
        x = div.input[0]
        if x not in self.shapes or not math.isclose(self.number(div.input[1]) or 0, math.sqrt(2),
                                                    rel_tol=1e-6):  # fmt: skip
            return False
        erf = self.reader(div.output[0])
        add = erf and erf.op_type == "Erf" and self.reader(erf.output[0])
        if not add or add.op_type != "Add" or self.number(
                next(i for i in add.input if i != erf.output[0])) != 1.0:  # fmt: skip
            return False
        chain, value, seen = [], add.output[0], set()
        while len(chain) < 2:
            mul = self.reader(value)
            if mul is None or mul.op_type != "Mul":
                return False
            other = next((i for i in mul.input if i != value), value)
            if other == x and "x" not in seen:
                seen.add("x")
            elif self.number(other) == 0.5 and "half" not in seen:
                seen.add("half")
            else:
                return False
            chain.append(mul)
            value = mul.output[0]
        for n in (erf, add, *chain):
            self.folded.add(id(n))
        self.module_step(Renamed(div, value), nn.GELU(), None, x)
        return True

    def op_Gemm(self, node, a):
        x = self.tensor(node)
        if len(self.shapes[x]) != 1:
            raise self.fail(node, f"input A must be (batch, K), got per-sample {self.shapes[x]}")
        if a.get("transA", 0):
            raise self.fail(node, "transA=1 transposes the batch axis into the features")
        w = np.asarray(self.const(node, 1, "B"), dtype=np.float64)
        w = w if a.get("transB", 0) else w.T  # (N, K), torch's Linear layout
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        n, k = w.shape
        if k != self.shapes[x][0]:
            raise self.fail(node, f"B gives {k} inputs, A has {self.shapes[x][0]}")
        c = self.const(node, 2, "C")
        bias = None
        if c is not None and beta != 0:
            c = np.asarray(c, dtype=np.float64)
            if c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1):
                raise self.fail(
                    node, f"C of shape {c.shape} must broadcast over the batch to ({n},)"
                )
            bias = beta * np.broadcast_to(c.reshape(-1), (n,))
        lin = nn.Linear(k, n, bias=bias is not None, dtype=F64)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(alpha * w))  # alpha folded into the weight
            if bias is not None:
                lin.bias.copy_(torch.from_numpy(np.ascontiguousarray(bias)))
        roles = {
            "weight": (
                node.input[1],
                f"{alpha:g} * B" + ("" if a.get("transB", 0) else " transposed"),
            )
        }
        if bias is not None:
            roles["bias"] = (node.input[2], f"{beta:g} * C of shape {c.shape}")
        self.share(node, lin, roles)
        self.module_step(node, lin, node.input[1] if alpha == 1 and a.get("transB", 0) else None, x)

    def op_Einsum(self, node, a):
        """torch.einsum of the operands, which the torch front-end lowers (fx_einsum.py)."""
        xs = [self.tensor(node, i) for i in range(len(node.input))]
        eq = text(a["equation"])
        why = fx_einsum.problem(eq, [len(self.shapes[x]) + 1 for x in xs])
        if why:
            raise self.fail(node, f"equation {eq!r}: {why}")
        try:
            with torch.no_grad():
                probe = torch.einsum(eq, *(torch.zeros(2, *self.shapes[x]) for x in xs))
        except RuntimeError as exc:
            raise self.fail(node, f"equation {eq!r} does not fit its inputs: {exc}") from None
        self.emit(node.output, lambda env, root, eq=eq, xs=tuple(xs): torch.einsum(
            eq, *(env[x] for x in xs)), probe.shape[1:])  # fmt: skip

    def op_MatMul(self, node, a):
        x = self.tensor(node)
        if node.input[1] in self.shapes:  # of two tensors (attention): torch.matmul
            sa, sb = self.shapes[x], self.shapes[node.input[1]]
            try:
                shape = torch.matmul(torch.zeros(2, *sa), torch.zeros(2, *sb)).shape[1:]
            except RuntimeError as exc:
                raise self.fail(node, f"operands of per-sample shapes {sa} and {sb}: "
                                f"{exc}") from None  # fmt: skip
            if len(sa) != len(sb) or len(sa) < 2:
                raise self.fail(node, f"operands of per-sample shapes {sa} and {sb}: two "
                                "tensors of the same rank, at least 2, are supported")  # fmt: skip
            return self.emit(node.output, lambda env, root, p=x, q=node.input[1]: torch.matmul(
                env[p], env[q]), shape)  # fmt: skip
        w = self.const(node, 1, "second operand")
        w = np.asarray(w, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] != self.shapes[x][-1]:
            raise self.fail(node, f"the weight must be (K, N) with K = {self.shapes[x][-1]}, "
                            f"got {w.shape}")  # fmt: skip
        bias = None
        roles = {"weight": (node.input[1], "1 * B transposed")}  # as a Gemm's with transB=0
        out = node.output[0]
        nxt = next((n for n in self.nodes if out in n.input), None)
        if nxt is not None and nxt.op_type == "Add" and self.readers.get(out) == 1:
            other = nxt.input[1] if nxt.input[0] == out else nxt.input[0]
            shape = np.shape(self.consts[other].value) if other in self.consts else None
            if shape in ((w.shape[1],), (1, w.shape[1])):
                bias = np.asarray(self.consts[other].value, dtype=np.float64).reshape(-1)
                self.folded.add(id(nxt))
                roles["bias"] = (other, f"1 * C of shape {shape}")
                node = Renamed(node, nxt.output[0])
        lin = nn.Linear(w.shape[0], w.shape[1], bias=bias is not None, dtype=F64)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
            if bias is not None:
                lin.bias.copy_(torch.from_numpy(bias))
        self.module_step(node, lin, None, x)

    def reduce(self, node, a, fn):
        """A sum or mean over constant per-sample axes (an input from opset 18 on, an
        attribute before)."""
        x = self.tensor(node)
        rank = len(self.shapes[x]) + 1
        axes = self.const(node, 1, "axes")
        axes = a.get("axes") if axes is None else axes
        if (axes is None or np.size(axes) == 0) and a.get("noop_with_empty_axes", 0):
            return self.op_Identity(node, {})
        if axes is None or np.size(axes) == 0:
            raise self.fail(node, "a reduction over every axis mixes the samples of the batch")
        if any(not -rank <= int(v) < rank for v in np.ravel(axes)):
            raise self.fail(
                node, f"axes {[int(v) for v in np.ravel(axes)]} out of range for {rank} axes"
            )
        axes = sorted({int(v) % rank for v in np.ravel(axes)})
        if 0 in axes:
            raise self.fail(node, "a reduction over the batch axis mixes its samples")
        keep = bool(a.get("keepdims", 1))
        shape = [1 if i + 1 in axes else n for i, n in enumerate(self.shapes[x])
                 if keep or i + 1 not in axes]  # fmt: skip
        self.emit(node.output, lambda env, root, x=x, d=tuple(axes), k=keep: fn(
            env[x], d, keepdim=k), shape)  # fmt: skip

    def op_ReduceSum(self, node, a):
        self.reduce(node, a, torch.sum)

    def op_ReduceMean(self, node, a):
        self.reduce(node, a, torch.mean)

    def op_ReduceMax(self, node, a):
        """A maximum over per-sample axes: over one as torch's x.max(dim) (the gradient to
        the first maximum), over several as torch.amax (shared among tied maxima); the file
        says nothing of gradients, and torch writes both as ReduceMax."""
        self.reduce(node, a, lambda x, dims, keepdim: torch.max(x, dims[0], keepdim=keepdim)[0]
                    if len(dims) == 1 else torch.amax(x, dims, keepdim))  # fmt: skip

    def op_ReduceMin(self, node, a):
        """A minimum over per-sample axes, as x.min(dim) over one, torch.amin over several."""
        self.reduce(node, a, lambda x, dims, keepdim: torch.min(x, dims[0], keepdim=keepdim)[0]
                    if len(dims) == 1 else torch.amin(x, dims, keepdim))  # fmt: skip

    def activation(self, node, module):
        self.module_step(node, module)

    def op_Relu(self, node, a):
        self.activation(node, nn.ReLU())

    def op_Sigmoid(self, node, a):
        self.activation(node, nn.Sigmoid())

    def op_Tanh(self, node, a):
        self.activation(node, nn.Tanh())

    def op_LeakyRelu(self, node, a):
        self.activation(node, nn.LeakyReLU(a.get("alpha", 0.01)))

    def op_Elu(self, node, a):
        self.activation(node, nn.ELU(a.get("alpha", 1.0)))

    def op_Softplus(self, node, a):
        self.activation(node, nn.Softplus())

    def op_Gelu(self, node, a):
        approx = text(a.get("approximate", b"none"))
        self.activation(node, nn.GELU(approximate=approx))

    def op_HardSwish(self, node, a):
        self.activation(node, nn.Hardswish())

    def op_HardSigmoid(self, node, a):
        alpha, beta = float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))
        if math.isclose(alpha, 1 / 6, rel_tol=1e-6) and beta == 0.5:  # torch's
            return self.activation(node, nn.Hardsigmoid())
        x = self.tensor(node)  # ONNX's defaults, or any: alpha x + beta clamped to [0, 1]
        self.emit(node.output, lambda env, root, x=x: torch.clamp(env[x] * alpha + beta, 0.0, 1.0),
                  self.shapes[x])  # fmt: skip

    def op_Clip(self, node, a):
        bounds = []
        for i, what, unbounded in ((1, "min", -math.inf), (2, "max", math.inf)):
            v = self.const(node, i, what)
            if v is not None and np.size(v) != 1:
                raise self.fail(node, f"its {what} must be one number, got shape {np.shape(v)}")
            bounds.append(unbounded if v is None else float(np.asarray(v).reshape(())))
        if not bounds[0] < bounds[1]:
            raise self.fail(node, f"min {bounds[0]} must be below max {bounds[1]}")
        self.activation(node, nn.Hardtanh(*bounds))

    def op_Mish(self, node, a):
        self.activation(node, nn.Mish())

    def op_Selu(self, node, a):
        alpha, gamma = float(a.get("alpha", 1.6732632)), float(a.get("gamma", 1.0507010))
        if not (math.isclose(alpha, 1.6732632423543772, rel_tol=1e-6)
                and math.isclose(gamma, 1.0507009873554805, rel_tol=1e-6)):  # fmt: skip
            raise self.fail(node, f"alpha={alpha}, gamma={gamma}: only torch's SELU constants "
                            "(alpha 1.6732632, gamma 1.0507010) are supported")  # fmt: skip
        self.activation(node, nn.SELU())

    def op_PRelu(self, node, a):
        x = self.tensor(node)
        slope = np.asarray(self.const(node, 1, "slope"), dtype=np.float64)
        shape = self.shapes[x]
        rank = len(shape) + 1
        if rank < 2:
            raise self.fail(node, "needs an input with a channel axis, (N, C, ...)")
        padded = (1,) * (rank - slope.ndim) + slope.shape if slope.ndim <= rank else None
        if padded is None or padded[1] not in (1, shape[0]) or any(
                d != 1 for i, d in enumerate(padded) if i != 1):  # fmt: skip
            raise self.fail(node, f"slope of shape {slope.shape} is not one value per channel "
                            f"(axis 1) of {tuple(shape)} or one for all")  # fmt: skip
        prelu = nn.PReLU(slope.size, dtype=F64)
        with torch.no_grad():
            prelu.weight.copy_(torch.from_numpy(slope.reshape(-1).copy()))
        self.share(node, prelu, {"weight": (node.input[1], f"slope of shape {slope.shape}")})
        self.module_step(node, prelu, node.input[1], x)

    def embedding(self, node, a):
        """Gather(weight, indices, axis=0): torch's export of nn.Embedding."""
        w = np.asarray(self.const(node, 0, "weight"), dtype=np.float64)
        ids = self.tensor(node, 1)
        if a.get("axis", 0) != 0 or w.ndim != 2:
            raise self.fail(node, f"Gather of a weight of shape {w.shape} along axis "
                            f"{a.get('axis', 0)}: an embedding (rows of a 2-d weight) only")  # fmt: skip
        emb = nn.Embedding(*w.shape, dtype=F64)
        with torch.no_grad():
            emb.weight.copy_(torch.from_numpy(w))
        self.share(node, emb, {"weight": (node.input[0], "embedding rows")})
        path = self.place(node, emb, node.input[0])
        self.emit(node.output, lambda env, root, p=path, x=ids: root.get_submodule(p)(env[x]),
                  (*self.shapes[ids], w.shape[1]))  # fmt: skip

    def softmax(self, node, a, cls):
        x = self.tensor(node)
        rank = len(self.shapes[x]) + 1
        axis = a.get("axis", -1) % rank
        if axis == 0:
            raise self.fail(node, "a softmax over the batch axis is not supported")
        self.module_step(node, cls(dim=axis), None, x)

    def op_Softmax(self, node, a):
        self.softmax(node, a, nn.Softmax)

    def op_LogSoftmax(self, node, a):
        self.softmax(node, a, nn.LogSoftmax)

    def op_BatchNormalization(self, node, a):
        x = self.tensor(node)
        if a.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
            raise self.fail(node, "training mode is not supported (an inference graph)")
        rank = len(self.shapes[x])
        if rank not in (1, 2, 3, 4):
            raise self.fail(node, f"per-sample shape {self.shapes[x]}: (C,), (C, L), (C, H, W) or "
                            "(C, D, H, W)")  # fmt: skip
        scale, bias, mean, var = (np.asarray(self.const(node, i, w), dtype=np.float64)
                                  for i, w in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")))  # fmt: skip
        cls = {3: nn.BatchNorm2d, 4: nn.BatchNorm3d}.get(rank, nn.BatchNorm1d)
        bn = cls(self.shapes[x][0], eps=a.get("epsilon", 1e-5), momentum=1 - a.get("momentum", 0.9),
                 dtype=F64)  # fmt: skip
        with torch.no_grad():
            for t, v in (
                (bn.weight, scale),
                (bn.bias, bias),
                (bn.running_mean, mean),
                (bn.running_var, var),
            ):
                t.copy_(torch.from_numpy(v))
        self.share(node, bn, {"weight": (node.input[1], "scale"), "bias": (node.input[2], "B")})
        self.module_step(node, bn, node.input[1], x)

    def op_InstanceNormalization(self, node, a):
        """Per sample and channel over the rest (torch's exporter writes GroupNorm as this, on
        the input reshaped to (groups, values), then the channels' scale and shift)."""
        x = self.tensor(node)
        if len(self.shapes[x]) < 2:
            raise self.fail(node, f"per-sample shape {self.shapes[x]}: (C, ...) with an axis "
                            "after the channels")  # fmt: skip
        scale, bias = (np.asarray(self.const(node, i, w), dtype=np.float64)
                       for i, w in ((1, "scale"), (2, "B")))  # fmt: skip
        # a GroupNorm of one channel per group: the same, and (unlike InstanceNorm) torch takes
        # one value per channel, which onnx allows
        C = self.shapes[x][0]
        norm = nn.GroupNorm(C, C, eps=a.get("epsilon", 1e-5), affine=True, dtype=F64)
        with torch.no_grad():
            norm.weight.copy_(torch.from_numpy(scale))
            norm.bias.copy_(torch.from_numpy(bias))
        self.share(node, norm, {"weight": (node.input[1], "scale"), "bias": (node.input[2], "B")})
        self.module_step(node, norm, node.input[1], x)

    def op_Resize(self, node, a):
        """Resize as torch's Upsample / F.interpolate writes it: nearest (asymmetric, floor) or
        linear (half-pixel or aligned corners) over the spatial axes, by constant scales or
        sizes."""
        x = self.tensor(node)
        shape = self.shapes[x]
        text_of = {k: v.decode() if isinstance(v, bytes) else v for k, v in a.items()}
        mode = text_of.get("mode", "nearest")
        coords = text_of.get("coordinate_transformation_mode", "half_pixel")
        if a.get("antialias", 0) or a.get("exclude_outside", 0):
            raise self.fail(node, "antialias and exclude_outside are not supported")
        if text_of.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise self.fail(node, "keep_aspect_ratio_policy other than stretch is not supported")
        if len(shape) not in (2, 3):
            raise self.fail(node, f"per-sample shape {shape}: (C, L) or (C, H, W)")
        scales = self.const(node, 2, "scales")
        sizes = self.const(node, 3, "sizes")
        if scales is not None and np.size(scales) == 0:
            scales = None
        if (scales is None) == (sizes is None):
            raise self.fail(node, "give constant scales or sizes (one of them)")
        if scales is not None:
            scales = [float(v) for v in np.ravel(scales)]
            if len(scales) != len(shape) + 1 or scales[:2] != [1.0, 1.0]:
                raise self.fail(node, f"scales {scales}: the batch and channel axes must stay")
            kw = {"scale_factor": tuple(scales[2:])}
            out = [int(math.floor(n * f)) for n, f in zip(shape[1:], scales[2:], strict=True)]
            onnx_out = [int(np.floor(np.float32(n) * np.float32(f)))
                        for n, f in zip(shape[1:], scales[2:], strict=True)]  # fmt: skip
            if onnx_out != out:
                raise self.fail(node, f"scales {scales[2:]} give sizes {onnx_out} in onnx's float "
                                f"arithmetic and {out} in torch's; give sizes instead")  # fmt: skip
        else:
            sizes = list(np.ravel(sizes))
            if len(sizes) != len(shape) + 1 or sizes[0] is not BATCH or int(sizes[1]) != shape[0]:
                raise self.fail(node, f"sizes {sizes}: the batch and channel axes must stay")
            out = [int(v) for v in sizes[2:]]
            kw = {"size": tuple(out)}
        if mode == "nearest":
            if (
                coords != "asymmetric"
                or text_of.get("nearest_mode", "round_prefer_floor") != "floor"
            ):
                raise self.fail(node, f"nearest with coordinate_transformation_mode={coords!r}: "
                                "asymmetric with nearest_mode floor (torch's) is supported")  # fmt: skip
            kw["mode"] = "nearest"
        elif mode == "linear":
            if coords not in ("half_pixel", "pytorch_half_pixel", "align_corners") or (
                    coords == "pytorch_half_pixel" and 1 in out):  # fmt: skip
                raise self.fail(node, f"linear with coordinate_transformation_mode={coords!r}: "
                                "half_pixel or align_corners are supported")  # fmt: skip
            kw["mode"] = "linear" if len(shape) == 2 else "bilinear"
            kw["align_corners"] = coords == "align_corners"
        else:
            raise self.fail(node, f"mode={mode!r}: nearest and linear are supported")
        self.emit(node.output, lambda env, root, x=x, kw=kw: F.interpolate(env[x], **kw),
                  (shape[0], *out))  # fmt: skip

    def op_LayerNormalization(self, node, a):
        x = self.tensor(node)
        rank = len(self.shapes[x]) + 1
        axis = a.get("axis", -1) % rank
        if axis == 0 or (len(node.output) > 1 and any(node.output[1:])):
            raise self.fail(node, "axis 0 and the mean / inv_std outputs are not supported")
        if a.get("stash_type", 1) != 1:
            raise self.fail(node, f"stash_type={a['stash_type']}: only 1 (float32 statistics)")
        shape = self.shapes[x][axis - 1 :]
        scale = np.asarray(self.const(node, 1, "scale"), dtype=np.float64)
        b = self.const(node, 2, "bias")
        ln = nn.LayerNorm(shape, eps=a.get("epsilon", 1e-5), bias=b is not None, dtype=F64)
        with torch.no_grad():
            ln.weight.copy_(torch.from_numpy(np.broadcast_to(scale, shape).copy()))
            if b is not None:
                ln.bias.copy_(
                    torch.from_numpy(np.broadcast_to(np.asarray(b, np.float64), shape).copy())
                )
        roles = {"weight": (node.input[1], f"Scale of shape {scale.shape} broadcast to {shape}")}
        if b is not None:
            roles["bias"] = (node.input[2], f"B of shape {np.shape(b)} broadcast to {shape}")
        self.share(node, ln, roles)
        self.module_step(node, ln, node.input[1], x)
