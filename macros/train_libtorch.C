// Train an exported rootclad model with LibTorch inside ROOT: LibTorch tensors, its autograd
// and torch::optim::Adam around rootclad::CompiledFunction (rootclad/torch_function.h), on
// batches read from the TTree in C++. Needs macros/load_libtorch.C first in the same session:
//
//   root -l -b -q macros/load_libtorch.C 'macros/train_libtorch.C("gw.root", "build/gwnet", 2)'
//
// Arguments as macros/train_gw.C's. The forward and the backward are the model library's (Clad
// or the pullback sweep); the loss and the optimizer are LibTorch's; the epochs, validation and
// early stopping are rootclad/fit.h's loop (fit_loop), as in train_gw.C. Weights are read from
// and saved to stem.root (checked against stem.so by rootclad::Model). Parsing the torch headers
// costs Cling 15-25 s at the start; rootclad/libtorch_trainer.h does the same training from a
// compiled library without them (docs/root.md).
#include "../rootclad/include/rootclad/fit.h"
#include "../rootclad/include/rootclad/model.h"
#include "../rootclad/include/rootclad/torch_function.h"
#include "../rootclad/include/rootclad/tree_reader.h"

#include <cstdio>
#include <string>
#include <vector>

namespace {
// rootclad::fit_loop's trainer for a LibTorch model: torch::optim::Adam steps on LibTorch's loss.
struct TorchFitTrainer {
  rootclad::TorchModel& model;
  torch::optim::Adam& opt;
  rootclad::data::BatchReader& train;
  rootclad::data::BatchReader* val;
  std::vector<float> x;
  std::vector<int> labels;

  double train_epoch(int epoch, long long& events) { return pass(train, epoch, true, events); }
  bool has_validation() const { return val != nullptr; }
  double validation_loss() {
    long long events = 0;
    return pass(*val, 0, false, events);
  }
  std::vector<double> weights() const {
    auto p = model.flat_parameters().detach().to(torch::kFloat64).contiguous();
    return std::vector<double>(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
  }
  void set_weights(const std::vector<double>& p) {
    torch::NoGradGuard no_grad;
    model.flat_parameters().copy_(torch::tensor(p, torch::kFloat64));
  }
  double lr() const {
    return static_cast<const torch::optim::AdamOptions&>(opt.param_groups()[0].options()).lr();
  }

  // The mean loss over one pass of `reader`; an optimizer step per batch when training.
  double pass(rootclad::data::BatchReader& reader, int epoch, bool training, long long& events) {
    const auto& api = model.api();
    x.resize(reader.batch_size() * reader.length());
    labels.resize(reader.batch_size());
    reader.start_epoch(epoch);
    double total = 0;
    events = 0;
    while (long long n = reader.next_batch(x.data(), labels.data())) {
      auto xt = torch::from_blob(x.data(), rootclad::detail::batch_shape((int)n, api.input_shape))
                    .to(model.flat_parameters().scalar_type());
      auto yt = torch::from_blob(labels.data(), {n}, torch::kInt32).to(torch::kFloat32);
      double loss;
      if (!training) {
        torch::NoGradGuard no_grad;
        model.eval();
        loss = rootclad::loss_of(api, model.predict(xt), yt).item<double>();
      } else {
        model.train();
        auto l = rootclad::loss_of(api, model(xt), yt);
        opt.zero_grad();
        l.backward();
        opt.step();
        loss = l.item<double>();
      }
      total += loss * n;
      events += n;
    }
    return events ? total / events : 0.0;
  }
};
} // namespace

int train_libtorch(const char* files = "gw.root", const char* stem = "build/gwnet", int epochs = 2,
                   int batch_size = 64, double lr = 1e-3, double validation_fraction = 0.2,
                   unsigned long long seed = 0, int patience = 0) {
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
      throw std::runtime_error("the strain has " + std::to_string(train.length()) +
                               " samples; the model " + stem + " takes " +
                               std::to_string(m.input_size()));
    torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(lr));
    printf("training %s with LibTorch (%s engine backward, torch::optim::Adam) on %lld events\n",
           stem, m.engine().c_str(), train.entries());
    TorchFitTrainer t{model, opt, train, val.entries() ? &val : nullptr, {}, {}};
    rootclad::FitOptions o;
    o.epochs = epochs;
    o.patience = patience;
    o.restore_best = patience > 0;
    rootclad::fit_loop(t, o);
    m.set_parameters(t.weights());
    m.save(std::string(stem) + ".root");
    printf("saved the weights to %s.root\n", stem);
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "train_libtorch: %s\n", e.what());
    return 1;
  }
}
