"""Multi-head attention as torch's exporter writes ``nn.MultiheadAttention`` (and with it
``nn.TransformerEncoderLayer``), found in an ONNX graph and imported as that layer.

torch writes the block over the sequence-first layout, with the batch axis merged into the
heads' ((B*H, L, d) products), and reshapes by shapes computed from the input's: nodes whose
values hold the batch size, which rootclad's per-sample import refuses one by one. Read as a
whole, the block is one layer. From each ``Softmax`` whose scores are a product of two tensors
(plus a mask, both sides maybe scaled: torch's baddbmm) and whose probabilities multiply a
third, the importer follows:

- the query, key and value back through layout ops (Reshape, Transpose, Squeeze, Unsqueeze,
  Gather, Slice, Split, Cast), scalings by constants and the projections' biases to their
  input projection: for self-attention one packed MatMul or Gemm by a weight of 3E outputs
  reading one batch-first input X (a Transpose to the sequence-first layout between); for
  cross-attention (``attn(q, kv, kv)``) the query's and the key-value's MatMuls by slices of
  one ``in_proj_weight`` (3E, E), read with its bias (3E,) by shape;
- the probabilities' product forward through layout ops to the output projection and back to
  the batch-first layout: the block's output Y (each place it could be, shortest first);
- the scores' added mask, where there is one, back through layout ops to torch's key padding
  mask: ``Where(mask, -inf, 0)`` of a boolean (B, S) mask the model computes (the encoder's
  ``src_key_padding_mask``).

The block (every node between X, the keys' input, the mask and Y) must read no weight of the
file but the two projections' (a learned temperature is not torch's layer). It is then
**checked by evaluation**: onnx's reference evaluator runs its nodes at two batch sizes on
random inputs and padding, with random values in place of its weights and then with the
file's, and ``nn.MultiheadAttention`` built from the same weights must give the same Y (the
heads' count read from the scores' shape there). A block that passes becomes that layer, placed
at the path torch's names give (``encoder.layers.0.self_attn``), its parameters the file's
initializers (builder.py); one that does not match the pattern or the evaluation is left to
the node-by-node import, which imports attention written per sample and refuses the rest
naming the first node it cannot take."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rootclad.frontends.onnx.common import attributes

LAYOUT = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice", "Split",
          "Identity", "Expand", "Cast")  # fmt: skip
F64 = torch.float64


class Block:
    """One attention block found: its query's input and its key's and value's (the same
    for self-attention), boolean padding mask (or None), output, the nodes it replaces, its
    weights, and the layer that computes it (after the check)."""

    def __init__(self, x, kv, mask, mask_float, y, nodes, scores, weights):
        self.x, self.kv, self.mask, self.mask_float, self.y = x, kv, mask, mask_float, y
        self.nodes, self.scores, self.weights = nodes, scores, weights
        self.layer: nn.MultiheadAttention | None = None
        self.reads: set = set()  # the initializers it reads (its weights)
        self.shape: tuple = ()  # its query's per-sample shape, where it was checked
        self.kv_shape: tuple = ()  # its key's and value's


def find(b, model) -> list[Block]:
    """The attention blocks of builder ``b``'s graph (``model``) that match the pattern and
    pass the evaluation; a block that does not is left to the node-by-node import."""
    import onnx

    producer = {o: n for n in b.nodes for o in n.output}
    readers: dict[str, list] = {}
    for n in b.nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    softmaxes = [n for n in b.nodes if n.op_type == "Softmax"]
    if not softmaxes:
        return []
    try:  # the per-sample shapes of the blocks' inputs
        g = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # a file onnx cannot infer: no block is read as one
        return []
    shapes = {}
    for v in [*g.input, *g.value_info]:
        dims = v.type.tensor_type.shape.dim
        if len(dims) > 1 and all(d.HasField("dim_value") for d in dims[1:]):
            shapes[v.name] = tuple(d.dim_value for d in dims[1:])
    blocks, taken = [], set()
    for soft in softmaxes:
        for block in _match(b, soft, producer, readers):
            if any(id(n) in taken for n in block.nodes) or not (
                len(shapes.get(block.x, ())) == len(shapes.get(block.kv, ())) == 2
            ):
                continue
            block.shape, block.kv_shape = shapes[block.x], shapes[block.kv]
            if _check(b, block) is None:
                blocks.append(block)
                taken.update(id(n) for n in block.nodes)
                break
    return blocks


def layer(b, block, node) -> nn.MultiheadAttention:
    """The block's layer (checked when found); refused, naming ``node`` (the block's last),
    where the import computes another shape for its input or mask than the check used."""
    for name, shape in ((block.x, block.shape), (block.kv, block.kv_shape)):
        if b.shapes.get(name) != shape:
            raise b.fail(node, f"an attention block (as torch writes nn.MultiheadAttention) "
                         f"reads {name!r} of per-sample shape {b.shapes.get(name)}; it was "
                         f"checked at {shape}")  # fmt: skip
    if block.mask is not None and (block.mask not in b.masks or b.shapes.get(block.mask)
                                   != block.kv_shape[:1]):  # fmt: skip
        raise b.fail(node, f"the attention block's padding mask {block.mask!r} is not a boolean "
                     f"(B, {block.kv_shape[0]}) mask computed from the inputs")  # fmt: skip
    return block.layer


def _init(b, name) -> str | None:
    """The initializer ``name`` is (directly or through Identity nodes), or None."""
    name = b.aliases.get(name, name)
    return name if name in b.initializers else None


def _const(b, name):
    c = b.consts.get(b.aliases.get(name, name))
    return None if c is None else np.asarray(c.value)


def _static(b, value, producer, memo) -> bool:
    """``value`` is known without the data and is no weight: a Constant, or arithmetic on
    Constants and shapes."""
    if value in b.initializers or value in b.aliases:
        return False  # a weight of the file: learned, never part of the pattern
    if value in b.consts or value in memo:
        return value in b.consts or memo[value]
    node = producer.get(value)
    memo[value] = False
    if node is not None:
        memo[value] = node.op_type == "Shape" or (node.op_type != "Constant" and all(
            _static(b, i, producer, memo) for i in node.input if i))  # fmt: skip
    return memo[value]


def _of_weights(b, value, producer, memo) -> bool:
    """``value`` is computed from the file's weights, constants and shapes alone (a slice of
    ``in_proj_weight``, as torch writes cross-attention's projections)."""
    if _init(b, value) or value in b.consts:
        return True
    key = ("weights", value)
    if key not in memo:
        memo[key] = False
        node = producer.get(value)
        if node is not None and node.op_type != "Constant":
            memo[key] = node.op_type == "Shape" or all(
                _of_weights(b, i, producer, memo) for i in node.input if i
            )
    return memo[key]


def _reads_weights(b, value, producer, memo) -> bool:
    return _of_weights(b, value, producer, memo) and not _static(b, value, producer, memo)


def _data_input(b, node, producer, memo) -> str | None:
    """The tensor a layout op, a scaling by a constant or a projection's bias passes on."""
    if node.op_type in LAYOUT:
        return node.input[0]
    if node.op_type == "Add" and len(node.input) == 2:  # a MatMul projection's bias
        for i, j in ((0, 1), (1, 0)):
            mm = producer.get(node.input[i])
            if (_reads_weights(b, node.input[j], producer, memo) and mm is not None
                    and mm.op_type == "MatMul"
                    and _reads_weights(b, mm.input[1], producer, memo)):  # fmt: skip
                return node.input[i]
    if node.op_type in ("Mul", "Div", "Add", "Sub") and len(node.input) == 2:
        static = [_static(b, i, producer, memo) for i in node.input]
        if static == [False, True]:
            return node.input[0]
        if static == [True, False] and node.op_type in ("Mul", "Add"):
            return node.input[1]
    return None


def _projection(b, value, producer, memo):
    """Follow ``value`` back to the MatMul/Gemm by a weight that makes it: (node, weight as
    torch's (out, in) or None where it is computed from weights, bias or None, the node's
    data input); None if it does not."""
    seen = 0
    while seen < 64:
        node = producer.get(value)
        if node is None:
            return None
        if node.op_type in ("MatMul", "Gemm") and _init(b, node.input[1]):
            w = _const(b, node.input[1]).astype(np.float64)
            a = attributes(node)
            if w.ndim != 2 or a.get("transA", 0) or a.get("alpha", 1.0) != 1.0:
                return None
            w = w if node.op_type == "Gemm" and a.get("transB", 0) else w.T
            bias = None
            if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
                if not _init(b, node.input[2]):
                    return None
                bias = (node.input[2], a.get("beta", 1.0))
            return node, w, bias, node.input[0]
        if node.op_type == "MatMul" and _reads_weights(b, node.input[1], producer, memo):
            return node, None, None, node.input[0]  # by a slice of a weight: read by shape
        nxt = _data_input(b, node, producer, memo)
        if nxt is None:
            return None
        value, seen = nxt, seen + 1
    return None


def _bias_after(b, proj, readers):
    """The initializer an Add right after a MatMul projection adds (its bias), or None."""
    out = readers.get(proj.output[0], [])
    if len(out) == 1 and out[0].op_type == "Add":
        other = [i for i in out[0].input if i != proj.output[0]]
        if other and _init(b, other[0]) and _const(b, other[0]).ndim == 1:
            return other[0]
    return None


def _source(b, value, producer):
    """``value`` followed back through Transpose and Identity nodes."""
    while (node := producer.get(value)) is not None and node.op_type in ("Transpose", "Identity"):
        value = node.input[0]
    return value


def _scaled(b, value, producer, memo, op: str):
    """The ``op`` node ``value`` comes from through scalings by constants (torch's baddbmm
    writes Mul by 1 on both sides of the scores' Add), or None."""
    for _ in range(8):
        node = producer.get(value)
        if node is None or node.op_type == op:
            return node
        if (
            node.op_type not in ("Mul", "Div")
            or (nxt := _data_input(b, node, producer, memo)) is None
        ):
            return None
        value = nxt
    return None


def _match(b, soft, producer, readers) -> list[Block]:
    """The candidate blocks of ``soft``: one per place its output could be back in the
    batch-first layout (the check keeps the first that computes the layer)."""
    memo: dict = {}
    mask_float = None
    scores = _scaled(b, soft.input[0], producer, memo, "Add")
    if scores is not None:  # scores + mask
        sides = [_scaled(b, i, producer, memo, "MatMul") for i in scores.input]
        k = next((i for i, n in enumerate(sides) if n is not None), None)
        if k is None:
            return []
        mask_float, scores = scores.input[1 - k], sides[k]
    else:
        scores = _scaled(b, soft.input[0], producer, memo, "MatMul")
    if scores is None:
        return []
    after = readers.get(soft.output[0], [])
    if len(after) != 1 or after[0].op_type != "MatMul" or after[0].input[0] != soft.output[0]:
        return []
    pv = after[0]
    found = [_projection(b, v, producer, memo) for v in (*scores.input, pv.input[1])]
    if any(f is None for f in found):
        return []
    q, k, v = (f[0] for f in found)
    if q is k is v and found[0][1] is not None:  # self-attention: one packed projection
        proj_in = found[0]
        x = kv = _source(b, proj_in[3], producer)
        name = proj_in[0].input[1]
        in_weight = (name, _transposed(q), "in_proj_weight" + " transposed" * _transposed(q))
        in_bias = (_bias_after(b, q, readers) if q.op_type == "MatMul"
                   else proj_in[2][0] if proj_in[2] else None)  # fmt: skip
    elif k is v and q is not k and found[0][1] is None and found[1][1] is None:
        # cross-attention: the query's and the key-value's projections by slices of one
        # in_proj_weight, which the block reads (found by shape below)
        x, kv = _source(b, found[0][3], producer), _source(b, found[1][3], producer)
        in_weight = in_bias = None
    else:
        return []
    # forward from the product with the values to the output projection
    value, out_proj = pv.output[0], None
    for _ in range(16):
        nxt = readers.get(value, [])
        if len(nxt) != 1:
            return []
        node = nxt[0]
        if node.op_type in ("MatMul", "Gemm") and node.input[0] == value:
            out_proj = node
            break
        if node.op_type not in ("Reshape", "Transpose"):
            return []
        value = node.output[0]
    if out_proj is None or not _init(b, out_proj.input[1]):
        return []
    proj = _projection(b, out_proj.output[0], producer, memo)
    if proj is None or proj[0] is not out_proj:
        return []
    y = out_proj.output[0]
    out_bias = proj[2]
    if out_bias is not None and out_bias[1] != 1.0:
        return []  # a Gemm's beta: nn.MultiheadAttention's bias is added as it is
    if out_proj.op_type == "MatMul":
        name = _bias_after(b, out_proj, readers)
        if name is not None:
            out_bias, y = (name, 1.0), readers[y][0].output[0]
    ys = [y]  # then back to the batch-first layout (Shape nodes read the sizes on the way)
    while (len(nxt := [r for r in readers.get(y, []) if r.op_type != "Shape"]) == 1
           and nxt[0].op_type in ("Reshape", "Transpose") and nxt[0].input[0] == y):  # fmt: skip
        y = nxt[0].output[0]
        ys.append(y)
    # the padding mask: Where(mask, -inf, 0) of a boolean mask, through layout ops
    mask = None
    if mask_float is not None:
        value = mask_float
        while (node := producer.get(value)) is not None and (
            node.op_type in LAYOUT or (node.op_type in ("Mul", "Div")
                                       and _data_input(b, node, producer, memo))):  # fmt: skip
            value = (
                node.input[0] if node.op_type in LAYOUT else _data_input(b, node, producer, memo)
            )
        where = producer.get(value)
        if where is None or where.op_type != "Where":
            return []
        fill, zeros = _const(b, where.input[1]), producer.get(where.input[2])
        if fill is None or fill.size != 1 or float(fill.ravel()[0]) != -np.inf:
            return []
        if zeros is None or zeros.op_type != "ConstantOfShape":
            return []
        mask_float, mask = value, where.input[0]
        while (node := producer.get(mask)) is not None and node.op_type in ("Cast", "Identity"):
            mask = node.input[0]
    out_names = {_init(b, out_proj.input[1]), _init(b, out_bias[0]) if out_bias else None} - {None}
    blocks = []
    for y in ys:
        nodes = _nodes(b, y, {x, kv, *([mask_float] if mask_float else [])}, producer, readers)
        if nodes is None:
            continue
        inside = {o for n in nodes for o in n.output}
        outside = {i for n in nodes for i in n.input if i and i not in inside}
        if x in inside or kv in inside:
            continue
        if outside - {x, kv, mask_float} - set(b.consts) - set(b.aliases):
            continue  # another tensor read inside the block
        reads = {_init(b, i): i for i in outside if _init(b, i)}
        w_in, b_in = in_weight, in_bias
        if w_in is None:  # cross-attention: in_proj_weight (3E, E) and its bias (3E,)
            e = proj[1].shape[0]
            shapes = {n: np.shape(_const(b, n)) for n in set(reads) - out_names}
            w_in = next(((reads[n], False, "in_proj_weight")
                         for n, sh in shapes.items() if sh == (3 * e, e)), None)  # fmt: skip
            b_in = next((reads[n] for n, sh in shapes.items() if sh == (3 * e,)), None)
            if w_in is None:
                continue
        learned = out_names | {_init(b, n) for n in (w_in[0], b_in) if n}
        if set(reads) != learned:
            continue  # a weight of the file the layer would not hold (a learned scale)
        t = _transposed(out_proj)
        weights = {"in": w_in, "in_bias": b_in,
                   "out": (out_proj.input[1], t, "out_proj" + " transposed" * t),
                   "out_bias": out_bias[0] if out_bias else None}  # fmt: skip
        block = Block(x, kv, mask, mask_float, y, nodes, scores.output[0], weights)
        block.reads = set(reads)
        blocks.append(block)
    return blocks


def _transposed(node) -> bool:
    """A projection's weight initializer holds torch's weight transposed (a MatMul's, a
    Gemm's with transB=0)."""
    return not (node.op_type == "Gemm" and attributes(node).get("transB", 0))


def _nodes(b, y, stops, producer, readers) -> list | None:
    """Every node ``y`` depends on, up to ``stops`` and constants, in the graph's order; None
    where another node reads what one of them computes (``y`` aside)."""
    nodes, todo, seen = {}, [y], set()
    while todo:
        value = todo.pop()
        node = producer.get(value)
        if (value in stops or value in seen or value in b.aliases or node is None
                or node.op_type == "Constant"):  # fmt: skip
            continue
        seen.add(value)
        if id(node) not in nodes:
            nodes[id(node)] = node
            todo.extend(i for i in node.input if i)
    for n in nodes.values():
        for o in n.output:
            if o != y and any(id(r) not in nodes for r in readers.get(o, [])):
                return None
    order = {id(n): k for k, n in enumerate(b.nodes)}
    return sorted(nodes.values(), key=lambda n: order[id(n)])


def _layer(b, block, heads: int, values=None) -> nn.MultiheadAttention | None:
    """nn.MultiheadAttention (float64) with the block's weights: the file's, or ``values``
    (initializer -> array) in their place; None if they do not fit."""

    def value(name, transposed=False):
        if name is None:
            return None
        v = np.array((values or {}).get(_init(b, name), _const(b, name)), dtype=np.float64)
        return v.T if transposed else v

    w = block.weights
    weight, bias = value(*w["in"][:2]), value(w["in_bias"])
    out_w, out_b = value(*w["out"][:2]), value(w["out_bias"])
    e = weight.shape[1] if weight.ndim == 2 else 0
    if weight.shape != (3 * e, e) or e % heads or out_w.shape != (e, e):
        return None
    if bias is not None and bias.shape != (3 * e,) or out_b is not None and out_b.shape != (e,):
        return None
    if (bias is None) != (out_b is None):
        return None  # nn.MultiheadAttention has both biases or neither
    mha = nn.MultiheadAttention(e, heads, bias=bias is not None, batch_first=True, dtype=F64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(np.ascontiguousarray(weight)))
        mha.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(out_w)))
        if bias is not None:
            mha.in_proj_bias.copy_(torch.from_numpy(bias))
            mha.out_proj.bias.copy_(torch.from_numpy(out_b))
    return mha.eval()


def _submodel(b, block, values=None):
    """The block's nodes as a model of their own: inputs X (and the float mask), outputs Y and
    the scores."""
    import onnx
    from onnx import TensorProto, helper

    producer = {o: n for n in b.nodes for o in n.output}
    used = {i for n in block.nodes for i in n.input if i}
    consts = [producer[i] for i in used if i in producer and producer[i].op_type == "Constant"]
    inits = [onnx.numpy_helper.from_array(np.asarray((values or {}).get(_init(b, i), _const(b, i))), i)
             for i in used if _init(b, i)]  # fmt: skip
    kind = TensorProto.DOUBLE if b.dtype == F64 else TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info(n, kind, None) for n in dict.fromkeys((block.x, block.kv))
    ]
    if block.mask_float:
        inputs.append(helper.make_tensor_value_info(block.mask_float, kind, None))
    outputs = [helper.make_tensor_value_info(n, kind, None) for n in (block.y, block.scores)]
    graph = helper.make_graph([*consts, *block.nodes], "block", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)])


def _check(b, block) -> str | None:
    """Why nn.MultiheadAttention from the block's weights does not compute what its nodes do,
    or None where it does; sets block.layer. onnx's reference evaluator runs the nodes at two
    batch sizes on random inputs and padding, first with random values in place of the
    weights (so that each weight's wiring is checked, also where the file's values would hide
    it: torch starts the biases at zero), then with the file's."""
    from onnx.reference import ReferenceEvaluator

    shape, length = block.shape, block.kv_shape[0]
    gen = np.random.default_rng(7)
    npdt = np.float64 if b.dtype == F64 else np.float32
    drawn = {n: (0.5 * gen.standard_normal(np.shape(_const(b, n)))).astype(npdt)
             for n in block.reads}  # fmt: skip
    heads = None
    for values, batches in ((drawn, (2, 5)), (None, (2,))):
        try:
            run = ReferenceEvaluator(_submodel(b, block, values))
        except Exception as exc:  # an op the evaluator lacks, a malformed block
            return f"onnx's reference evaluator cannot run them ({exc})"
        layer = None
        for batch in batches:
            x = gen.standard_normal((batch, *shape)).astype(npdt)
            kv = x if block.kv == block.x else gen.standard_normal(
                (batch, *block.kv_shape)).astype(npdt)  # fmt: skip
            feeds = {block.x: x, block.kv: kv}
            pad = np.zeros((batch, length), bool)
            if block.mask_float:
                pad = gen.random((batch, length)) < 0.3
                pad[:, 0] = False  # every query attends to one key at least
                feeds[block.mask_float] = np.where(pad, -np.inf, 0).astype(npdt)
            try:
                y, scores = run.run(None, feeds)
            except Exception as exc:
                return f"onnx's reference evaluator fails on them at batch size {batch} ({exc})"
            heads = heads or _heads(np.shape(scores), batch, shape[0], length)
            layer = layer or (_layer(b, block, heads, values) if heads else None)
            if layer is None:
                return (f"no heads' count and weights of nn.MultiheadAttention fit (scores of "
                        f"shape {np.shape(scores)} at batch size {batch})")  # fmt: skip
            with torch.no_grad():
                q, k = torch.from_numpy(x).to(F64), torch.from_numpy(kv).to(F64)
                want = layer(q, k, k, need_weights=False,
                             key_padding_mask=torch.from_numpy(pad) if block.mask_float else None
                             )[0].numpy()  # fmt: skip
            if np.shape(y) != want.shape:
                return f"they give shape {np.shape(y)}, the layer {want.shape}"
            scale = max(float(np.abs(want).max()), 1e-30)
            err = float(np.abs(y - want).max()) / scale
            if not err <= (1e-9 if npdt == np.float64 else 1e-4):
                what = "random weights" if values else "the file's weights"
                return f"with {what} they differ from the layer by {err:.2e} of its scale"
        block.layer = layer
    return None


def _heads(scores_shape, batch: int, length: int, keys: int) -> int | None:
    """The heads' count from the scores' shape: (B*H, L, S) or (B, H, L, S)."""
    if (
        len(scores_shape) == 3
        and scores_shape[0] % batch == 0
        and scores_shape[1:]
        == (
            length,
            keys,
        )
    ):
        return scores_shape[0] // batch
    if len(scores_shape) == 4 and scores_shape[0] == batch and scores_shape[2:] == (length, keys):
        return scores_shape[1]
    return None
