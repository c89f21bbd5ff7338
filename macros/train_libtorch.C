// Train an exported rootclad model with LibTorch inside ROOT: LibTorch tensors, its autograd
// and torch::optim::Adam around rootclad::CompiledFunction (rootclad/torch_function.h), on
// batches read from the TTree in C++. Needs macros/load_libtorch.C first in the same session:
//
//   root -l -b -q macros/load_libtorch.C 'macros/train_libtorch.C("gw.root", "build/gwnet", 2)'
//
// Arguments as macros/train_gw.C's. The forward and the backward are the model library's (Clad
// or the pullback sweep); the loss and the optimizer are LibTorch's. Weights are read from and
// saved to stem.root (checked against stem.so by rootclad::Model). Parsing the torch headers
// costs Cling 15-25 s at the start; rootclad/libtorch_trainer.h does the same training from a
// compiled library without them (docs/root.md).
#include "../rootclad/include/rootclad/model.h"
#include "../rootclad/include/rootclad/torch_function.h"
#include "../rootclad/include/rootclad/tree_reader.h"
#include "gw_training.h"

#include <cstdio>
#include <string>
#include <vector>

namespace {
// Mean loss over one pass of `reader`; an optimizer step per batch when opt is given.
double libtorch_epoch(rootclad::TorchModel& model, rootclad::data::BatchReader& reader,
                      unsigned long long epoch, torch::optim::Optimizer* opt) {
  const auto& api = model.api();
  return gw_training::mean_loss(reader, epoch, [&](float* x, int* labels, long long n) {
    auto xt = torch::from_blob(x, rootclad::detail::batch_shape((int)n, api.input_shape))
                  .to(model.flat_parameters().scalar_type());
    auto yt = torch::from_blob(labels, {n}, torch::kInt32).to(torch::kFloat32);
    if (!opt) {
      torch::NoGradGuard no_grad;
      model.eval();
      return rootclad::loss_of(api, model.predict(xt), yt).item<double>();
    }
    model.train();
    auto loss = rootclad::loss_of(api, model(xt), yt);
    opt->zero_grad();
    loss.backward();
    opt->step();
    return loss.item<double>();
  });
}
} // namespace

int train_libtorch(const char* files = "gw.root", const char* stem = "build/gwnet", int epochs = 2,
                   int batch_size = 64, double lr = 1e-3, double validation_fraction = 0.2,
                   unsigned long long seed = 0) {
  try {
    rootclad::Model m(stem); // the weights, checked against the library
    rootclad::TorchModel model(rootclad::load_model(std::string(stem) + ".so", m.api().prefix));
    {
      torch::NoGradGuard no_grad;
      const std::vector<double> p = m.parameters();
      model.flat_parameters().copy_(torch::tensor(p, torch::kFloat64));
    }
    const auto names = rootclad::data::file_list(files);
    rootclad::data::BatchReader train(names), val(names);
    gw_training::configure(train, val, batch_size, validation_fraction, seed, m.input_size(), stem);
    torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(lr));
    printf("training %s with LibTorch (%s engine backward, torch::optim::Adam) on %lld events\n",
           stem, m.engine().c_str(), train.entries());
    gw_training::train_epochs(epochs, train, val, [&](auto& reader, int epoch, bool training) {
      return libtorch_epoch(model, reader, epoch, training ? &opt : nullptr);
    });
    auto p = model.flat_parameters().detach().to(torch::kFloat64).contiguous();
    m.set_parameters(std::vector<double>(p.data_ptr<double>(), p.data_ptr<double>() + p.numel()));
    m.save(std::string(stem) + ".root");
    printf("saved the weights to %s.root\n", stem);
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "train_libtorch: %s\n", e.what());
    return 1;
  }
}
