// rootclad/torch_function.h — a compiled rootclad model as a LibTorch autograd Function.
//
//   auto model = rootclad::TorchModel(rootclad::load_model("model.so", "rc_..."));
//   model.load_state_dict(rootclad::read_state_dict("weights.pt"));  // see read_state_dict
//   torch::optim::SGD opt(model.parameters(), /*lr=*/0.1);
//   auto loss = torch::binary_cross_entropy_with_logits(model(x), y);
//   opt.zero_grad(); loss.backward(); opt.step();
//
// CompiledFunction runs the library's forward, saves the activation buffer, and its backward
// is the library's vector-Jacobian product (Clad-generated or rootclad's pullback sweep), so
// the model composes with any LibTorch code. TorchModel owns the flat parameter block (one
// leaf tensor with requires_grad, what torch::optim updates) and adds the fused C++ paths:
// loss_and_grad and train_step (forward + backward + optimizer update in one call).
//
// Everything runs on the CPU, in the dtype the model was compiled for.
#ifndef ROOTCLAD_TORCH_FUNCTION_H
#define ROOTCLAD_TORCH_FUNCTION_H

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dropout_mask.h" // call_seed
#include "model_api.h"
#include "optim.h"

namespace rootclad {

namespace detail {

inline torch::ScalarType scalar_type(const ModelApi& api) {
  return api.is_double() ? torch::kFloat64 : torch::kFloat32;
}

inline std::string shape_str(torch::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}

inline std::string expected_input(const ModelApi& api) {
  std::string s = "(B";
  for (long d : api.input_shape)
    s += ", " + std::to_string(d);
  return s + ")";
}

// Checks x against the model's per-sample input shape and dtype; returns the batch size.
inline int check_input(const ModelApi& api, const torch::Tensor& x) {
  const std::string who = "rootclad model " + api.prefix + ": ";
  TORCH_CHECK_VALUE(x.defined(), who, "input tensor is undefined");
  TORCH_CHECK_VALUE(x.device().is_cpu(), who, "input is on ", x.device(),
                    "; this compiled model runs on the CPU");
  TORCH_CHECK_TYPE(x.scalar_type() == scalar_type(api), who, "input dtype is ", x.scalar_type(),
                   ", expected ", scalar_type(api), " (the model was compiled for ", api.dtype,
                   ")");
  bool ok = x.dim() == static_cast<int64_t>(api.input_shape.size()) + 1;
  for (size_t i = 0; ok && i < api.input_shape.size(); ++i)
    ok = x.size(static_cast<int64_t>(i) + 1) == api.input_shape[i];
  TORCH_CHECK_VALUE(ok, who, "input shape is ", shape_str(x.sizes()), ", expected ",
                    expected_input(api));
  TORCH_CHECK_VALUE(x.size(0) >= 1, who, "input batch is empty");
  TORCH_CHECK_VALUE(x.size(0) <= INT32_MAX / 2, who, "batch of ", x.size(0), " is too large");
  return static_cast<int>(x.size(0));
}

inline torch::Tensor check_params(const ModelApi& api, const torch::Tensor& params) {
  const std::string who = "rootclad model " + api.prefix + ": ";
  TORCH_CHECK_VALUE(params.defined() && params.dim() == 1 && params.numel() == api.n_params, who,
                    "params must be the flat parameter block of ", api.n_params,
                    " elements (TorchModel::flat_parameters())");
  TORCH_CHECK_TYPE(params.scalar_type() == scalar_type(api) && params.device().is_cpu(), who,
                   "params must be CPU ", scalar_type(api), ", got ", params.scalar_type(), " on ",
                   params.device());
  return params.contiguous();
}

// The region [B*offset, B*(offset+size)) of a flat buffer.
inline torch::Tensor region(const torch::Tensor& buf, long offset, long size, int B) {
  return buf.narrow(0, static_cast<int64_t>(B) * offset, static_cast<int64_t>(B) * size);
}

inline std::vector<int64_t> batch_shape(int B, const std::vector<long>& shape) {
  std::vector<int64_t> s{B};
  s.insert(s.end(), shape.begin(), shape.end());
  return s;
}

template <typename T> T* ptr(const torch::Tensor& t) {
  return t.numel() ? t.data_ptr<T>() : nullptr;
}

template <typename T>
torch::Tensor forward_impl(torch::autograd::AutogradContext* ctx, const ModelApi& api,
                           const torch::Tensor& x, const torch::Tensor& params, int B,
                           bool training, std::uint64_t seed) {
  auto act = torch::empty({api.act_size(B)}, params.options());
  region(act, api.input_offset, api.input_size, B).view(x.sizes()).copy_(x);
  api.entry_points<T>().forward(ptr<T>(params), ptr<T>(act), B, training, seed);
  ctx->save_for_backward({act, params});
  return region(act, api.output_offset, api.output_size, B)
      .view(batch_shape(B, api.output_shape))
      .clone();
}

template <typename T>
torch::autograd::variable_list backward_impl(torch::autograd::AutogradContext* ctx,
                                             const ModelApi& api, const torch::Tensor& d_out_in) {
  const int B = static_cast<int>(ctx->saved_data["B"].toInt());
  const bool training = ctx->saved_data["training"].toBool();
  const auto seed = static_cast<std::uint64_t>(ctx->saved_data["seed"].toInt());
  const bool need_dx = ctx->needs_input_grad(0), need_params = ctx->needs_input_grad(1);
  torch::autograd::variable_list grads(5);
  if (!need_dx && !need_params)
    return grads;
  auto saved = ctx->get_saved_variables();
  const torch::Tensor &act = saved[0], &params = saved[1];
  auto d_out = d_out_in.to(act.scalar_type()).contiguous();
  TORCH_CHECK_VALUE(d_out.numel() == static_cast<int64_t>(B) * api.output_size, "rootclad model ",
                    api.prefix, ": output gradient of ", d_out.numel(), " elements, expected ",
                    static_cast<int64_t>(B) * api.output_size);
  auto d_act = torch::empty({api.d_act_size(B)}, act.options());
  auto d_params = torch::empty_like(params);
  api.entry_points<T>().vjp(ptr<T>(params), ptr<T>(act), ptr<T>(d_params), ptr<T>(d_act),
                            ptr<T>(d_out), B, training, seed, need_dx);
  if (need_dx)
    grads[0] = region(d_act, api.input_offset, api.input_size, B)
                   .view(ctx->saved_data["x_sizes"].toIntVector())
                   .clone();
  if (need_params)
    grads[1] = d_params;
  return grads;
}

} // namespace detail

// out (B, output_shape...) = model(x (B, input_shape...)) with parameters `params` (the flat
// block, n_params long). Differentiable w.r.t. x and params. `training` switches dropout on;
// `seed` picks its masks (the same seed gives the same masks in forward and backward).
// `api` must outlive the autograd graph.
class CompiledFunction : public torch::autograd::Function<CompiledFunction> {
public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& params, const ModelApi* api,
                               bool training = true, std::uint64_t seed = 0) {
    TORCH_CHECK_VALUE(api != nullptr, "rootclad::CompiledFunction: api is null");
    const int B = detail::check_input(*api, x);
    auto p = detail::check_params(*api, params);
    ctx->saved_data["api"] = reinterpret_cast<int64_t>(api);
    ctx->saved_data["B"] = static_cast<int64_t>(B);
    ctx->saved_data["training"] = training;
    ctx->saved_data["seed"] = static_cast<int64_t>(seed);
    ctx->saved_data["x_sizes"] = x.sizes();
    if (api->is_double())
      return detail::forward_impl<double>(ctx, *api, x, p, B, training, seed);
    return detail::forward_impl<float>(ctx, *api, x, p, B, training, seed);
  }

  // Gradients for (x, params); the non-tensor arguments get none.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto* api = reinterpret_cast<const ModelApi*>(ctx->saved_data["api"].toInt());
    if (api->is_double())
      return detail::backward_impl<double>(ctx, *api, grad_out[0]);
    return detail::backward_impl<float>(ctx, *api, grad_out[0]);
  }
};

// Hyperparameters and state of an optimizer run inside the library (TorchModel::train_step).
// The updates follow torch.optim's exactly (see rootclad/optim.h).
struct FusedOptimizer {
  OptimConfig config{};
  long step = 0;       // updates done so far
  torch::Tensor state; // momentum or Adam moments (2 * n_params), made at the first step

  static FusedOptimizer sgd(double lr, double momentum = 0, double dampening = 0,
                            double weight_decay = 0, bool nesterov = false) {
    TORCH_CHECK_VALUE(!nesterov || (momentum > 0 && dampening == 0),
                      "Nesterov momentum requires a momentum and zero dampening");
    FusedOptimizer o;
    o.config = {OPTIM_SGD, lr, momentum, dampening, weight_decay, double(nesterov), 0, 0, 0};
    return o;
  }
  static FusedOptimizer adam(double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
                             double eps = 1e-8, double weight_decay = 0) {
    FusedOptimizer o;
    o.config = {OPTIM_ADAM, lr, 0, 0, weight_decay, 0, beta1, beta2, eps};
    return o;
  }
  static FusedOptimizer adamw(double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
                              double eps = 1e-8, double weight_decay = 1e-2) {
    FusedOptimizer o = adam(lr, beta1, beta2, eps, weight_decay);
    o.config.kind = OPTIM_ADAMW;
    return o;
  }
};

// Reads a dict of name -> tensor written in Python by torch.save, for
// TorchModel::load_state_dict. Save a plain dict: torch.save(dict(cm.state_dict()), path)
// (LibTorch's unpickler cannot rebuild the collections.OrderedDict of state_dict() itself).
inline torch::OrderedDict<std::string, torch::Tensor> read_state_dict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), "rootclad: cannot open ", path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const char* hint =
      "; expected a dict of tensors saved with torch.save(dict(cm.state_dict()), path)";
  torch::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "rootclad: cannot read ", path, ": ", e.what_without_backtrace(),
                      hint);
  }
  TORCH_CHECK_VALUE(value.isGenericDict(), "rootclad: ", path, " holds a ", value.tagKind(), hint);
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (const auto& item : value.toGenericDict()) {
    TORCH_CHECK_VALUE(item.key().isString() && item.value().isTensor(), "rootclad: ", path,
                      " holds an entry that is not name -> tensor", hint);
    out.insert(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

// The model's loss on its output as torch computes it (mean over the batch), for LibTorch
// loops that call backward() themselves: bce_with_logits and mse take targets of the
// output's shape (or (B) for one output), cross_entropy and nll B class indices.
inline torch::Tensor loss_of(const ModelApi& api, const torch::Tensor& out,
                             const torch::Tensor& y) {
  if (api.loss == "cross_entropy")
    return torch::nn::functional::cross_entropy(out, y.to(torch::kLong).reshape({-1}));
  if (api.loss == "nll")
    return torch::nll_loss(out, y.to(torch::kLong).reshape({-1}));
  TORCH_CHECK_VALUE(y.numel() == out.numel(), "rootclad model ", api.prefix, ": ", api.loss,
                    " targets have shape ", detail::shape_str(y.sizes()), ", expected ",
                    detail::shape_str(out.sizes()));
  auto target = y.to(out.scalar_type()).reshape(out.sizes());
  if (api.loss == "bce_with_logits")
    return torch::binary_cross_entropy_with_logits(out, target);
  if (api.loss == "huber")
    return torch::huber_loss(out, target);
  TORCH_CHECK_VALUE(api.loss == "mse", "rootclad model ", api.prefix, ": unknown loss '", api.loss,
                    "'");
  return torch::mse_loss(out, target);
}

// A compiled model with its parameters, for LibTorch programs. Parameters start at zero:
// load them with load_state_dict() or by writing into named_parameters(). Copies share the
// parameters (tensors are handles). Keep the model alive while a graph built by forward()
// may still run backward: the graph points at its ModelApi.
class TorchModel {
public:
  explicit TorchModel(ModelApi api, std::uint64_t seed = 0)
      : api_(std::make_shared<const ModelApi>(std::move(api))), seed_(seed) {
    auto opts = torch::TensorOptions().dtype(detail::scalar_type(*api_));
    params_ = torch::zeros({api_->n_params}, opts).requires_grad_();
    grads_ = torch::zeros({api_->n_params}, opts);
  }

  const ModelApi& api() const { return *api_; }

  // out (B, output_shape...), differentiable w.r.t. x and the parameters.
  torch::Tensor forward(const torch::Tensor& x) {
    return CompiledFunction::apply(x, params_, api_.get(), training_, next_seed());
  }
  torch::Tensor operator()(const torch::Tensor& x) { return forward(x); }

  // The output without autograd bookkeeping.
  torch::Tensor predict(const torch::Tensor& x) {
    const int B = detail::check_input(*api_, x);
    auto [act, d_act] = workspace(B);
    detail::region(act, api_->input_offset, api_->input_size, B).view(x.sizes()).copy_(x);
    const auto seed = next_seed();
    if (api_->is_double())
      api_->f64.forward(detail::ptr<double>(params_), detail::ptr<double>(act), B, training_, seed);
    else
      api_->f32.forward(detail::ptr<float>(params_), detail::ptr<float>(act), B, training_, seed);
    return detail::region(act, api_->output_offset, api_->output_size, B)
        .view(detail::batch_shape(B, api_->output_shape))
        .clone();
  }

  // {flat parameter block}: what torch::optim optimizers take.
  std::vector<torch::Tensor> parameters() const { return {params_}; }
  const torch::Tensor& flat_parameters() const { return params_; }

  // Views into the flat block, named and shaped as in the torch module. They do not require
  // grad; writing into them (copy_) changes the model.
  torch::OrderedDict<std::string, torch::Tensor> named_parameters() const {
    torch::OrderedDict<std::string, torch::Tensor> out;
    auto flat = params_.detach();
    for (const auto& p : api_->params)
      out.insert(p.name, flat.narrow(0, p.offset, p.numel)
                             .view(std::vector<int64_t>(p.shape.begin(), p.shape.end())));
    return out;
  }

  // Copies values in by name (converting dtype); names and shapes must match.
  void load_state_dict(const torch::OrderedDict<std::string, torch::Tensor>& state,
                       bool strict = true) {
    auto views = named_parameters();
    if (strict) {
      for (const auto& item : state)
        TORCH_CHECK_VALUE(views.contains(item.key()), "rootclad model ", api_->prefix,
                          ": load_state_dict: unexpected key '", item.key(), "'");
      for (const auto& item : views)
        TORCH_CHECK_VALUE(state.contains(item.key()), "rootclad model ", api_->prefix,
                          ": load_state_dict: missing key '", item.key(), "'");
    }
    torch::NoGradGuard no_grad;
    for (auto& item : views) {
      const torch::Tensor* value = state.find(item.key());
      if (!value)
        continue;
      TORCH_CHECK_VALUE(value->sizes() == item.value().sizes(), "rootclad model ", api_->prefix,
                        ": load_state_dict: '", item.key(), "' has shape ",
                        detail::shape_str(value->sizes()), ", expected ",
                        detail::shape_str(item.value().sizes()));
      item.value().copy_(*value);
    }
  }

  // The mean loss of a batch and the gradient of the flat parameter block (a fresh tensor),
  // in one library call. y: B * output_size targets (cross_entropy, nll: B class indices).
  // w (optional): B per-sample weights (HEP event weights), the loss then the mean over
  // elements of w[b] * loss_element, as torch's reduction="none" losses weighted that way.
  std::pair<torch::Tensor, torch::Tensor>
  loss_and_grad(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& w = {}) {
    const int B = detail::check_input(*api_, x);
    auto yt = check_targets(y, B);
    auto wt = check_weights(w, B);
    auto [act, d_act] = workspace(B);
    detail::region(act, api_->input_offset, api_->input_size, B).view(x.sizes()).copy_(x);
    const auto seed = next_seed();
    double loss;
    if (api_->is_double())
      loss = call_loss_and_grad<double>(act, d_act, yt, wt, B, seed);
    else
      loss = call_loss_and_grad<float>(act, d_act, yt, wt, B, seed);
    return {torch::tensor(loss, params_.options().requires_grad(false)), grads_.clone()};
  }

  // Forward, backward and opt's update in one library call (training mode); returns the loss.
  // w (optional): per-sample weights, as in loss_and_grad.
  double train_step(const torch::Tensor& x, const torch::Tensor& y, FusedOptimizer& opt,
                    const torch::Tensor& w = {}) {
    const int B = detail::check_input(*api_, x);
    auto yt = check_targets(y, B);
    auto wt = check_weights(w, B);
    if (!opt.state.defined())
      opt.state = torch::zeros({2 * api_->n_params}, grads_.options());
    TORCH_CHECK_VALUE(
        opt.state.numel() == 2 * api_->n_params && opt.state.scalar_type() == grads_.scalar_type(),
        "rootclad model ", api_->prefix, ": this FusedOptimizer was used with another model");
    auto [act, d_act] = workspace(B);
    detail::region(act, api_->input_offset, api_->input_size, B).view(x.sizes()).copy_(x);
    opt.step += 1;
    const auto seed = next_seed();
    double loss;
    if (api_->is_double())
      loss = call_train_step<double>(act, d_act, yt, wt, opt, B, seed);
    else
      loss = call_train_step<float>(act, d_act, yt, wt, opt, B, seed);
    // The library wrote params_ behind autograd's back: make graphs that saved it fail loudly.
    params_.unsafeGetTensorImpl()->bump_version();
    return loss;
  }

  TorchModel& train(bool on = true) {
    training_ = on;
    return *this;
  }
  TorchModel& eval() { return train(false); }
  bool is_training() const { return training_; }

private:
  std::shared_ptr<const ModelApi> api_;
  torch::Tensor params_, grads_, work_;
  int work_batch_ = 0;
  bool training_ = true;
  std::uint64_t seed_, calls_ = 0;

  // The same sequence as the Python CompiledModel, so both draw the same dropout masks.
  std::uint64_t next_seed() { return call_seed(seed_, ++calls_); }

  // act and d_act for batch B, reusing the largest buffer allocated so far.
  std::pair<torch::Tensor, torch::Tensor> workspace(int B) {
    const long n = api_->act_size(B), nd = api_->d_act_size(B);
    if (B > work_batch_) {
      work_ = torch::empty({n + nd}, grads_.options());
      work_batch_ = B;
    }
    return {work_.narrow(0, 0, n), work_.narrow(0, n, nd)};
  }

  torch::Tensor check_targets(const torch::Tensor& y, int B) const {
    const std::string who = "rootclad model " + api_->prefix + ": ";
    TORCH_CHECK_VALUE(y.defined() && y.device().is_cpu(), who, "targets must be a CPU tensor");
    if (api_->class_targets()) {
      TORCH_CHECK_VALUE(!y.is_floating_point() && y.numel() == B, who, api_->loss,
                        " targets must be ", B, " integer class indices, got ", y.scalar_type(),
                        " of shape ", detail::shape_str(y.sizes()));
      const int64_t nc = api_->output_size;
      TORCH_CHECK_VALUE(y.min().item<int64_t>() >= 0 && y.max().item<int64_t>() < nc, who,
                        api_->loss, " targets must lie in [0, ", nc, ")");
    } else { // the output's shape, as torch's losses demand; (B) too for one output per sample
      const auto shape = detail::batch_shape(B, api_->output_shape);
      const bool single = api_->output_size == 1 && y.dim() == 1 && y.size(0) == B;
      TORCH_CHECK_VALUE(y.sizes() == c10::IntArrayRef(shape) || single, who, api_->loss,
                        " targets have shape ", detail::shape_str(y.sizes()), ", expected ",
                        detail::shape_str(shape), " (the model output's shape)");
    }
    return y.reshape({-1}).to(grads_.scalar_type()).contiguous();
  }

  // Undefined (no weights) or B finite weights, in the model's dtype.
  torch::Tensor check_weights(const torch::Tensor& w, int B) const {
    if (!w.defined())
      return w;
    const std::string who = "rootclad model " + api_->prefix + ": ";
    TORCH_CHECK_VALUE(w.device().is_cpu() && w.numel() == B && (w.dim() == 1 || w.dim() == 2), who,
                      "weights must be ", B, " per-sample values on the CPU, got shape ",
                      detail::shape_str(w.sizes()));
    auto wt = w.reshape({-1}).to(grads_.scalar_type()).contiguous();
    TORCH_CHECK_VALUE(torch::isfinite(wt).all().item<bool>(), who, "weights must be finite");
    return wt;
  }

  template <typename T> static const T* weights_ptr(const torch::Tensor& w) {
    return w.defined() ? w.data_ptr<T>() : nullptr;
  }

  template <typename T>
  double call_loss_and_grad(const torch::Tensor& act, const torch::Tensor& d_act,
                            const torch::Tensor& y, const torch::Tensor& w, int B,
                            std::uint64_t seed) {
    using detail::ptr;
    return api_->entry_points<T>().loss_and_grad(ptr<T>(params_), ptr<T>(act), ptr<T>(y),
                                                 ptr<T>(grads_), ptr<T>(d_act), B, training_, seed,
                                                 0, weights_ptr<T>(w));
  }

  template <typename T>
  double call_train_step(const torch::Tensor& act, const torch::Tensor& d_act,
                         const torch::Tensor& y, const torch::Tensor& w, FusedOptimizer& opt, int B,
                         std::uint64_t seed) {
    using detail::ptr;
    return api_->entry_points<T>().train_step(ptr<T>(params_), ptr<T>(act), ptr<T>(y),
                                              ptr<T>(grads_), ptr<T>(d_act), ptr<T>(opt.state),
                                              reinterpret_cast<const double*>(&opt.config),
                                              opt.step, B, seed, nullptr, weights_ptr<T>(w));
  }
};

} // namespace rootclad

#endif // ROOTCLAD_TORCH_FUNCTION_H
