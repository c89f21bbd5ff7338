// rootclad/ops/windows_impl.h — the definitions of the kernels windows.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_WINDOWS_IMPL_H
#define ROOTCLAD_OPS_WINDOWS_IMPL_H

#include "core.h"
#include "window_geometry.h"
#include "windows.h"

namespace rootclad {

template <typename T>
void window_bias_forward(T* out, const T* x, const T* table, int B, ROOTCLAD_WIN_ARGS) {
  ROOTCLAD_REPLAY_SKIP;
  const Win w{nh, nw, wh, ww, heads, sh, sw};
  const long n = w.per_sample();
  for (int b = 0; b < B; ++b)
    for (long i = 0; i < n; ++i)
      out[b * n + i] = win_biased(w, x + b * n, table, i);
}

template <typename T>
void window_bias_backward(T* d_x, T* d_table, const T* d_out, int B, ROOTCLAD_WIN_ARGS) {
  const Win w{nh, nw, wh, ww, heads, sh, sw};
  const long n = w.per_sample();
  for (long i = 0; i < (long)B * n; ++i)
    d_x[i] += d_out[i];
  if (!d_table)
    return;
  for (int b = 0; b < B; ++b)
    for (long e = 0; e < (long)w.table_rows() * heads; ++e)
      d_table[e] += win_table_grad(w, d_out + b * n, e);
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_WINDOWS_IMPL_H
