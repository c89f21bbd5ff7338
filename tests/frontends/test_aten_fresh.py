"""Architectures no issue names (tests/fixtures/fresh_models.py), as their authors write them,
through the export front-end against torch autograd in float64: output, input and every
parameter gradient. Those it refuses are listed with the reason it gives."""

from __future__ import annotations

import pytest
import torch
from fixtures.core import check_against_torch
from fixtures.fresh_models import FRESH, fresh_inputs

import rootclad
from rootclad.ir.graph import IRError

# refused before any C++ is written, naming the op (docs/core.md says what is missing)
REFUSED: dict[str, str] = {}


@pytest.mark.parametrize(("name", "build", "shapes", "source"), FRESH, ids=[f[0] for f in FRESH])
def test_an_architecture_no_issue_names_compiles_and_matches_torch(name, build, shapes, source):
    torch.manual_seed(0)
    net = build().double()
    xs = fresh_inputs(shapes)
    x = xs if len(xs) > 1 else xs[0]
    if name in REFUSED:
        with pytest.raises(IRError, match=REFUSED[name]):
            rootclad.compile(net, x, loss="mse", engine="pullback")
        return
    check_against_torch(net, x, engine="pullback", loss="mse", against_all=True)
