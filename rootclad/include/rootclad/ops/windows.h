// rootclad/ops/windows.h — the scores of a Swin Transformer's shifted-window attention on the
// CPU (window_geometry.h says what they are): forward, backward and the Clad-convention
// pullback.
#ifndef ROOTCLAD_OPS_WINDOWS_H
#define ROOTCLAD_OPS_WINDOWS_H

#include "core.h"

// the windows' geometry: numbers of windows, their size, the heads and the shift
#define ROOTCLAD_WIN_ARGS int nh, int nw, int wh, int ww, int heads, int sh, int sw

namespace rootclad {

// out(B, nh * nw, heads, N, N) = x + the relative position bias (+ the shift's mask)
template <typename T>
void window_bias_forward(T* out, const T* x, const T* table, int B, ROOTCLAD_WIN_ARGS);

// d_x += d_out; d_table (null: frozen) += d_out summed over the batch, windows and pairs
template <typename T>
void window_bias_backward(T* d_x, T* d_table, const T* d_out, int B, ROOTCLAD_WIN_ARGS);

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

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "windows_impl.h"
#endif

#endif // ROOTCLAD_OPS_WINDOWS_H
