"""The arena planner (rootclad/codegen/arena.py, used by codegen/cpu.py): values whose lifetimes do not overlap share
memory, in act and, with their own plan, in d_act.

Two kinds of check. The layout: no two regions that are alive at the same step overlap in
memory, and the plan is smaller than one region per value for the models it is for. The
liveness itself: ``ROOTCLAD_CHECK_PLAN=1`` compiles a build that shares nothing but fills every
activation no pullback reads with NaN once the forward is past it, and every planned adjoint
with NaN before the backward; a wrong ``saves`` entry in the op registry or a missing adjoint
marker then turns the gradients into NaN. Every op case of fixtures/op_cases.py runs that way, inside
a graph (its output feeds one more op, so it is not the model's output), against torch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures.core import check_against_torch, perturbed
from fixtures.op_cases import CASES, TORCH_RTOL_F64, Fn, sample_input
from torch import nn

from rootclad.codegen import cpu
from rootclad.frontends.aten import graph_from_export
from rootclad.gw.models import gw_cnn, gw_resnet
from rootclad.ir import OPS
from rootclad.nets import digits_cnn

F64 = torch.float64

MODELS = {
    "gw_cnn": (lambda: gw_cnn(2048), (1, 2048)),
    "gw_resnet_bn": (lambda: perturbed(gw_resnet(2048, batch_norm=True)), (1, 2048)),
    "digits_cnn": (lambda: digits_cnn(), (1, 28, 28)),
}


def _emitted(build, shape, engine="pullback"):
    net = build()
    graph = graph_from_export(net, torch.randn(2, *shape), "float32")
    em = cpu._Emitter(graph, "bce_with_logits", engine, True)
    em.build()
    return em


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return not (a[1] < b[0] or b[1] < a[0])


@pytest.mark.parametrize("name", MODELS)
def test_regions_alive_together_never_share_memory(name):
    em = _emitted(*MODELS[name])
    end = len(em.g.nodes)
    for area in ("H", "R"):
        rs = [r for r in em.regions if r.area == area and r.size]
        for key, span in (
            ("offset", lambda r: (r.producer, end if r.saved else r.last_read)),
            ("d_offset", lambda r: (r.producer, r.last_read)),
        ):
            for i, a in enumerate(rs):
                lo_a = getattr(a, key)
                assert lo_a + a.size <= em.area_size["act" if key == "offset" else "d_act", area]
                for b in rs[i + 1 :]:
                    if not _overlap(span(a), span(b)):
                        continue
                    lo_b = getattr(b, key)
                    assert lo_a + a.size <= lo_b or lo_b + b.size <= lo_a, (
                        f"{name}: {a.name} and {b.name} are alive together ({key})"
                    )


@pytest.mark.parametrize("name", MODELS)
def test_plan_is_smaller_than_one_region_per_value(name):
    em = _emitted(*MODELS[name])
    flat = sum(r.size for r in em.regions)
    assert em.flat_per_sample == flat
    # the adjoints of a chain of layers live two or three at a time (GW CNN 0.52 of the
    # flat layout, ResNet 0.44, the digit CNN 0.64 since its direct Conv2d needs no im2col
    # columns, which had made the flat layout larger)
    assert em.d_act_per_sample < 0.7 * flat
    assert em.act_per_sample <= flat
    # the library reports the planned sizes to its hosts
    em_src = em.source("rc_plan_probe")
    assert f"constexpr long ACT_FLAT_PER_SAMPLE = {flat};" in em_src


def _then_scale(build):
    """The case's layers, then one more op, so that their output is not the model's."""

    def make():
        inner = build()
        net = nn.Sequential(inner, Fn(lambda x: 0.5 * x - 0.25))
        return net.train(inner.training)

    return make


@pytest.mark.parametrize(
    "build, shape, rtol",
    [pytest.param(_then_scale(b), s, TORCH_RTOL_F64.get(n), id=n) for n, b, s, _ in CASES],
)
def test_op_pullback_reads_only_what_its_registry_entry_saves(build, shape, rtol, monkeypatch):
    monkeypatch.setenv("ROOTCLAD_CHECK_PLAN", "1")
    torch.manual_seed(0)
    check_against_torch(build(), sample_input(shape), F64, rtol=rtol)


@pytest.mark.parametrize("name", MODELS)
def test_models_under_the_plan_check(name, monkeypatch):
    monkeypatch.setenv("ROOTCLAD_CHECK_PLAN", "1")
    build, shape = MODELS[name]
    torch.manual_seed(0)
    check_against_torch(build().double(), sample_input(shape, B=5), F64)


def test_plan_check_fails_when_an_op_claims_to_need_less(monkeypatch):
    """A non-overlapping MaxPool's pullback finds each window's maximum by comparing its input
    with its output: a registry entry that drops the output must be caught."""
    monkeypatch.setenv("ROOTCLAD_CHECK_PLAN", "1")
    monkeypatch.setattr(OPS["maxpool1d"], "saves", ("in",))
    net = _then_scale(lambda: nn.Sequential(nn.MaxPool1d(4)).double())()
    with pytest.raises(AssertionError, match="d_input"):
        check_against_torch(net, sample_input((2, 12)), F64)


def test_plan_check_fails_without_the_adjoint_markers(monkeypatch):
    """Adjoints in H and R are zeroed by markers in the sweep; without them they hold NaN."""
    monkeypatch.setenv("ROOTCLAD_CHECK_PLAN", "1")
    monkeypatch.setattr(cpu._Emitter, "markers", lambda self, idx, code: None)
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    with pytest.raises(AssertionError, match="d_input|vjp"):
        check_against_torch(net, sample_input((6,)), F64)


def test_a_permutation_merged_to_fewer_axes_moves_every_element_as_numpy_does():
    """merged_permutation (size-1 axes dropped, neighbours that stay in order merged) against
    numpy's transpose on random shapes and permutations of up to 6 axes; and a permutation
    that needs 5 axes stays 5."""
    from rootclad.ir.ops.shape import merged_permutation

    rng = np.random.default_rng(0)
    for _ in range(500):
        rank = int(rng.integers(1, 7))
        shape = tuple(int(v) for v in rng.integers(1, 4, rank))
        perm = tuple(int(v) for v in rng.permutation(rank))
        x = rng.standard_normal(shape)
        merged, mperm = merged_permutation(shape, perm)
        assert len(merged) <= rank
        np.testing.assert_array_equal(
            x.transpose(perm).ravel(), x.reshape(merged).transpose(mperm).ravel()
        )
    assert merged_permutation((2, 3, 4, 5, 6), (4, 3, 2, 1, 0)) == (
        (2, 3, 4, 5, 6),
        (4, 3, 2, 1, 0),
    )
    assert merged_permutation((2, 3, 4, 5, 6), (0, 2, 1, 3, 4)) == ((2, 3, 4, 30), (0, 2, 1, 3))
