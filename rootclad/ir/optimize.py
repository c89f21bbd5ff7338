"""Rewrites of a validated graph that change its cost, never its values or gradients."""

from __future__ import annotations

from rootclad.ir.graph import Graph, Node


def _monotone(node: Node) -> bool:
    """Non-decreasing elementwise ops: they commute with a max over a window."""
    if node.op in ("relu", "tanh", "sigmoid"):
        return True
    return node.op == "leaky_relu" and node.attrs["negative_slope"] >= 0


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
    i = 0
    while i + 1 < len(nodes):
        act, pool = nodes[i], nodes[i + 1]
        readers = [n for n in nodes if act.output in n.inputs]
        if (
            _monotone(act)
            and pool.op == "maxpool1d"
            and readers == [pool]
            and act.output != graph.output
        ):
            a_out, p_out = act.output, pool.output
            pool = Node(pool.name, pool.op, list(act.inputs), a_out, pool.attrs, pool.params)
            act = Node(act.name, act.op, [a_out], p_out, act.attrs, act.params)
            nodes[i], nodes[i + 1] = pool, act
            i += 2
        else:
            i += 1
    out = Graph(
        graph.inputs, graph.input_shapes, nodes, graph.output, graph.params, graph.dtype,
        buffers=graph.buffers,
    )  # fmt: skip
    out.validate()
    return out
