"""A neural likelihood-ratio fit inside RooFit, against the exact likelihood fit.

The toy: an observable x ~ Gauss(mu, 1) with mu the parameter of interest, generated with
ROOT's generators (TRandom3 for training, RooGaussian::generate for the observed data). A
classifier conditioned on mu learns to tell (x, mu) with x ~ Gauss(mu, 1) from x ~ Gauss(0, 2):
its logit is then log p(x | mu) - log p_ref(x), so that minus its sum over the observed events
is the negative log-likelihood up to a constant (the likelihood-ratio trick). rootclad trains
it, and `rootclad::RooModelSum` puts it into RooFit; RooMinimizer (Minuit2) fits mu with the
network's exact gradient from the compiled backward, and again with Minuit's numerical one.
The exact fit is RooFit's own (RooGaussian::fitTo).

    python tutorials/roofit_neural_likelihood.py [--out build/roofit_nlr]

Prints the three fits (value, uncertainty, calls of the NLL + of its gradient, time) and writes the profile of -log L
around each minimum as a PNG and the workspace (data, network, NLL) as a ROOT file.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import rootclad
from rootclad.root import roofit

MU_TRUE, N_OBSERVED, N_TRAIN, MU_RANGE = 0.3, 200, 500_000, 1.5


def training_data(rng) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, mu) pairs, label 1 for x ~ Gauss(mu, 1), 0 for x ~ Gauss(0, 2) (mu drawn alike),
    from TRandom3's uniforms (RndmArray: a million numbers per call, not a call per number)
    by the Box-Muller transform."""
    u = np.empty(3 * 2 * N_TRAIN)
    rng.RndmArray(len(u), u)
    u1, u2, u3 = u.reshape(3, -1)
    mu = MU_RANGE * (2 * u1 - 1)
    z = np.sqrt(-2 * np.log(u2)) * np.cos(2 * np.pi * u3)
    signal = np.arange(2 * N_TRAIN) < N_TRAIN
    x = np.where(signal, mu + z, 2 * z)
    return torch.tensor(np.stack([x, mu], 1)), torch.tensor(signal[:, None], dtype=torch.float64)


def optimal_logit(z: torch.Tensor) -> torch.Tensor:
    """log Gauss(x; mu, 1) - log Gauss(x; 0, 2): what the classifier would learn exactly."""
    x, mu = z[:, :1], z[:, 1:]
    return -0.5 * (x - mu) ** 2 + 0.5 * (x / 2) ** 2 + np.log(2.0)


def train(x: torch.Tensor, y: torch.Tensor):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    cm = rootclad.compile(net.double(), example_input=x[:1], loss="bce_with_logits")
    opt = rootclad.optim.Adam(cm, lr=3e-3)
    g = torch.Generator().manual_seed(2)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    for epoch in range(6):
        if epoch == 4:
            opt.lr = 3e-4
        order = torch.randperm(len(x), generator=g)
        losses = [cm.train_step(x[b], y[b], opt) for b in order.split(2048)]
        print(f"epoch {epoch + 1}: loss {np.mean(losses):.5f}")
    cm.eval()
    with torch.no_grad():
        print(
            f"loss {bce(cm(x), y).item():.5f}; the exact ratio's {bce(optimal_logit(x), y).item():.5f}"
        )
    return cm


def migrad(ROOT, function, gradient: bool):
    cfg = ROOT.RooMinimizer.Config()
    cfg.useGradient = gradient
    m = ROOT.RooMinimizer(function, cfg)
    m.setPrintLevel(-1)
    m.setErrorLevel(0.5)
    function.getVal()  # first calls (the model loaded, Cling's wrappers) outside the timing
    function.gradient(np.zeros(1))
    start, before = time.perf_counter(), function.gradient_calls()
    status = m.migrad() + m.hesse()
    calls = f"{m.evalCounter()}+{function.gradient_calls() - before}"
    return status, calls, time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default="build/roofit_nlr", help="directory for the PNG and ROOT file"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    ROOT = roofit.load()
    ROOT.RooMsgService.instance().setGlobalKillBelow(ROOT.RooFit.WARNING)
    cm = train(*training_data(ROOT.TRandom3(7)))

    x = ROOT.RooRealVar("x", "x", -10, 10)
    mu = ROOT.RooRealVar("mu", "mu", 0.0, -MU_RANGE, MU_RANGE)
    one = ROOT.RooRealVar("one", "sigma", 1.0)
    pdf = ROOT.RooGaussian("gauss", "Gauss(x; mu, 1)", x, mu, one)
    ROOT.RooRandom.randomGenerator().SetSeed(3)
    mu.setVal(MU_TRUE)
    data = pdf.generate(ROOT.RooArgSet(x), N_OBSERVED)

    fits = {}
    mu.setVal(0.0)
    start = time.perf_counter()
    pdf.fitTo(data, ROOT.RooFit.PrintLevel(-1))
    fits["exact (RooGaussian::fitTo)"] = (
        mu.getVal(),
        mu.getError(),
        None,
        time.perf_counter() - start,
    )

    network = roofit.function(cm, [x, mu], name="logr")
    nll = roofit.model_sum(network, data, scale=-1.0, name="nll")
    migrad(ROOT, nll, False)  # the process's first RooMinimizer sets itself up: not timed
    for gradient in (True, False):
        mu.setVal(0.0)
        mu.setError(0.0)
        status, calls, seconds = migrad(ROOT, nll, gradient)
        assert status == 0, "the fit did not converge"
        label = "network, rootclad's gradient" if gradient else "network, numerical gradient"
        fits[label] = (mu.getVal(), mu.getError(), calls, seconds)
    best = fits["network, rootclad's gradient"][0]

    exact_mu, exact_err = next(iter(fits.values()))[:2]
    print(f"\n{N_OBSERVED} events with mu = {MU_TRUE}")
    print(f"{'fit':32s} {'mu':>8s} {'error':>7s} {'calls':>8s} {'ms':>7s}")
    for label, (value, error, calls, seconds) in fits.items():
        print(f"{label:32s} {value:8.4f} {error:7.4f} {calls or '':>8} {1e3 * seconds:7.1f}")
    value, error = fits["network, rootclad's gradient"][:2]
    shift = (value - exact_mu) / exact_err
    print(f"network - exact: {shift:+.3f} sigma; error ratio {error / exact_err:.3f}")

    profile(ROOT, pdf, data, nll, mu, exact_mu, best, exact_err, out / "profile.png")
    w = ROOT.RooWorkspace("w", "neural likelihood ratio")
    w.Import(nll)
    w.Import(data)
    w.writeToFile(str(out / "workspace.root"))
    print(f"wrote {out / 'profile.png'} and {out / 'workspace.root'}")
    return fits


def profile(ROOT, pdf, data, nll, mu, exact_mu, best, err, path: Path) -> None:
    """-log L - its minimum over mu for the exact likelihood and the network's."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    exact_nll = pdf.createNLL(data)
    grid = np.linspace(exact_mu - 3 * err, exact_mu + 3 * err, 61)
    curves = {}
    for label, f, at in (("exact", exact_nll, exact_mu), ("network", nll, best)):
        mu.setVal(at)
        low = f.getVal()
        values = []
        for m in grid:
            mu.setVal(m)
            values.append(f.getVal() - low)
        curves[label] = values
    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(grid, curves["exact"], label="exact (RooGaussian)")
    ax.plot(grid, curves["network"], "--", label="network (rootclad::RooModelSum)")
    ax.axhline(0.5, color="grey", lw=0.5)
    ax.set_xlabel("mu")
    ax.set_ylabel("-log L - min")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
