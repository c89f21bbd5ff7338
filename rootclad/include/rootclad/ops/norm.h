// rootclad/ops/norm.h — Softmax, LogSoftmax, LayerNorm and BatchNorm.
#ifndef ROOTCLAD_OPS_NORM_H
#define ROOTCLAD_OPS_NORM_H

#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Softmax and LogSoftmax along an axis of length N: inp viewed as (R, N, S), the axis in the
// middle (S = the product of the axes after it). Max-subtracted, as torch's.
template <typename T> void softmax_forward(T* out, const T* inp, int R, int N, int S);

// torch's safe softmax (scaled_dot_product_attention's, from torch 2.5): a line of all -inf
// (every key masked) gives 0s where softmax gives 0/0; its backward is softmax's (y = 0 there)
template <typename T> void safe_softmax_forward(T* out, const T* inp, int R, int N, int S);

// y = softmax(x)  =>  d_x += y * (d_y - sum_n d_y * y)
template <typename T>
void softmax_backward(T* d_inp, const T* d_out, const T* out, int R, int N, int S);

template <typename T> void log_softmax_forward(T* out, const T* inp, int R, int N, int S);

// y = log_softmax(x)  =>  d_x += d_y - exp(y) * sum_n d_y
template <typename T>
void log_softmax_backward(T* d_inp, const T* d_out, const T* out, int R, int N, int S);

// ---------------------------------------------------------------------------------------
// LayerNorm over rows of M values (the trailing normalized_shape): with the row's mean and
// biased variance, out = (x - mean) / sqrt(var + eps) * weight + bias (weight, bias: M values,
// or null). stats keeps (mean, 1/sqrt(var + eps)) of each row for the backward.
template <typename T>
void layer_norm_forward(T* out, T* stats, const T* inp, const T* weight, const T* bias, int R,
                        int M, T eps);

// With xhat = (x - mean) * rstd and g = d_out * weight:
//   d_bias += d_out;  d_weight += d_out * xhat;
//   d_x += rstd * (g - mean(g) - xhat * mean(g * xhat))
template <typename T>
void layer_norm_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                         const T* stats, const T* weight, int R, int M);

// ---------------------------------------------------------------------------------------
// BatchNorm over inp(B, C, S) (S = the positions per channel: 1 for BatchNorm1d on (B, C),
// L for (B, C, L), H*W for BatchNorm2d), per channel c:
//   training: the batch's mean and biased variance over its B*S values; the running
//     statistics are updated as torch's (running = (1 - momentum) * running + momentum *
//     batch, the variance unbiased) and the batch counted in *tracked (both may be null:
//     track_running_stats=False). The clad engine's replay returns before all of this.
//   training == 0: the running statistics.
// out = (x - mean) / sqrt(var + eps) * weight + bias (weight, bias: C values, or null);
// stats keeps (mean, 1/sqrt(var + eps)) of each channel for the backward (2C + 1 values per
// sample of room: one more serves the batch's count when the batch is split into chunks).
template <typename T>
void batch_norm_forward(T* out, T* stats, const T* inp, const T* weight, const T* bias,
                        T* running_mean, T* running_var, T* tracked, int B, int C, int S, T eps,
                        T momentum, int training);

// With xhat = (x - mean) * rstd and g = d_out * weight, per channel over its n = B*S values:
//   d_bias += sum d_out;  d_weight += sum d_out * xhat;
//   batch statistics: d_x += rstd * (g - mean(g) - xhat * mean(g * xhat));
//   running statistics (constants): d_x += rstd * g.
template <typename T>
void batch_norm_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                         const T* stats, const T* weight, const T* running_mean, int B, int C,
                         int S, int training, T* sums);

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void softmax_forward_pullback(T* out, const T* inp, int R, int N, int S, T* d_out, T* d_inp,
                              int* d_R, int* d_N, int* d_S) {
  ::rootclad::softmax_backward(d_inp, d_out, out, R, N, S);
}

template <typename T>
void safe_softmax_forward_pullback(T* out, const T* inp, int R, int N, int S, T* d_out, T* d_inp,
                                   int* d_R, int* d_N, int* d_S) {
  ::rootclad::softmax_backward(d_inp, d_out, out, R, N, S);
}

template <typename T>
void log_softmax_forward_pullback(T* out, const T* inp, int R, int N, int S, T* d_out, T* d_inp,
                                  int* d_R, int* d_N, int* d_S) {
  ::rootclad::log_softmax_backward(d_inp, d_out, out, R, N, S);
}

template <typename T>
void layer_norm_forward_pullback(T* out, T* stats, const T* inp, const T* weight, const T* bias,
                                 int R, int M, T eps, T* d_out, T* d_stats, T* d_inp, T* d_weight,
                                 T* d_bias, int* d_R, int* d_M, T* d_eps) {
  ::rootclad::layer_norm_backward(d_inp, weight ? d_weight : (T*)nullptr,
                                  bias ? d_bias : (T*)nullptr, d_out, inp, stats, weight, R, M);
}

template <typename T>
void batch_norm_forward_pullback(T* out, T* stats, const T* inp, const T* weight, const T* bias,
                                 T* running_mean, T* running_var, T* tracked, int B, int C, int S,
                                 T eps, T momentum, int training, T* d_out, T* d_stats, T* d_inp,
                                 T* d_weight, T* d_bias, T* d_running_mean, T* d_running_var,
                                 T* d_tracked, int* d_B, int* d_C, int* d_S, T* d_eps,
                                 T* d_momentum, int* d_training) {
  // d_stats, the scratch's adjoint, is the backward's room for its sums
  ::rootclad::batch_norm_backward(d_inp, weight ? d_weight : (T*)nullptr,
                                  bias ? d_bias : (T*)nullptr, d_out, inp, stats, weight,
                                  running_mean, B, C, S, training, d_stats);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "norm_impl.h"
#endif

#endif // ROOTCLAD_OPS_NORM_H
