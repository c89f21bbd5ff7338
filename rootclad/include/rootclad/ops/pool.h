// rootclad/ops/pool.h — max and average pooling over the last axis (the 2-D windows are in
// conv2d.h; global pooling is a window over every position).
#ifndef ROOTCLAD_OPS_POOL_H
#define ROOTCLAD_OPS_POOL_H

#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Pooling over the last axis of inp(R, L) -> out(R, LO), LO = pool_out(L, K, S, P, ceil_mode)
// (pool_geometry.h). R = B*C rows. MaxPool takes the first maximum (as torch does); the backward
// finds it again.
template <typename T>
void maxpool1d_forward(T* out, const T* inp, int R, int L, int K, int S, int P, int ceil_mode);

// The gradient of each window goes to its first maximum (as torch), or to its first NaN.
template <typename T>
void maxpool1d_backward(T* d_inp, const T* d_out, const T* out, const T* inp, int R, int L, int K,
                        int S, int P, int ceil_mode);

// AvgPool: a window divides by pool_span (pool_geometry.h): with count_include_pad (torch's
// default) by K, less what a ceil_mode window runs past the padding, otherwise by the number
// of its elements inside the input.
template <typename T>
void avgpool1d_forward(T* out, const T* inp, int R, int L, int K, int S, int P,
                       int count_include_pad, int ceil_mode);

template <typename T>
void avgpool1d_backward(T* d_inp, const T* d_out, int R, int L, int K, int S, int P,
                        int count_include_pad, int ceil_mode);

// ---------------------------------------------------------------------------------------
// Adaptive pooling of inp(R, H, W) -> out(R, OH, OW) (1-D: H = OH = 1), windows by
// adaptive_start/adaptive_end (pool_geometry.h). The average divides by the window's size; the
// maximum is the window's first (row-major), or its last NaN (as torch), and takes the gradient.
template <typename T>
void adaptive_avgpool_forward(T* out, const T* inp, int R, int H, int W, int OH, int OW);

template <typename T>
void adaptive_avgpool_backward(T* d_inp, const T* d_out, int R, int H, int W, int OH, int OW);

// plain loops that Clad can differentiate itself (pullbacks=False), as maxpool2d_forward's
template <typename T>
void adaptive_maxpool_forward(T* out, const T* inp, int R, int H, int W, int OH, int OW);

template <typename T>
void adaptive_maxpool_backward(T* d_inp, const T* d_out, const T* inp, int R, int H, int W, int OH,
                               int OW);

// ---------------------------------------------------------------------------------------
// Upsampling inp(R, H, W) -> out(R, OH, OW) (1-D: H = OH = 1), nearest or linear along each
// axis (upsample_i0 / upsample_lambda, pool_geometry.h; mode and scales as torch's); the
// backward sends each output's gradient back to the positions it read, with their weights.
template <typename T>
void upsample_forward(T* out, const T* inp, int R, int H, int W, int OH, int OW, int mode, T sh,
                      T sw);

template <typename T>
void upsample_backward(T* d_inp, const T* d_out, int R, int H, int W, int OH, int OW, int mode,
                       T sh, T sw);

// ---------------------------------------------------------------------------------------
// amax over each row of inp(R, L) (torch.amax, the reduced axes permuted last; amax_row in
// pool_geometry.h): out(R) the maximum; the backward shares a row's gradient as torch's.
template <typename T> void amax_forward(T* out, const T* inp, int R, int L);

template <typename T> void amax_backward(T* d_inp, const T* d_out, const T* inp, int R, int L);

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void maxpool1d_forward_pullback(T* out, const T* inp, int R, int L, int K, int S, int P, int ceil,
                                T* d_out, T* d_inp, int* d_R, int* d_L, int* d_K, int* d_S,
                                int* d_P, int* d_ceil) {
  ::rootclad::maxpool1d_backward(d_inp, d_out, out, inp, R, L, K, S, P, ceil);
}

template <typename T>
void avgpool1d_forward_pullback(T* out, const T* inp, int R, int L, int K, int S, int P, int cip,
                                int ceil, T* d_out, T* d_inp, int* d_R, int* d_L, int* d_K,
                                int* d_S, int* d_P, int* d_cip, int* d_ceil) {
  ::rootclad::avgpool1d_backward(d_inp, d_out, R, L, K, S, P, cip, ceil);
}

template <typename T>
void adaptive_avgpool_forward_pullback(T* out, const T* inp, int R, int H, int W, int OH, int OW,
                                       T* d_out, T* d_inp, int*, int*, int*, int*, int*) {
  ::rootclad::adaptive_avgpool_backward(d_inp, d_out, R, H, W, OH, OW);
}

template <typename T>
void adaptive_maxpool_forward_pullback(T* out, const T* inp, int R, int H, int W, int OH, int OW,
                                       T* d_out, T* d_inp, int*, int*, int*, int*, int*) {
  ::rootclad::adaptive_maxpool_backward(d_inp, d_out, inp, R, H, W, OH, OW);
}

template <typename T>
void amax_forward_pullback(T* out, const T* inp, int R, int L, T* d_out, T* d_inp, int*, int*) {
  ::rootclad::amax_backward(d_inp, d_out, inp, R, L);
}

template <typename T>
void upsample_forward_pullback(T* out, const T* inp, int R, int H, int W, int OH, int OW, int mode,
                               T sh, T sw, T* d_out, T* d_inp, int*, int*, int*, int*, int*, int*,
                               T*, T*) {
  ::rootclad::upsample_backward(d_inp, d_out, R, H, W, OH, OW, mode, sh, sw);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "pool_impl.h"
#endif

#endif // ROOTCLAD_OPS_POOL_H
