"""Architectures of particle and gravitational-wave physics (issue 27), written here as their
papers describe them, with small dimensions; each compiles and computes what torch computes.

- DeepSets (Zaheer et al. 2017; Komiske, Metodiev and Thaler's energy flow networks): a
  per-particle MLP, a sum over the particles masked by a second input (padding), the masked
  mean, then an MLP on the pooled features.
- A Particle-Transformer-style encoder (Qu, Li and Qian 2022, without its pairwise
  features): particles embedded, transformer encoder layers whose attention skips the padded
  particles (``src_key_padding_mask=~mask``, the mask a torch.bool input), the masked mean,
  a classifier.
- The same encoder in weaver's layout: particles (N, C, P) embedded by a 1x1 Conv1d,
  permuted to (P, N, C) for attention and encoder layers built with batch_first=False, a
  residual around the attention, permuted back for the masked mean.
- A DeepJet-style tagger (Bols et al. 2020): 1x1 convolutions per particle and per secondary
  vertex, an LSTM over each list, the global features, a dense classifier.
- ParticleNet (Qu and Gouskos 2020): weaver's knn as written, its get_graph_feature as a
  torch.gather, and once more with weaver's get_graph_feature_v1 as written (idx + idx_base
  indexes the whole batch at once: each sample reads its own rows). EdgeConv blocks over
  each jet's particles, the k nearest neighbours by ``topk`` of pairwise distances (in the
  (eta, phi) plane, then in the previous block's features; padded particles moved 1e9 away),
  the neighbours' features by ``torch.gather``, an edge MLP of 1x1 Conv2d + BatchNorm + ReLU
  on (x_i, x_j - x_i), the mean over the neighbours, a shortcut; the masked mean over the
  particles, a classifier. topk's indices carry no gradient (the coordinates get none), the
  gathers do.
- A 3-d CNN over calorimeter showers (the energy deposits of a particle in layers x eta x
  phi cells, as CaloGAN's and CaloChallenge's images): Conv3d + BatchNorm3d + ReLU stages,
  MaxPool3d and AvgPool3d, the global average, a classifier.
- A 1-D U-Net for strain denoising: Conv1d stages with GroupNorm, ConvTranspose1d upsampling,
  skip connections by torch.cat.
- A 1-D ResNet for gravitational-wave strain, in the shape of ml4gw's ResNet1D: torchvision's
  ResNet with 1-d convolutions and GroupNorm (stem of 7 taps and stride 2, max-pooling,
  basic blocks with 1x1 projections where the stride or width changes, global average).

Each: the output, the gradients of every input and parameter against torch autograd
(float64, against the largest of all gradients, 1e-9; float32 to 1e-4), on the pullback and
clad engines, and 20 Adam steps against torch.optim.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.core import assert_close_rel, assert_grads_close, perturbed, torch_loss
from torch import nn

import rootclad
from rootclad.ir.graph import IRError

F64 = torch.float64


class DeepSets(nn.Module):
    def __init__(self, features=4, hidden=16, classes=3):
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU())  # fmt: skip
        self.rho = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, particles, mask):  # (B, N, F), (B, N): 1 for a particle, 0 for padding
        h = self.phi(particles) * mask.unsqueeze(-1)
        return self.rho(h.sum(1) / mask.sum(1, keepdim=True))


class ParticleTransformer(nn.Module):
    def __init__(self, features=4, width=16, heads=4, classes=3):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(features, width), nn.GELU())
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)  # fmt: skip
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, particles, mask):  # (B, N, F), (B, N) torch.bool: True for a particle
        h = self.encoder(self.embed(particles), src_key_padding_mask=~mask)
        m = mask.unsqueeze(-1).float()
        return self.head((h * m).sum(1) / m.sum(1))


def knn(pts, k):  # (B, P, N) -> (B, N, k): each point's k nearest others (weaver's knn)
    inner = -2 * torch.matmul(pts.transpose(2, 1), pts)
    xx = torch.sum(pts**2, dim=1, keepdim=True)
    pairwise = -xx - inner - xx.transpose(2, 1)
    return pairwise.topk(k=k + 1, dim=-1)[1][:, :, 1:]


def get_graph_feature_v1(x, k, idx):  # weaver's, as written (ParticleNet.py)
    batch_size, num_dims, num_points = x.size()

    idx_base = torch.arange(0, batch_size, device=x.device).view(-1, 1, 1) * num_points
    idx = idx + idx_base
    idx = idx.view(-1)

    fts = x.transpose(2, 1).reshape(
        -1, num_dims
    )  # -> (batch_size, num_points, num_dims) -> (batch_size*num_points, num_dims)
    fts = fts[idx, :].view(
        batch_size, num_points, k, num_dims
    )  # neighbors: -> (batch_size*num_points*k, num_dims) -> ...
    fts = fts.permute(0, 3, 1, 2).contiguous()  # (batch_size, num_dims, num_points, k)
    x = x.view(batch_size, num_dims, num_points, 1).repeat(1, 1, 1, k)
    fts = torch.cat((x, fts - x), dim=1)  # ->(batch_size, 2*num_dims, num_points, k)
    return fts


class EdgeConv(nn.Module):
    def __init__(self, k, cin, widths, weaver=False):
        super().__init__()
        self.k, self.weaver = k, weaver
        layers, c = [], 2 * cin
        for w in widths:
            layers += [nn.Conv2d(c, w, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            c = w
        self.edge_mlp = nn.Sequential(*layers)
        self.shortcut = nn.Sequential(nn.Conv1d(cin, c, 1, bias=False), nn.BatchNorm1d(c))
        self.relu = nn.ReLU()

    def forward(self, pts, fts):  # (B, P, N), (B, C, N)
        if self.weaver:  # the edges as weaver builds them, batch-wide indexing included
            x = self.edge_mlp(get_graph_feature_v1(fts, self.k, knn(pts, self.k))).mean(dim=-1)
            return self.relu(x + self.shortcut(fts))
        B, C, N = fts.shape
        idx = knn(pts, self.k)
        nb = torch.gather(fts, 2, idx.reshape(B, 1, N * self.k).expand(-1, C, -1))
        nb = nb.view(B, C, N, self.k)
        ctr = fts.unsqueeze(-1).expand(-1, -1, -1, self.k)
        x = self.edge_mlp(torch.cat([ctr, nb - ctr], dim=1)).mean(dim=-1)
        return self.relu(x + self.shortcut(fts))


class ParticleNet(nn.Module):
    def __init__(self, features=4, k=3, classes=3, weaver=False):
        super().__init__()
        self.bn_fts = nn.BatchNorm1d(features)
        self.blocks = nn.ModuleList([EdgeConv(k, features, (8, 8), weaver),
                                     EdgeConv(k, 8, (16, 16), weaver)])  # fmt: skip
        self.head = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, classes))

    def forward(self, points, features, mask):  # (B, 2, N), (B, F, N), (B, 1, N) torch.bool
        mask = mask.float()
        shift = (1 - mask) * 1e9  # padded particles far from every other (weaver's coord_shift)
        fts = self.bn_fts(features) * mask
        pts = points
        for block in self.blocks:
            fts = block(pts + shift, fts) * mask
            pts = fts
        return self.head(fts.sum(dim=-1) / mask.sum(dim=-1))


class Calo3D(nn.Module):
    def __init__(self, classes=2):
        super().__init__()

        def stage(cin, cout):
            return [nn.Conv3d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm3d(cout), nn.ReLU()]

        self.features = nn.Sequential(*stage(1, 4), nn.MaxPool3d((1, 2, 2)), *stage(4, 8),
                                      nn.AvgPool3d(2, ceil_mode=True), nn.AdaptiveAvgPool3d(1))  # fmt: skip
        self.head = nn.Linear(8, classes)

    def forward(self, shower):  # (B, 1, layers, eta, phi)
        return self.head(torch.flatten(self.features(shower), 1))


class ParticleTransformerSeqFirst(nn.Module):
    def __init__(self, features=4, width=8, heads=2, classes=3):
        super().__init__()
        self.embed = nn.Conv1d(features, width, 1)
        self.attn = nn.MultiheadAttention(width, heads)
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, particles, mask):  # (N, C, P), (N, P) torch.bool: True for a particle
        h = self.embed(particles).permute(2, 0, 1)  # (P, N, C)
        h = h + self.attn(self.norm(h), h, h, key_padding_mask=~mask, need_weights=False)[0]
        h = self.encoder(h, src_key_padding_mask=~mask).permute(1, 2, 0)  # (N, C, P)
        m = mask.unsqueeze(1).float()
        return self.head((h * m).sum(-1) / m.sum(-1))


class Block1d(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv1d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv1d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(4, cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv1d(cin, cout, 1, stride, bias=False),
                                            nn.GroupNorm(4, cout))  # fmt: skip

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet1D(nn.Module):
    def __init__(self, channels=2, widths=(8, 16, 16), classes=1):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, widths[0], 7, 2, 3, bias=False)
        self.norm1 = nn.GroupNorm(4, widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool1d(3, 2, 1)
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers.append(Block1d(cin, w, 1 if i == 0 else 2))
            cin = w
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.norm1(self.conv1(x))))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


class DeepJet(nn.Module):
    """DeepJet (Bols et al. 2020), small: per-particle 1x1 convolutions over the charged
    candidates and the secondary vertices, an LSTM over each list (its last state), joined
    with the global jet features in a dense classifier."""

    def __init__(self, classes=3):
        super().__init__()
        self.cpf = nn.Sequential(nn.Conv1d(6, 16, 1), nn.ReLU(), nn.Conv1d(16, 8, 1), nn.ReLU())
        self.sv = nn.Sequential(nn.Conv1d(5, 8, 1), nn.ReLU())
        self.cpf_lstm = nn.LSTM(8, 16, batch_first=True)
        self.sv_lstm = nn.LSTM(8, 8, batch_first=True)
        self.head = nn.Sequential(nn.Linear(4 + 16 + 8, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, glob, cpf, sv):  # (B, 4), (B, particles, 6), (B, vertices, 5)
        c = self.cpf(cpf.transpose(1, 2)).transpose(1, 2)
        v = self.sv(sv.transpose(1, 2)).transpose(1, 2)
        _, (h_c, _) = self.cpf_lstm(c)
        _, (h_v, _) = self.sv_lstm(v)
        return self.head(torch.cat([glob, h_c[-1], h_v[-1]], dim=1))


class UNet1D(nn.Module):
    """A 1-D U-Net for strain denoising (Ronneberger et al. 2015 in one dimension, as GW
    denoisers use it): two downsampling stages of Conv1d + GroupNorm + ReLU, upsampling by
    ConvTranspose1d, skip connections by torch.cat, a 1x1 convolution to the cleaned series."""

    def __init__(self, channels=1, width=8):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv1d(cin, cout, 3, padding=1), nn.GroupNorm(2, cout),
                                 nn.ReLU(inplace=True))  # fmt: skip

        self.down1, self.down2 = block(channels, width), block(width, 2 * width)
        self.pool = nn.MaxPool1d(2)
        self.bottom = block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose1d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose1d(2 * width, width, 2, stride=2)
        self.dec1 = block(2 * width, width)
        self.out = nn.Conv1d(width, channels, 1)

    def forward(self, x):  # (B, channels, L), L divisible by 4
        d1 = self.down1(x)
        d2 = self.down2(self.pool(d1))
        b = self.bottom(self.pool(d2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.out(u1)


def _unet_inputs(B, gen):
    x = torch.randn(B, 1, 64, dtype=F64, generator=gen)
    return (x,), torch.randn(B, 1, 64, dtype=F64, generator=gen), "mse"


def _deepsets_inputs(B, gen):
    x = torch.randn(B, 6, 4, dtype=F64, generator=gen)
    mask = (torch.rand(B, 6, generator=gen) > 0.4).to(F64)
    mask[:, 0] = 1  # every set holds a particle
    x = x * mask.unsqueeze(-1)  # padding is zeros, as a loader writes it
    return (x, mask), torch.randint(0, 3, (B,), generator=gen), "cross_entropy"


def _part_inputs(B, gen):
    (x, mask), y, loss = _deepsets_inputs(B, gen)
    return (x, mask.bool()), y, loss


def _particlenet_inputs(B, gen):
    N = 10
    mask = torch.ones(B, 1, N, dtype=torch.bool)
    for b in range(B):  # 6 to 10 particles, the rest padding
        mask[b, 0, 6 + b % 5 :] = False
    xs = [torch.randn(B, c, N, dtype=F64, generator=gen) * mask for c in (2, 4)]
    return (*xs, mask), torch.randint(0, 3, (B,), generator=gen), "cross_entropy"


def _calo_inputs(B, gen):
    x = torch.rand(B, 1, 3, 8, 6, dtype=F64, generator=gen) ** 3  # sparse-ish positive deposits
    return (x,), torch.randint(0, 2, (B,), generator=gen), "cross_entropy"


def _part_seq_first_inputs(B, gen):
    (x, mask), y, loss = _deepsets_inputs(B, gen)
    return (x.transpose(1, 2).contiguous(), mask.bool()), y, loss


def _resnet_inputs(B, gen):
    x = torch.randn(B, 2, 128, dtype=F64, generator=gen)
    return (x,), torch.randint(0, 2, (B,), generator=gen).to(F64), "bce_with_logits"


def _deepjet_inputs(B, gen):
    xs = tuple(torch.randn(B, *shape, dtype=F64, generator=gen)
               for shape in ((4,), (7, 6), (3, 5)))  # fmt: skip
    return xs, torch.randint(0, 3, (B,), generator=gen), "cross_entropy"


MODELS = {
    "deepsets": (DeepSets, _deepsets_inputs),
    "particle-transformer": (ParticleTransformer, _part_inputs),
    "particlenet": (ParticleNet, _particlenet_inputs),
    "particlenet-weaver": (lambda: ParticleNet(weaver=True), _particlenet_inputs),
    "particle-transformer-seq-first": (ParticleTransformerSeqFirst, _part_seq_first_inputs),
    "calo3d": (Calo3D, _calo_inputs),
    "resnet1d": (ResNet1D, _resnet_inputs),
    "deepjet": (DeepJet, _deepjet_inputs),
    "unet1d": (UNet1D, _unet_inputs),
}


def _vjp(fn, params, xs, d_out):
    """The output and the gradients of the float inputs (a torch.bool mask has none) and of
    ``params``."""
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
    wrt = [x for x in xs if x.requires_grad]
    out = fn(*xs)
    # allow_unused: ParticleNet's coordinates reach the output through topk's indices alone
    # (None: no gradient)
    grads = torch.autograd.grad(out, [*wrt, *params], d_out.to(out.dtype), allow_unused=True)
    return out.detach(), grads[: len(wrt)], grads[len(wrt) :]


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("engine", ["pullback", pytest.param("clad", marks=pytest.mark.clad)])
@pytest.mark.parametrize("name", MODELS)
def test_hep_model_forward_and_gradients_match_torch(name, engine, dtype, request):
    if engine == "clad":
        request.getfixturevalue("clad")  # skips, saying why, without Clad
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    net = perturbed(build().double()).eval()
    xs, _, loss = inputs(3, torch.Generator().manual_seed(1))
    xs = tuple(x.to(dtype) if x.is_floating_point() else x for x in xs)
    cm = rootclad.compile(copy.deepcopy(net).to(dtype), example_input=xs if len(xs) > 1 else xs[0],
                          loss=loss, engine=engine)  # fmt: skip
    ref = copy.deepcopy(net).to(dtype).double()  # the parameters rounded as rootclad's
    xs64 = [x.double() if x.is_floating_point() else x for x in xs]
    out_ref = ref(*xs64)
    d_out = torch.randn(out_ref.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    out_ref, dx_ref, dp_ref = _vjp(ref, list(ref.parameters()), xs64, d_out)
    out, dx, dp = _vjp(cm, list(cm.parameters()), xs, d_out)
    rtol = 1e-9 if dtype == F64 else 1e-4
    assert out.dtype == dtype
    assert_close_rel(out, out_ref, rtol, f"{name} forward")
    for i, (a, e) in enumerate(zip(dx, dx_ref, strict=True)):  # a float mask's too
        if e is None:  # no path but through topk's indices: exactly none here either
            assert a is None or float(a.abs().max()) == 0, f"{name} d_input {i} is not zero"
            continue
        assert_close_rel(a, e, rtol, f"{name} d_input {i}")
    names = [n for n, _ in ref.named_parameters()]
    assert_grads_close(dict(zip(names, dp, strict=True)), dict(zip(names, dp_ref, strict=True)),
                       rtol, f"{name} parameters", against_all=True)  # fmt: skip


@pytest.mark.parametrize("name", MODELS)
def test_hep_model_training_tracks_torch_optim(name):
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    net = build().double().train()
    xs, y, loss = inputs(24, torch.Generator().manual_seed(2))
    cm = rootclad.compile(net, example_input=xs if len(xs) > 1 else xs[0], loss=loss,
                          engine="pullback")  # fmt: skip
    ref = copy.deepcopy(net)
    opt = rootclad.optim.Adam(cm, lr=1e-3)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-3)
    losses, ref_losses = [], []
    for step in range(20):
        idx = torch.arange(step % 3 * 8, step % 3 * 8 + 8)
        batch = [x[idx] for x in xs]
        losses.append(cm.train_step(batch if len(batch) > 1 else batch[0], y[idx], opt))
        opt_ref.zero_grad()
        value = torch_loss(loss, ref(*batch), y[idx])
        value.backward()
        opt_ref.step()
        ref_losses.append(value.item())
    assert_close_rel(torch.tensor(losses), torch.tensor(ref_losses), 1e-9, f"{name} losses")
    start = {k: v.detach() for k, v in net.named_parameters()}
    moved = max(float((q.detach() - start[k]).abs().max()) for k, q in ref.named_parameters())
    assert moved > 1e-3, f"{name}: the parameters did not move"
    for (k, p), q in zip(cm.named_parameters(), ref.parameters(), strict=True):
        err = float((p.detach() - q.detach()).abs().max()) / moved
        assert err <= 1e-8, f"{name} {k}: off by {err:.3e} of the largest move"


# exported by torch's (TorchScript) exporter, imported, and run beside onnxruntime: every
# architecture above but the attention ones, refused naming the node: torch writes
# nn.MultiheadAttention with the batch axis merged into the heads', and the encoder's padding
# mask as a float tensor of a shape that holds the batch size (ConstantOfShape)
NOT_IMPORTED = {
    # weaver's batch offsets: a Range over the batch size, then indices across the batch
    "particlenet-weaver": r"\(Gather, opset 18\): gathers along the batch axis",
}


@pytest.mark.parametrize("name", MODELS)
def test_hep_model_through_onnx_matches_onnxruntime_and_torch(name):
    pytest.importorskip("onnxruntime")
    from fixtures.onnx import export, run_ort

    build, inputs = MODELS[name]
    torch.manual_seed(0)
    net = perturbed(build()).eval()
    xs, _, _ = inputs(3, torch.Generator().manual_seed(1))
    xs = tuple(x.float() if x.is_floating_point() else x for x in xs)
    model = export(copy.deepcopy(net), xs, opset=18)
    if name in NOT_IMPORTED:
        with pytest.raises(IRError, match=NOT_IMPORTED[name]):
            rootclad.onnx.load(model, loss="mse", engine="pullback")
        return
    cm = rootclad.onnx.load(model, loss="mse", engine="pullback")
    want = torch.from_numpy(run_ort(model, *(x.numpy() for x in xs)))
    assert_close_rel(cm.predict(*xs), want, 1e-4, f"{name} forward against onnxruntime")
    ref = copy.deepcopy(net).double()
    xs64 = [x.double() if x.is_floating_point() else x for x in xs]
    d_out = torch.randn(want.shape, dtype=F64, generator=torch.Generator().manual_seed(4))
    _, dx_ref, _ = _vjp(ref, [], xs64, d_out)
    dx = cm.input_grad(*xs, d_out=d_out.float())
    dx = dx if isinstance(dx, (tuple, list)) else (dx,)
    floats = [d for x, d in zip(xs, dx, strict=True) if x.is_floating_point()]
    for i, (a, e) in enumerate(zip(floats, dx_ref, strict=True)):
        if e is None:
            assert float(a.abs().max()) == 0, f"{name} d_input {i} is not zero"
            continue
        assert_close_rel(a, e, 1e-4, f"{name} d_input {i}")
