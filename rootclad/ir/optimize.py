"""Rewrites of a validated graph that change its cost, never its values or gradients."""

from __future__ import annotations

import dataclasses
from collections import Counter

from rootclad.ir.graph import Graph, Node
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
