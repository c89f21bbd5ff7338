"""ONNX file -> the same graph IR as the torch front-end -> a compiled model.

The ONNX graph is rebuilt as a ``torch.nn`` module whose layers are the ONNX nodes (a Gemm is a
``Linear`` holding its initializers, a Conv a ``Conv1d``/``Conv2d``, ...) and whose forward
replays the nodes in order; :func:`rootclad.compile` then traces it with the torch front-end,
so an imported model gets the same IR, checks, engines and hosts as any other. Layers are
placed at the path their weight initializer names (``fc1.weight`` -> ``fc1``), so a file
exported from torch compiles to a model with the torch module's parameter names. Everything is
checked here first: a node that is not supported, or an attribute outside what rootclad does,
is refused before any module is built, with the node's name, op and opset and the list of
supported ops. Integer "shape" arithmetic (Shape, Gather, Concat, ... as torch's exporter writes
for a flatten) is folded, with the batch axis kept symbolic.
"""

from __future__ import annotations

import keyword
import math
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rootclad.ir.graph import IRError

SUPPORTED = (
    "Gemm, MatMul (by a weight, with a following Add of a bias folded in), Add, Sub, Mul, Div "
    "(two tensors with broadcasting, or a tensor and a number), Relu, LeakyRelu, Elu, Sigmoid, "
    "Tanh, Softplus, Gelu (and the Erf form exporters write), Softmax, LogSoftmax, Conv (1-d, 2-d), MaxPool, AveragePool, "
    "GlobalAveragePool, GlobalMaxPool, BatchNormalization (inference), LayerNormalization, "
    "Flatten, Reshape, Transpose, Squeeze, Unsqueeze, Concat, Dropout, Identity, Constant, and "
    "the Shape/Gather/Slice/Concat/Cast arithmetic on shapes that torch's exporter writes"
)
MIN_OPSET = 13
# the attributes each op's handler reads (opset 13 and later): any other is refused by name, so
# an attribute a newer opset adds (AveragePool's dilations, opset 19) cannot be ignored
ATTRIBUTES = {
    "Gemm": {"alpha", "beta", "transA", "transB"},
    "LeakyRelu": {"alpha"},
    "Elu": {"alpha"},
    "Gelu": {"approximate"},
    "Softmax": {"axis"},
    "LogSoftmax": {"axis"},
    "Conv": {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
    # storage_order only orders the Indices output, which is refused
    "MaxPool": {
        "auto_pad",
        "ceil_mode",
        "dilations",
        "kernel_shape",
        "pads",
        "storage_order",
        "strides",
    },  # fmt: skip
    "AveragePool": {
        "auto_pad",
        "ceil_mode",
        "count_include_pad",
        "dilations",
        "kernel_shape",
        "pads",
        "strides",
    },  # fmt: skip
    "BatchNormalization": {"epsilon", "momentum", "training_mode"},
    "LayerNormalization": {"axis", "epsilon", "stash_type"},
    "Flatten": {"axis"},
    "Reshape": {"allowzero"},
    "Transpose": {"perm"},
    "Concat": {"axis"},
    "Dropout": {"seed"},  # no effect in inference
    "Constant": {"value"},
    "Shape": {"start", "end"},
    "Gather": {"axis"},
    "Cast": {"to", "saturate"},  # saturate: float8 targets only, which are refused
}
BATCH = "B"  # the batch axis in a folded shape


class _Const:
    """A value known when the file is read: an initializer, a Constant, or shape arithmetic
    (an int array in which BATCH stands for the batch size)."""

    def __init__(self, value):
        self.value = value


def _attrs(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _ints(values) -> list:
    return [v if v == BATCH else int(v) for v in values]


class _Builder:
    def __init__(self, model, where: str):
        import onnx

        self.where = where
        self.opset = next(
            (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None
        )
        newest = onnx.defs.onnx_opset_version()
        if self.opset is not None and self.opset > newest:
            raise IRError(
                f"{where}: ONNX opset {self.opset} is newer than the installed onnx package "
                f"knows ({newest}); upgrade onnx or export with an older opset"
            )
        if self.opset is None or self.opset < MIN_OPSET:
            raise IRError(
                f"{where}: ONNX opset {self.opset} is not supported; rootclad reads opset "
                f"{MIN_OPSET} and later (re-export with opset_version={MIN_OPSET} or newer)"
            )
        g = model.graph
        self.consts: dict[str, _Const] = {
            t.name: _Const(onnx.numpy_helper.to_array(t)) for t in g.initializer
        }
        self.initializers = {t.name for t in g.initializer}
        # initializer -> (its layout in the layer, the one parameter every node reading it uses)
        self.params: dict[str, tuple[str, nn.Parameter]] = {}
        self.inputs = [i for i in g.input if i.name not in self.consts]
        # the shapes the file declares (a symbolic axis by its name), checked against the nodes'
        self.declared = {
            v.name: [
                d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in t.shape.dim
            ]
            for v in [*g.value_info, *g.output]
            if (t := v.type.tensor_type).HasField("shape")
        }
        self.nodes = list(g.node)
        self.outputs = [o.name for o in g.output]
        self.steps: list = []  # (function of env, output names)
        names = [i.name for i in self.inputs]
        # the module itself from the start, so that a layer's name cannot take its attributes
        self.root = _module_class(len(names))(self.steps, names, self.outputs)
        self.shapes: dict[str, tuple] = {}  # per-sample shapes of tensors, batch excluded
        self.readers: dict[str, int] = {}
        for node in self.nodes:
            for name in node.input:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.folded: set[int] = set()  # nodes folded into others (or constants), by id
        self.identity_of: dict[str, str] = {}  # Identity / Dropout outputs -> their source
        self.dtype = None

    # -- errors and helpers ----------------------------------------------------------------
    def fail(self, node, why: str) -> IRError:
        label = node.name or (node.output[0] if node.output else "?")
        return IRError(
            f"{self.where}: node {label!r} ({node.op_type}, opset {self.opset}): {why}. "
            f"rootclad imports: {SUPPORTED}"
        )

    def const(self, node, i: int, what: str):
        name = node.input[i] if i < len(node.input) else ""
        if not name:
            return None
        if name not in self.consts:
            raise self.fail(node, f"its {what} ({name!r}) must be a constant (an initializer)")
        return np.array(self.consts[name].value)  # a writable copy (torch takes it)

    def tensor(self, node, i: int = 0) -> str:
        name = node.input[i]
        if name in self.consts or name not in self.shapes:
            raise self.fail(node, f"input {name!r} must be a tensor computed from the model input")
        return name

    def place(self, node, module: nn.Module, weight: str | None) -> str:
        """Add ``module`` at the path its weight initializer names (``fc1.weight`` -> ``fc1``),
        else at the node's name; returns the path."""
        path = weight.removesuffix(".weight") if weight and weight.endswith(".weight") else ""
        if not self.free_path(path):
            base = re.sub(r"\W+", "_", node.name or node.op_type).strip("_") or node.op_type
            path, k = base, 1
            while not _free(self.root, path):
                path, k = f"{base}_{k}", k + 1
        parent = self.root
        *heads, last = path.split(".")
        for part in heads:
            if part not in parent._modules:
                parent.add_module(part, nn.Module())
            parent = parent._modules[part]
        parent.add_module(last, module)
        return path

    def share(self, node, module: nn.Module, roles: dict) -> None:
        """Give ``module`` (built from copies) the parameters of the initializers it reads
        (``roles``: parameter -> (initializer, its layout in the layer)): one initializer is one
        parameter, however many nodes read it, and its gradient sums over their uses. A value
        from a Constant node is not a weight of the file: its parameter is frozen."""
        for role, (name, layout) in roles.items():
            param = getattr(module, role)
            if name not in self.initializers:
                param.requires_grad_(False)
            elif name not in self.params:
                self.params[name] = (layout, param)
            elif self.params[name][0] != layout or self.params[name][1].shape != param.shape:
                raise self.fail(node, f"initializer {name!r} is read here as {layout}, shape "
                                f"{tuple(param.shape)}, and by an earlier node as "
                                f"{self.params[name][0]}, shape {tuple(self.params[name][1].shape)}; "
                                "one parameter cannot be both")  # fmt: skip
            else:
                setattr(module, role, self.params[name][1])

    def free_path(self, path: str) -> bool:
        """A new layer can go at ``path``: on the way, containers made for earlier layers or
        free names; at the end, a free name (see :func:`_free`)."""
        *heads, last = path.split(".")
        parent = self.root
        for part in heads:
            if type(parent._modules.get(part)) is nn.Module:
                parent = parent._modules[part]
            elif _free(parent, part):
                parent = nn.Module()  # the container that will be made
            else:
                return False
        return _free(parent, last)

    def emit(self, outputs, fn, shape) -> None:
        self.steps.append((fn, outputs[0]))
        self.shapes[outputs[0]] = tuple(shape)

    def module_step(self, node, module, weight=None, x=None) -> None:
        x = x or self.tensor(node)
        try:
            with torch.no_grad():
                probe = module.to(torch.float64).eval()(
                    torch.zeros(2, *self.shapes[x], dtype=torch.float64)
                )
        except RuntimeError as exc:
            raise self.fail(node, f"its attributes do not fit its input: {exc}") from None
        path = self.place(node, module, weight)
        self.emit(
            node.output,
            lambda env, root, p=path, x=x: root.get_submodule(p)(env[x]),
            probe.shape[1:],
        )

    # -- the graph -------------------------------------------------------------------------
    def build(self) -> tuple[nn.Module, list[tuple[int, ...]], torch.dtype]:
        import onnx

        dtypes = set()
        for inp in self.inputs:
            t = inp.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            if len(dims) < 2:
                raise IRError(
                    f"{self.where}: input {inp.name!r} has shape {dims}: rootclad needs the batch "
                    "axis first and at least one axis after it"
                )
            if any(d is None for d in dims[1:]):
                raise IRError(
                    f"{self.where}: input {inp.name!r} has shape {dims}: the first axis is the "
                    "batch, the others must be fixed numbers"
                )
            self.shapes[inp.name] = tuple(dims[1:])
            dtypes.add(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
        if not dtypes <= {np.dtype("float32"), np.dtype("float64")}:
            raise IRError(f"{self.where}: inputs of type {sorted(map(str, dtypes))}; rootclad "
                          "takes float32 or float64")  # fmt: skip
        self.dtype = torch.float64 if np.dtype("float64") in dtypes else torch.float32
        for node in self.nodes:  # before any node is folded into a pattern
            unknown = sorted(a.name for a in node.attribute if a.name not in ATTRIBUTES.get(
                node.op_type, ()))  # fmt: skip
            if unknown and hasattr(self, f"op_{node.op_type}"):
                raise self.fail(node, f"attribute {', '.join(unknown)} is not supported")
        for node in self.nodes:  # constants first: patterns look ahead at them
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.op_Constant(node, _attrs(node))
                self.folded.add(id(node))
        for node in self.nodes:
            if node.domain not in ("", "ai.onnx"):
                raise self.fail(node, f"domain {node.domain!r} is not supported")
            if id(node) in self.folded:
                continue
            handler = getattr(self, f"op_{node.op_type}", None)
            if handler is None:
                raise self.fail(node, "op not supported")
            done = len(self.steps)
            handler(node, _attrs(node))
            for _, out in self.steps[done:]:
                self.check_declared(node, out)
        if len(self.outputs) != 1 or self.outputs[0] not in self.shapes:
            raise IRError(f"{self.where}: the graph must have one tensor output, it has "
                          f"{self.outputs}")  # fmt: skip
        names = [i.name for i in self.inputs]
        if self.identity_of.get(self.outputs[0], self.outputs[0]) in names:
            raise IRError(f"{self.where}: the graph computes nothing: its output "
                          f"{self.outputs[0]!r} is its input")  # fmt: skip
        return self.root.to(self.dtype).eval(), [self.shapes[n] for n in names], self.dtype

    def check_declared(self, node, name: str) -> None:
        """The shape ``node`` gives ``name`` is the one the file declares, where it does (its
        batch axis and symbolic axes aside)."""
        dims, got = self.declared.get(name), self.shapes[name]
        if dims is not None and (
            len(dims) != len(got) + 1
            or any(isinstance(d, int) and d != g for d, g in zip(dims[1:], got, strict=True))
        ):
            want = ", ".join(map(str, dims))
            raise self.fail(node, f"rootclad computes {name!r} of shape "
                            f"({', '.join(map(str, ('B', *got)))}), the file declares ({want})")  # fmt: skip

    # -- shape arithmetic ------------------------------------------------------------------
    def fold(self, node, value) -> None:
        self.consts[node.output[0]] = _Const(value)

    def op_Constant(self, node, a):
        import onnx

        if "value" not in a:
            raise self.fail(node, "only the 'value' form of Constant is supported")
        self.fold(node, onnx.numpy_helper.to_array(a["value"]))

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
            parts = [
                np.atleast_1d(np.asarray(self.consts[n].value, dtype=object)) for n in node.input
            ]
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
            raise self.fail(node, "Cast of a tensor is not supported")
        v = np.asarray(self.consts[node.input[0]].value)
        if v.dtype != object:  # shape arithmetic, where BATCH stands, is integer already
            v = v.astype(onnx.helper.tensor_dtype_to_np_dtype(a["to"]))
        self.fold(node, v)

    def op_Slice(self, node, a):
        data = self.const(node, 0, "data")
        starts, ends = self.const(node, 1, "starts"), self.const(node, 2, "ends")
        if np.ndim(data) != 1 or len(node.input) > 3:
            raise self.fail(node, "Slice is supported on shape vectors only")
        self.fold(node, np.asarray(data, dtype=object)[int(starts[0]) : int(ends[0])])

    # -- layout ----------------------------------------------------------------------------
    def reshape_step(self, node, shape) -> None:
        x = self.tensor(node)
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != math.prod(self.shapes[x]):
            raise self.fail(node, f"cannot reshape per-sample shape {self.shapes[x]} to {shape}")
        self.emit(node.output, lambda env, root, x=x, s=shape: env[x].reshape(-1, *s), shape)

    def op_Reshape(self, node, a):
        x = self.tensor(node)
        spec = list(np.asarray(self.const(node, 1, "shape"), dtype=object).ravel())
        if a.get("allowzero", 0):
            raise self.fail(node, "allowzero=1 is not supported")
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
        x = self.tensor(node)
        rank = len(self.shapes[x]) + 1
        perm = list(a.get("perm", range(rank - 1, -1, -1)))
        if perm[0] != 0:
            raise self.fail(node, f"perm={perm} moves the batch axis")
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

    # -- arithmetic ------------------------------------------------------------------------
    def binary(self, node, fn, number_on_left: bool = True):
        a_name, b_name = node.input[0], node.input[1]
        if a_name in self.consts and b_name in self.consts:
            a_v, b_v = self.consts[a_name].value, self.consts[b_name].value
            return self.fold(node, fn(np.asarray(a_v), np.asarray(b_v)))
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
        if c.size != 1:
            raise self.fail(node, f"operand {c_name!r} is a constant tensor of shape {c.shape}; "
                            "only numbers (and a MatMul's bias) are supported")  # fmt: skip
        x = a_name if tensor_first else b_name
        if c.ndim > len(self.shapes[x]) + 1:
            raise self.fail(node, f"constant {c_name!r} of shape {c.shape} has more axes than "
                            f"{x!r} (B, {', '.join(map(str, self.shapes[x]))}): broadcasting "
                            "puts axes before the batch axis, which must stay first")  # fmt: skip
        if not tensor_first and not number_on_left:
            raise self.fail(node, f"a number ({c_name!r}) on the left of {node.op_type} is not "
                            "supported")  # fmt: skip
        c = float(c.reshape(()))
        f = (lambda env, root, x=x, c=c: fn(env[x], c)) if tensor_first else (
            lambda env, root, x=x, c=c: fn(c, env[x]))  # fmt: skip
        self.emit(node.output, f, self.shapes[x])

    def op_Add(self, node, a):
        self.binary(node, lambda p, q: p + q)

    def op_Sub(self, node, a):
        self.binary(node, lambda p, q: p - q)

    def op_Mul(self, node, a):
        self.binary(node, lambda p, q: p * q)

    def op_Div(self, node, a):
        if not self.erf_gelu(node):
            self.binary(node, lambda p, q: p / q, number_on_left=False)

    def reader(self, name: str):
        """The one node that reads ``name`` (None when there are none or several)."""
        readers = [n for n in self.nodes if name in n.input]
        return readers[0] if len(readers) == 1 else None

    def number(self, name: str) -> float | None:
        v = self.consts.get(name)
        return float(np.asarray(v.value).reshape(())) if v and np.size(v.value) == 1 else None

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
        self.module_step(_Renamed(div, value), nn.GELU(), None, x)
        return True

    # -- layers ----------------------------------------------------------------------------
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
        lin = nn.Linear(k, n, bias=bias is not None)
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

    def op_MatMul(self, node, a):
        x = self.tensor(node)
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
                node = _Renamed(node, nxt.output[0])
        lin = nn.Linear(w.shape[0], w.shape[1], bias=bias is not None)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
            if bias is not None:
                lin.bias.copy_(torch.from_numpy(bias))
        self.module_step(node, lin, None, x)

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
        approx = a.get("approximate", b"none")
        approx = approx.decode() if isinstance(approx, bytes) else approx
        self.activation(node, nn.GELU(approximate=approx))

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

    def spatial(self, node, a, x, what: str) -> tuple[int, list, list, list]:
        """(dims, kernel, stride, symmetric pads) of a Conv or pool, refusing what torch's
        layers cannot express."""
        dims = len(self.shapes[x]) - 1
        if dims not in (1, 2):
            raise self.fail(node, f"{what} on per-sample shape {self.shapes[x]}: 1-d and 2-d only")
        auto = a.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        pads = list(a.get("pads", [0] * 2 * dims))
        if auto in ("SAME_UPPER", "SAME_LOWER"):  # output = ceil(input / stride)
            kernel = list(a.get("kernel_shape") or self.consts_shape(node, dims))
            strides = list(a.get("strides", [1] * dims))
            dil = list(a.get("dilations", [1] * dims))
            pads = [0] * 2 * dims
            for i in range(dims):
                n = self.shapes[x][1 + i]
                total = max(
                    0, (-(-n // strides[i]) - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - n
                )
                lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
                pads[i], pads[dims + i] = lo, total - lo
        elif auto not in ("NOTSET", "VALID"):
            raise self.fail(node, f"auto_pad={auto!r} is not supported")
        if pads[:dims] != pads[dims:]:
            raise self.fail(node, f"pads={pads} are not symmetric")
        return (
            dims,
            list(a.get("kernel_shape", [])),
            list(a.get("strides", [1] * dims)),
            pads[:dims],
        )

    def consts_shape(self, node, dims: int) -> list:
        """A Conv's kernel shape from its weight, when the node does not state it."""
        return list(np.shape(self.const(node, 1, "weight"))[2 : 2 + dims])

    def op_Conv(self, node, a):
        x = self.tensor(node)
        w = np.asarray(self.const(node, 1, "weight"), dtype=np.float64)
        dims, kernel, strides, pads = self.spatial(node, a, x, "Conv")
        if kernel and list(kernel) != list(w.shape[2:]):
            raise self.fail(node, f"kernel_shape={kernel} differs from the weight's {w.shape[2:]}")
        group = a.get("group", 1)
        dil = list(a.get("dilations", [1] * dims))
        cls = nn.Conv1d if dims == 1 else nn.Conv2d
        b = self.const(node, 2, "bias")
        conv = cls(self.shapes[x][0], w.shape[0], w.shape[2:], stride=strides, padding=pads,
                   dilation=dil, groups=group, bias=b is not None)  # fmt: skip
        if tuple(conv.weight.shape) != w.shape:
            raise self.fail(node, f"weight {w.shape} does not fit {self.shapes[x][0]} input "
                            f"channels in {group} groups")  # fmt: skip
        with torch.no_grad():
            conv.weight.copy_(torch.from_numpy(w))
            if b is not None:
                conv.bias.copy_(torch.from_numpy(np.asarray(b, dtype=np.float64)))
        roles = {"weight": (node.input[1], "W")}
        if b is not None:
            roles["bias"] = (node.input[2], "B")
        self.share(node, conv, roles)
        self.module_step(node, conv, node.input[1], x)

    def pool(self, node, a, kind: str):
        x = self.tensor(node)
        dims, k, s, p = self.spatial(node, a, x, kind)
        if a.get("ceil_mode", 0):
            raise self.fail(node, "ceil_mode=1 is not supported")
        if any(pi > ki // 2 for pi, ki in zip(p, k, strict=True)):
            raise self.fail(node, f"pads {p} larger than half the kernel {k} are not supported")
        if len(node.output) > 1 and node.output[1]:
            raise self.fail(node, "the Indices output is not supported")
        if any(d != 1 for d in a.get("dilations", [1] * dims)):
            raise self.fail(node, f"dilations={a['dilations']} are not supported (only 1)")
        if kind == "MaxPool":
            cls = nn.MaxPool1d if dims == 1 else nn.MaxPool2d
            mod = cls(k, stride=s, padding=p)
        else:
            cls = nn.AvgPool1d if dims == 1 else nn.AvgPool2d
            mod = cls(k, stride=s, padding=p, count_include_pad=bool(a.get("count_include_pad", 0)))
        self.module_step(node, mod, None, x)

    def op_MaxPool(self, node, a):
        self.pool(node, a, "MaxPool")

    def op_AveragePool(self, node, a):
        self.pool(node, a, "AveragePool")

    def global_pool(self, node, kind):
        x = self.tensor(node)
        dims = len(self.shapes[x]) - 1
        if dims not in (1, 2):
            raise self.fail(node, f"per-sample shape {self.shapes[x]}: 1-d and 2-d only")
        cls = {("avg", 1): nn.AdaptiveAvgPool1d, ("avg", 2): nn.AdaptiveAvgPool2d,
               ("max", 1): nn.AdaptiveMaxPool1d, ("max", 2): nn.AdaptiveMaxPool2d}[kind, dims]  # fmt: skip
        self.module_step(node, cls(1), None, x)

    def op_GlobalAveragePool(self, node, a):
        self.global_pool(node, "avg")

    def op_GlobalMaxPool(self, node, a):
        self.global_pool(node, "max")

    def op_BatchNormalization(self, node, a):
        x = self.tensor(node)
        if a.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
            raise self.fail(node, "training mode is not supported (an inference graph)")
        rank = len(self.shapes[x])
        if rank not in (1, 2, 3):
            raise self.fail(node, f"per-sample shape {self.shapes[x]}: (C,), (C, L) or (C, H, W)")
        scale, bias, mean, var = (np.asarray(self.const(node, i, w), dtype=np.float64)
                                  for i, w in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")))  # fmt: skip
        cls = nn.BatchNorm2d if rank == 3 else nn.BatchNorm1d
        bn = cls(self.shapes[x][0], eps=a.get("epsilon", 1e-5), momentum=1 - a.get("momentum", 0.9))
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
        ln = nn.LayerNorm(shape, eps=a.get("epsilon", 1e-5), bias=b is not None)
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


def _free(parent: nn.Module, name: str) -> bool:
    """``name`` can be a new layer of ``parent``: not a Python keyword (torch.fx writes
    ``self.<name>`` for an identifier, getattr otherwise), not taken by a layer or by the
    module's own attributes (``training``, ``forward``, ...)."""
    return (
        bool(name) and "." not in name and not keyword.iskeyword(name) and not hasattr(parent, name)
    )


class _Renamed:
    """A node seen with another output name (a MatMul that takes its Add's output)."""

    def __init__(self, node, output: str):
        self.name, self.op_type, self.input, self.output = (
            node.name,
            node.op_type,
            node.input,
            [output],
        )


class _OnnxModule(nn.Module):
    """The ONNX graph as a torch module: its layers are submodules, forward replays the
    nodes in order (torch.fx traces through it)."""

    def __init__(self, steps, inputs: list[str], outputs: list[str]):
        super().__init__()
        self._steps, self._inputs, self._outputs = steps, inputs, outputs  # outputs: one

    def run(self, xs):
        env = dict(zip(self._inputs, xs, strict=True))
        for fn, out in self._steps:
            env[out] = fn(env, self)
        return env[self._outputs[0]]


def _module_class(n: int) -> type:
    """An _OnnxModule whose forward takes exactly n tensors (torch.fx makes one input of each
    parameter)."""
    args = ", ".join(f"x{i}" for i in range(n))  # none: the file is refused later, saying why
    ns: dict = {}
    exec(f"def forward(self, {args}):\n    return self.run(({args}{',' * (n > 0)}))", ns)
    return type(f"OnnxModel{n}", (_OnnxModule,), {"forward": ns["forward"]})


def to_module(model) -> tuple[nn.Module, list[tuple[int, ...]], torch.dtype]:
    """An ONNX ``ModelProto`` (or a path) as (torch module, per-sample input shapes, dtype)."""
    import onnx

    where = "ONNX model"
    if isinstance(model, (str, Path)):
        where = str(model)
        if not Path(model).is_file():
            raise FileNotFoundError(f"{where}: no such ONNX file")
        try:
            model = onnx.load(str(model))
        except Exception as exc:  # protobuf's DecodeError, a missing external-data file, ...
            raise IRError(f"{where}: cannot read the ONNX file: {exc}") from exc
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise IRError(f"{where}: not a valid ONNX model: {exc}") from exc
    return _Builder(model, where).build()


def load(model, loss: str = "bce_with_logits", *, engine: str = "auto", pullbacks: bool = True,
         dtype: torch.dtype | None = None, seed: int = 0):  # fmt: skip
    """Compile an ONNX file (or ``ModelProto``) into a :class:`rootclad.torch.CompiledModel`:
    the same API as :func:`rootclad.compile` (``cm(x)``, ``input_grad``, ``loss_and_grad``,
    ``train_step``). The first input axis is the batch; the others must be fixed. dtype
    defaults to the graph's (float64 if an input is float64, else float32)."""
    import rootclad

    module, shapes, graph_dtype = to_module(model)
    dtype = dtype or graph_dtype
    examples = tuple(torch.zeros(2, *s, dtype=dtype) for s in shapes)
    example = examples[0] if len(examples) == 1 else examples
    return rootclad.compile(module.to(dtype), example, loss, engine=engine, pullbacks=pullbacks,
                            dtype=dtype, seed=seed)  # fmt: skip
