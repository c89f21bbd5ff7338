"""Deep graphs: turning a long chain into C++ takes time linear in its length.

The emitter searched the whole body of each function with one regular expression per region
(a 3000-node chain took 537 s to emit, 1000 nodes 20 s); the planner, the graph's parameter
look-up and the MaxPool rewrite each scanned every node per node. The bound below is
generous (the chain emits in about a second); the old code took minutes.
"""

from __future__ import annotations

import time

import pytest
import torch
from fixtures.core import assert_close_rel
from torch import nn

import rootclad
from rootclad.codegen import emit_model
from rootclad.frontends.aten import graph_from_export


def _chain(n: int) -> nn.Module:
    """n layers: Linear(8, 8) and an activation in turn, then one Linear(8, 1)."""
    acts = (nn.Tanh, nn.Sigmoid, nn.ReLU, nn.GELU)
    layers = [nn.Linear(8, 8) if i % 2 == 0 else acts[i // 2 % 4]() for i in range(n - 1)]
    return nn.Sequential(*layers, nn.Linear(8, 1)).double()


@pytest.mark.parametrize("engine, pullbacks", [("pullback", True), ("clad", True), ("clad", False)])
def test_a_2000_node_chain_is_emitted_in_seconds(engine, pullbacks):
    torch.manual_seed(0)
    net = _chain(2000)
    t0 = time.perf_counter()
    graph = graph_from_export(net, torch.randn(2, 8, dtype=torch.float64), "float64")
    emitted = emit_model(graph, "mse", engine, pullbacks)
    seconds = time.perf_counter() - t0
    assert len(graph.nodes) == 2000
    assert emitted.source.count("::rootclad::linear_forward(") >= 1001
    assert seconds < 30, f"tracing and emitting 2000 nodes took {seconds:.1f} s"


@pytest.mark.slow
def test_a_200_node_chain_compiles_and_matches_torch():
    """The whole path on a long chain. Not 1000 nodes: g++ -O3 then takes many minutes (its
    time grows faster than the chain: 17 s of CPU for 125 nodes, 46 s for 250)."""
    torch.manual_seed(0)
    net = _chain(200)
    x = torch.randn(5, 8, dtype=torch.float64)
    y = torch.randn(5, 1, dtype=torch.float64)
    cm = rootclad.compile(net, x, "mse", engine="pullback")
    loss, grads = cm.loss_and_grad(x, y)
    ref = torch.nn.functional.mse_loss(net(x), y)
    ref_grads = torch.autograd.grad(ref, list(net.parameters()))
    assert_close_rel(loss, ref.detach(), 1e-10, "loss")
    flat = torch.cat([g.reshape(-1) for g in grads.values()])
    assert_close_rel(flat, torch.cat([g.reshape(-1) for g in ref_grads]), 1e-8, "gradients")
