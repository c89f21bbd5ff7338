// Counts heap allocations made during a compiled model's train_step, after warm-up calls.
// usage: test_no_alloc <library.so> <prefix> <batch>
// Exit status 0 when steady-state steps allocate nothing; prints the count either way.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "rootclad/model_api.h"

static std::atomic<long> g_allocs{0};
static std::atomic<bool> g_counting{false};

extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_calloc(size_t, size_t);
extern "C" void* __libc_realloc(void*, size_t);
extern "C" void __libc_free(void*);

// Interpose the C allocator (this executable is linked with -rdynamic, so the model library and
// BLAS resolve to these) and the C++ one.
extern "C" void* malloc(size_t n) {
  if (g_counting.load(std::memory_order_relaxed))
    ++g_allocs;
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t n, size_t s) {
  if (g_counting.load(std::memory_order_relaxed))
    ++g_allocs;
  return __libc_calloc(n, s);
}
extern "C" void* realloc(void* p, size_t n) {
  if (g_counting.load(std::memory_order_relaxed))
    ++g_allocs;
  return __libc_realloc(p, n);
}
extern "C" void free(void* p) {
  __libc_free(p);
}
void* operator new(size_t n) {
  void* p = malloc(n);
  if (!p)
    throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  free(p);
}
void operator delete[](void* p) noexcept {
  free(p);
}
void operator delete(void* p, size_t) noexcept {
  free(p);
}
void operator delete[](void* p, size_t) noexcept {
  free(p);
}

template <typename T> int run(const rootclad::ModelApi& api, int B) {
  const auto& e = api.entry_points<T>();
  std::vector<T> params(api.n_params), grads(api.n_params), state(2 * api.n_params);
  std::vector<T> act(api.act_size(B)), d_act(api.d_act_size(B));
  std::vector<T> y(B * api.output_size);
  std::mt19937 rng(1);
  std::normal_distribution<double> normal;
  for (auto& p : params)
    p = T(0.05 * normal(rng));
  for (long i = 0; i < B * api.input_size; ++i)
    act[api.input_offset * B + i] = T(normal(rng));
  for (auto& v : y)
    v = T(rng() % 2);
  // Adam: kind, lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps
  const double cfg[9] = {1, 1e-3, 0, 0, 0, 0, 0.9, 0.999, 1e-8};
  long step = 0;
  auto train = [&](int b) {
    return e.train_step(params.data(), act.data(), y.data(), grads.data(), d_act.data(),
                        state.data(), cfg, ++step, b, 7, nullptr, nullptr);
  };
  for (int i = 0; i < 3; ++i) // warm-up: thread pool, gradient scratch, BLAS buffers
    train(B);
  g_counting = true;
  T loss = 0;
  for (int i = 0; i < 20; ++i)
    loss += train(B);
  loss += train(B > 1 ? B / 2 : 1); // a smaller batch reuses the same buffers
  g_counting = false;
  std::printf("allocations in 21 steady-state steps: %ld (loss sum %g)\n", g_allocs.load(),
              (double)loss);
  return g_allocs.load() == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <library.so> <prefix> <batch>\n", argv[0]);
    return 2;
  }
  rootclad::ModelApi api = rootclad::load_model(argv[1], argv[2]);
  const int B = std::atoi(argv[3]);
  return api.is_double() ? run<double>(api, B) : run<float>(api, B);
}
