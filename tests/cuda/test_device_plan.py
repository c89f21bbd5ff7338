"""The device programs' plan of d_act (rootclad/codegen/cuda.py: plan_adjoints): adjoints
alive at different times of the backward share memory, and each one that takes over memory an
earlier-dying one used is zeroed where it starts.

Two kinds of check, as for the CPU plan (tests/codegen/test_plan.py). The layout: no two
adjoints alive at the same step overlap, and the plan is smaller than a region each. The
liveness: ``ROOTCLAD_CHECK_PLAN=1`` compiles a build that shares nothing but holds every
planned adjoint at NaN until its start and again after its producer's pullback, so a kernel
that reads an adjoint outside the span the plan gives it, or writes it before, spoils the
gradients; the graph-IR and GW models train like torch under it. The host loops plan at any
batch size (the other tests of tests/cuda run planned); the GPU only from D_ACT_PLAN_MIN_VALUES
on, so one library here runs both layouts.
"""

from __future__ import annotations

import ctypes
import re

import pytest
import test_device_models as models_tests
import test_device_ops as ops_tests
import torch
from fixtures.graph_models import MODELS as GRAPH_MODELS
from test_device_models import _build, _p, _program, _step_like_torch

from rootclad.codegen import cuda as device
from rootclad.codegen.cuda import fused_activations, plan_adjoints
from rootclad.frontends.aten import graph_from_export
from rootclad.gw.models import gw_cnn, gw_resnet
from rootclad.nets import digits_cnn

F64 = torch.float64
MODELS = {
    "gw_cnn": (lambda: gw_cnn(2048), (1, 2048)),
    "gw_resnet": (lambda: gw_resnet(2048), (1, 2048)),
    "gw_resnet_bn": (lambda: gw_resnet(2048, batch_norm=True), (1, 2048)),
    "digits_cnn": (digits_cnn, (1, 28, 28)),
}


def _plans(name):
    build, shape = MODELS[name]
    graph = graph_from_export(build(), torch.zeros(2, *shape), "float32")
    fused = fused_activations(graph)
    return graph, plan_adjoints(graph, fused, share=False), plan_adjoints(graph, fused)


@pytest.mark.parametrize("name", MODELS)
def test_adjoints_alive_together_never_share_memory(name):
    graph, flat, plan = _plans(name)
    # the inputs' adjoints where the inputs are in act (hosts read them there), then the output's
    assert plan.offset[graph.inputs[0]] == 0 and plan.fixed == flat.fixed
    assert plan.offset[plan.root[graph.output]] == flat.offset[flat.root[graph.output]]
    assert plan.spans == flat.spans and len(plan.spans) >= 5
    sizes = {v: graph.shapes[v] for v in plan.spans}
    n = {v: torch.Size(s).numel() for v, s in sizes.items()}
    for i, (a, (lo_a, hi_a)) in enumerate(plan.spans.items()):
        assert plan.fixed <= plan.offset[a] and plan.offset[a] + n[a] <= plan.size
        for b, (lo_b, hi_b) in list(plan.spans.items())[i + 1 :]:
            if hi_a < lo_b or hi_b < lo_a:  # never alive together
                continue
            apart = (
                plan.offset[a] + n[a] <= plan.offset[b] or plan.offset[b] + n[b] <= plan.offset[a]
            )
            assert apart, f"{name}: the adjoints of {a} and {b} are alive together"


@pytest.mark.parametrize("name", MODELS)
def test_every_adjoint_starts_on_zeros(name):
    """The backward walked node by node, last first, over d_act's planned area: before the
    pullback that first adds into an adjoint, its memory must be as the zero before the
    backward left it, or zeroed just then (zero_at)."""
    graph, _, plan = _plans(name)
    n = {v: torch.Size(graph.shapes[v]).numel() for v in plan.spans}
    dirty = torch.zeros(plan.size, dtype=torch.bool)  # written since the zero before the backward
    for k in reversed(range(len(graph.nodes))):
        for v in plan.zero_at.get(k, []):
            dirty[plan.offset[v] : plan.offset[v] + n[v]] = False
        for v, (_, last) in plan.spans.items():
            if last == k:  # this pullback is the first to add into v's adjoint
                at = slice(plan.offset[v], plan.offset[v] + n[v])
                assert not dirty[at].any(), f"{name}: {v}'s adjoint starts on what another left"
                dirty[at] = True


@pytest.mark.parametrize("name", MODELS)
def test_plan_is_smaller_than_a_region_each(name):
    graph, flat, plan = _plans(name)
    assert flat.size == sum(torch.Size(graph.shapes[v]).numel() for v in flat.offset)
    # GW CNN 0.59 of a region each, ResNet 0.40, with BatchNorm 0.26, digit CNN 0.69
    assert plan.size < 0.7 * flat.size
    # each zeroed adjoint takes over memory of one that dies earlier in the backward
    zeroed = [v for vs in plan.zero_at.values() for v in vs]
    assert zeroed and len(zeroed) < len(plan.spans) and not flat.zero_at


def _check_plan_build(monkeypatch):
    monkeypatch.setenv("ROOTCLAD_CHECK_PLAN", "1")
    source = _program(gw_cnn(512).double(), (1, 512))[1]
    assert "(the checking build of d_act's plan)" in source


@pytest.mark.parametrize("name", GRAPH_MODELS)
def test_graph_ir_models_under_the_plan_check(name, monkeypatch):
    _check_plan_build(monkeypatch)
    ops_tests.test_graph_ir_model_trains_like_torch_on_the_device_kernels(name, "cpu")


@pytest.mark.parametrize("model", models_tests.MODELS)
def test_gw_models_under_the_plan_check(model, monkeypatch, tmp_path):
    _check_plan_build(monkeypatch)
    models_tests.test_device_program_trains_like_torch(model, tmp_path)


@pytest.mark.parametrize("check", [False, True])
def test_gradients_go_wrong_without_the_zeroing(check, monkeypatch, tmp_path):
    """Without the zeroing where adjoints start, a planned adjoint adds onto what an earlier
    one left (wrong gradients) or, in the checking build, onto NaN."""
    if check:
        monkeypatch.setenv("ROOTCLAD_CHECK_PLAN", "1")
    monkeypatch.setattr(device, "_zero_lines", lambda spans: [])
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        models_tests.test_device_program_trains_like_torch("gw-cnn", tmp_path)


def test_one_library_runs_both_layouts(tmp_path):
    """The GPU's default threshold, moved between two batch sizes: at 5 samples a region each
    (one zero before the backward), at 41 planned (the adjoints that take over memory zeroed
    where they start, one launch more each). Both match torch and write nothing past d_act."""
    torch.manual_seed(0)
    net = gw_cnn(512).double()
    _, source = _program(net, (1, 512))
    flat = int(re.search(r"D_ACT_FLAT = (\d+)", source)[1])
    planned = int(re.search(r"D_ACT_PLANNED = (\d+)", source)[1])
    zeroings = source[source.index("void backward(") : source.index("void backward_input(")]
    zeroings = zeroings.count("if (planned)")
    assert planned < flat and zeroings == 3
    lib = _build(tmp_path, source, f"-DROOTCLAD_D_ACT_PLAN_MIN_VALUES={20 * flat}")
    for fn in (lib.net_act_size, lib.net_d_act_size, lib.net_output_offset):
        fn.restype = ctypes.c_long
    for B, per_sample in ((5, flat), (41, planned)):
        assert lib.net_d_act_size(B) == B * per_sample
        act = torch.zeros(lib.net_act_size(B), dtype=F64)
        d_act = torch.full((lib.net_d_act_size(B) + 1,), float("nan"), dtype=F64)
        d_act[-1] = 7.0  # one value past the end
        _step_like_torch(lib, net, B, act, d_act)
        assert d_act[-1] == 7.0
        # the input's adjoint for an upstream gradient, in either layout
        x = torch.randn(B, 1, 512, generator=torch.Generator().manual_seed(B), dtype=F64)
        d_out = torch.randn(B, 1, generator=torch.Generator().manual_seed(-B), dtype=F64)
        act[: x.numel()] = x.reshape(-1)
        params = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).contiguous()
        lib.net_input_grad(None, _p(params), None, _p(act), _p(d_out), _p(d_act), B, 1,
                           ctypes.c_ulonglong(1))  # fmt: skip
        x.requires_grad_(True)
        (want,) = torch.autograd.grad(net(x), x, d_out)
        torch.testing.assert_close(d_act[: x.numel()].view_as(x), want, rtol=1e-10, atol=1e-12)
        assert d_act[-1] == 7.0
    # the launches of a training step (float32, as the count's buffers): the zeroings are the
    # only difference
    source = _program(net.float(), (1, 512), "float32")[1]
    count = models_tests._launches_per_step
    as_flat = count(tmp_path, source, (1, 512), plan="-DROOTCLAD_D_ACT_PLAN_MIN_VALUES=(1L<<40)")
    as_planned = count(tmp_path, source, (1, 512), plan="-DROOTCLAD_D_ACT_PLAN_MIN_VALUES=0")
    assert as_planned - as_flat == zeroings


def test_the_store_serves_every_smaller_batch(tmp_path):
    """d_act_size is not monotonic in B: the first planned batch needs less than the last one
    with a region each. d_act_store_size(B), what DeviceModel allocates, is the most any batch
    up to B needs, so a smaller batch never grows the store (and drops the CUDA graphs)."""
    _, source = _program(gw_cnn(512).double(), (1, 512))
    flat = int(re.search(r"D_ACT_FLAT = (\d+)", source)[1])
    for threshold in (20 * flat, 0):  # planned from 20 samples on; from the first (the host)
        (tmp := tmp_path / str(threshold)).mkdir()  # one library each (dlopen keeps a path's)
        lib = _build(tmp, source, f"-DROOTCLAD_D_ACT_PLAN_MIN_VALUES={threshold}")
        lib.net_d_act_size.restype = lib.net_d_act_store_size.restype = ctypes.c_long
        sizes = [lib.net_d_act_size(B) for B in range(1, 81)]
        most = [max(sizes[:B]) for B in range(1, 81)]
        assert [lib.net_d_act_store_size(B) for B in range(1, 81)] == most
        assert (sizes[20] < sizes[18]) == bool(threshold)  # B = 21 against 19
