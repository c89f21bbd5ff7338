// rootclad/optim.h — fused in-place optimizer updates over the whole parameter block.
//
// Each follows torch.optim's update order exactly (so float64 runs track torch to rounding):
//   SGD:   g += wd*p;  buf = g (first step) | momentum*buf + (1-dampening)*g;
//          g = nesterov ? g + momentum*buf : buf;  p -= lr*g
//   Adam:  g += wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//          p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
//   AdamW: p *= 1 - lr*wd, then Adam without the L2 term.
#pragma once

#include <cmath>

#include "parallel.h" // sibling-relative: macros include these headers by path

namespace rootclad {

enum OptimKind { OPTIM_SGD = 0, OPTIM_ADAM = 1, OPTIM_ADAMW = 2 };

// Hyperparameters, laid out as the double array the Python side passes (see optim.py).
struct OptimConfig {
  double kind, lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps;
};

// Updates p[0..n) from g; buf (SGD momentum) or m, v (Adam) are the matching slices of the
// optimizer state. step counts from 1.
template <typename T>
void optim_update(T* p, const T* g, T* m, T* v, long n, const OptimConfig& c, long step) {
  const int kind = (int)c.kind;
  const T lr = (T)c.lr, wd = (T)c.weight_decay;
  if (kind == OPTIM_SGD) {
    const T mom = (T)c.momentum, damp = (T)c.dampening;
    const bool nesterov = c.nesterov != 0;
    T* buf = m;
    for (long i = 0; i < n; ++i) {
      T gi = g[i] + wd * p[i];
      if (mom != 0) {
        buf[i] = step == 1 ? gi : mom * buf[i] + (T(1) - damp) * gi;
        gi = nesterov ? gi + mom * buf[i] : buf[i];
      }
      p[i] -= lr * gi;
    }
    return;
  }
  const T b1 = (T)c.beta1, b2 = (T)c.beta2, eps = (T)c.eps;
  const T bc1 = T(1) - (T)std::pow(c.beta1, (double)step);
  const T bc2_sqrt = (T)std::sqrt(1.0 - std::pow(c.beta2, (double)step));
  const T step_size = lr / bc1;
  const bool decoupled = kind == OPTIM_ADAMW;
  for (long i = 0; i < n; ++i) {
    T gi = g[i];
    if (decoupled)
      p[i] *= T(1) - lr * wd;
    else
      gi += wd * p[i];
    m[i] = b1 * m[i] + (T(1) - b1) * gi;
    v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
    T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] -= step_size * m[i] / denom;
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
