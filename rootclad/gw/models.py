"""The networks of the GW workflow: 2048 whitened samples in, one logit out.

- :func:`gw_cnn`: three Conv1d/ReLU/MaxPool1d blocks and two Linear layers (140k parameters),
  the 1-d CNN family of Gabbard et al. 2018;
- :func:`gw_mlp`: two hidden layers (541k parameters), for comparison;
- :func:`gw_resnet`: a ResNet-style 1-d classifier (residual blocks, optionally with
  BatchNorm, global pooling), a graph rather than a chain;
- :func:`gw_resnet_deep`: a deeper one (three stages of two residual blocks, GroupNorm, the
  average and the maximum over time), the 1-d ResNets of the GW searches that use them.
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


def gw_resnet(n: int = 2048, channels: int = 16, batch_norm: bool = False):
    """A ResNet-style GW classifier for segments of ``n`` samples (input (B, 1, n)): a strided
    stem, two residual blocks at ``channels`` and one at twice as many (each convolution
    followed by BatchNorm with ``batch_norm``), global average pooling and one Linear layer."""
    import torch
    from torch import nn

    class ResBlock(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            # no bias before BatchNorm: its mean would cancel it (the gradient is zero)
            self.conv1 = nn.Conv1d(c, c, 7, padding=3, bias=not batch_norm)
            self.bn1 = nn.BatchNorm1d(c) if batch_norm else nn.Identity()
            self.conv2 = nn.Conv1d(c, c, 7, padding=3, bias=not batch_norm)
            self.bn2 = nn.BatchNorm1d(c) if batch_norm else nn.Identity()

        def forward(self, x):
            return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))

    class GWResNet(nn.Module):
        def __init__(self):
            super().__init__()
            c = channels
            self.stem = nn.Conv1d(1, c, 16, stride=2)
            self.pool = nn.MaxPool1d(4)
            self.block1 = ResBlock(c)
            self.block2 = ResBlock(c)
            self.widen = nn.Conv1d(c, 2 * c, 1)
            self.block3 = ResBlock(2 * c)
            self.gap = nn.AdaptiveAvgPool1d(1)
            self.head = nn.Linear(2 * c, 1)

        def forward(self, x):
            h = self.pool(torch.relu(self.stem(x)))
            h = self.pool(self.block2(self.block1(h)))
            h = self.block3(self.widen(h))
            return self.head(self.gap(h).flatten(1))

    if ((n - 16) // 2 + 1) // 16 < 1:
        raise ValueError(f"segments of {n} samples are too short for the GW ResNet (at least 46)")
    return GWResNet()


def gw_resnet_deep(n: int = 2048, channels: int = 16, groups: int = 4):
    """A deeper ResNet GW classifier for segments of ``n`` samples (input (B, 1, n)): a strided
    stem, three stages of two residual blocks at ``channels``, 2x and 4x as many (GroupNorm of
    ``groups`` groups after each convolution, MaxPool1d(2) between stages), then the mean and
    the maximum of each channel over time into one Linear layer (a short signal is a peak in
    time, which the mean alone dilutes)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c_in: int, c: int):
            super().__init__()
            self.conv1 = nn.Conv1d(c_in, c, 7, padding=3, bias=False)
            self.gn1 = nn.GroupNorm(groups, c)
            self.conv2 = nn.Conv1d(c, c, 7, padding=3, bias=False)
            self.gn2 = nn.GroupNorm(groups, c)
            self.skip = nn.Conv1d(c_in, c, 1, bias=False) if c_in != c else nn.Identity()

        def forward(self, x):
            h = self.gn2(self.conv2(torch.relu(self.gn1(self.conv1(x)))))
            return torch.relu(self.skip(x) + h)

    class GWResNetDeep(nn.Module):
        def __init__(self):
            super().__init__()
            c = channels
            self.stem = nn.Sequential(
                nn.Conv1d(1, c, 16, stride=2, bias=False),
                nn.GroupNorm(groups, c),
                nn.ReLU(),
                nn.MaxPool1d(4),
            )
            widths = (c, c, 2 * c, 2 * c, 4 * c, 4 * c)
            self.blocks = nn.ModuleList(
                Block(a, b) for a, b in zip((c, *widths[:-1]), widths, strict=True)
            )
            self.pool = nn.MaxPool1d(2)
            self.head = nn.Linear(8 * c, 1)

        def forward(self, x):
            h = self.stem(x)
            for i, block in enumerate(self.blocks):
                h = block(h)
                if i in (1, 3):
                    h = self.pool(h)
            return self.head(torch.cat([h.mean(dim=2), h.amax(dim=2)], dim=1))

    if ((n - 16) // 2 + 1) // 16 < 1:
        raise ValueError(f"segments of {n} samples are too short for the GW ResNet (at least 46)")
    return GWResNetDeep()


MODELS = ("cnn", "mlp", "resnet", "resnet-deep")


def make(name: str, n: int = 2048):
    """One of :data:`MODELS`: ``"cnn"``, ``"mlp"``, ``"resnet"`` or ``"resnet-deep"``."""
    if name == "cnn":
        return gw_cnn(n)
    if name == "mlp":
        return gw_mlp(n)
    if name == "resnet":
        return gw_resnet(n)
    if name == "resnet-deep":
        return gw_resnet_deep(n)
    raise ValueError(f"unknown GW model '{name}' ({', '.join(MODELS)})")
