// rootclad/linear_update_impl.h — the definition of linear_update.h's fused backward and update;
// compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_LINEAR_UPDATE_IMPL_H
#define ROOTCLAD_LINEAR_UPDATE_IMPL_H

#include <vector>

#include "linear_update.h"
#include "parallel.h"

namespace rootclad {

template <typename T> struct LinearUpdateJob {
  T* weight;
  T* m;
  T* v;
  const T* d_out;
  const T* inp;
  int R, C, OC;
  const OptimConfig* cfg;
  long step;
};

// Rows [o0, o1) of the weight: d_weight[o, :] = sum_r d_out[r, o] * inp[r, :], then the update.
template <typename T> void linear_update_rows(void* ctx, int t, int n) {
  const LinearUpdateJob<T>& j = *static_cast<const LinearUpdateJob<T>*>(ctx);
  int o0, o1;
  chunk_range(j.OC, n, t, o0, o1);
  static thread_local std::vector<T> row; // grown once per thread: no allocation after that
  if (row.size() < (size_t)j.C)
    row.resize(j.C);
  T* g = row.data();
  const int C = j.C;
  for (int o = o0; o < o1; ++o) {
    const T d0 = j.d_out[o];
    ROOTCLAD_SIMD
    for (int i = 0; i < C; ++i)
      g[i] = d0 * j.inp[i];
    for (int r = 1; r < j.R; ++r) {
      const T d = j.d_out[(long)r * j.OC + o];
      const T* x = j.inp + (long)r * C;
      ROOTCLAD_SIMD
      for (int i = 0; i < C; ++i)
        g[i] += d * x[i];
    }
    const long off = (long)o * C;
    optim_update(j.weight + off, g, j.m + off, j.v + off, C, *j.cfg, j.step);
  }
}

template <typename T>
void linear_backward_update(T* d_inp, const T* d_out, const T* inp, T* weight, T* bias, int R,
                            int C, int OC, T* w_m, T* w_v, T* d_bias, T* b_m, T* b_v,
                            const double* cfg_raw, long step) {
  if (d_inp)
    gemm(false, false, R, C, OC, T(1), d_out, OC, weight, C, T(1), d_inp, C);
  const OptimConfig* cfg = reinterpret_cast<const OptimConfig*>(cfg_raw);
  if (bias) {
    for (int o = 0; o < OC; ++o)
      d_bias[o] = T(0);
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < OC; ++o)
        d_bias[o] += d_out[(long)r * OC + o];
    optim_update(bias, d_bias, b_m, b_v, OC, *cfg, step);
  }
  LinearUpdateJob<T> job{weight, w_m, w_v, d_out, inp, R, C, OC, cfg, step};
  ThreadPool& pool = ThreadPool::instance();
  const bool split = !in_pool_task() && (long)OC * C >= OPTIM_SPLIT_MIN;
  pool.run(linear_update_rows<T>, &job, split ? pool.size() : 1);
}

} // namespace rootclad

#endif // ROOTCLAD_LINEAR_UPDATE_IMPL_H
