// A compiled model's train_step in a loop, through its C API, for callgrind
// (benchmarks/core/bench_glue_share.py):  glue_driver LIB PREFIX B STEPS
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using F = float;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: glue_driver LIB PREFIX B STEPS\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  const std::string prefix = argv[2];
  const int B = std::atoi(argv[3]), steps = std::atoi(argv[4]);
  auto sym = [&](const char* name) { return dlsym(lib, (prefix + "_" + name).c_str()); };
  auto n_params = (long (*)())sym("n_params");
  auto act_size = (long (*)(int))sym("act_size");
  auto d_act_size = (long (*)(int))sym("d_act_size");
  auto input_size = (long (*)())sym("input_size");
  using Step = F (*)(F*, F*, const F*, F*, F*, F*, const double*, long, int, std::uint64_t,
                     const long*, const F*);
  auto train_step = (Step)sym("train_step");
  const long P = n_params();
  std::vector<F> params(2 * P, 0.01f), grads(2 * P), state(2 * P), act(act_size(B)),
      d_act(d_act_size(B)), y(B, 1.f);
  for (long i = 0; i < (long)B * input_size(); ++i)
    act[i] = F(i % 7) * 0.1f;
  const double adam[9] = {1, 1e-3, 0, 0, 0, 0, 0.9, 0.999, 1e-8}; // rootclad::OptimConfig
  F loss = 0;
  for (int s = 1; s <= steps; ++s)
    loss += train_step(params.data(), act.data(), y.data(), grads.data(), d_act.data(),
                       state.data(), adam, s, B, 0, nullptr, nullptr);
  std::printf("%g\n", loss);
  return 0;
}
