// rootclad/ops/windows.h — the scores of a Swin Transformer's shifted-window attention on the
// CPU (window_geometry.h says what they are): forward, backward and the Clad-convention
// pullback.
#ifndef ROOTCLAD_OPS_WINDOWS_H
#define ROOTCLAD_OPS_WINDOWS_H

#include "core.h"
#include "window_geometry.h"

namespace rootclad {

#define ROOTCLAD_WIN_ARGS int nh, int nw, int wh, int ww, int heads, int sh, int sw

// out(B, nh * nw, heads, N, N) = x + the relative position bias (+ the shift's mask)
template <typename T>
void window_bias_forward(T* out, const T* x, const T* table, int B, ROOTCLAD_WIN_ARGS) {
  ROOTCLAD_REPLAY_SKIP;
  const Win w{nh, nw, wh, ww, heads, sh, sw};
  const long n = w.per_sample();
  for (int b = 0; b < B; ++b)
    for (long i = 0; i < n; ++i)
      out[b * n + i] = win_biased(w, x + b * n, table, i);
}

// d_x += d_out; d_table (null: frozen) += d_out summed over the batch, windows and pairs
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

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void window_bias_forward_pullback(T* out, const T* x, const T* table, int B, ROOTCLAD_WIN_ARGS,
                                  T* d_out, T* d_x, T* d_table, int*, int*, int*, int*, int*, int*,
                                  int*, int*) {
  ::rootclad::window_bias_backward(d_x, d_table, d_out, B, nh, nw, wh, ww, heads, sh, sw);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#endif // ROOTCLAD_OPS_WINDOWS_H
