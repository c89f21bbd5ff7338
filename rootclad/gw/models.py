"""The networks of the GW workflow: 2048 whitened samples in, one logit out.

- :func:`gw_cnn`: three Conv1d/ReLU/MaxPool1d blocks and two Linear layers (140k parameters),
  the 1-d CNN family of Gabbard et al. 2018;
- :func:`gw_mlp`: two hidden layers (541k parameters), for comparison.
"""

from __future__ import annotations


def gw_cnn(n: int = 2048):
    """The GW CNN for segments of ``n`` samples (input (B, 1, n))."""
    from torch import nn

    length = n
    for k in (16, 8, 8):
        length = (length - k + 1) // 4
    if length < 1:
        raise ValueError(f"segments of {n} samples are too short for the GW CNN (at least 280)")
    return nn.Sequential(
        nn.Conv1d(1, 16, 16), nn.ReLU(), nn.MaxPool1d(4),
        nn.Conv1d(16, 32, 8), nn.ReLU(), nn.MaxPool1d(4),
        nn.Conv1d(32, 64, 8), nn.ReLU(), nn.MaxPool1d(4),
        nn.Flatten(), nn.Linear(64 * length, 64), nn.ReLU(), nn.Linear(64, 1),
    )  # fmt: skip


def gw_mlp(n: int = 2048):
    """The GW MLP for segments of ``n`` samples (input (B, n))."""
    from torch import nn

    return nn.Sequential(nn.Linear(n, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
                         nn.Linear(64, 1))  # fmt: skip


def make(name: str, n: int = 2048):
    """``"cnn"`` or ``"mlp"``."""
    if name == "cnn":
        return gw_cnn(n)
    if name == "mlp":
        return gw_mlp(n)
    raise ValueError(f"unknown GW model '{name}' (cnn or mlp)")
