"""Reference networks beyond the GW ones (``rootclad.gw.models``), shared by the tests, the
benchmarks and the tutorials."""

from __future__ import annotations


def digits_cnn(classes: int = 10):
    """The classic 2-D CNN for 28x28 digit images (input (B, 1, 28, 28), logits out)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 32), nn.ReLU(), nn.Linear(32, classes),
    )  # fmt: skip
