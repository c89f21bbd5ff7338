"""The ONNX graph rebuilt as a ``torch.nn`` module whose layers are its nodes and whose forward
replays them in order. Layers are placed at the path their weight initializer names
(``fc1.weight`` -> ``fc1``), so a file exported from torch compiles to a model with the torch
module's parameter names. Everything is checked here first: a node that is not supported, or
an attribute outside what rootclad does, is refused before any module is built, with the
node's name, op and opset and the list of supported ops."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rootclad.frontends.onnx import attention, folding, index_layers, layers, recurrent_layers
from rootclad.frontends.onnx.common import Const, attributes
from rootclad.frontends.onnx.conv_layers import ConvOps
from rootclad.frontends.onnx.folding import ShapeOps
from rootclad.frontends.onnx.index_layers import IndexOps
from rootclad.frontends.onnx.layers import SUPPORTED, LayerOps
from rootclad.frontends.onnx.limits import Budget
from rootclad.frontends.onnx.recurrent_layers import RecurrentOps
from rootclad.ir.graph import IRError

MIN_OPSET = 13
# what may read an integer input (indices): a Gather of a weight by them (an embedding), and
# the slicing, reshaping and integer casts between the input and it
INDEX_OPS = ("Gather", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Slice", "Split",
             "Transpose", "Identity", "Shape", "Cast", "Equal")  # fmt: skip
# what keeps a mask a mask (a later Cast makes it 1s and 0s of a float type)
MASK_LAYOUT = ("Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Slice", "Split",
               "Identity", "Expand", "Tile")  # fmt: skip
ATTRIBUTES = {**folding.ATTRIBUTES, **layers.ATTRIBUTES, **index_layers.ATTRIBUTES,
              **recurrent_layers.ATTRIBUTES}  # fmt: skip


class Builder(ShapeOps, LayerOps, ConvOps, IndexOps, RecurrentOps):
    """An ONNX graph rebuilt as a torch module (see :func:`rootclad.frontends.onnx.to_module`)."""

    def __init__(self, model, where: str, budget: Budget | None = None):
        import onnx

        self.where = where
        self.budget = budget or Budget(where)
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
        self.consts: dict[str, Const] = {
            # a copy: onnx reads raw data into read-only arrays, which torch takes with a warning
            t.name: Const(np.array(onnx.numpy_helper.to_array(t)))
            for t in g.initializer
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
        self.model, self.nodes = model, list(g.node)
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
        # Identity nodes of initializers: torch's TorchScript exporter writes one where two
        # parameters hold equal values, named as the second (a deep copy's, a bias of zeros
        # beside another): each is a parameter of its own, starting at the initializer's value
        self.aliases: dict[str, str] = {}
        for node in self.nodes:
            if node.op_type == "Identity" and node.input and node.output:
                src = self.aliases.get(node.input[0], node.input[0])
                if src in self.initializers:
                    self.aliases[node.output[0]] = src
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
            base = re.sub(r"[^A-Za-z0-9_]+", "_", node.name or node.op_type).strip("_")
            base = base or node.op_type
            path, k = base, 1
            while not _free(self.root, path):
                path, k = f"{base}_{k}", k + 1
        parent, last = self.parent_of(path)
        parent.add_module(last, module)
        return path

    def parent_of(self, path: str) -> tuple[nn.Module, str]:
        """The module that holds ``path``'s last part (containers made on the way), and it."""
        parent = self.root
        *heads, last = path.split(".")
        for part in heads:
            if part not in parent._modules:
                parent.add_module(part, nn.Module())
            parent = parent._modules[part]
        return parent, last

    def place_parameter(self, node, name: str, param: nn.Parameter) -> str:
        """Register ``param`` (read directly) at the path initializer ``name`` spells, else as
        the weight of a holder at the node's name; one already registered (an initializer read
        twice) keeps its place. Returns its dotted name."""
        for dotted, p in self.root.named_parameters():
            if p is param:
                return dotted
        if self.free_path(name):
            parent, last = self.parent_of(name)
            parent.register_parameter(last, param)
            return name
        holder = nn.Module()
        holder.weight = param
        return f"{self.place(node, holder, None)}.weight"

    def share(self, node, module: nn.Module, roles: dict) -> None:
        """Give ``module`` (built from copies) the parameters of the initializers it reads
        (``roles``: parameter -> (initializer, its layout in the layer)): one initializer is one
        parameter, however many nodes read it, and its gradient sums over their uses. A value
        from a Constant node is not a weight of the file: its parameter is frozen."""
        for role, (name, layout) in roles.items():
            param = getattr(module, role)
            if name not in self.initializers and name not in self.aliases:
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
        self.budget.value(f"value {outputs[0]!r}", shape, self.dtype.itemsize)
        self.steps.append((fn, outputs[0]))
        self.shapes[outputs[0]] = tuple(shape)

    def module_step(self, node, module, weight=None, x=None) -> None:
        x = x or self.tensor(node)
        try:
            with torch.no_grad():
                probe = module.to(torch.float64).eval()(
                    torch.zeros(2, *self.shapes[x], dtype=torch.float64)
                )
        except (RuntimeError, ValueError) as exc:
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

        dtypes, integers = set(), {np.dtype("int32"), np.dtype("int64")}
        self.int_tensors: set[str] = set()  # the integer inputs and their slices
        self.topk_indices: set[str] = set()  # a TopK's indices and their layouts
        self.masks: set[str] = set()  # boolean tensors (Equal of a tensor and a number, Not)
        # values whose batch axis is not the first, around LSTM / GRU (recurrent_layers.py)
        self.layouts: dict[str, tuple] = {}
        self.root.input_dtypes = []  # an integer input's torch type (indices), None: floats
        for inp in self.inputs:
            t = inp.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            if len(dims) < 2:
                raise IRError(
                    f"{self.where}: input {inp.name!r} has shape {dims}: rootclad needs the batch "
                    "axis first and at least one axis after it"
                )
            if any(d is None or d < 1 for d in dims[1:]):
                raise IRError(
                    f"{self.where}: input {inp.name!r} has shape {dims}: the first axis is the "
                    "batch, the others must be fixed positive numbers"
                )
            kind = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            self.budget.value(f"input {inp.name!r}", dims[1:], np.dtype(kind).itemsize)
            self.shapes[inp.name] = tuple(dims[1:])
            boolean = kind == np.dtype("bool")  # a mask (padding, attention)
            self.root.input_dtypes.append(
                torch.int64 if kind in integers else torch.bool if boolean else None
            )
            if kind in integers:
                self.int_tensors.add(inp.name)
            if boolean:
                self.masks.add(inp.name)
            dtypes.add(kind)
        if not dtypes <= {np.dtype("float32"), np.dtype("float64"), np.dtype("bool"), *integers}:
            raise IRError(f"{self.where}: inputs of type {sorted(map(str, dtypes))}; rootclad "
                          "takes float32 or float64, int32 or int64 indices (of Gather on a "
                          "weight: an embedding) and bool masks")  # fmt: skip
        floats = dtypes - integers - {np.dtype("bool")} or {  # a graph of indices only: its weights' type
            np.asarray(c.value).dtype for n, c in self.consts.items() if n in self.initializers
            and np.asarray(c.value).dtype in (np.float32, np.float64)} or {np.dtype("float32")}  # fmt: skip
        self.dtype = torch.float64 if np.dtype("float64") in floats else torch.float32
        for node in self.nodes:  # before any node is folded into a pattern
            unknown = sorted(a.name for a in node.attribute if a.name not in ATTRIBUTES.get(
                node.op_type, ()))  # fmt: skip
            if unknown and hasattr(self, f"op_{node.op_type}"):
                raise self.fail(node, f"attribute {', '.join(unknown)} is not supported")
        for node in self.nodes:  # constants first: patterns look ahead at them
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.op_Constant(node, attributes(node))
                self.folded.add(id(node))
        # attention blocks as torch writes them: one layer each, computed at their last node
        self.fused = {}
        for block in attention.find(self, self.model):
            last = block.nodes[-1]
            self.fused[id(last)] = block
            self.folded.update(id(n) for n in block.nodes if n is not last)
        if self.fused:
            self.fold_dead()
        for node in self.nodes:
            if id(node) in self.folded:
                continue
            if id(node) in self.fused:
                self.attention_step(node, self.fused[id(node)])
                continue
            if node.domain not in ("", "ai.onnx"):
                raise self.fail(node, f"domain {node.domain!r} is not supported")
            handler = getattr(self, f"op_{node.op_type}", None)
            if handler is None:
                raise self.fail(node, "op not supported")
            self.check_indices(node)
            self.check_topk_indices(node)
            if self.follow_layout(node):
                continue
            done = len(self.steps)
            handler(node, attributes(node))
            if node.input and node.input[0] in self.masks and node.op_type in MASK_LAYOUT:
                self.masks.update(node.output)  # a mask reshaped is a mask
            for _, out in self.steps[done:]:
                self.check_declared(node, out)
        names = [i.name for i in self.inputs]
        for out in self.outputs:  # several: the module returns a dict by their names
            if out in self.topk_indices or out in self.int_tensors or out in self.masks:
                why = (f"the graph's output {out!r} holds integers or booleans (indices, a mask); "
                       "rootclad computes float outputs")  # fmt: skip
                node = next((n for n in self.nodes if out in n.output), None)
                raise self.fail(node, why) if node else IRError(f"{self.where}: {why}")
            if out in self.consts:
                raise IRError(f"{self.where}: the graph computes nothing from its input: its "
                              f"output {out!r} is a constant (shapes and constants "
                              "alone)")  # fmt: skip
            if out not in self.shapes:
                raise IRError(f"{self.where}: the graph's output {out!r} is not a tensor "
                              f"computed per sample; its outputs: {self.outputs}")  # fmt: skip
            if self.identity_of.get(out, out) in names:
                raise IRError(f"{self.where}: the graph computes nothing: its output "
                              f"{out!r} is its input")  # fmt: skip
        return self.root.to(self.dtype).eval(), [self.shapes[n] for n in names], self.dtype

    def fold_dead(self) -> None:
        """Fold the nodes no output depends on any more (what fused blocks read no longer)."""
        live, todo = set(), list(self.outputs)
        producer = {o: n for n in self.nodes for o in n.output}
        while todo:
            node = producer.get(todo.pop())
            if node is None or id(node) in live:
                continue
            live.add(id(node))
            block = self.fused.get(id(node))
            todo.extend([block.x, block.kv, *([block.mask] if block.mask else [])] if block
                        else node.input)  # fmt: skip
        self.folded.update(id(n) for n in self.nodes if id(n) not in live)

    def attention_step(self, node, block) -> None:
        """An attention block (attention.py) as one nn.MultiheadAttention."""
        mha = attention.layer(self, block, node)
        weight, _, out_layout = block.weights["out"]
        # the layer's path: its output projection's (torch names that weight where it has a
        # bias) or the scope torch's node names spell (/encoder/layers.0/self_attn/Transpose_7)
        base = (
            weight.removesuffix(".out_proj.weight") if weight.endswith(".out_proj.weight") else ""
        )
        scope = re.fullmatch(r"/((?:[\w.]+/)*[\w.]+)/\w+", node.name or "")
        base = base or (scope.group(1).replace("/", ".") if scope else "")
        path = self.place(node, mha, f"{base}.weight" if base else None)
        name, _, layout = block.weights["in"]
        roles = {"in_proj_weight": (name, layout)}
        if block.weights["in_bias"]:
            roles["in_proj_bias"] = (block.weights["in_bias"], "in_proj_bias")
        self.share(node, mha, roles)
        roles = {"weight": (weight, out_layout)}
        if block.weights["out_bias"]:
            roles["bias"] = (block.weights["out_bias"], "out_proj bias")
        self.share(node, mha.out_proj, roles)
        x, kv, m = block.x, block.kv, block.mask
        self.emit([block.y], lambda env, root, p=path, x=x, kv=kv, m=m: root.get_submodule(p)(
            env[x], env[kv], env[kv], key_padding_mask=env[m] if m else None,
            need_weights=False)[0], self.shapes[x])  # fmt: skip

    def check_indices(self, node) -> None:
        """An integer input reaches only a Gather of a weight, through slicing, reshaping and
        integer casts; what these make of it is integer too."""
        ints = [i for i in node.input if i in self.int_tensors]
        if not ints:
            return
        to = attributes(node).get("to")
        if node.op_type not in INDEX_OPS or (node.op_type == "Cast" and to not in (6, 7)):
            raise self.fail(node, f"reads {ints[0]!r}, integer indices; rootclad takes an integer "
                            "input as the indices of a Gather of a weight (an embedding), "
                            "through slicing and reshaping")  # fmt: skip
        if node.input[0] in self.int_tensors and node.op_type not in ("Shape", "Equal"):
            self.int_tensors.update(node.output)

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
    def reader(self, name: str):
        """The one node that reads ``name`` (None when there are none or several)."""
        readers = [n for n in self.nodes if name in n.input]
        return readers[0] if len(readers) == 1 else None

    def const_ints(self, node, i: int, what: str) -> list[int]:
        """Input ``i``, a constant of integers (not shape arithmetic holding the batch size)."""
        values = list(np.ravel(np.asarray(self.const(node, i, what), dtype=object)))
        if any(isinstance(v, str) or not float(v).is_integer() for v in values):
            raise self.fail(node, f"its {what} {values} depend on the batch size or are not "
                            "integers")  # fmt: skip
        return [int(v) for v in values]

    def number(self, name: str) -> float | None:
        v = self.consts.get(name)
        return float(np.asarray(v.value).reshape(())) if v and np.size(v.value) == 1 else None


def _free(parent: nn.Module, name: str) -> bool:
    """``name`` can be a new layer of ``parent``: ASCII letters, digits and ``_`` only (torch.fx
    writes layer names into the Python source of its trace, so a name from the file that is not
    that plain is replaced by one made from the node's), not a Python keyword, not taken by a
    layer or by the module's own attributes (``training``, ``forward``, ...)."""
    return (
        bool(re.fullmatch(r"[A-Za-z0-9_]+", name))
        and not keyword.iskeyword(name)
        and not hasattr(parent, name)
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
        if len(self._outputs) == 1:
            return env[self._outputs[0]]
        return {name: env[name] for name in self._outputs}


def _module_class(n: int) -> type:
    """An _OnnxModule whose forward takes exactly n tensors (torch.fx makes one input of each
    parameter)."""
    args = ", ".join(f"x{i}" for i in range(n))  # none: the file is refused later, saying why
    ns: dict = {}
    exec(f"def forward(self, {args}):\n    return self.run(({args}{',' * (n > 0)}))", ns)
    return type(f"OnnxModel{n}", (_OnnxModule,), {"forward": ns["forward"]})


def to_module(model) -> tuple[nn.Module, list[tuple[int, ...]], torch.dtype]:
    """An ONNX ``ModelProto`` (or a path, or a file's bytes) as (torch module, per-sample input
    shapes, dtype)."""
    return Builder(*read(model)).build()


def read(model):
    """(the checked ``ModelProto``, where it is from, its :class:`Budget`) of a ModelProto, a
    path or a file's bytes: its sizes bounded before its external data is read."""
    import onnx

    where = "ONNX model"
    if isinstance(model, (bytes, bytearray)):  # a file's contents (torch.onnx.export to BytesIO)
        try:
            model = onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise IRError(f"{where}: cannot read the ONNX bytes: {exc}") from exc
    base = None
    if isinstance(model, (str, Path)):
        where, base = str(model), Path(model).parent
        if not Path(model).is_file():
            raise FileNotFoundError(f"{where}: no such ONNX file")
        try:  # its external data (if any) once its size is known to be within the limits
            model = onnx.load(str(model), load_external_data=False)
        except Exception as exc:  # protobuf's DecodeError, ...
            raise IRError(f"{where}: cannot read the ONNX file: {exc}") from exc
    budget = Budget(where)
    budget.parameters(_tensors(model.graph))
    if base is not None:
        budget.external(model.graph.initializer, base)
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(base))
        except Exception as exc:  # a missing or unsafe external-data file, ...
            raise IRError(f"{where}: cannot read the ONNX file's external data: {exc}") from exc
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise IRError(f"{where}: not a valid ONNX model: {exc}") from exc
    return model, where, budget


def _tensors(graph) -> list:
    """The tensors a graph holds: its initializers and its Constant nodes' values."""
    return [*graph.initializer] + [
        a.t
        for node in graph.node
        if node.op_type == "Constant"
        for a in node.attribute
        if a.name == "value"
    ]
