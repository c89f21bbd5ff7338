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

#include <TStopwatch.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {
// Mean loss over one pass of `reader`; an optimizer step per batch when opt is given.
double libtorch_epoch(rootclad::TorchModel& model, rootclad::data::BatchReader& reader,
                      unsigned long long epoch, torch::optim::Optimizer* opt) {
  const long long B = reader.batch_size(), N = reader.length();
  std::vector<float> x(B * N);
  std::vector<int> labels(B);
  const auto& api = model.api();
  reader.start_epoch(epoch);
  double total = 0;
  long long seen = 0;
  while (long long n = reader.next_batch(x.data(), labels.data())) {
    auto xt = torch::from_blob(x.data(), rootclad::detail::batch_shape((int)n, api.input_shape))
                  .to(model.flat_parameters().scalar_type());
    auto yt = torch::from_blob(labels.data(), {n}, torch::kInt32).to(torch::kFloat32);
    torch::Tensor loss;
    if (opt) {
      model.train();
      loss = rootclad::loss_of(api, model(xt), yt);
      opt->zero_grad();
      loss.backward();
      opt->step();
    } else {
      torch::NoGradGuard no_grad;
      model.eval();
      loss = rootclad::loss_of(api, model.predict(xt), yt);
    }
    total += loss.item<double>() * n;
    seen += n;
  }
  return seen ? total / seen : 0.0;
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
    train.configure(batch_size, "train", validation_fraction, /*shuffle=*/true, seed);
    val.configure(batch_size, "validation", validation_fraction, /*shuffle=*/false, seed);
    if (train.length() != m.input_size())
      throw std::runtime_error(std::string("the strain has ") + std::to_string(train.length()) +
                               " samples; the model " + stem + " takes " +
                               std::to_string(m.input_size()));
    torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(lr));
    printf("training %s with LibTorch (%s engine backward, torch::optim::Adam) on %lld events\n",
           stem, m.engine().c_str(), train.entries());
    for (int epoch = 0; epoch < epochs; ++epoch) {
      TStopwatch clock;
      const double train_loss = libtorch_epoch(model, train, epoch, &opt);
      const double val_loss = val.entries() ? libtorch_epoch(model, val, 0, nullptr) : 0.0;
      printf("epoch %d: train loss %.6f, validation loss %.6f, %.1f s\n", epoch + 1, train_loss,
             val_loss, clock.RealTime());
    }
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
