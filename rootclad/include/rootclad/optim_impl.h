// rootclad/optim_impl.h — the definitions of optim.h's updates; compiled once into the runtime
// library (runtime.cpp).
#ifndef ROOTCLAD_OPTIM_IMPL_H
#define ROOTCLAD_OPTIM_IMPL_H

#include "optim.h"
#include "parallel.h"

namespace rootclad {

template <typename T>
void optim_update(T* p, const T* g, T* m, T* v, long n, const OptimConfig& c, long step) {
  const OptimStep<T> s(c, step);
  if (s.kind == OPTIM_SGD) {
    for (long i = 0; i < n; ++i)
      sgd_element(p[i], g[i], m[i], s);
  } else if (s.kind == OPTIM_ADAMW) {
    for (long i = 0; i < n; ++i)
      adam_element<true>(p[i], g[i], m[i], v[i], s);
  } else {
    for (long i = 0; i < n; ++i)
      adam_element<false>(p[i], g[i], m[i], v[i], s);
  }
}

template <typename T> struct OptimJob {
  T* p;
  const T* g;
  T* m;
  T* v;
  long N;
  const OptimConfig* c;
  long step;
};

template <typename T> void optim_range(void* ctx, int t, int n) {
  const OptimJob<T>& j = *static_cast<const OptimJob<T>*>(ctx);
  long chunk = (j.N + n - 1) / n, i0 = t * chunk, i1 = i0 + chunk < j.N ? i0 + chunk : j.N;
  if (i0 < i1)
    optim_update(j.p + i0, j.g + i0, j.m + i0, j.v + i0, i1 - i0, *j.c, j.step);
}

template <typename T>
void optim_step_mv(T* p, const T* g, T* m, T* v, long n, const double* cfg_raw, long step) {
  const OptimConfig* c = reinterpret_cast<const OptimConfig*>(cfg_raw);
  OptimJob<T> job{p, g, m, v, n, c, step};
  ThreadPool& pool = ThreadPool::instance();
  pool.run(optim_range<T>, &job, n >= OPTIM_SPLIT_MIN && !in_pool_task() ? pool.size() : 1);
}

template <typename T>
void optim_step(T* p, const T* g, T* state, long N, const double* cfg_raw, long step) {
  optim_step_mv(p, g, state, state + N, N, cfg_raw, step);
}

} // namespace rootclad

#endif // ROOTCLAD_OPTIM_IMPL_H
