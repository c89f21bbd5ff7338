"""Rewrites of a validated graph that change its cost, never its values or gradients."""

from __future__ import annotations

import dataclasses
from collections import Counter

from rootclad.ir.graph import Graph, IRError, Node
from rootclad.ir.registry import OPS


def _with_nodes(graph: Graph, nodes: list[Node]) -> Graph:
    """The graph with these nodes, validated (shapes inferred again)."""
    out = dataclasses.replace(graph, nodes=nodes, shapes={}, by_name={})
    out.validate()
    return out


def drop_identities(graph: Graph) -> Graph:
    """Remove the views that keep their input's shape (nn.Identity, ``.contiguous()``, a
    reshape to the same shape) inside the graph: their readers read the view's input instead.
    One that gives the graph's output stays.

    An Identity computes nothing (its output aliases its input), but it is a node between a
    producer and its reader: without it the device programs fuse the ReLU after each of the
    GW ResNet's convolutions (no BatchNorm: an nn.Identity in between) into the convolution.
    """
    source: dict[str, str] = {}  # a dropped Identity's output -> the value it passes on
    nodes = []
    for node in graph.nodes:
        inputs = [source.get(v, v) for v in node.inputs]
        spec = OPS[node.op]
        same = spec.view and tuple(node.in_shape) == tuple(node.out_shape)
        if same and node.output != graph.output:
            source[node.output] = inputs[0]
        else:
            nodes.append(dataclasses.replace(node, inputs=inputs))
    return _with_nodes(graph, nodes)


def _monotone(node: Node) -> bool:
    """Non-decreasing elementwise ops: they commute with a max over a window."""
    monotone = OPS[node.op].monotone
    return monotone is not None and monotone(node.attrs)


def pool_before_activation(graph: Graph) -> Graph:
    """Swap `activation -> MaxPool1d` into `MaxPool1d -> activation` where the pool is the
    activation's only reader.

    For a non-decreasing f, max_k f(x_k) = f(max_k x_k), so the output is unchanged and the
    activation runs on K times fewer elements. Gradients are unchanged too: a strictly
    increasing f keeps the same (first) maximum; ReLU (and LeakyReLU with slope 0) can only
    create ties among values it maps to 0, and there its derivative is 0 whichever element the
    pool picks. The CNN tests compare both orders' gradients against torch to 1e-10.
    """
    nodes = list(graph.nodes)
    # how many nodes read each value; a swap below keeps every count
    readers = Counter(v for n in nodes for v in set(n.inputs))
    i = 0
    while i + 1 < len(nodes):
        act, pool = nodes[i], nodes[i + 1]
        if (
            _monotone(act)
            and OPS[pool.op].swaps_with_monotone
            and act.output in pool.inputs
            and readers[act.output] == 1
            and act.output != graph.output
        ):
            a_out, p_out = act.output, pool.output
            pool = Node(pool.name, pool.op, list(act.inputs), a_out, pool.attrs, pool.params)
            act = Node(act.name, act.op, [a_out], p_out, act.attrs, act.params)
            nodes[i], nodes[i + 1] = pool, act
            i += 2
        else:
            i += 1
    return _with_nodes(graph, nodes)


def global_pools(graph: Graph) -> Graph:
    """Adaptive average pooling to size 1 along every axis as the global op: the same windows
    (all of a channel), one kernel per channel instead of the windows' index arithmetic. (Not
    the max: the global max pool's backward gives a NaN window's gradient to its first NaN,
    torch and adaptive_maxpool to its last.)"""
    nodes = []
    for node in graph.nodes:
        if node.op == "adaptive_avgpool" and all(d == 1 for d in node.out_shape[1:]):
            node = dataclasses.replace(node, op=node.op.replace("adaptive_", "global_"), attrs={})
        nodes.append(node)
    return _with_nodes(graph, nodes)


def _producers(nodes: list[Node | None]) -> dict[str, int]:
    return {n.output: i for i, n in enumerate(nodes) if n is not None}


def _permutes(graph: Graph, value: str, perm: tuple, node: Node) -> bool:
    """Whether the permute kernels take ``perm`` of ``value`` (at most 4 axes moved)."""
    made = dataclasses.replace(node, attrs={"perm": perm})
    try:
        OPS["permute"].infer(made, [graph.shapes[value]], graph)
    except IRError:
        return False
    return True


def merge_permutes(graph: Graph) -> Graph:
    """A permute of a permute's output, where it is that permute's only reader, as one permute
    of the first one's input (an identity where they undo each other, which drop_identities
    removes): torch.export writes attention's transposes back and forth as such pairs."""
    readers = Counter(v for n in graph.nodes for v in n.inputs)
    nodes: list[Node | None] = []
    made: dict[str, int] = {}  # value -> its node's place in nodes
    for node in graph.nodes:
        at = made.get(node.inputs[0]) if node.op == "permute" else None
        first = nodes[at] if at is not None else None
        if (
            first is not None
            and first.op == "permute"
            and readers[first.output] == 1
            and first.output != graph.output
        ):
            perm = tuple(first.attrs["perm"][i] for i in node.attrs["perm"])
            if perm == tuple(range(len(perm))):
                nodes[at] = None
                node = dataclasses.replace(node, op="identity", inputs=list(first.inputs), attrs={})
            elif _permutes(graph, first.inputs[0], perm, node):
                nodes[at] = None
                node = dataclasses.replace(node, inputs=list(first.inputs), attrs={"perm": perm})
        made[node.output] = len(nodes)
        nodes.append(node)
    return _with_nodes(graph, [n for n in nodes if n is not None])


def _scaling(node: Node | None) -> float | None:
    """The factor of an affine map without shift, else None."""
    if node is None or node.op != "affine" or node.attrs.get("shift", 0.0) != 0.0:
        return None
    return float(node.attrs["scale"])


def one_scale(graph: Graph) -> Graph:
    """A product of two scaled values, each scaled for it alone, as the product of the first
    scaled by both factors and the second as it is (s a) (t b) = (s t a) b: torch's attention
    scales the queries and the keys each by the square root of its scale."""
    readers = Counter(v for n in graph.nodes for v in n.inputs)
    nodes: list[Node | None] = list(graph.nodes)
    made = _producers(nodes)
    for i, node in enumerate(nodes):
        if node is None or node.op != "matmul" or node.inputs[0] == node.inputs[1]:
            continue
        a, b = (nodes[made[v]] if v in made else None for v in node.inputs)
        s, t = _scaling(a), _scaling(b)
        if s is None or t is None:
            continue
        if any(readers[n.output] != 1 or n.output == graph.output for n in (a, b)):
            continue
        nodes[made[a.output]] = dataclasses.replace(a, attrs={"scale": s * t, "shift": 0.0})
        nodes[made[b.output]] = None
        nodes[i] = dataclasses.replace(node, inputs=[a.output, b.inputs[0]])
    return _with_nodes(graph, [n for n in nodes if n is not None])


# ops whose result is zero where one input is (a product), or where their input is (a view, a
# permutation, a piece or copies of it)
_ZERO_IF_ANY = ("mul", "matmul")
_ZERO_IF_INPUT = ("permute", "slice", "expand")


def _zeros(graph: Graph) -> set[str]:
    """The values that are 0 whatever the inputs and parameters: a read of a constant of zeros
    (a recurrent layer's initial state, torch.zeros in forward), products with one, views and
    pieces of one, and a linear map of one without a bias."""
    zero: set[str] = set()
    for node in graph.nodes:
        name = node.buffers.get("value") if node.op == "parameter" else None
        if name in graph.constants and not graph.constants[name].any():
            zero.add(node.output)
        elif node.op in _ZERO_IF_ANY and zero.intersection(node.inputs):
            zero.add(node.output)
        elif (
            node.inputs
            and node.inputs[0] in zero
            and (
                OPS[node.op].view
                or node.op in _ZERO_IF_INPUT
                or node.op == "linear"
                and "bias" not in node.params
            )
        ):
            zero.add(node.output)
    return zero


def zero_products(graph: Graph) -> Graph:
    """A sum with a value that is always 0 (:func:`_zeros`) as its other term (where that has
    the sum's shape), and a linear map of one as its bias: the first step of a recurrent layer
    from its zero state (h W + b, f * c) costs no product with zeros, and what computed only
    for them (the first forget gate) goes. Values and gradients are unchanged but where a
    factor of a zero product is not finite (torch's product is then NaN, this one 0)."""
    zero = _zeros(graph)
    if not zero:
        return graph
    shapes = {**dict(zip(graph.inputs, graph.input_shapes, strict=True)), **graph.shapes}
    source: dict[str, str] = {}
    nodes = []
    for node in graph.nodes:
        node = dataclasses.replace(node, inputs=[source.get(v, v) for v in node.inputs])
        out = tuple(node.out_shape)
        if node.output == graph.output:
            nodes.append(node)
            continue
        if node.op in ("add", "sub"):
            a, b = node.inputs
            kept = a if b in zero else b if a in zero and node.op == "add" else None
            if kept is not None and tuple(shapes[kept]) == out:
                source[node.output] = kept
                continue
        if node.op == "linear" and node.inputs[0] in zero and "bias" in node.params:
            nodes.extend(_bias_rows(node, out))
            continue
        nodes.append(node)
    read, kept = {graph.output}, []
    for node in reversed(nodes):  # what computed only for the terms dropped goes too
        if node.output in read:
            kept.append(node)
            read.update(node.inputs)
    return _with_nodes(graph, kept[::-1])


def _bias_rows(node: Node, out: tuple[int, ...]) -> list[Node]:
    """A linear map of zeros: its bias, copied to every row of ``out``."""
    row = (1,) * (len(out) - 1) + (out[-1],)
    bias = {"weight": node.params["bias"]}
    if row == out:
        return [Node(node.name, "parameter", [], node.output, {"shape": out}, params=bias)]
    read = Node(f"{node.name}__bias", "parameter", [], attrs={"shape": row}, params=bias)
    return [read, Node(node.name, "expand", [read.output], node.output, {"shape": out})]


def simplify(graph: Graph) -> Graph:
    """Every rewrite above, as each front-end's graph gets them."""
    graph = drop_identities(one_scale(merge_permutes(drop_identities(zero_products(graph)))))
    return pool_before_activation(global_pools(graph))
