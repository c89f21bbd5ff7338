"""The two engines: Clad's gradients equal the pullback engine's and torch's; engine choice.

Tests marked ``clad`` need an installed Clad and skip, saying what was looked for, without
one. The tests that fake an absent Clad run everywhere.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import (
    assert_close_rel,
    assert_grads_close,
    check_against_torch,
    compiled_vjp,
    mixed_batch,
    mixed_model,
    torch_loss_and_grad,
)
from torch import nn

import rootclad
from rootclad.toolchain import ToolchainError, find_clad

F64 = torch.float64

CLAD_MODES = [pytest.param(True, id="clad-pullbacks"), pytest.param(False, id="clad-nopullbacks")]


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", CLAD_MODES)
def test_clad_gradients_equal_pullback_engine_and_torch_on_the_mixed_model(clad, pullbacks):
    torch.manual_seed(0)
    net = mixed_model().eval()
    x, y = mixed_batch(5)
    by_clad = rootclad.compile(
        copy.deepcopy(net), x, loss="cross_entropy", engine="clad", pullbacks=pullbacks
    ).eval()
    by_pullback = rootclad.compile(
        copy.deepcopy(net), x, loss="cross_entropy", engine="pullback"
    ).eval()
    assert (by_clad.engine, by_clad.pullbacks) == ("clad", pullbacks)
    assert "clad::gradient" in by_clad.source_path.read_text()
    assert "clad::gradient" not in by_pullback.source_path.read_text()
    ref_value, ref_grads = torch_loss_and_grad(net, x, y, "cross_entropy")
    value_c, grads_c = by_clad.loss_and_grad(x, y)
    value_p, grads_p = by_pullback.loss_and_grad(x, y)
    assert_close_rel(value_c, ref_value, 1e-10, "clad loss vs torch")
    assert_grads_close(grads_c, ref_grads, 1e-10, "clad vs torch")
    assert_close_rel(value_c, value_p, 1e-10, "clad loss vs pullback")
    assert_grads_close(grads_c, grads_p, 1e-10, "clad vs pullback")


@pytest.mark.clad
@pytest.mark.parametrize(
    "pullbacks, dtype",
    [(True, F64), (False, F64), (False, torch.float32)],
    ids=["clad-pullbacks-f64", "clad-nopullbacks-f64", "clad-nopullbacks-f32"],
)
def test_clad_vjp_of_the_autograd_function_matches_torch(clad, pullbacks, dtype):
    """cm(x) with engine='clad' differentiates <output, d_out> with Clad: d_x and d_params."""
    torch.manual_seed(0)
    net = mixed_model().eval()
    x, _ = mixed_batch(3, seed=1)
    # float64: the libraries of the test above (the loss is part of the code, eval is not)
    check_against_torch(net, x, dtype, engine="clad", pullbacks=pullbacks, loss="cross_entropy")


@pytest.mark.clad
@pytest.mark.parametrize(
    "loss, pullbacks",
    [("bce_with_logits", False), ("mse", True), ("huber", False), ("huber", True)],
    ids=["bce-nopullbacks", "mse-pullbacks", "huber-nopullbacks", "huber-pullbacks"],
)
def test_clad_losses_match_torch(clad, loss, pullbacks):
    """Losses keep their hand-written pullback in both modes; one compile per loss."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, generator=gen, dtype=F64)
    y = torch.rand(5, 2, generator=gen, dtype=F64)
    cm = rootclad.compile(copy.deepcopy(net), x, loss=loss, engine="clad", pullbacks=pullbacks)
    value, grads = cm.loss_and_grad(x, y)
    ref_value, ref_grads = torch_loss_and_grad(net, x, y, loss)
    assert_close_rel(value, ref_value, 1e-10, f"{loss} value")
    assert_grads_close(grads, ref_grads, 1e-10, loss)


@pytest.mark.clad
@pytest.mark.parametrize("pullbacks", CLAD_MODES)
def test_clad_and_pullback_engines_agree_with_dropout_in_training_mode(clad, pullbacks):
    """torch cannot be the reference (another RNG); equal seeds give equal masks in both
    engines, so the training-mode gradients and train_step runs must agree."""
    torch.manual_seed(0)
    net = mixed_model()
    x, y = mixed_batch(6, seed=2)
    by_clad = rootclad.compile(
        copy.deepcopy(net), x, loss="cross_entropy", engine="clad", pullbacks=pullbacks, seed=3
    )
    by_pullback = rootclad.compile(
        copy.deepcopy(net), x, loss="cross_entropy", engine="pullback", seed=3
    )
    assert by_clad.training and by_pullback.training
    for _ in range(2):
        value_c, grads_c = by_clad.loss_and_grad(x, y)
        value_p, grads_p = by_pullback.loss_and_grad(x, y)
        assert_close_rel(value_c, value_p, 1e-10, "loss")
        assert_grads_close(grads_c, grads_p, 1e-10, "clad vs pullback")
        # the autograd Function: Clad's VJP re-runs the forward with the call's own seed
        d_out = torch.randn(6, 3, dtype=F64)
        out_c, dx_c, dp_c = compiled_vjp(by_clad, x, d_out)
        out_p, dx_p, dp_p = compiled_vjp(by_pullback, x, d_out)
        assert_close_rel(out_c, out_p, 1e-10, "output")
        assert_close_rel(dx_c, dx_p, 1e-10, "d_input")
        assert_grads_close(dp_c, dp_p, 1e-10, "vjp clad vs pullback")
    opt_c, opt_p = rootclad.optim.Adam(by_clad, lr=1e-2), rootclad.optim.Adam(by_pullback, lr=1e-2)
    for _ in range(20):
        lc, lp = by_clad.train_step(x, y, opt_c), by_pullback.train_step(x, y, opt_p)
        assert lc == pytest.approx(lp, rel=1e-10)
    for (k, p), q in zip(by_clad.named_parameters(), by_pullback.parameters(), strict=True):
        assert_close_rel(p, q, 1e-9, k)


@pytest.mark.clad
@pytest.mark.parametrize(
    "layer, shape",
    [
        (nn.Conv1d(3, 2, 4, stride=2, padding=2, dilation=2), (3, 13)),
        (nn.MaxPool1d(3, stride=2, padding=1), (2, 11)),
    ],
    ids=["conv1d", "maxpool"],
)
def test_clad_differentiates_single_kernels_itself(clad, layer, shape):
    """pullbacks=False: Clad differentiates the plain loops of one kernel (then a Linear).

    The mixed model covers every kernel; these two (index arithmetic, argmax) localise."""
    torch.manual_seed(0)
    n = torch.zeros(1, *shape)
    with torch.no_grad():
        n = layer.double()(n.double()).numel()
    net = nn.Sequential(layer, nn.Flatten(), nn.Linear(n, 2)).double()
    x = torch.randn(3, *shape, dtype=F64)
    check_against_torch(net, x, engine="clad", pullbacks=False)


@pytest.mark.clad
def test_auto_picks_clad_when_present(clad):
    net = nn.Sequential(nn.Linear(4, 2)).double()
    cm = rootclad.compile(net, example_input=torch.randn(2, 4, dtype=F64))
    assert cm.engine == "clad"
    assert rootclad.engines_available()["clad"].startswith("available")


def test_engine_clad_without_clad_says_what_was_looked_for(toolchain_env, tmp_path):
    import rootclad.toolchain.find as find

    for var in ("ROOTCLAD_CLAD_PLUGIN", "ROOTCLAD_CLAD_INCLUDE", "CLAD_PREFIX"):
        toolchain_env.delenv(var, raising=False)
    toolchain_env.setattr(find, "CLAD_PREFIXES", (str(tmp_path / "no-clad"),))
    net = nn.Sequential(nn.Linear(5, 3)).double()  # the library of the per-op Linear case
    x = torch.randn(2, 5, dtype=F64)
    with pytest.raises(ToolchainError) as err:
        rootclad.compile(net, example_input=x, engine="clad")
    msg = str(err.value)
    assert str(tmp_path / "no-clad" / "lib" / "clad.so") in msg, msg
    assert "ROOTCLAD_CLAD_PLUGIN" in msg, msg
    assert "engine='pullback'" in msg, msg
    with pytest.raises(ToolchainError):
        rootclad.compile(net, example_input=x, engine="clad", pullbacks=False)
    assert rootclad.engines_available()["clad"].startswith("unavailable")
    cm = rootclad.compile(net, example_input=x)  # auto
    assert cm.engine == "pullback"
    assert_close_rel(cm.predict(x), net(x).detach(), 1e-10)


def test_clad_header_missing_is_reported(toolchain_env, clad, tmp_path):
    """A plugin without its headers is not a usable Clad; the reason names the header."""
    toolchain_env.setenv("ROOTCLAD_CLAD_PLUGIN", clad.plugin)
    toolchain_env.setenv("ROOTCLAD_CLAD_INCLUDE", str(tmp_path))
    find_clad.cache_clear()  # the clad fixture looked before the variables changed
    with pytest.raises(ToolchainError) as err:
        rootclad.compile(nn.Sequential(nn.Linear(4, 2)), torch.randn(2, 4), engine="clad")
    assert "Differentiator.h" in str(err.value)
