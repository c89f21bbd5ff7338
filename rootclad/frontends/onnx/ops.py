"""The ONNX table: each ONNX op (opset 13 and later) as what torch computes for it, written
once (pointwise ops and layers here, layout, shapes and indices in ops_shapes.py). ``OPS[op](node, inputs)`` returns the node's outputs; an input is a torch tensor (the
data, a parameter, a buffer) or a numpy array of numbers known without the data (integer
initializers, shapes: the batch size is torch.export's symbol in them), and integer ops on
numbers stay numbers. What an op does not take as written is refused with ``node.refuse``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from rootclad.frontends.onnx.common import text
from rootclad.ir.graph import IRError

OPS: dict[str, Callable] = {}


class Node:
    """A node as the table reads it."""

    def __init__(self, name, op, inputs, outputs, attrs, where, opset):
        self.name, self.op, self.inputs, self.outputs = name, op, inputs, outputs
        self.attrs, self.where, self.opset, self.value = attrs, where, opset, None

    def refuse(self, why: str) -> IRError:
        return IRError(f"{self.where}: node {self.name!r} ({self.op}, opset {self.opset}): {why}")

    def attr(self, key, default=None):
        value = self.attrs.get(key, default)
        return text(value) if isinstance(value, bytes) else value


def onnx_op(*names: str):
    def register(fn):
        for name in names:
            OPS[name] = fn
        return fn

    return register


def is_number(v) -> bool:
    return isinstance(v, np.ndarray)


def tensor(node: Node, v, like: torch.Tensor | None = None) -> torch.Tensor:
    """``v`` as a torch tensor (numbers in ``like``'s float type where it has one)."""
    if isinstance(v, torch.Tensor):
        return v
    if v.dtype == object:
        if any(isinstance(e, torch.SymInt) for e in v.flat):
            raise node.refuse("a tensor of sizes that depend on the batch size")
        v = v.astype(np.int64)
    out = torch.as_tensor(v)
    if like is not None and like.is_floating_point() and not out.is_floating_point():
        out = out.to(like.dtype)
    if like is not None and like.is_floating_point() and out.is_floating_point():
        out = out.to(like.dtype)
    return out


# the most numbers shape arithmetic makes (anything larger is no shape)
MAX_NUMBERS = 1 << 16


def few(node: Node, shape) -> list:
    """``shape`` of an array of numbers to make, refused where it is no shape's size."""
    if any(isinstance(d, torch.SymInt) for d in shape) or math.prod(shape) > MAX_NUMBERS:
        raise node.refuse(f"{list(shape)} numbers known when it compiles (at most {MAX_NUMBERS})")
    return [int(d) for d in shape]


def ints(node: Node, v, what: str) -> list:
    """The integers (the batch size among them: a symbol) that ``v`` holds."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        raise node.refuse(f"its {what} are computed from the data, not known when it compiles")
    return [e if isinstance(e, torch.SymInt) else int(e) for e in np.asarray(v).reshape(-1)]


def positive_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# -- pointwise ---------------------------------------------------------------------------------
_UNARY = {
    "Relu": torch.relu,
    "Sigmoid": torch.sigmoid,
    "Tanh": torch.tanh,
    "Exp": torch.exp,
    "Log": torch.log,
    "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal,
    "Neg": torch.neg,
    "Abs": torch.abs,
    "Sign": torch.sign,
    "Softplus": F.softplus,
    "Mish": F.mish,
    "HardSwish": F.hardswish,
    "Erf": torch.erf,
    "Identity": lambda x: x,
    "Floor": torch.floor,
    "Ceil": torch.ceil,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Softsign": F.softsign,
}


_ON_NUMBERS = {
    "Neg": np.negative,
    "Abs": np.abs,
    "Identity": lambda v: v,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Sqrt": np.sqrt,
    "Sign": np.sign,
}


@onnx_op(*_UNARY)
def _unary(node, ins):
    x = ins[0]
    if is_number(x):
        if node.op not in _ON_NUMBERS:
            raise node.refuse("of numbers known when it compiles")
        if x.dtype == object and not any(isinstance(e, torch.SymInt) for e in x.flat):
            x = np.array(x.tolist())  # numbers of a shape: as numpy's own
        return _ON_NUMBERS[node.op](x)
    return _UNARY[node.op](x)


@onnx_op("LeakyRelu")
def _leaky(node, ins):
    return F.leaky_relu(ins[0], node.attr("alpha", 0.01))


@onnx_op("Elu")
def _elu(node, ins):
    return F.elu(ins[0], node.attr("alpha", 1.0))


@onnx_op("Selu")
def _selu(node, ins):
    alpha, gamma = (
        node.attr("alpha", 1.67326319217681884765625),
        node.attr("gamma", 1.05070102214813232421875),
    )
    return gamma * F.elu(ins[0], alpha)


@onnx_op("Gelu")
def _gelu(node, ins):
    return F.gelu(ins[0], approximate=node.attr("approximate", "none"))


@onnx_op("HardSigmoid")
def _hardsigmoid(node, ins):
    alpha, beta = node.attr("alpha", 0.2), node.attr("beta", 0.5)
    if math.isclose(alpha, 1 / 6) and beta == 0.5:
        return F.hardsigmoid(ins[0])
    return torch.clamp(alpha * ins[0] + beta, 0.0, 1.0)


@onnx_op("Clip")
def _clip(node, ins):
    bounds = [
        float(np.asarray(v).reshape(())) if v is not None else None
        for v in (list(ins) + [None, None])[1:3]
    ]
    for v in ins[1:]:
        if isinstance(v, torch.Tensor):
            raise node.refuse("bounds computed from the data")
    return torch.clamp(ins[0], *bounds)


@onnx_op("PRelu")
def _prelu(node, ins):
    x, slope = ins
    return torch.where(x >= 0, x, tensor(node, slope, x) * x)


_BINARY = {
    "Add": (torch.add, np.add),
    "Sub": (torch.sub, np.subtract),
    "Mul": (torch.mul, np.multiply),
    "Div": (torch.div, None),
    "Pow": (torch.pow, np.power),
    "Equal": (torch.eq, np.equal),
    "Less": (torch.lt, np.less),
    "Greater": (torch.gt, np.greater),
    "LessOrEqual": (torch.le, np.less_equal),
    "GreaterOrEqual": (torch.ge, np.greater_equal),
    "And": (torch.logical_and, np.logical_and),
    "Or": (torch.logical_or, np.logical_or),
    "Max": (torch.maximum, np.maximum),
    "Min": (torch.minimum, np.minimum),
    "Mod": (None, np.mod),
}


@onnx_op(*_BINARY)
def _binary(node, ins):
    on_tensors, on_numbers = _BINARY[node.op]
    a, b = ins[0], ins[1] if len(ins) > 1 else None
    if node.op in ("Max", "Min") and len(ins) != 2:
        raise node.refuse(f"{len(ins)} operands (rootclad takes two)")
    if is_number(a) and is_number(b):
        if node.op == "Div":
            integer = all(
                np.issubdtype(np.asarray(v).dtype, np.integer) or v.dtype == object for v in (a, b)
            )
            return (a // b) if integer else np.true_divide(a, b)
        return on_numbers(a, b)
    if on_tensors is None:
        raise node.refuse("of tensors (rootclad takes it of integers known when it compiles)")
    like = a if isinstance(a, torch.Tensor) else b
    if is_number(b) and b.size == 1 and b.dtype != object and node.op not in ("Max", "Min"):
        b = b.item()  # a number: torch's op with a scalar (x ** 2, x * 0.5)
        b = float(b) if like.is_floating_point() else b
        return on_tensors(a, b) if not is_number(a) else on_tensors(tensor(node, a, like), b)
    a, b = tensor(node, a, like), tensor(node, b, like)
    if node.op == "Pow" and not b.is_floating_point():
        b = b.to(a.dtype)
    return on_tensors(a, b)


@onnx_op("Not")
def _not(node, ins):
    return np.logical_not(ins[0]) if is_number(ins[0]) else torch.logical_not(ins[0])


@onnx_op("Where")
def _where(node, ins):
    cond, a, b = ins
    if all(is_number(v) for v in ins):
        return np.where(cond, a, b)
    like = next(v for v in (a, b) if isinstance(v, torch.Tensor) and v.is_floating_point())
    return torch.where(tensor(node, cond).bool(), tensor(node, a, like), tensor(node, b, like))


@onnx_op("Cast", "CastLike")
def _cast(node, ins):
    x, like = ins[0], ins[1] if len(ins) > 1 else None
    if node.op == "Cast":
        dtype = _DTYPES.get(node.attr("to"))
    else:
        dtype = like.dtype if isinstance(like, torch.Tensor) else tensor(node, like).dtype
    if dtype is None:
        raise node.refuse(f"to element type {node.attr('to')}")
    if is_number(x):
        if dtype == torch.bool:
            return x.astype(bool)
        return x.astype(np.float64) if dtype.is_floating_point and x.dtype != object else x
    if dtype.is_floating_point:  # one float type in a compiled model: the data's
        return x if x.is_floating_point() else x.to(torch.get_default_dtype())
    return x.to(dtype)


_DTYPES = {
    1: torch.float32,
    11: torch.float64,
    10: torch.float16,
    7: torch.int64,
    6: torch.int32,
    9: torch.bool,
}

# the inputs of an op that are numbers known when it compiles (sizes, axes, bounds): an
# initializer read only there stays a number, never a parameter
STATIC = {
    "Clip": (1, 2),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Reshape": (1,),
    "Slice": (1, 2, 3, 4),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Tile": (1,),
    "Expand": (1,),
    "TopK": (1,),
    "Split": (1,),
    "Range": (0, 1, 2),
    "ConstantOfShape": (0,),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "Pow": (1,),
    "Trilu": (1,),
    "CumSum": (1,),
    "Dropout": (1, 2),
}


# -- layers ------------------------------------------------------------------------------------
@onnx_op("MatMul")
def _matmul(node, ins):
    a, b = ins
    return torch.matmul(
        tensor(node, a, b if isinstance(b, torch.Tensor) else None),
        tensor(node, b, a if isinstance(a, torch.Tensor) else None),
    )


@onnx_op("Gemm")
def _gemm(node, ins):
    a, b, c = (list(ins) + [None])[:3]
    if node.attr("transA", 0):
        a = a.transpose(0, 1)
    if node.attr("transB", 0):
        b = b.transpose(0, 1)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if alpha == 1.0 and isinstance(b, torch.Tensor) and b.dim() == 2:  # a linear layer
        bias = None if c is None else tensor(node, c, a)
        if bias is not None and beta != 1.0:
            bias = beta * bias
        if bias is None or bias.dim() == 1:
            return F.linear(a, b.transpose(0, 1), bias)
    out = alpha * torch.matmul(a, tensor(node, b, a))
    return out if c is None else out + beta * tensor(node, c, a)


def _pads(node, rank: int):
    """torch's symmetric padding, or None where the file pads asymmetrically (then padded
    first); auto_pad SAME as the explicit padding it gives."""
    pads = node.attr("pads") or [0] * (2 * rank)
    if text(node.attr("auto_pad", "NOTSET")) not in ("NOTSET", "VALID"):
        raise node.refuse(f"auto_pad={node.attr('auto_pad')} (write explicit pads)")
    begin, end = pads[:rank], pads[rank:]
    return begin, end


def _padded(x, begin, end, value=0.0):
    if list(begin) == list(end):
        return x, list(begin)
    flat = [p for b, e in zip(reversed(begin), reversed(end), strict=True) for p in (b, e)]
    return F.pad(x, flat, value=value), [0] * len(begin)


@onnx_op("Conv")
def _conv(node, ins):
    x, w, b = (list(ins) + [None])[:3]
    rank = w.dim() - 2
    if rank not in (1, 2, 3):
        raise node.refuse(f"a {rank}-d convolution")
    begin, end = _pads(node, rank)
    x, pad = _padded(x, begin, end)
    fn = (F.conv1d, F.conv2d, F.conv3d)[rank - 1]
    return fn(
        x, w, b, node.attr("strides") or 1, pad, node.attr("dilations") or 1, node.attr("group", 1)
    )


@onnx_op("ConvTranspose")
def _conv_transpose(node, ins):
    x, w, b = (list(ins) + [None])[:3]
    rank = w.dim() - 2
    if rank not in (1, 2) or node.attr("output_shape"):
        raise node.refuse("a 3-d transposed convolution or one given its output shape")
    begin, end = _pads(node, rank)
    if list(begin) != list(end):
        raise node.refuse(f"asymmetric pads {node.attr('pads')}")
    fn = (F.conv_transpose1d, F.conv_transpose2d)[rank - 1]
    return fn(
        x,
        w,
        b,
        node.attr("strides") or 1,
        list(begin),
        node.attr("output_padding") or 0,
        node.attr("group", 1),
        node.attr("dilations") or 1,
    )


@onnx_op("MaxPool", "AveragePool")
def _pool(node, ins):
    x = ins[0]
    kernel = node.attr("kernel_shape")
    rank = len(kernel)
    begin, end = _pads(node, rank)
    ceil = bool(node.attr("ceil_mode", 0))
    if node.op == "MaxPool":
        if len(node.outputs) > 1 and node.outputs[1]:
            raise node.refuse("its indices output")
        x, pad = _padded(x, begin, end, -math.inf)
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[rank - 1]
        return fn(x, kernel, node.attr("strides") or kernel, pad, node.attr("dilations") or 1, ceil)
    if node.attr("dilations") and any(d != 1 for d in node.attr("dilations")):
        raise node.refuse("dilated average pooling")
    if list(begin) != list(end):
        raise node.refuse(f"asymmetric pads {node.attr('pads')}")
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[rank - 1]
    return fn(
        x,
        kernel,
        node.attr("strides") or kernel,
        list(begin),
        ceil,
        bool(node.attr("count_include_pad", 0)),
    )


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(node, ins):
    x = ins[0]
    axes = list(range(2, x.dim()))
    return x.mean(axes, keepdim=True) if "Average" in node.op else x.amax(axes, keepdim=True)


@onnx_op("BatchNormalization")
def _batch_norm(node, ins):
    if node.attr("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        raise node.refuse("training mode (rootclad imports inference graphs)")
    x, scale, bias, mean, var = ins
    shape = (-1,) + (1,) * (x.dim() - 2)
    inv = torch.rsqrt(tensor(node, var, x) + node.attr("epsilon", 1e-5))
    return (x - tensor(node, mean, x).reshape(shape)) * (scale * inv).reshape(shape) + bias.reshape(
        shape
    )


@onnx_op("InstanceNormalization")
def _instance_norm(node, ins):
    x, scale, bias = ins
    return F.instance_norm(x, weight=scale, bias=bias, eps=node.attr("epsilon", 1e-5))


@onnx_op("LayerNormalization")
def _layer_norm(node, ins):
    x, scale, bias = (list(ins) + [None])[:3]
    axis = positive_axis(node.attr("axis", -1), x.dim())
    if len([o for o in node.outputs if o]) > 1:
        raise node.refuse("its mean and inverse deviation outputs")
    return F.layer_norm(x, x.shape[axis:], scale, bias, node.attr("epsilon", 1e-5))


@onnx_op("Softmax", "LogSoftmax")
def _softmax(node, ins):
    fn = torch.softmax if node.op == "Softmax" else torch.log_softmax
    return fn(ins[0], node.attr("axis", -1))


@onnx_op("Dropout")
def _dropout(node, ins):
    if len(ins) > 2 and ins[2] is not None and bool(np.asarray(ins[2])):
        raise node.refuse("training mode")
    return ins[0]


@onnx_op("Einsum")
def _einsum(node, ins):
    return torch.einsum(node.attr("equation"), *[tensor(node, v) for v in ins])


# -- recurrent layers: their cells written out step by step ------------------------------------
def _recurrent_inputs(node, ins, gates: int):
    """(x as (T, B, F), W, R, bias of W, bias of R, hidden size, directions, initial states
    as (D, B, H)) of an LSTM or GRU node, what it does not take refused."""
    if node.attr("clip") is not None or (len(ins) > 4 and ins[4] is not None):
        raise node.refuse("a clip or sequence lengths")
    acts = [text(a) for a in node.attr("activations") or []]
    if acts and acts != (["Sigmoid", "Tanh", "Tanh"] * 2)[: len(acts)]:
        raise node.refuse(f"activations {acts}")
    x, w, r = ins[:3]
    if node.attr("layout", 0):  # batch first: (B, T, F), initial states (B, D, H)
        x = x.transpose(0, 1)
        ins = [s.transpose(0, 1) if i >= 5 and s is not None else s for i, s in enumerate(ins)]
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


def _zeros_like_state(x, hidden):
    return x.new_zeros(x.shape[1], hidden)


@onnx_op("LSTM")
def _lstm(node, ins):
    if len(ins) > 7 and ins[7] is not None or node.attr("input_forget", 0):
        raise node.refuse("peepholes or coupled input and forget gates")
    x, w, r, wb, rb, hidden, order, (h0, c0) = _recurrent_inputs(node, ins, 4)

    def step(d, xt, state):
        h, c = state
        h = _zeros_like_state(x, hidden) if h is None else h
        c = _zeros_like_state(x, hidden) if c is None else c
        g = xt @ w[d].t() + h @ r[d].t()
        if wb is not None:
            g = g + wb[d] + rb[d]
        i, o, f, cand = g.chunk(4, -1)  # ONNX's order: input, output, forget, cell
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cand)
        return [torch.sigmoid(o) * torch.tanh(c), c]

    return _laid_out(node, _run(node, x, order, step, [h0, c0]))


@onnx_op("GRU")
def _gru(node, ins):
    x, w, r, wb, rb, hidden, order, (h0, _) = _recurrent_inputs(node, ins, 3)
    before = bool(node.attr("linear_before_reset", 0))

    def step(d, xt, state):
        h = _zeros_like_state(x, hidden) if state[0] is None else state[0]
        gx = xt @ w[d].t() + (wb[d] if wb is not None else 0)
        (zx, rx, nx), (zr, rr, nr) = gx.chunk(3, -1), r[d].chunk(3, 0)
        rbz, rbr, rbn = rb[d].chunk(3, -1) if rb is not None else (0, 0, 0)
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
