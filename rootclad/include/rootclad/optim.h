// rootclad/optim.h — fused in-place optimizer updates over the whole parameter block, each
// following torch.optim's update order exactly (the rules: optim_rule.h).
#ifndef ROOTCLAD_OPTIM_H
#define ROOTCLAD_OPTIM_H

#include <cmath>

#include "optim_rule.h" // sibling-relative: macros include these headers by path
#include "parallel.h"

namespace rootclad {

// Updates p[0..n) from g; buf (SGD momentum) or m, v (Adam) are the matching slices of the
// optimizer state. step counts from 1. The element rules are optim_rule.h's.
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

// Below this many parameters, waking a thread costs more than updating them.
constexpr long OPTIM_SPLIT_MIN = 65536;

// Updates p[0..n) from g with state m (SGD's momentum buffer, Adam's first moment) and v
// (Adam's second moment), each n long; large blocks in parallel over rootclad's thread pool.
template <typename T>
void optim_step_mv(T* p, const T* g, T* m, T* v, long n, const double* cfg_raw, long step) {
  const OptimConfig* c = reinterpret_cast<const OptimConfig*>(cfg_raw);
  OptimJob<T> job{p, g, m, v, n, c, step};
  ThreadPool& pool = ThreadPool::instance();
  pool.run(optim_range<T>, &job, n >= OPTIM_SPLIT_MIN && !in_pool_task() ? pool.size() : 1);
}

// The whole parameter block: state holds 2N values, m then v (SGD uses the first N).
template <typename T>
void optim_step(T* p, const T* g, T* state, long N, const double* cfg_raw, long step) {
  optim_step_mv(p, g, state, state + N, N, cfg_raw, step);
}

} // namespace rootclad

#endif // ROOTCLAD_OPTIM_H
