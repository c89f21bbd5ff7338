"""A rootclad model as a RooFit function (rootclad/roofit.h): its value and gradient against
torch, Minuit2 fits with it against RooFit's own exact fit, a workspace read back in a fresh
process, and the errors for inputs that do not match the model."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import rootclad

pytest.importorskip("ROOT")
from rootclad.root import roofit  # noqa: E402

N_EVENTS, MU_TRUE = 400, 0.35


class GaussLogLikelihood(nn.Module):
    """log N(x; mu, 1) up to a constant, from the input (x, mu): a network whose sum over a
    toy is exactly the Gaussian log-likelihood, so that the fit with it must equal RooFit's."""

    def __init__(self):
        super().__init__()
        self.diff = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.diff.weight.copy_(torch.tensor([[1.0, -1.0]]))

    def forward(self, z):
        d = self.diff(z)
        return -0.5 * d * d


@pytest.fixture(scope="module")
def root():
    return roofit.load()


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)).double().eval()
    return net, rootclad.compile(net, example_input=torch.zeros(1, 2, dtype=torch.float64))


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    net = GaussLogLikelihood().double().eval()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 2, dtype=torch.float64))
    stem = tmp_path_factory.mktemp("gauss") / "gauss"
    cm.export(str(stem))
    return str(stem)


def _toy(root):
    x = root.RooRealVar("x", "x", -10, 10)
    mu = root.RooRealVar("mu", "mu", MU_TRUE, -3, 3)
    sigma = root.RooRealVar("sigma", "sigma", 1.0)
    pdf = root.RooGaussian("pdf", "pdf", x, mu, sigma)
    root.RooRandom.randomGenerator().SetSeed(11)
    data = pdf.generate(root.RooArgSet(x), N_EVENTS)
    return x, mu, sigma, pdf, data


def _migrad(root, function):
    m = root.RooMinimizer(function)
    m.setPrintLevel(-1)
    m.setErrorLevel(0.5)
    m.setEps(1e-6)  # Migrad stops at EDM < 1e-9: the minimum to a fraction of 1e-4 sigma
    assert m.migrad() == 0
    assert m.hesse() == 0
    return m


def test_value_and_gradient_are_the_models(root, mlp):
    net, cm = mlp
    x = root.RooRealVar("x", "x", 0.3, -5, 5)
    mu = root.RooRealVar("mu", "mu", -0.2, -3, 3)
    f = roofit.function(cm, [x, mu], name="nn")
    for xv, mv in [(0.3, -0.2), (-1.7, 2.1)]:
        x.setVal(xv)
        mu.setVal(mv)
        z = torch.tensor([[xv, mv]], dtype=torch.float64, requires_grad=True)
        out = net(z)
        (dz,) = torch.autograd.grad(out.sum(), z)
        assert f.getVal() == pytest.approx(out.item(), rel=1e-12, abs=1e-12)
        assert f.hasGradient()
        g = np.zeros(2)
        f.gradient(g)  # RooMinimizer's order: floating parameters by name, mu then x
        np.testing.assert_allclose(g, [dz[0, 1].item(), dz[0, 0].item()], rtol=1e-10)
        np.testing.assert_allclose(list(f.input_gradient()), dz[0].tolist(), rtol=1e-10)
    x.setConstant(True)  # a constant parameter keeps its entry (RooMinimizer's layout)
    g = np.zeros(2)
    f.gradient(g)
    np.testing.assert_allclose(g, [dz[0, 1].item(), dz[0, 0].item()], rtol=1e-10)


class ShiftedGaussLogLikelihood(nn.Module):
    """log N(x; mu + 2 alpha, 1) from (x, alpha, mu): with alpha held constant, a parameter that
    RooMinimizer's gradient layout holds before mu (they sort by name)."""

    def forward(self, z):
        d = z[:, 0:1] - 2 * z[:, 1:2] - z[:, 2:3]
        return -0.5 * d * d


def test_a_constant_parameter_keeps_its_place_in_the_gradient(root, tmp_path):
    """RooMinimizer asks for one derivative per parameter, constant ones too (by name): the fit
    of mu with alpha fixed lands where the exact one does, with the gradient and without."""
    net = ShiftedGaussLogLikelihood().double().eval()
    cm = rootclad.compile(net, example_input=torch.zeros(1, 3, dtype=torch.float64))
    x, mu, _, _, data = _toy(root)
    alpha = root.RooRealVar("alpha", "alpha", 0.1, -1, 1)
    alpha.setConstant(True)
    f = roofit.function(cm, [x, alpha, mu], name="shifted")
    nll = roofit.model_sum(f, data, scale=-1.0)
    g = np.zeros(2)
    mu.setVal(0.0)
    nll.gradient(g)  # [alpha, mu]: d/dalpha = 2 d/dmu
    assert g[0] == pytest.approx(2 * g[1], rel=1e-12) and g[1] != 0
    want = np.mean([data.get(i).getRealValue("x") for i in range(N_EVENTS)]) - 0.2
    for gradient in (True, False):
        mu.setVal(0.0)
        cfg = root.RooMinimizer.Config()
        cfg.useGradient = gradient
        m = root.RooMinimizer(nll, cfg)
        m.setPrintLevel(-1)
        m.setEps(1e-6)
        assert m.migrad() == 0
        assert mu.getVal() == pytest.approx(want, abs=1e-5), gradient
        assert alpha.getVal() == 0.1


def test_the_network_fit_is_the_exact_fit(root, exact):
    x, mu, sigma, pdf, data = _toy(root)
    pdf.fitTo(data, root.RooFit.PrintLevel(-1), root.RooFit.Save())
    fitted, want_err = mu.getVal(), mu.getError()
    want = np.mean([data.get(i).getRealValue("x") for i in range(N_EVENTS)])  # the exact MLE
    assert fitted == pytest.approx(want, abs=0.05 * want_err)  # RooFit's fit, at its tolerance

    mu.setVal(0.0)
    mu.setError(0.0)
    f = roofit.function(exact, [x, mu], name="loglik")
    nll = roofit.model_sum(f, data, scale=-1.0)
    assert nll.hasGradient() and nll.rows() == N_EVENTS
    g = np.zeros(1)
    nll.gradient(g)  # d/dmu of sum (x - mu)^2 / 2 at mu = 0: -sum x
    assert g[0] == pytest.approx(-N_EVENTS * want, rel=1e-9)
    _migrad(root, nll)
    assert mu.getVal() == pytest.approx(want, abs=1e-4 * want_err)
    assert mu.getError() == pytest.approx(want_err, rel=1e-3)


def test_a_workspace_is_fitted_again_in_a_fresh_process(root, exact, tmp_path):
    x, mu, sigma, pdf, data = _toy(root)
    f = roofit.function(exact, [x, mu], name="loglik")
    nll = roofit.model_sum(f, data, scale=-1.0, name="nll")
    w = root.RooWorkspace("w")
    getattr(w, "import")(nll)
    path = tmp_path / "ws.root"
    w.writeToFile(str(path))
    assert path.is_file()
    _migrad(root, nll)
    here = (mu.getVal(), mu.getError())
    # as on another account: the export's copy gone from the private cache, so its library
    # (code) runs only once trusted
    md5 = f.model_export().md5()
    for copy in (Path(os.environ["ROOTCLAD_CACHE_DIR"]) / "exports").glob(f"roofit-{md5}.*"):
        copy.unlink()
    code = textwrap.dedent(
        f"""
        from rootclad.root import roofit
        ROOT = roofit.load()
        f = ROOT.TFile.Open({str(path)!r})
        w = f.Get("w")
        nll = w.function("nll")
        try:
            nll.getVal()
        except Exception as err:
            print("REFUSED", str(err).replace("\\n", " "))
        roofit.trust({md5!r})
        m = ROOT.RooMinimizer(nll)
        m.setPrintLevel(-1); m.setErrorLevel(0.5); m.setEps(1e-6); m.migrad(); m.hesse()
        mu = w.var("mu")
        print("FIT", repr(mu.getVal()), repr(mu.getError()))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    fit = [line for line in run.stdout.splitlines() if line.startswith("FIT")]
    assert fit, run.stdout + run.stderr
    refused = [line for line in run.stdout.splitlines() if line.startswith("REFUSED")]
    assert refused and f'rootclad.root.roofit.trust("{md5}")' in refused[0], run.stdout
    _, value, error = fit[0].split()
    assert float(value) == pytest.approx(here[0], abs=1e-7)
    assert float(error) == pytest.approx(here[1], rel=1e-5)


def test_inputs_that_do_not_match_the_model_are_named(root, mlp):
    _, cm = mlp
    x = root.RooRealVar("x", "x", 0.3, -5, 5)
    mu = root.RooRealVar("mu", "mu", -0.2, -3, 3)
    extra = root.RooRealVar("sigma", "sigma", 1.0)
    with pytest.raises(roofit.RooFitError, match=r"'nn'.*takes 2 inputs.*holds 3 \(x, mu, sigma\)"):
        roofit.function(cm, [x, mu, extra], name="nn")
    with pytest.raises(roofit.RooFitError, match=r"holds 1 \(x\)"):
        roofit.function(cm, [x], name="nn")
    data = root.RooDataSet("toy", "toy", root.RooArgSet(extra))
    f = roofit.function(cm, [x, mu], name="nn")
    with pytest.raises(
        roofit.RooFitError, match="dataset 'toy' has no column named as an input of 'nn'"
    ):
        roofit.model_sum(f, data)
