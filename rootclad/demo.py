"""``rootclad demo``: train the issue's 1-d CNN on a small synthetic signal-vs-noise set.

This is the placeholder main job until the gravitational-wave workflow lands: noise is white
Gaussian, signals are short chirps at random times, and the network learns to tell them apart.
It shows which engine built the backward pass, compile and warm-load times, the training
curve, validation accuracy, and the step time next to the same model in torch eager.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default="auto", choices=["auto", "clad", "pullback"])
    p.add_argument("--events", type=int, default=2048, help="training events (default 2048)")
    p.add_argument("--steps", type=int, default=300, help="Adam steps (default 300)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=2048, help="samples per event")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("rootclad-demo"),
        help="where the plot and summary go (default ./rootclad-demo)",
    )


def synthetic_events(n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 1, length) float32 strain and labels: white noise, half with a chirp added."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, length)).astype(np.float32)
    y = (rng.random(n) < 0.5).astype(np.float32)
    t = np.arange(length) / length
    for i in np.flatnonzero(y):
        t0 = rng.uniform(0.3, 0.9)
        f0, f1 = rng.uniform(20, 40), rng.uniform(100, 200)
        tau = np.clip((t - (t0 - 0.25)) / 0.25, 0, 1)  # 0.25 s chirp ending at t0
        phase = 2 * np.pi * length * (f0 * tau + 0.5 * (f1 - f0) * tau**2) * 0.25
        env = np.where((tau > 0) & (tau < 1), np.sin(np.pi * tau) ** 2, 0.0)
        x[i, 0] += (rng.uniform(1.0, 2.0) * env * np.sin(phase)).astype(np.float32)
    return x, y


def make_cnn() -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv1d(1, 16, 16), nn.ReLU(), nn.MaxPool1d(4),
        nn.Conv1d(16, 32, 8), nn.ReLU(), nn.MaxPool1d(4),
        nn.Conv1d(32, 64, 8), nn.ReLU(), nn.MaxPool1d(4),
        nn.Flatten(), nn.LazyLinear(64), nn.ReLU(), nn.Linear(64, 1),
    )  # fmt: skip


def _write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def run_demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import rootclad

    torch.manual_seed(args.seed)
    n_val = max(args.events // 4, args.batch)
    x, y = synthetic_events(args.events + n_val, args.length, args.seed)
    xt, yt = torch.from_numpy(x[: args.events]), torch.from_numpy(y[: args.events])
    xv, yv = torch.from_numpy(x[args.events :]), torch.from_numpy(y[args.events :])

    net = make_cnn()
    net(xt[: args.batch])  # materialise LazyLinear
    reference = make_cnn()
    reference(xt[: args.batch])
    reference.load_state_dict(net.state_dict())

    t0 = time.perf_counter()
    cm = rootclad.compile(net, xt[: args.batch], loss="bce_with_logits", engine=args.engine)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    rootclad.compile(net, xt[: args.batch], loss="bce_with_logits", engine=args.engine)
    warm = time.perf_counter() - t0
    print(
        f"compiled with engine={cm.engine!r} in {first:.2f} s "
        f"({'built' if cm.built_now else 'from cache'}); warm-cache load {warm:.2f} s"
    )
    print(f"  library: {cm.library_path}")

    opt = rootclad.optim.Adam(cm, lr=1e-3)
    topt = torch.optim.Adam(reference.parameters(), lr=1e-3)
    lossf = torch.nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(args.seed)
    losses, t_rc, t_torch = [], [], []
    for step in tqdm(range(args.steps), desc="training", unit="step"):
        idx = torch.randint(0, args.events, (args.batch,), generator=gen)
        xb, yb = xt[idx], yt[idx]
        t = time.perf_counter()
        losses.append(cm.train_step(xb, yb, opt))
        t_rc.append(time.perf_counter() - t)
        if step < 50:  # the same step in torch eager, for the speed comparison
            t = time.perf_counter()
            topt.zero_grad()
            lossf(reference(xb).squeeze(1), yb).backward()
            topt.step()
            t_torch.append(time.perf_counter() - t)

    cm.eval()
    with torch.no_grad():
        pred = (cm.predict(xv).squeeze(1) > 0).float()
    acc = float((pred == yv).float().mean())
    rc_ms, torch_ms = 1e3 * float(np.median(t_rc)), 1e3 * float(np.median(t_torch))
    print(
        f"final training loss {np.mean(losses[-20:]):.4f}; validation accuracy {acc:.3f} "
        f"on {len(yv)} events"
    )
    print(
        f"train step (batch {args.batch}): rootclad {rc_ms:.2f} ms, torch eager {torch_ms:.2f} ms"
        f" (x{torch_ms / rc_ms:.2f})"
    )

    args.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "engine": cm.engine,
        "compile_seconds": first,
        "warm_load_seconds": warm,
        "validation_accuracy": acc,
        "losses": losses,
        "step_ms_rootclad": rc_ms,
        "step_ms_torch_eager": torch_ms,
        "batch": args.batch,
        "steps": args.steps,
    }
    _write_json(args.out / "summary.json", summary)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=0.8, label=f"rootclad ({cm.engine})")
    ax.set_xlabel("step")
    ax.set_ylabel("BCE loss")
    ax.set_title(f"CNN on synthetic chirps: validation accuracy {acc:.3f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "loss.png", dpi=120)
    print(f"wrote {args.out / 'summary.json'} and {args.out / 'loss.png'}")
    return 0 if acc > 0.5 else 1
