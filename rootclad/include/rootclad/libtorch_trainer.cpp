// The compiled side of rootclad/libtorch_trainer.h: LibTorch's autograd and torch::optim around
// rootclad::TorchModel (compiled from a copy of this file: it names the headers through the
// include path). Built by `python -m rootclad.torch.libtorch --trainer` (or
// rootclad.torch.libtorch.build_trainer()) into a shared library that ROOT sessions load.
#include "rootclad/libtorch_trainer.h"

#include "rootclad/torch_function.h"

#include <memory>
#include <stdexcept>
#include <string>

namespace rootclad {

struct LibTorchTrainer::Impl {
  explicit Impl(ModelApi api) : model(std::move(api)) {}
  TorchModel model;
  std::unique_ptr<torch::optim::Optimizer> opt;

  torch::Tensor rows(const float* x, int B, const std::vector<long>& shape) {
    TORCH_CHECK_VALUE(B >= 1, "rootclad: the batch is empty");
    auto t =
        torch::from_blob(const_cast<float*>(x), detail::batch_shape(B, shape), torch::kFloat32);
    return t.to(model.flat_parameters().scalar_type()); // a copy, in the model's dtype
  }
  torch::Tensor targets(const float* y, int B) {
    const auto& api = model.api();
    const long n = api.class_targets() ? B : (long)B * api.output_size;
    return torch::from_blob(const_cast<float*>(y), {n}, torch::kFloat32).clone();
  }
};

namespace {
// c10::Error carries a C++ backtrace in what(); a ROOT session wants the message.
template <class F> auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

// A null array would be read or written through (PyROOT passes ROOT.nullptr as it is).
void not_null(const void* p, const char* method, const char* arg) {
  if (!p)
    throw std::invalid_argument(std::string("rootclad::LibTorchTrainer::") + method + ": " + arg +
                                " is null");
}
} // namespace

LibTorchTrainer::LibTorchTrainer(const char* library, const char* prefix, const double* params,
                                 long n_params, const char* optimizer, double lr)
    : impl_(nullptr) {
  not_null(library, "LibTorchTrainer", "library");
  not_null(prefix, "LibTorchTrainer", "prefix");
  not_null(params, "LibTorchTrainer", "params");
  not_null(optimizer, "LibTorchTrainer", "optimizer");
  guarded([&] {
    auto impl = std::make_unique<Impl>(load_model(library, prefix));
    auto& flat = impl->model.flat_parameters();
    TORCH_CHECK_VALUE(n_params == flat.numel(), "rootclad: ", n_params, " starting values for ",
                      flat.numel(), " parameters of ", library);
    {
      torch::NoGradGuard no_grad;
      flat.copy_(torch::from_blob(const_cast<double*>(params), {n_params}, torch::kFloat64));
    }
    const std::string name = optimizer;
    auto ps = impl->model.parameters();
    if (name == "sgd")
      impl->opt = std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(lr));
    else if (name == "adam")
      impl->opt = std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(lr));
    else if (name == "adamw")
      impl->opt = std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(lr));
    else
      TORCH_CHECK_VALUE(false, "rootclad: unknown optimizer '", name, "' (sgd, adam or adamw)");
    impl_ = impl.release();
    return 0;
  });
}

LibTorchTrainer::~LibTorchTrainer() {
  delete impl_;
}

double LibTorchTrainer::train_step(const float* x, const float* y, int B) {
  not_null(x, "train_step", "x");
  not_null(y, "train_step", "y");
  return guarded([&] {
    auto& m = impl_->model;
    m.train();
    auto loss = loss_of(m.api(), m(impl_->rows(x, B, m.api().input_shape)), impl_->targets(y, B));
    impl_->opt->zero_grad();
    loss.backward();
    impl_->opt->step();
    return loss.item<double>();
  });
}

double LibTorchTrainer::loss(const float* x, const float* y, int B) {
  not_null(x, "loss", "x");
  not_null(y, "loss", "y");
  return guarded([&] {
    torch::NoGradGuard no_grad;
    auto& m = impl_->model;
    m.eval();
    auto out = m.predict(impl_->rows(x, B, m.api().input_shape));
    return loss_of(m.api(), out, impl_->targets(y, B)).item<double>();
  });
}

void LibTorchTrainer::predict(const float* x, float* out, int B) {
  not_null(x, "predict", "x");
  not_null(out, "predict", "out");
  guarded([&] {
    auto& m = impl_->model;
    m.eval();
    auto o = m.predict(impl_->rows(x, B, m.api().input_shape)).to(torch::kFloat32).contiguous();
    std::memcpy(out, o.data_ptr<float>(), sizeof(float) * o.numel());
    return 0;
  });
}

long LibTorchTrainer::n_params() const {
  return impl_->model.flat_parameters().numel();
}

void LibTorchTrainer::parameters(double* out) const {
  not_null(out, "parameters", "out");
  auto p = impl_->model.flat_parameters().detach().to(torch::kFloat64).contiguous();
  std::memcpy(out, p.data_ptr<double>(), sizeof(double) * p.numel());
}

} // namespace rootclad
