"""Dense: Linear on the last axis, and the batched product of two values (attention)."""

from __future__ import annotations

from rootclad.ir.graph import expect
from rootclad.ir.ops.common import numel
from rootclad.ir.registry import OpSpec, register


def _linear_infer(node, shapes, graph):
    (shape,) = shapes
    w = graph.param(node.params["weight"])
    expect(
        len(shape) >= 1 and shape[-1] == w.shape[1],
        node,
        f"expected input (..., {w.shape[1]}), got per-sample shape {shape}",
    )
    return (*shape[:-1], w.shape[0])


register(
    OpSpec(
        "linear",
        "dense",
        "Linear on the last axis (any leading per-sample axes)",
        _linear_infer,
        params=("weight", "bias"),
        saves=("in",),
        flops=lambda node, g: 2 * numel(node.in_shape) * node.out_shape[-1],
        modules=("Linear", "LazyLinear"),
    )
)


def _lead(node, a: tuple, b: tuple) -> tuple:
    """The output's leading axes: torch's broadcasting of the operands' leading axes (a
    parameter's start after the batch axis), where each operand has them all or none but 1s."""
    la, lb = a[:-2], b[:-2]
    n = max(len(la), len(lb))
    la, lb = (1,) * (n - len(la)) + la, (1,) * (n - len(lb)) + lb
    out = tuple(max(p, q) for p, q in zip(la, lb, strict=True))
    expect(
        all(numel(s) == 1 or s == out for s in (la, lb)),
        node,
        f"shapes {a} and {b}: each operand's leading axes must be the product's {out}, or 1s "
        "(one matrix shared by the products)",
    )
    return out


def matmul_geometry(a: tuple, b: tuple) -> tuple[int, int, int, int, int, int]:
    """(G, M, K, N, a's group stride, b's group stride) of a batched product (..., M, K) @
    (..., K, N): G products per sample; an operand with one matrix per sample (stride 0) is
    shared by its sample's G products."""
    la, lb = a[:-2], b[:-2]
    G = max(numel(la), numel(lb))
    M, K, N = a[-2], a[-1], b[-1]
    return G, M, K, N, (M * K if numel(la) > 1 else 0), (K * N if numel(lb) > 1 else 0)


def _matmul_infer(node, shapes, graph):
    a, b = (tuple(s) for s in shapes)
    expect(
        len(a) >= 2 and len(b) >= 2,
        node,
        f"a product of per-sample shapes {a} and {b}: both need at least two axes (the "
        "front-end makes a vector a one-row or one-column matrix)",
    )
    expect(a[-1] == b[-2], node, f"shapes {a} and {b} do not multiply ({a[-1]} != {b[-2]})")
    return (*_lead(node, a, b), a[-2], b[-1])


def _matmul_flops(node, graph):
    G, M, K, N, _, _ = matmul_geometry(*node.in_shapes)
    return 2 * G * M * K * N


register(
    OpSpec(
        "matmul",
        "dense",
        "a product of two values, batched over their leading axes (attention's Q K^T and A V)",
        _matmul_infer,
        arity=2,
        saves=("in",),
        flops=_matmul_flops,
    )
)


def _cdist_infer(node, shapes, graph):
    a, b = (tuple(s) for s in shapes)
    expect(len(a) == 2 and len(b) == 2 and a[1] == b[1], node, f"cdist of per-sample shapes "
           f"{a} and {b}: points (P, M) and (R, M) needed")  # fmt: skip
    return (a[0], b[0])


register(
    OpSpec(
        "cdist",
        "dense",
        "torch.cdist(a, b) (p=2): the Euclidean distances (P, R) between points (P, M) and "
        "(R, M), from their differences; no gradient where a distance is 0, as torch's",
        _cdist_infer,
        arity=2,
        saves=("in", "out"),
        flops=lambda node, graph: 3 * node.out_shape[0] * node.out_shape[1] * node.in_shapes[0][1],
    )
)


def _embedding_infer(node, shapes, graph):
    (shape,) = shapes
    w = graph.param(node.params["weight"])
    expect(len(w.shape) == 2, node, f"weight of shape {w.shape}; (num_embeddings, dim) needed")
    return (*shape, w.shape[1])


def _embedding_module(mod, where):
    from rootclad.ir.graph import IRError

    for what, off in (("max_norm", mod.max_norm is None), ("scale_grad_by_freq",
                                                             not mod.scale_grad_by_freq)):  # fmt: skip
        if not off:
            raise IRError(f"{where}: {what} is not supported")
    pad = mod.padding_idx
    return {"padding_idx": -1 if pad is None else int(pad)}


register(
    OpSpec(
        "embedding",
        "dense",
        "Embedding: a row of the weight per index (an integer input of the model, or slices "
        "of one); no gradient to the indices, none to the padding_idx row",
        _embedding_infer,
        params=("weight",),
        saves=("in",),
        modules=("Embedding",),
        from_module=_embedding_module,
    )
)
