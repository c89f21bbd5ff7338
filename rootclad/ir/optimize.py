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


def simplify(graph: Graph) -> Graph:
    """Every rewrite above, as each front-end's graph gets them."""
    graph = drop_identities(one_scale(merge_permutes(drop_identities(graph))))
    return pool_before_activation(global_pools(graph))
