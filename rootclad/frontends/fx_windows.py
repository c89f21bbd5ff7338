"""torchvision's Swin Transformer: the three functions it wraps for torch.fx (each one call in
the trace) lowered per sample.

- ``_get_relative_position_bias(table, index, window_size)``: nothing is computed; the table
  (a parameter) is read by the attention's ``window_bias`` op, after the index buffer is
  checked to be torchvision's (the op computes each pair's row itself).
- ``shifted_window_attention(x, qkv_weight, proj_weight, bias, window_size, num_heads, ...)``:
  torchvision merges the batch with the windows (``reshape(B * nW, ...)``); per sample the
  windows are a leading axis instead. The cyclic shift (``torch.roll``) is two slices and a
  concatenation per axis, the partition a reshape and a permute, then the qkv Linear, the
  heads' products, ``window_bias`` (the relative position bias and the shifted windows' mask
  of -100, ops/window_geometry.h), softmax, the product with the values, the projection, and
  the same steps back. Dropout follows the compiled model's mode, as ``nn.Dropout`` does
  (torchvision passes ``training=self.training``, which fx fixes when it traces: a model with
  dropout above 0 is compiled in eval mode, then ``cm.train()``; in train mode torch's own
  output is random and the trace check refuses it).
- ``_patch_merging_pad(x)``: the 2x2 neighbours' channels side by side, as reshapes and
  permutes.

Feature maps that are not a multiple of the window (or of 2, for the merging) get
torchvision's zero padding (``pad``) and, after the attention, its crop (``slice``). Swin V2
(``logit_scale``) is refused naming the node."""

from __future__ import annotations

import inspect

import torch

from rootclad.frontends.fx_attention import Emit
from rootclad.frontends.fx_layout import emit_roll
from rootclad.ir.graph import IRError
from rootclad.ir.ops.shape import pad_steps

MODULE = "torchvision.models.swin_transformer"
ATTENTION, BIAS, MERGE = (
    "shifted_window_attention",
    "_get_relative_position_bias",
    "_patch_merging_pad",
)


def which(fx_node) -> str | None:
    """The wrapped function ``fx_node`` calls, or None."""
    t = fx_node.target
    if fx_node.op != "call_function" or getattr(t, "__module__", "") != MODULE:
        return None
    return t.__name__ if t.__name__ in (ATTENTION, BIAS, MERGE) else None


def is_bias(fx_node) -> bool:
    """The relative position bias: computed from a parameter alone, read by the attention."""
    return which(fx_node) == BIAS


def reads_for_windows(fx_node) -> bool:
    """A parameter or buffer that only the wrapped calls read (named by them)."""
    return fx_node.op == "get_attr" and bool(fx_node.users) and all(map(which, fx_node.users))


def lower(low, fx_node) -> bool:
    """Lower ``fx_node`` if it is one of the wrapped calls or a parameter or buffer only they
    read; False otherwise."""
    if reads_for_windows(fx_node):
        return True
    name = which(fx_node)
    if name is None:
        return False
    where = f"fx node {fx_node.name!r} ({name})"
    if name == BIAS:
        table, index, size = fx_node.args[:3]
        _check_index(low, index, tuple(size), where)
        low.window_tables[fx_node.name] = (table.target, tuple(size))
    elif name == ATTENTION:
        _attention(low, fx_node, where)
    else:
        _merge(low, fx_node, where)
    return True


def _check_index(low, index, size, where) -> None:
    """The index buffer must be torchvision's relative_position_index of this window size."""
    got = dict(low.traced.named_buffers()).get(getattr(index, "target", None))
    wh, ww = size
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij"))
    flat = torch.flatten(coords, 1)
    rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0)
    want = ((rel[:, :, 0] + wh - 1) * (2 * ww - 1) + rel[:, :, 1] + ww - 1).flatten()
    if got is None or got.shape != want.shape or not torch.equal(got.cpu().long(), want):
        raise IRError(f"{where}: the relative position index is not torchvision's for windows "
                      f"of {size}; rootclad computes each pair's table row itself")  # fmt: skip


def _arguments(fx_node) -> dict:
    bound = inspect.signature(fx_node.target).bind(*fx_node.args, **fx_node.kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _param(node, what, where):
    if node is None:
        return None
    if getattr(node, "op", None) != "get_attr":
        raise IRError(f"{where}: its {what} must be a parameter of the model")
    return node.target


def _attention(low, fx_node, where) -> None:
    a = _arguments(fx_node)
    if a.get("logit_scale") is not None:
        raise IRError(f"{where}: Swin V2's cosine attention (logit_scale) is not supported")
    bias = a["relative_position_bias"]
    if getattr(bias, "name", None) not in low.window_tables:
        raise IRError(f"{where}: its relative position bias must be torchvision's "
                      "_get_relative_position_bias of the block's table")  # fmt: skip
    table, size = low.window_tables[bias.name]
    x = a["input"]
    H, W, C = tuple(low.shape(x))[1:]
    (wh, ww), heads = tuple(a["window_size"]), int(a["num_heads"])
    if size != (wh, ww) or C % heads:
        raise IRError(f"{where}: windows of {wh}x{ww} with a bias table for {size}, or {C} "
                      f"channels in {heads} heads")  # fmt: skip
    # torchvision pads the map with zeros to a multiple of the window (the zero tokens take
    # part in the attention), shifts and masks on the padded map, and crops the result
    PH, PW = H + (wh - H % wh) % wh, W + (ww - W % ww) % ww
    sh, sw = (0 if wh >= PH else a["shift_size"][0]), (0 if ww >= PW else a["shift_size"][1])
    nh, nw, N, d = PH // wh, PW // ww, wh * ww, C // heads
    emit = Emit(low, fx_node.name)
    shifted, padded = sh + sw > 0, (PH, PW) != (H, W)
    v = x.name
    for op, attrs in pad_steps((H, W, C), [(0, PH - H), (0, PW - W), (0, 0)]):
        v = emit(op, [v], attrs)
    if shifted:
        v = emit_roll(low, v, (PH, PW, C), {0: -sh, 1: -sw}, f"{fx_node.name}__shifted")
    v = emit("reshape", [v], {"shape": (nh, wh, nw, ww * C)})
    v = emit("permute", [v], {"perm": (0, 2, 1, 3)})
    v = emit("reshape", [v], {"shape": (nh * nw, N, C)})
    qkv_w, qkv_b = (_param(a[k], k, where) for k in ("qkv_weight", "qkv_bias"))
    qkv = emit("linear", [v], params={"weight": qkv_w, "bias": qkv_b})
    parts = []
    for i in range(3):  # q, k, v: (windows, heads, N, d)
        p = emit("slice", [qkv], {"axis": 2, "start": i * C, "stop": (i + 1) * C, "step": 1})
        p = emit("reshape", [p], {"shape": (nh * nw, N, heads, d)})
        parts.append(emit("permute", [p], {"perm": (0, 2, 1, 3)}))
    q = emit("affine", [parts[0]], {"scale": float(d**-0.5), "shift": 0.0})
    kt = emit("permute", [parts[1]], {"perm": (0, 1, 3, 2)})
    scores = emit("matmul", [q, kt])
    geometry = {"nh": nh, "nw": nw, "wh": wh, "ww": ww, "heads": heads, "sh": sh, "sw": sw}
    scores = emit("window_bias", [scores], geometry, params={"weight": table})
    attn = emit("softmax", [scores], {"axis": 3})
    if a["attention_dropout"]:
        attn = emit("dropout", [attn], {"p": float(a["attention_dropout"])})
    out = emit("matmul", [attn, parts[2]])
    out = emit("permute", [out], {"perm": (0, 2, 1, 3)})
    out = emit("reshape", [out], {"shape": (nh * nw, N, C)})
    proj_w, proj_b = (_param(a[k], k, where) for k in ("proj_weight", "proj_bias"))
    out = emit("linear", [out], params={"weight": proj_w, "bias": proj_b})
    if a["dropout"]:
        out = emit("dropout", [out], {"p": float(a["dropout"])})
    out = emit("reshape", [out], {"shape": (nh, nw, wh, ww * C)})
    out = emit("permute", [out], {"perm": (0, 2, 1, 3)})
    last = None if padded else fx_node.name
    if shifted:
        out = emit("reshape", [out], {"shape": (PH, PW, C)})
        out = emit_roll(low, out, (PH, PW, C), {0: sh, 1: sw},
                        last or f"{fx_node.name}__unshifted")  # fmt: skip
    else:
        out = emit("reshape", [out], {"shape": (PH, PW, C)}, name=last)
    crop = pad_steps((PH, PW, C), [(0, H - PH), (0, W - PW), (0, 0)])  # the padded axes
    for i, (op, attrs) in enumerate(crop):
        out = emit(op, [out], attrs, name=fx_node.name if i == len(crop) - 1 else None)


def _merge(low, fx_node, where) -> None:
    """x (H, W, C) -> (H/2, W/2, 4C): channels of (2i, 2j), (2i+1, 2j), (2i, 2j+1),
    (2i+1, 2j+1) side by side, as torchvision's x0, x1, x2, x3."""
    x = fx_node.args[0]
    shape = tuple(low.shape(x))[1:]
    if len(shape) != 3:
        raise IRError(f"{where}: a feature map of per-sample shape {shape}; rootclad merges "
                      "patches of (H, W, C) maps")  # fmt: skip
    emit = Emit(low, fx_node.name)
    v = x.name
    for op, attrs in pad_steps(shape, [(0, shape[0] % 2), (0, shape[1] % 2), (0, 0)]):
        v = emit(op, [v], attrs)  # torchvision's zero row and column to even H and W
    H, W, C = shape[0] + shape[0] % 2, shape[1] + shape[1] % 2, shape[2]
    v = emit("reshape", [v], {"shape": (H // 2, 2, W // 2, 2 * C)})
    v = emit("permute", [v], {"perm": (0, 2, 1, 3)})  # (i, j, row parity, col parity * C)
    v = emit("reshape", [v], {"shape": (H * W // 4, 2, 2, C)})
    v = emit("permute", [v], {"perm": (0, 2, 1, 3)})  # (ij, col parity, row parity, C)
    emit("reshape", [v], {"shape": (H // 2, W // 2, 4 * C)}, name=fx_node.name)
