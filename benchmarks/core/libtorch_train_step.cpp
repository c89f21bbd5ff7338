// The issue's MLP and CNN trained with LibTorch's C++ autograd and Adam: the "LibTorch C++
// training loop" column of benchmarks/core/bench_train_step.py.
// usage: libtorch_train_step <mlp|cnn> <batch> <repeats>
// prints one JSON object: {"model": ..., "batch": ..., "times_ms": [...]}
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace nn = torch::nn;

static nn::Sequential make_model(const std::string& name) {
  if (name == "mlp")
    return nn::Sequential(nn::Linear(2048, 256), nn::ReLU(), nn::Linear(256, 64), nn::ReLU(),
                          nn::Linear(64, 1));
  // 2048 -> conv 2033 -> pool 508 -> conv 501 -> pool 125 -> conv 118 -> pool 29
  return nn::Sequential(nn::Conv1d(nn::Conv1dOptions(1, 16, 16)), nn::ReLU(), nn::MaxPool1d(4),
                        nn::Conv1d(nn::Conv1dOptions(16, 32, 8)), nn::ReLU(), nn::MaxPool1d(4),
                        nn::Conv1d(nn::Conv1dOptions(32, 64, 8)), nn::ReLU(), nn::MaxPool1d(4),
                        nn::Flatten(), nn::Linear(64 * 29, 64), nn::ReLU(), nn::Linear(64, 1));
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <mlp|cnn> <batch> <repeats>\n", argv[0]);
    return 2;
  }
  const std::string name = argv[1];
  const long B = std::atol(argv[2]);
  const int repeats = std::atoi(argv[3]);
  torch::manual_seed(0);
  auto model = make_model(name);
  auto x = name == "mlp" ? torch::randn({B, 2048}) : torch::randn({B, 1, 2048});
  auto y = torch::randint(0, 2, {B}).to(torch::kFloat);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto step = [&] {
    opt.zero_grad();
    auto loss = torch::binary_cross_entropy_with_logits(model->forward(x).squeeze(1), y);
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i)
    step();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("{\"model\": \"%s\", \"batch\": %ld, \"threads\": %d, \"times_ms\": [", name.c_str(),
              B, torch::get_num_threads());
  for (size_t i = 0; i < times.size(); ++i)
    std::printf("%s%.6f", i ? ", " : "", times[i]);
  std::printf("]}\n");
  return 0;
}
