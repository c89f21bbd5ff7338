"""The ONNX convolutions and poolings, each rebuilt as the torch layer that computes it (a Conv
a ``Conv1d``/``Conv2d``/``Conv3d``, a ConvTranspose a ``ConvTranspose1d``/``2d``, a MaxPool a
``MaxPool1d``/``2d``/``3d``, ...); a mixin of the builder (builder.py), as layers.py's."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rootclad.frontends.onnx.common import text

F64 = torch.float64


class ConvOps:
    """Handlers of the ONNX builder for convolutions and poolings."""

    def spatial(self, node, a, x, what: str, most: int = 3) -> tuple[int, list, list, list]:
        """(dims, kernel, stride, symmetric pads) of a Conv or pool of at most ``most``
        dimensions, refusing what torch's layers cannot express."""
        dims = len(self.shapes[x]) - 1
        if not 1 <= dims <= most:
            raise self.fail(node, f"{what} on per-sample shape {self.shapes[x]}: "
                            f"{', '.join(f'{d}-d' for d in range(1, most + 1))} only")  # fmt: skip
        auto = text(a.get("auto_pad", b"NOTSET"))
        pads = list(a.get("pads", [0] * 2 * dims))
        if auto in ("SAME_UPPER", "SAME_LOWER"):  # output = ceil(input / stride)
            kernel = list(a.get("kernel_shape") or self.consts_shape(node, dims))
            strides = list(a.get("strides", [1] * dims))
            dil = list(a.get("dilations", [1] * dims))
            pads = [0] * 2 * dims
            for i in range(dims):
                n = self.shapes[x][1 + i]
                total = (-(-n // strides[i]) - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - n
                if total < 0:  # onnxruntime pads negatively (drops positions): not torch's
                    raise self.fail(node, f"auto_pad={auto} with strides {strides} larger than "
                                    f"the kernel {kernel} is not supported")  # fmt: skip
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
        cls = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1]
        b = self.const(node, 2, "bias")
        conv = cls(self.shapes[x][0], w.shape[0], w.shape[2:], stride=strides, padding=pads,
                   dilation=dil, groups=group, bias=b is not None, dtype=F64)  # fmt: skip
        if tuple(conv.weight.shape) != w.shape:
            raise self.fail(node, f"weight {w.shape} does not fit {self.shapes[x][0]} input "
                            f"channels in {group} groups")  # fmt: skip
        self.conv_step(node, conv, w, b, x)

    def conv_step(self, node, conv, w, b, x) -> None:
        """A Conv or ConvTranspose layer holding the file's weight and bias (or none)."""
        with torch.no_grad():
            conv.weight.copy_(torch.from_numpy(w))
            if b is not None:
                conv.bias.copy_(torch.from_numpy(np.asarray(b, dtype=np.float64)))
        roles = {"weight": (node.input[1], "W")}
        if b is not None:
            roles["bias"] = (node.input[2], "B")
        self.share(node, conv, roles)
        self.module_step(node, conv, node.input[1], x)

    def op_ConvTranspose(self, node, a):
        x = self.tensor(node)
        w = np.asarray(self.const(node, 1, "weight"), dtype=np.float64)  # (C, M / group, *k)
        if "output_shape" in a:
            raise self.fail(node, "output_shape is not supported (give pads and output_padding, "
                            "as torch's exporter does)")  # fmt: skip
        if text(a.get("auto_pad", b"NOTSET")) != "NOTSET":
            raise self.fail(node, f"auto_pad={text(a['auto_pad'])!r} is not supported")
        dims, kernel, strides, pads = self.spatial(node, a, x, "ConvTranspose", most=2)
        if kernel and list(kernel) != list(w.shape[2:]):
            raise self.fail(node, f"kernel_shape={kernel} differs from the weight's {w.shape[2:]}")
        group = a.get("group", 1)
        cls = nn.ConvTranspose1d if dims == 1 else nn.ConvTranspose2d
        b = self.const(node, 2, "bias")
        if self.shapes[x][0] != w.shape[0] or self.shapes[x][0] % group:
            raise self.fail(node, f"weight {w.shape} does not fit {self.shapes[x][0]} input "
                            f"channels in {group} groups")  # fmt: skip
        conv = cls(w.shape[0], w.shape[1] * group, w.shape[2:], stride=strides, padding=pads,
                   output_padding=list(a.get("output_padding", [0] * dims)),
                   dilation=list(a.get("dilations", [1] * dims)), groups=group,
                   bias=b is not None, dtype=F64)  # fmt: skip
        self.conv_step(node, conv, w, b, x)

    def pool(self, node, a, kind: str):
        x = self.tensor(node)
        dims, k, s, p = self.spatial(node, a, x, kind)
        if any(pi > ki // 2 for pi, ki in zip(p, k, strict=True)):
            raise self.fail(node, f"pads {p} larger than half the kernel {k} are not supported")
        if len(node.output) > 1 and node.output[1]:
            raise self.fail(node, "the Indices output is not supported")
        if any(d != 1 for d in a.get("dilations", [1] * dims)):
            raise self.fail(node, f"dilations={a['dilations']} are not supported (only 1)")
        if a.get("ceil_mode", 0) and self._window_in_right_padding(x, k, s, p):
            # onnx's shape inference keeps a last window that starts in the right padding, and
            # the file may declare that; onnxruntime drops it, as torch does, and so does
            # rootclad: the declared shape is not held against the output
            self.declared.pop(node.output[0], None)
        if kind == "MaxPool":
            cls = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)[dims - 1]
            mod = cls(k, stride=s, padding=p, ceil_mode=bool(a.get("ceil_mode", 0)))
        else:
            cls = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)[dims - 1]
            mod = cls(k, stride=s, padding=p, ceil_mode=bool(a.get("ceil_mode", 0)),
                      count_include_pad=bool(a.get("count_include_pad", 0)))  # fmt: skip
        self.module_step(node, mod, None, x)

    def _window_in_right_padding(self, x, k, s, p) -> bool:
        """Whether a ceil_mode pooling's last window along some axis would start in the right
        padding (torch and onnxruntime drop it)."""
        for n, ki, si, pi in zip(self.shapes[x][1:], k, s, p, strict=True):
            o = (n + 2 * pi - ki + si - 1) // si + 1
            if (o - 1) * si >= n + pi:
                return True
        return False

    def op_MaxPool(self, node, a):
        self.pool(node, a, "MaxPool")

    def op_AveragePool(self, node, a):
        self.pool(node, a, "AveragePool")

    def global_pool(self, node, kind):
        x = self.tensor(node)
        dims = len(self.shapes[x]) - 1
        if dims not in (1, 2) and (kind, dims) != ("avg", 3):
            raise self.fail(node, f"per-sample shape {self.shapes[x]}: 1-d and 2-d only (and "
                            "3-d for the average)")  # fmt: skip
        cls = {("avg", 1): nn.AdaptiveAvgPool1d, ("avg", 2): nn.AdaptiveAvgPool2d,
               ("max", 1): nn.AdaptiveMaxPool1d, ("max", 2): nn.AdaptiveMaxPool2d,
               ("avg", 3): nn.AdaptiveAvgPool3d}[kind, dims]  # fmt: skip
        self.module_step(node, cls(1), None, x)

    def op_GlobalAveragePool(self, node, a):
        self.global_pool(node, "avg")

    def op_GlobalMaxPool(self, node, a):
        self.global_pool(node, "max")
