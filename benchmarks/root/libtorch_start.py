"""One timing of LibTorch training inside ROOT, run by bench_scoring.py in a fresh process.

From after `import ROOT` to the end of the first training step of an exported model (input
2048, batch 8, torch::optim::Adam): route "cling" declares the torch headers and
rootclad/torch_function.h to Cling (as macros/train_libtorch.C does); route "trainer" loads the
compiled library of rootclad/libtorch_trainer.h and declares only that header.

usage: python libtorch_start.py {cling,trainer} STEM TRAINER_LIBRARY   (prints one JSON line)
"""

import json
import sys
import time

import numpy as np

route, stem, trainer_lib = sys.argv[1:4]
import ROOT  # noqa: E402

ROOT.gInterpreter  # noqa: B018  (ROOT's own set-up, outside the timing)
from rootclad.data.cling import add_include_path, declare, include_dir  # noqa: E402

FIRST_STEP = """
double rc_bench_first_step(const std::string& stem, float* x, float* y) {
  rootclad::Model m(stem);
  rootclad::TorchModel model(rootclad::load_model(stem + ".so", m.api().prefix));
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(1e-3));
  auto loss = rootclad::loss_of(model.api(), model(torch::from_blob(x, {8, 2048})),
                                torch::from_blob(y, {8}));
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss.item<double>();
}
"""

t = time.perf_counter()
add_include_path(include_dir())
x = np.zeros((8, 2048), np.float32)
y = np.zeros(8, np.float32)
if route == "cling":
    import torch  # noqa: F401  (loads LibTorch's libraries)

    from rootclad.torch.libtorch import libtorch_flags

    cflags, _ = libtorch_flags()
    for i, flag in enumerate(cflags):
        if flag == "-isystem":
            add_include_path(cflags[i + 1])
    declare('#include "rootclad/torch_function.h"\n#include "rootclad/model.h"\n')
    declare(FIRST_STEP)
    ROOT.rc_bench_first_step.__release_gil__ = True  # LibTorch's autograd refuses the GIL
    ROOT.rc_bench_first_step(stem, x, y)
else:
    ROOT.gSystem.Load(trainer_lib)
    declare('#include "rootclad/libtorch_trainer.h"\n#include "rootclad/model.h"\n')
    m = ROOT.rootclad.Model(stem)
    p = m.parameters()
    trainer = ROOT.rootclad.LibTorchTrainer(stem + ".so", str(m.api().prefix), p.data(),
                                            m.n_params(), "adam", 1e-3)  # fmt: skip
    trainer.train_step.__release_gil__ = True
    trainer.train_step(x, y, 8)
print(json.dumps({"route": route, "first_step_s": time.perf_counter() - t}))
