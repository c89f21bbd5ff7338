"""The comparison helpers must fail on wrong answers, or every test built on them is vacuous."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import (
    assert_close_rel,
    assert_grads_close,
    assert_same_nan,
    check_against_torch,
    max_rel_err,
    torch_loss,
)
from torch import nn

import rootclad


def test_assert_close_rel_passes_on_equal_and_on_rounding():
    a = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    assert_close_rel(a, a.clone(), 1e-10)
    assert_close_rel(a * (1 + 1e-12), a, 1e-10)


@pytest.mark.parametrize(
    "actual, expected",
    [
        ([1.0, 2.0, 3.0 + 1e-6], [1.0, 2.0, 3.0]),  # just above the tolerance
        ([1.0, 2.0], [1.0, 2.0, 3.0]),  # shape
        ([[1.0, 2.0, 3.0]], [1.0, 2.0, 3.0]),  # shape, same values
        ([1.0, float("nan"), 3.0], [1.0, 2.0, 3.0]),
        ([1.0, float("inf"), 3.0], [1.0, 2.0, 3.0]),
        ([0.0, 0.0], [0.0, 0.0]),  # a vacuous (all-zero) reference
        ([-1.0, -2.0, -3.0], [1.0, 2.0, 3.0]),  # sign
    ],
)
def test_assert_close_rel_fails_on_wrong_answers(actual, expected):
    with pytest.raises(AssertionError):
        assert_close_rel(
            torch.tensor(actual, dtype=torch.float64),
            torch.tensor(expected, dtype=torch.float64),
            1e-10,
        )


def test_assert_close_rel_float32_tolerance_fails_on_wrong_answer():
    with pytest.raises(AssertionError):
        assert_close_rel(torch.tensor([1.0, 2.001]), torch.tensor([1.0, 2.0]), 1e-4)


def test_assert_close_rel_nonzero_false_accepts_zero_reference_only_when_equal():
    assert_close_rel(torch.zeros(3), torch.zeros(3), 1e-10, nonzero=False)
    with pytest.raises(AssertionError):
        assert_close_rel(torch.tensor([0.0, 1e-30, 0.0]), torch.zeros(3), 1e-10, nonzero=False)


def test_max_rel_err_is_relative_to_the_reference_scale():
    e = torch.tensor([100.0, 0.0], dtype=torch.float64)
    assert max_rel_err(torch.tensor([100.0, 1.0], dtype=torch.float64), e) == pytest.approx(0.01)


def test_assert_grads_close_fails_on_wrong_gradient_and_on_wrong_names():
    g = {"0.weight": torch.ones(2, 3, dtype=torch.float64), "0.bias": torch.ones(2)}
    assert_grads_close({k: v.clone() for k, v in g.items()}, g, 1e-10)
    wrong = {k: v.clone() for k, v in g.items()}
    wrong["0.bias"][1] += 1e-6
    with pytest.raises(AssertionError):
        assert_grads_close(wrong, g, 1e-10)
    with pytest.raises(AssertionError):
        assert_grads_close({"0.weight": g["0.weight"]}, g, 1e-10)
    with pytest.raises(AssertionError):
        assert_grads_close(dict(reversed(list(g.items()))), g, 1e-10)


def test_torch_loss_references_match_their_formulas():
    z = torch.tensor([[0.3, -1.2], [2.0, 0.1]], dtype=torch.float64)
    y = torch.tensor([[1.0, 0.0], [0.25, 1.0]], dtype=torch.float64)
    bce = (torch.clamp(z, min=0) - z * y + torch.log1p(torch.exp(-z.abs()))).mean()
    assert_close_rel(torch_loss("bce_with_logits", z, y), bce, 1e-14)
    assert_close_rel(torch_loss("mse", z, y), ((z - y) ** 2).mean(), 1e-14)
    t = torch.tensor([1, 0])
    ce = (torch.logsumexp(z, 1) - z[torch.arange(2), t]).mean()
    assert_close_rel(torch_loss("cross_entropy", z, t), ce, 1e-14)
    with pytest.raises(ValueError):
        torch_loss("hinge", z, y)


def test_check_against_torch_fails_when_the_compiled_model_is_wrong(monkeypatch):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 3)).double()
    x = torch.randn(4, 5, dtype=torch.float64)
    check_against_torch(net, x)  # the honest model passes

    real_compile = rootclad.compile

    def compile_with_a_perturbed_weight(*args, **kwargs):
        cm = real_compile(*args, **kwargs)
        with torch.no_grad():
            dict(cm.named_parameters())["0.weight"][1, 2] += 1e-7
        return cm

    monkeypatch.setattr(rootclad, "compile", compile_with_a_perturbed_weight)
    with pytest.raises(AssertionError):
        check_against_torch(net, x)


def test_assert_same_nan_passes_on_the_same_pattern():
    nan = float("nan")
    assert_same_nan(torch.tensor([1.0, nan, 2.0]), torch.tensor([5.0, nan, 0.0]))


@pytest.mark.parametrize(
    "actual, expected",
    [([1.0, 0.0, 2.0], [1.0, float("nan"), 2.0]), ([float("nan"), 1.0], [1.0, 1.0]),
     ([float("nan")], [float("nan"), float("nan")])],
)  # fmt: skip
def test_assert_same_nan_fails_on_another_pattern(actual, expected):
    with pytest.raises(AssertionError):
        assert_same_nan(torch.tensor(actual), torch.tensor(expected))


def test_assert_grads_close_against_all_fails_on_a_wrong_small_gradient():
    """Measured against the largest gradient, a near-zero gradient may carry rounding noise,
    but a wrong one still fails, and so does a wrong large one."""
    g = {
        "big": torch.tensor([10.0, -4.0], dtype=torch.float64),
        "tiny": torch.tensor([1e-13, 0.0], dtype=torch.float64),
    }
    noisy = {"big": g["big"].clone(), "tiny": torch.tensor([3e-13, -2e-13], dtype=torch.float64)}
    assert_grads_close(noisy, g, 1e-10, against_all=True)
    with pytest.raises(AssertionError, match="dtiny"):
        assert_grads_close(noisy, g, 1e-10)  # against its own scale: noise fails
    with pytest.raises(AssertionError, match="dtiny: error"):
        assert_grads_close({**noisy, "tiny": torch.tensor([0.1, 0.0], dtype=torch.float64)}, g, 1e-10,
                           against_all=True)  # fmt: skip
    with pytest.raises(AssertionError, match="dbig: error"):
        assert_grads_close({**noisy, "big": g["big"] * 1.01}, g, 1e-10, against_all=True)
    with pytest.raises(AssertionError, match="every reference gradient is zero"):
        assert_grads_close({"a": torch.zeros(2)}, {"a": torch.zeros(2)}, 1e-10, against_all=True)
