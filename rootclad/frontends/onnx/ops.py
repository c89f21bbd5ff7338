"""The ONNX table: each ONNX op (opset 13 and later) as what torch computes for it, written once
(pointwise ops and layers here; layout, shapes and indices in ops_shapes.py; sums of several
operands, reductions, arg-extremes and normalizations in ops_math.py; recurrent layers in
ops_recurrent.py). ``OPS[op](node, inputs)`` returns the node's outputs; an input is a torch
tensor (the data, a parameter, a buffer) or a numpy array of numbers known without the data
(integer initializers, shapes: the batch size is torch.export's symbol in them), and integer ops
on numbers stay numbers. What an op does not take as written is refused with ``node.refuse``."""

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
        self.dtype = torch.float32  # the model's float type (Replay sets it)

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op}, opset {self.opset})"

    def refuse(self, why: str) -> IRError:
        return IRError(f"{self.where}: {self.describe()}: {why}")

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
        if any(isinstance(e, (torch.SymInt, torch.SymFloat)) for e in v.flat):
            raise node.refuse("a tensor of sizes that depend on the batch size")
        v = plain(v)
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


def plain(v: np.ndarray) -> np.ndarray:
    """Numbers held as Python objects (a shape's) as numpy's own ints or floats, where no
    symbol is among them."""
    if v.dtype != object or any(isinstance(e, (torch.SymInt, torch.SymFloat)) for e in v.flat):
        return v
    return np.array(v.tolist())


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
    **{op: getattr(torch, op.lower()) for op in ("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh")},
    **{op: getattr(torch, op.lower()) for op in ("Asinh", "Acosh", "Atanh")},
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
    # torch's hardsigmoid: ONNX's attributes are float32, and 1/6 is not one
    if np.float32(alpha) == np.float32(1 / 6) and beta == 0.5:
        return F.hardsigmoid(ins[0])
    return torch.clamp(alpha * ins[0] + beta, 0.0, 1.0)


@onnx_op("Clip")
def _clip(node, ins):
    for v in ins[1:]:
        if isinstance(v, torch.Tensor):
            raise node.refuse("bounds computed from the data")
    bounds = [
        float(np.asarray(v).reshape(())) if v is not None else None
        for v in (list(ins) + [None, None])[1:3]
    ]
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
    "Mod": (torch.remainder, np.mod),  # (fmod=1: torch.fmod and np.fmod, in _binary)
}


@onnx_op(*_BINARY)
def _binary(node, ins):
    on_tensors, on_numbers = _BINARY[node.op]
    if node.op == "Mod" and node.attr("fmod", 0):  # the sign of the dividend, as C's fmod
        on_tensors, on_numbers = torch.fmod, np.fmod
    a, b = ins[0], ins[1] if len(ins) > 1 else None
    if is_number(a) and is_number(b):
        a, b = plain(a), plain(b)
        few(node, np.broadcast_shapes(a.shape, b.shape))
        if node.op == "Div":
            integer = all(np.issubdtype(v.dtype, np.integer) or v.dtype == object for v in (a, b))
            if not integer:
                return np.true_divide(a, b)
            if a.dtype == object or b.dtype == object:  # sizes: not negative
                return a // b
            return np.trunc(np.true_divide(a, b)).astype(np.int64)  # ONNX's: toward zero
        return on_numbers(a, b)
    like = a if isinstance(a, torch.Tensor) else b
    b = plain(b) if is_number(b) else b
    scalar = is_number(b) and b.size == 1 and b.dtype != object and b.ndim <= like.dim()
    if scalar and isinstance(a, torch.Tensor) and node.op not in ("Max", "Min"):
        b = b.item()  # a number: torch's op with a scalar (x ** 2, x * 0.5)
        b = float(b) if like.is_floating_point() else b
    else:
        a, b = tensor(node, a, like), tensor(node, b, like)
    if node.op == "Pow" and isinstance(b, torch.Tensor) and not b.is_floating_point():
        b = b.to(a.dtype)
    if (
        node.op == "Div"
        and not a.is_floating_point()
        and not torch.is_floating_point(
            torch.as_tensor(b) if not isinstance(b, torch.Tensor) else b
        )
    ):
        return torch.div(a, b, rounding_mode="trunc")  # ONNX's integer division
    return on_tensors(a, b)


@onnx_op("Not")
def _not(node, ins):
    return np.logical_not(ins[0]) if is_number(ins[0]) else torch.logical_not(ins[0])


@onnx_op("Where")
def _where(node, ins):
    cond, a, b = ins
    if all(is_number(v) for v in ins):
        return np.where(cond, a, b)
    few(node, np.broadcast_shapes(*(tuple(v.shape) for v in ins if is_number(v))))
    like = next((v for v in (a, b) if isinstance(v, torch.Tensor)), None)
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
        x = plain(x)
        if dtype == torch.bool:
            return x.astype(bool)
        if x.dtype == object:  # the batch size's symbol: a float of it
            return np.array(
                [torch.sym_float(e) if dtype.is_floating_point else e for e in x.flat],
                dtype=object,
            ).reshape(x.shape)
        return x.astype(np.float64 if dtype.is_floating_point else np.int64)
    if dtype.is_floating_point:  # one float type in a compiled model: the model's
        return x if x.is_floating_point() else x.to(node.dtype)
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


# the inputs of an op that are state, not weights: an initializer read only there is a buffer
STATE = {"BatchNormalization": (3, 4)}  # the running mean and variance

_REDUCE = {"axes", "keepdims", "noop_with_empty_axes"}
_POOL = {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides"}
_RECURRENT = {"activations", "clip", "direction", "hidden_size", "layout"}
# the attributes each op's entry reads (any other the file sets is refused: an attribute the
# table would not read could change what the op computes)
ATTRIBUTES = {
    "Mod": {"fmod"},
    "LeakyRelu": {"alpha"},
    "Elu": {"alpha"},
    "Selu": {"alpha", "gamma"},
    "Gelu": {"approximate"},
    "HardSigmoid": {"alpha", "beta"},
    "Cast": {"to", "saturate"},
    "CastLike": {"saturate"},
    "Gemm": {"alpha", "beta", "transA", "transB"},
    "Conv": {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
    "ConvTranspose": {
        "auto_pad",
        "dilations",
        "group",
        "kernel_shape",
        "pads",
        "strides",
        "output_padding",
        "output_shape",
    },
    "MaxPool": _POOL | {"storage_order"},
    "AveragePool": _POOL | {"count_include_pad"},
    "BatchNormalization": {"epsilon", "momentum", "training_mode"},
    "InstanceNormalization": {"epsilon"},
    "LayerNormalization": {"axis", "epsilon", "stash_type"},
    "RMSNormalization": {"axis", "epsilon", "stash_type"},
    "Softmax": {"axis"},
    "LogSoftmax": {"axis"},
    "Dropout": {"seed"},
    "Einsum": {"equation"},
    "Reshape": {"allowzero"},
    "Flatten": {"axis"},
    "Transpose": {"perm"},
    "Squeeze": {"axes"},
    "Unsqueeze": {"axes"},
    "Concat": {"axis"},
    "Split": {"axis", "split", "num_outputs"},
    "Pad": {"mode"},
    "Shape": {"start", "end"},
    "Constant": {"value", "value_float", "value_floats", "value_int", "value_ints"},
    "ConstantOfShape": {"value"},
    **{
        op: _REDUCE
        for op in (
            "ReduceSum",
            "ReduceMean",
            "ReduceMax",
            "ReduceMin",
            "ReduceL2",
            "ReduceSumSquare",
        )
    },
    **{"Gather": {"axis"}, "GatherND": {"batch_dims"}, "ScatterND": {"reduction"}},
    **{"GatherElements": {"axis"}, "ScatterElements": {"axis", "reduction"}},
    "TopK": {"axis", "largest", "sorted"},
    "Trilu": {"upper"},
    "CumSum": {"exclusive", "reverse"},
    "Resize": {"mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "axes"}
    | {"antialias", "exclude_outside", "keep_aspect_ratio_policy", "extrapolation_value"},
    "LSTM": _RECURRENT | {"input_forget"},
    "GRU": _RECURRENT | {"linear_before_reset"},
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
    b = tensor(node, b, a)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if alpha == 1.0 and b.dim() == 2:  # a linear layer, its weight (out, in) as the file has it
        bias = None if c is None else tensor(node, c, a)
        if bias is not None and beta != 1.0:
            bias = beta * bias
        if bias is None or bias.dim() == 1:
            return F.linear(a, b if node.attr("transB", 0) else b.transpose(0, 1), bias)
    if node.attr("transB", 0):
        b = b.transpose(0, 1)
    out = alpha * torch.matmul(a, b)
    return out if c is None else out + beta * tensor(node, c, a)


def _pads(node, rank: int):
    """The padding before and after each axis (auto_pad other than NOTSET and VALID is
    refused: write the pads out)."""
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
    _kernel_is(node, w)
    begin, end = _pads(node, rank)
    x, pad = _padded(x, begin, end)
    fn = (F.conv1d, F.conv2d, F.conv3d)[rank - 1]
    return fn(
        x, w, b, node.attr("strides") or 1, pad, node.attr("dilations") or 1, node.attr("group", 1)
    )


def _kernel_is(node, w) -> None:
    """A kernel_shape the file sets is the weight's (onnx's checker does not compare them)."""
    kernel = node.attr("kernel_shape")
    if kernel and list(kernel) != list(w.shape[2:]):
        raise node.refuse(f"kernel_shape {list(kernel)}, but the weight's is {list(w.shape[2:])}")


@onnx_op("ConvTranspose")
def _conv_transpose(node, ins):
    x, w, b = (list(ins) + [None])[:3]
    rank = w.dim() - 2
    if rank not in (1, 2) or node.attr("output_shape"):
        raise node.refuse("a 3-d transposed convolution or one given its output shape")
    _kernel_is(node, w)
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
    strides, dilations = node.attr("strides") or [1] * rank, node.attr("dilations") or [1] * rank
    for n, k, d, st, b, e in zip(x.shape[2:], kernel, dilations, strides, begin, end, strict=True):
        k = (k - 1) * d + 1  # the window's span
        if ceil and ((n + b + e - k + st - 1) // st) * st >= n + b:
            # a last window starting in the right padding: onnx's shape inference keeps it
            # (the file may declare it), onnxruntime drops it, as torch and rootclad do
            node.declares_more = True
    if node.op == "MaxPool":
        if len(node.outputs) > 1 and node.outputs[1]:
            raise node.refuse("its indices output")
        x, pad = _padded(x, begin, end, -math.inf)
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[rank - 1]
        return fn(x, kernel, node.attr("strides") or 1, pad, node.attr("dilations") or 1, ceil)
    if node.attr("dilations") and any(d != 1 for d in node.attr("dilations")):
        raise node.refuse("dilated average pooling")
    if list(begin) != list(end):
        raise node.refuse(f"asymmetric pads {node.attr('pads')}")
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[rank - 1]
    return fn(
        x,
        kernel,
        node.attr("strides") or 1,
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
    x, scale, bias = ins  # one group per channel (torch's instance norm refuses one value)
    return F.group_norm(x, x.shape[1], scale, bias, node.attr("epsilon", 1e-5))


@onnx_op("LayerNormalization")
def _layer_norm(node, ins):
    x, scale, bias = (list(ins) + [None])[:3]
    axis, eps = positive_axis(node.attr("axis", -1), x.dim()), node.attr("epsilon", 1e-5)
    if node.attr("stash_type", 1) != 1:  # (statistics in float: rootclad's, the input's type)
        raise node.refuse(f"stash_type {node.attr('stash_type')}")
    y = F.layer_norm(x, x.shape[axis:], scale, bias, eps)
    if len([o for o in node.outputs if o]) == 1:
        return y
    dims = list(range(axis, x.dim()))  # the mean and 1 / deviation outputs, as ONNX's
    mean = x.mean(dims, keepdim=True)
    return y, mean, torch.rsqrt(((x - mean) ** 2).mean(dims, keepdim=True) + eps)


@onnx_op("RMSNormalization")
def _rms_norm(node, ins):
    x, scale = ins[0], ins[1]
    if node.attr("stash_type", 1) != 1:
        raise node.refuse(f"stash_type {node.attr('stash_type')}")
    axis, eps = positive_axis(node.attr("axis", -1), x.dim()), node.attr("epsilon", 1e-5)
    dims = list(range(axis, x.dim()))
    return x * torch.rsqrt((x * x).mean(dims, keepdim=True) + eps) * scale


@onnx_op("Softmax", "LogSoftmax")
def _softmax(node, ins):
    if node.op == "Softmax":  # a row of -inf only gives 0s, as torch's attention (ONNX: NaNs)
        return torch.ops.aten._safe_softmax(ins[0], node.attr("axis", -1))
    return torch.log_softmax(ins[0], node.attr("axis", -1))


@onnx_op("Dropout")
def _dropout(node, ins):
    if len(ins) > 2 and ins[2] is not None and bool(np.asarray(ins[2])):
        raise node.refuse("training mode")
    if len(node.outputs) > 1 and node.outputs[1]:  # the mask: every value kept
        return ins[0], torch.ones_like(ins[0], dtype=torch.bool)
    return ins[0]
