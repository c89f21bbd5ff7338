"""``torch.einsum`` of one or two values in a traced model, lowered to the ops a product is
made of: each operand's letters that appear nowhere else summed away (a permute, a reshape to
rows and the global average pooling, scaled), then for two operands one batched ``matmul``
over (shared, kept letters; left letters; contracted letters) x (shared; contracted; right),
reshaped and permuted to the output's order. The batch axis is the first letter of every
operand and of the output, and appears nowhere else; repeated letters in one operand (a
diagonal), ``...``, three or more operands and parameters as operands are refused naming the
node. At most 4 per-sample axes are permuted at once (the IR's permute)."""

from __future__ import annotations

import math

from rootclad.frontends.fx_attention import Emit
from rootclad.ir.graph import IRError


def lower(low, fx_node, args, kw, where) -> None:
    eq = args[0] if args else kw.get("equation")
    operands = list(args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if not isinstance(eq, str):
        raise IRError(f"{where}: the equation must be a string fixed in the model")
    if not 1 <= len(operands) <= 2 or not all(low.is_tensor(x) for x in operands):
        raise IRError(f"{where}: einsum of {len(operands)} operands; rootclad compiles one or two "
                      "values of the model (not parameters: use a Linear or matmul)")  # fmt: skip
    if any(x.name in low.param_shapes for x in operands):
        raise IRError(f"{where}: an einsum with a parameter read directly; rootclad's einsum "
                      "takes values (use x @ w or an nn.Linear for a weight)")  # fmt: skip
    ins, out = _parse(eq.replace(" ", ""), len(operands), where)
    shapes = [tuple(low.shape(x)) for x in operands]
    for letters, shape in zip(ins, shapes, strict=True):
        if len(letters) != len(shape):
            raise IRError(f"{where}: subscripts {letters!r} for an operand of {len(shape)} axes")
    batch = ins[0][0]
    if (
        any(s[0] != batch for s in ins)
        or out[:1] != batch
        or any(batch in s[1:] for s in [*ins, out])
    ):
        raise IRError(f"{where}: equation {eq!r}: the batch axis must be the first letter of "
                      "every operand and of the output, and appear nowhere else")  # fmt: skip
    size = {}
    for letters, shape in zip(ins, shapes, strict=True):
        for c, n in zip(letters[1:], shape[1:], strict=True):
            if size.setdefault(c, n) != n:
                raise IRError(f"{where}: letter {c!r} stands for {size[c]} and {n} values")
    if len(out) < 2:
        raise IRError(f"{where}: equation {eq!r} keeps the batch axis alone; rootclad's values "
                      "keep at least one axis per sample (write 'bi->bi' and a sum over i)")  # fmt: skip
    emit = Emit(low, fx_node.name)
    vals = [(x.name, s[1:]) for x, s in zip(operands, ins, strict=True)]
    o = out[1:]
    # letters that appear in one operand only and not in the output are summed first
    summed = []
    for i, (name, letters) in enumerate(vals):
        others = "".join(v[1] for j, v in enumerate(vals) if j != i) + o
        keep = [c for c in letters if c in others]
        summed.append((_sum(emit, name, letters, keep, size), "".join(keep)))
    if len(summed) == 1:
        name, letters = summed[0]
        emit("identity", [_arrange(emit, name, letters, o, size)], name=fx_node.name)
        return
    (a, la), (b, lb) = summed
    G = [c for c in la if c in lb and c in o]
    K = [c for c in la if c in lb and c not in o]
    M = [c for c in la if c not in lb]
    N = [c for c in lb if c not in la]

    def n(cs):
        return math.prod(size[c] for c in cs)

    a = _reshape(emit, _arrange(emit, a, la, "".join(G + M + K), size), (n(G), n(M), n(K)))
    b = _reshape(emit, _arrange(emit, b, lb, "".join(G + K + N), size), (n(G), n(K), n(N)))
    prod = _reshape(emit, emit("matmul", [a, b]), tuple(size[c] for c in G + M + N) or (1,))
    emit("identity", [_arrange(emit, prod, "".join(G + M + N), o, size)], name=fx_node.name)


def problem(eq: str, ranks: list) -> str | None:
    """Why ``eq`` over operands of ``ranks`` (batch axis counted) is not compiled, or None
    (the ONNX import asks before building its module)."""
    try:
        ins, out = _parse(eq.replace(" ", ""), len(ranks), "")
    except IRError as exc:
        return str(exc).removeprefix(": ")
    if len(ranks) > 2:
        return f"einsum of {len(ranks)} operands; one or two are compiled"
    if any(len(s) != r for s, r in zip(ins, ranks, strict=True)):
        return f"subscripts {ins} for operands of {ranks} axes"
    batch = ins[0][0]
    if (
        any(s[0] != batch for s in ins)
        or out[:1] != batch
        or any(batch in s[1:] for s in [*ins, out])
    ):
        return "the batch axis must be the first letter of every operand and of the output"
    if len(out) < 2:
        return "the output keeps the batch axis alone"
    return None


def _parse(eq: str, count: int, where):
    if "..." in eq:
        raise IRError(f"{where}: equation {eq!r}: '...' is not supported; name every axis")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != count or not all(s.isalpha() for s in ins):
        raise IRError(f"{where}: equation {eq!r} does not name {count} operands' axes by letters")
    for s in ins:
        if len(set(s)) != len(s):
            raise IRError(f"{where}: equation {eq!r}: a letter repeated in one operand (a "
                          "diagonal) is not supported")  # fmt: skip
    if not arrow:  # torch's implicit output: the letters seen once, in alphabetical order
        seen = "".join(ins)
        rhs = "".join(sorted(c for c in set(seen) if seen.count(c) == 1))
    return ins, rhs


def _arrange(emit, name, letters: str, order: str, size) -> str:
    """``name`` (axes ``letters``) permuted to ``order`` (the same letters)."""
    if letters == order:
        return name
    return emit("permute", [name], {"perm": tuple(letters.index(c) for c in order)})


def _reshape(emit, name, shape) -> str:
    return emit("reshape", [name], {"shape": tuple(shape)})


def _sum(emit, name, letters: str, keep: list, size) -> str:
    """``name`` with the letters not in ``keep`` summed away (the kept ones in their order)."""
    gone = [c for c in letters if c not in keep]
    if not gone:
        return name
    rows = _reshape(emit, _arrange(emit, name, letters, "".join(keep + gone), size),
                    (math.prod(size[c] for c in keep), math.prod(size[c] for c in gone)))  # fmt: skip
    mean = emit("global_avgpool", [rows])
    total = emit("affine", [mean], {"scale": float(math.prod(size[c] for c in gone)),
                                    "shift": 0.0})  # fmt: skip
    return _reshape(emit, total, tuple(size[c] for c in keep) or (1,))
