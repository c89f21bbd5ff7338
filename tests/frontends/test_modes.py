"""A layer of the model's own whose forward reads ``self.training``: torch.export captures the
branch of the mode the model is compiled in, and cm.train()/cm.eval() switch only torch's own
layers. A switch to a mode whose capture lowers otherwise is refused, naming the layer; one
whose capture is the same graph is taken, and the compiled model then matches torch there."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import assert_close_rel
from torch import nn
from torch.nn import functional as F

import rootclad

F64 = torch.float64


class _Shifted(nn.Module):
    """Adds 0.5 in training only (an augmentation written as its author would)."""

    def forward(self, x):
        return x + 0.5 if self.training else x


class _Refused(nn.Module):
    """In eval mode, a shape read from the values (which the compile refuses)."""

    def forward(self, x):
        return x if self.training else x[x > 0].sum().reshape(1, 1).expand_as(x)


class _Harmless(nn.Module):
    """Reads the mode for a dropout of p = 0: the same graph in either mode."""

    def forward(self, x):
        return F.dropout(x, 0.0, self.training)


class _NeverRead(nn.Module):
    """Reads the mode only behind a flag that is off (torchvision's DenseNet layer so)."""

    def __init__(self):
        super().__init__()
        self.checkpointed = False

    def forward(self, x):
        return x * 2 if self.checkpointed and self.training else x


def _net(layer):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), layer, nn.Linear(3, 2)).double()


def _x():
    return torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("compiled_in", ["train", "eval"])
def test_a_switch_to_a_mode_the_models_own_layer_computes_otherwise_is_refused(compiled_in):
    net, x = _net(_Shifted()), _x()
    getattr(net, compiled_in)()
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    assert cm.graph.mode_reads == ("1",)
    assert_close_rel(cm(x), net(x), 1e-14, f"{compiled_in} mode")  # the captured mode
    other = "eval" if compiled_in == "train" else "train"
    words = rf"compiled in .* mode, and the forward of '1' reads self\.training: .*net\.{other}\(\)"
    with pytest.raises(RuntimeError, match=words):
        getattr(cm, other)()
    assert cm.training == (compiled_in == "train")  # the mode stays
    assert type(net[1]) is _Shifted  # the layer's own class again after the capture


def test_a_switch_to_a_mode_whose_capture_is_refused_is_refused_saying_why():
    cm = rootclad.compile(_net(_Refused()), _x(), loss="mse", engine="pullback")
    with pytest.raises(RuntimeError, match=r"capture in that mode is refused .*depends on"):
        cm.eval()


def test_a_layer_reading_the_mode_to_the_same_graph_switches_and_matches_torch_in_both():
    net, x = _net(_Harmless()), _x()
    cm = rootclad.compile(net, x, loss="mse", engine="pullback")
    assert cm.graph.mode_reads == ("1",)
    assert_close_rel(cm.eval()(x), net.eval()(x), 1e-14, "eval")
    assert_close_rel(cm.train()(x), net.train()(x), 1e-14, "train")


def test_a_mode_read_behind_a_flag_that_is_off_is_not_a_read():
    cm = rootclad.compile(_net(_NeverRead()), _x(), loss="mse", engine="pullback")
    assert cm.graph.mode_reads == ()
    assert cm._mode_check.__qualname__.startswith("ModelBase")  # none held, none captured


def test_the_device_programs_switch_captures_with_the_example_it_was_compiled_with():
    """compile_device casts the example to the model's type: the other mode's capture takes
    that example too (a float32 example of a float64 build switches, and is checked)."""
    from rootclad.compiler import compile_device

    net, x = _net(_Harmless()), _x()
    dm = compile_device(net, x.float(), device="cpu", loss="mse", dtype=F64)
    assert_close_rel(dm.eval().predict(x), net.eval()(x), 1e-12, "eval")
    shifted = compile_device(_net(_Shifted()), x.float(), device="cpu", loss="mse", dtype=F64)
    with pytest.raises(RuntimeError, match="computes otherwise in that mode"):
        shifted.eval()
