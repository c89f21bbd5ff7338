"""LibTorch training inside a PyROOT session, batches read from a TTree in C++.

The model is compiled and exported by rootclad; LibTorch's autograd and torch::optim::Adam train
it through rootclad/torch_function.h, inside the compiled library of
rootclad/libtorch_trainer.h, so this session never parses the torch headers (19 s in Cling;
this route starts in under a second, docs/benchmarks/root.md). The C++ reader of tree_reader.h
fills the batches. At the end the weights go back into the ROOT file of the exported model.

    python tutorials/root_libtorch.py
"""

import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

import rootclad
from rootclad.data.cling import add_include_path, declare, import_root, include_dir
from rootclad.data.compiled import CompiledBatchIterator
from rootclad.gw import simulate
from rootclad.torch.libtorch import build_trainer

work = Path(tempfile.mkdtemp(prefix="rootclad-libtorch-"))
N = 512  # 0.25 s at 2048 Hz
simulate(work / "gw.root", 600, seed=2, workers=1, progress=False, duration=N / 2048, snr=(8, 20))

torch.manual_seed(0)
net = nn.Sequential(nn.Conv1d(1, 8, 16), nn.ReLU(), nn.MaxPool1d(8), nn.Flatten(),
                    nn.Linear(8 * 62, 1))  # fmt: skip
cm = rootclad.compile(net, example_input=torch.zeros(1, 1, N), loss="bce_with_logits")
cm.export(work / "gwnet")

ROOT = import_root()
ROOT.gSystem.Load(str(build_trainer()))  # compiled against LibTorch once, then cached
add_include_path(include_dir())
declare('#include "rootclad/libtorch_trainer.h"\n#include "rootclad/model.h"\n')

stem = str(work / "gwnet")
model = ROOT.rootclad.Model(stem)  # the exported weights, checked against the library
params = model.parameters()
trainer = ROOT.rootclad.LibTorchTrainer(stem + ".so", str(model.api().prefix), params.data(),
                                        model.n_params(), "adam", 3e-3)  # fmt: skip
trainer.train_step.__release_gil__ = True  # LibTorch's autograd runs without the GIL

train = CompiledBatchIterator(str(work / "gw.root"), batch_size=32, split="train",
                              validation_fraction=0.25, seed=1)  # fmt: skip
val = CompiledBatchIterator(str(work / "gw.root"), batch_size=150, split="validation",
                            validation_fraction=0.25, shuffle=False)  # fmt: skip
for epoch in range(8):
    losses = [trainer.train_step(np.ascontiguousarray(x), y.astype(np.float32), len(y))
              for x, y in train]  # fmt: skip
    x, y = next(iter(val))
    out = np.empty(len(y), np.float32)
    trainer.predict(np.ascontiguousarray(x), out, len(y))
    accuracy = float(((out > 0) == (y == 1)).mean())
    print(
        f"epoch {epoch + 1}: train loss {np.mean(losses):.4f}, validation accuracy {accuracy:.3f}"
    )

flat = ROOT.std.vector["double"](int(trainer.n_params()))
trainer.parameters(flat.data())
model.set_parameters(flat)
model.save(stem + ".root")
print(f"validation accuracy {accuracy:.3f}; weights saved to {stem}.root")
