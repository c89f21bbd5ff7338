"""Comparison helpers for the core tests; each one has a must-fail test in test_core_helpers.

References always come from torch (float64) or from finite differences, never from rootclad.
"""

from __future__ import annotations

import copy

import torch

import rootclad

RTOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (the error relative to the tensor's scale)."""
    a = torch.as_tensor(actual).detach().to(torch.float64)
    e = torch.as_tensor(expected).detach().to(torch.float64)
    scale = e.abs().max().item() if e.numel() else 0.0
    err = (a - e).abs().max().item() if e.numel() else 0.0
    return err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))


def assert_close_rel(actual, expected, rtol: float, what: str = "", nonzero: bool = True) -> None:
    """Equal shapes, finite values, and ``max|a - e| <= rtol * max|e|``.

    ``nonzero`` (the default) also demands that the reference is not all zeros, so that a
    gradient comparison cannot pass because both sides are trivially zero.
    """
    a = torch.as_tensor(actual).detach()
    e = torch.as_tensor(expected).detach()
    label = f"{what}: " if what else ""
    assert tuple(a.shape) == tuple(e.shape), f"{label}shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert bool(torch.isfinite(a).all()), f"{label}non-finite values in {a}"
    assert bool(torch.isfinite(e).all()), f"{label}non-finite values in the reference {e}"
    if nonzero:
        assert e.numel() > 0 and e.abs().max().item() > 0, f"{label}reference is all zeros"
    err = max_rel_err(a, e)
    assert err <= rtol, f"{label}relative error {err:.3e} > {rtol:.1e}\n got {a}\n want {e}"


def assert_grads_close(actual: dict, expected: dict, rtol: float, what: str = "") -> None:
    """Same parameter names, and every gradient close (see :func:`assert_close_rel`)."""
    assert list(actual) == list(expected), f"{what}: names {list(actual)} != {list(expected)}"
    for name in expected:
        assert_close_rel(actual[name], expected[name], rtol, f"{what} d{name}".strip())


def rounded_reference(net: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A float64 copy of ``net`` whose parameters are rounded to ``dtype`` first."""
    return copy.deepcopy(net).to(dtype).to(torch.float64)


def perturbed(net: torch.nn.Module, seed: int = 3) -> torch.nn.Module:
    """``net`` with random parameters and running statistics (LayerNorm and BatchNorm start
    at weight 1, bias 0, running mean 0 and variance 1, which would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        for name, b in net.named_buffers():
            if "running" in name:
                b.add_(0.3 * torch.rand(b.shape, generator=gen, dtype=b.dtype))
    return net


def sparse_like(d_out: torch.Tensor, every: int, seed: int = 0) -> torch.Tensor:
    """``d_out`` with one nonzero per window of ``every`` positions along the last axis, at a
    random place in it, and a quarter of those zeroed too: what a max-pool and a ReLU leave."""
    gen = torch.Generator().manual_seed(seed)
    n = d_out.shape[-1]
    keep = torch.zeros(d_out.shape, dtype=torch.bool)
    for w0 in range(0, n, every):
        width = min(every, n - w0)
        at = w0 + torch.randint(0, width, d_out.shape[:-1], generator=gen)
        keep.scatter_(-1, at.unsqueeze(-1), True)
    keep &= torch.rand(d_out.shape, generator=gen) >= 0.25
    return torch.where(keep, d_out, torch.zeros((), dtype=d_out.dtype))


def torch_vjp(
    net: torch.nn.Module, x: torch.Tensor, d_out: torch.Tensor | None = None, seed=0, every=1
):
    """torch's output of ``net`` and the VJP (w.r.t. x and each named parameter) for ``d_out``.

    ``d_out`` defaults to a random upstream gradient drawn with ``seed``, with one nonzero in
    ``every`` positions (``sparse_like``) when ``every`` > 1.
    """
    x = x.detach().clone().requires_grad_(True)
    out = net(x)
    if d_out is None:
        gen = torch.Generator().manual_seed(seed)
        d_out = torch.randn(out.shape, generator=gen, dtype=out.dtype)
        if every > 1:
            d_out = sparse_like(d_out, every, seed)
    names = [n for n, _ in net.named_parameters()]
    grads = torch.autograd.grad(out, [x, *net.parameters()], d_out)
    return out.detach(), d_out, grads[0], dict(zip(names, grads[1:], strict=True))


def compiled_vjp(cm, x: torch.Tensor, d_out: torch.Tensor):
    """The compiled model's output and VJP, through its torch.autograd.Function."""
    x = x.detach().clone().requires_grad_(True)
    out = cm(x)
    names = [n for n, _ in cm.named_parameters()]
    grads = torch.autograd.grad(out, [x, *cm.parameters()], d_out.to(out.dtype))
    return out.detach(), grads[0], dict(zip(names, grads[1:], strict=True))


def check_against_torch(net, x, dtype=torch.float64, engine="pullback", rtol=None, every=1, **kw):
    """Compile ``net`` for ``dtype`` and compare forward and VJP with torch in float64.

    Returns the compiled model. The reference is ``net`` in float64 with its parameters
    rounded to ``dtype``, run on ``x`` rounded to ``dtype``. ``every`` > 1 makes the upstream
    gradient sparse (``sparse_like``).
    """
    rtol = RTOL[dtype] if rtol is None else rtol
    net_c = copy.deepcopy(net).to(dtype)
    x_c = x.detach().to(dtype)
    cm = rootclad.compile(
        net_c, example_input=x_c, loss=kw.pop("loss", "bce_with_logits"), engine=engine, **kw
    )
    ref = rounded_reference(net, dtype)
    out_ref, d_out, dx_ref, dp_ref = torch_vjp(ref, x_c.to(torch.float64), every=every)
    out, dx, dp = compiled_vjp(cm, x_c, d_out)
    assert out.dtype == dtype, f"output dtype {out.dtype}, expected {dtype}"
    assert_close_rel(out, out_ref, rtol, "forward")
    assert_close_rel(dx, dx_ref, rtol, "d_input")
    assert_grads_close(dp, dp_ref, rtol, "vjp")
    return cm


def torch_loss(name: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The torch reference of a rootclad loss (mean reduction)."""
    F = torch.nn.functional
    if name == "bce_with_logits":
        return F.binary_cross_entropy_with_logits(out, y.reshape(out.shape).to(out.dtype))
    if name == "cross_entropy":
        return F.cross_entropy(out, y.reshape(-1).long())
    if name == "mse":
        return F.mse_loss(out, y.reshape(out.shape).to(out.dtype))
    if name == "nll":
        return F.nll_loss(out, y.reshape(-1).long())
    if name == "huber":
        return F.huber_loss(out, y.reshape(out.shape).to(out.dtype))
    raise ValueError(name)


def torch_loss_and_grad(net, x, y, loss: str):
    """torch's loss value and the gradient of every named parameter."""
    out = net(x)
    value = torch_loss(loss, out, y)
    names = [n for n, _ in net.named_parameters()]
    grads = torch.autograd.grad(value, list(net.parameters()))
    return value.detach(), dict(zip(names, grads, strict=True))


def mixed_model() -> torch.nn.Module:
    """Every supported layer in one chain, on (B, 2, 32) inputs, 3 logits out (float64)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv1d(2, 4, 5, stride=2, padding=2),  # (4, 16)
        nn.LeakyReLU(0.1),
        nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False),  # (4, 8)
        nn.Conv1d(4, 3, 9, padding=6, dilation=2, bias=False),  # (3, 4); 36 taps: im2col+GEMM
        nn.GELU(approximate="tanh"),
        nn.MaxPool1d(2, padding=1),  # (3, 3)
        nn.Tanh(),
        nn.AvgPool1d(2, stride=1, padding=1),  # (3, 4), count_include_pad=True
        nn.Dropout(0.3),
        nn.Flatten(),
        nn.Linear(12, 8),
        nn.ReLU(),
        nn.Linear(8, 6),
        nn.GELU(),
        nn.Identity(),
        nn.Linear(6, 5),
        nn.Sigmoid(),
        nn.Linear(5, 3, bias=False),
    ).double()


def mixed_batch(B: int = 4, seed: int = 0):
    """An input batch for :func:`mixed_model` and cross_entropy targets."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, 2, 32, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (B,), generator=gen)
    return x, y


def assert_same_nan(actual, expected, what: str = "") -> None:
    """Equal shapes and NaN at exactly the places where the reference has NaN."""
    a = torch.as_tensor(actual).detach()
    e = torch.as_tensor(expected).detach()
    label = f"{what}: " if what else ""
    assert tuple(a.shape) == tuple(e.shape), f"{label}shape {tuple(a.shape)} != {tuple(e.shape)}"
    diff = a.isnan() != e.isnan()
    assert not bool(diff.any()), (
        f"{label}NaN at {int(a.isnan().sum())} places, the reference at {int(e.isnan().sum())}; "
        f"first difference at {tuple(int(i) for i in diff.nonzero()[0])}"
    )
