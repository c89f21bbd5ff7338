// Trains a compiled rootclad model from LibTorch through rootclad/torch_function.h; driven and
// checked by tests/libtorch/test_torch_function.py, which runs the same steps in Python.
//
//   test_torch_function <model.so> <prefix> <dir> <seed>
//
// <dir>/config.txt: "B steps optimizer lr" (optimizer: sgd (momentum 0.9) or adam).
// <dir>/state_dict.pt: torch.save(dict(cm.state_dict())) of the same parameters;
// <dir>/ordered_dict.pt: torch.save(cm.state_dict()), which LibTorch cannot read.
// <dir>/params.bin, x.bin, y.bin: raw arrays in the model's dtype (flat parameter block;
// steps x B x input; steps x B x output). Results are written to <dir> as raw arrays of the
// same dtype; self-checks print "ok <name>" or "FAIL <name>: ..." and set the exit code.
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rootclad/torch_function.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& name, const std::string& detail = "") {
  if (ok)
    std::cout << "ok " << name << "\n";
  else {
    std::cout << "FAIL " << name << ": " << detail << "\n";
    ++failures;
  }
}

// Runs f, which must throw an exception whose message contains `needle`.
void check_throws(const std::function<void()>& f, const std::string& needle,
                  const std::string& name) {
  try {
    f();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    check(msg.find(needle) != std::string::npos, name, "message was: " + msg);
    std::cout << "  message: " << msg << "\n";
    return;
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    check(msg.find(needle) != std::string::npos, name, "message was: " + msg);
    std::cout << "  message: " << msg << "\n";
    return;
  }
  check(false, name, "no exception");
}

torch::Tensor read_raw(const std::string& path, int64_t n, torch::ScalarType dtype) {
  auto t = torch::empty({n}, torch::dtype(dtype));
  std::ifstream in(path, std::ios::binary);
  const auto bytes = static_cast<std::streamsize>(n * t.element_size());
  if (!in.read(static_cast<char*>(t.data_ptr()), bytes))
    throw std::runtime_error("cannot read " + std::to_string(n) + " values from " + path);
  return t;
}

void write_raw(const std::string& path, const torch::Tensor& t) {
  auto c = t.detach().contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()),
            static_cast<std::streamsize>(c.numel() * c.element_size()));
  if (!out)
    throw std::runtime_error("cannot write " + path);
}

// The model's loss, written with LibTorch.
torch::Tensor torch_loss(const std::string& loss, const torch::Tensor& out,
                         const torch::Tensor& y) {
  if (loss == "bce_with_logits")
    return torch::binary_cross_entropy_with_logits(out, y.view_as(out));
  if (loss == "mse")
    return torch::mse_loss(out, y.view_as(out));
  if (loss == "cross_entropy")
    return torch::nn::functional::cross_entropy(out, y.to(torch::kLong));
  throw std::runtime_error("unknown loss " + loss);
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: " << argv[0] << " <model.so> <prefix> <dir> <seed>\n";
    return 2;
  }
  const std::string lib = argv[1], prefix = argv[2], dir = std::string(argv[3]) + "/";
  const std::uint64_t seed = std::stoull(argv[4]);
  int B = 0, steps = 0;
  std::string optimizer;
  double lr = 0;
  std::ifstream(dir + "config.txt") >> B >> steps >> optimizer >> lr;

  const rootclad::ModelApi api = rootclad::load_model(lib, prefix);
  const auto dtype = api.is_double() ? torch::kFloat64 : torch::kFloat32;
  std::cout << "model " << api.prefix << ": engine " << api.engine << ", " << api.dtype << ", "
            << api.n_params << " parameters, loss " << api.loss << "\n";
  const auto init = read_raw(dir + "params.bin", api.n_params, dtype);
  auto x_shape = rootclad::detail::batch_shape(B, api.input_shape);
  x_shape.insert(x_shape.begin(), steps);
  const auto xs = read_raw(dir + "x.bin", steps * B * api.input_size, dtype).view(x_shape);
  const auto ys = read_raw(dir + "y.bin", steps * B * api.output_size, dtype)
                      .view({steps, B, static_cast<int64_t>(api.output_size)});
  auto fresh_model = [&] {
    rootclad::TorchModel m(api, seed);
    torch::NoGradGuard no_grad;
    m.flat_parameters().copy_(init);
    return m;
  };

  // 1. Gradients at the initial parameters (eval: no dropout), through torch autograd and
  //    through the library's own loss_and_grad.
  {
    auto model = fresh_model();
    model.eval();
    auto x = xs[0].clone().requires_grad_();
    auto loss = torch_loss(api.loss, model(x), ys[0]);
    auto g = torch::autograd::grad({loss}, {model.flat_parameters(), x});
    write_raw(dir + "loss_autograd.bin", loss);
    write_raw(dir + "grad_autograd.bin", g[0]);
    write_raw(dir + "dx_autograd.bin", g[1]);
    auto [lib_loss, lib_grad] = model.loss_and_grad(xs[0], ys[0]);
    write_raw(dir + "loss_library.bin", lib_loss);
    write_raw(dir + "grad_library.bin", lib_grad);
    write_raw(dir + "out_eval.bin", model.predict(xs[0]));

    // named_parameters() views the flat block.
    auto named = model.named_parameters();
    check(named.size() == api.params.size(), "named_parameters count");
    bool views_ok = true;
    for (const auto& p : api.params)
      views_ok = views_ok && named[p.name].data_ptr() ==
                                 static_cast<char*>(model.flat_parameters().data_ptr()) +
                                     p.offset * model.flat_parameters().element_size();
    check(views_ok, "named_parameters view the flat block");

    // load_state_dict round trip through the named views.
    auto other = rootclad::TorchModel(api, seed);
    other.load_state_dict(named);
    check(torch::equal(other.flat_parameters(), model.flat_parameters()), "load_state_dict");
    auto bad = named;
    bad.insert("no.such.parameter", torch::zeros({1}, dtype));
    check_throws([&] { other.load_state_dict(bad); }, "unexpected key 'no.such.parameter'",
                 "load_state_dict rejects an unknown name");

    // Parameters saved in Python with torch.save(dict(cm.state_dict()), path).
    auto from_python = rootclad::TorchModel(api, seed);
    from_python.load_state_dict(rootclad::read_state_dict(dir + "state_dict.pt"));
    check(torch::equal(from_python.flat_parameters(), init), "read_state_dict");
    check_throws([&] { rootclad::read_state_dict(dir + "x.bin"); }, "cannot read " + dir + "x.bin",
                 "read_state_dict refuses a file torch.save did not write");
    check_throws([&] { rootclad::read_state_dict(dir + "ordered_dict.pt"); }, "torch.save(dict(",
                 "read_state_dict explains the OrderedDict trap");

    // Input checks: a non-contiguous input is accepted (copied), a wrong one refused.
    auto wide = torch::cat({xs[0], xs[0]}, -1);
    auto strided = wide.narrow(-1, 0, wide.size(-1) / 2);
    check(!strided.is_contiguous(), "strided input is non-contiguous");
    check(torch::equal(model(strided), model(xs[0])), "non-contiguous input");
    auto xt = xs[0].clone().requires_grad_();
    auto xn = torch::cat({xt, xt}, -1).narrow(-1, 0, xt.size(-1));
    auto gn = torch::autograd::grad({torch_loss(api.loss, model(xn), ys[0])}, {xt})[0];
    check(torch::allclose(gn, g[1]), "non-contiguous input: input gradient");
    auto other_dtype = api.is_double() ? torch::kFloat32 : torch::kFloat64;
    check_throws([&] { model(xs[0].to(other_dtype)); }, "dtype", "wrong dtype refused");
    check_throws([&] { model(xs[0].unsqueeze(1)); }, "input shape", "wrong shape refused");
    check_throws([&] { model.loss_and_grad(xs[0], ys[0].narrow(0, 0, 1)); }, "targets",
                 "wrong target count refused");
    auto wrong_params = torch::zeros({api.n_params + 1}, dtype);
    check_throws([&] { rootclad::CompiledFunction::apply(xs[0], wrong_params, &api); },
                 "flat parameter block", "wrong parameter block refused");

    // A graph whose parameters were then updated by the fused step must not run backward.
    auto pending = torch_loss(api.loss, model(xs[0]), ys[0]);
    auto opt = rootclad::FusedOptimizer::sgd(lr);
    model.train_step(xs[0], ys[0], opt);
    check_throws([&] { pending.backward(); }, "modified by an inplace operation",
                 "stale graph after train_step refused");
  }

  // 2. Training through CompiledFunction with a torch::optim optimizer.
  {
    auto model = fresh_model();
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (optimizer == "sgd")
      opt = std::make_unique<torch::optim::SGD>(model.parameters(),
                                                torch::optim::SGDOptions(lr).momentum(0.9));
    else
      opt = std::make_unique<torch::optim::Adam>(model.parameters(), torch::optim::AdamOptions(lr));
    auto losses = torch::empty({steps}, dtype);
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad();
      auto loss = torch_loss(api.loss, model(xs[s]), ys[s]);
      loss.backward();
      opt->step();
      losses[s] = loss.detach();
    }
    write_raw(dir + "losses_torch_optim.bin", losses);
    write_raw(dir + "params_torch_optim.bin", model.flat_parameters());
  }

  // 3. The same steps fused into the library (forward + backward + update per call).
  {
    auto model = fresh_model();
    auto opt = optimizer == "sgd" ? rootclad::FusedOptimizer::sgd(lr, 0.9)
                                  : rootclad::FusedOptimizer::adam(lr);
    auto losses = torch::empty({steps}, dtype);
    for (int s = 0; s < steps; ++s)
      losses[s] = model.train_step(xs[s], ys[s], opt);
    write_raw(dir + "losses_fused.bin", losses);
    write_raw(dir + "params_fused.bin", model.flat_parameters());
  }

  // 4. The fused steps with per-sample (event) weights w[s] = 0.5 + (sample index mod 3).
  {
    auto model = fresh_model();
    auto opt = optimizer == "sgd" ? rootclad::FusedOptimizer::sgd(lr, 0.9)
                                  : rootclad::FusedOptimizer::adam(lr);
    auto w = 0.5 + torch::arange(B, torch::kFloat64).remainder(3);
    auto losses = torch::empty({steps}, dtype);
    for (int s = 0; s < steps; ++s)
      losses[s] = model.train_step(xs[s], ys[s], opt, w);
    write_raw(dir + "losses_weighted.bin", losses);
    write_raw(dir + "params_weighted.bin", model.flat_parameters());
    check_throws([&] { model.train_step(xs[0], ys[0], opt, w.narrow(0, 0, B - 1)); }, "weights",
                 "weights of another length refused");
  }

  std::cout << (failures ? "FAILED\n" : "PASSED\n");
  return failures ? 1 : 0;
}
