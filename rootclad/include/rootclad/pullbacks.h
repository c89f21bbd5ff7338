// rootclad/pullbacks.h — Clad custom derivatives for every kernel in rootclad/kernels.h.
//
// Clad's convention for a pullback: the primal arguments, then (for a function that returns
// a value) the adjoint of that value, then one adjoint pointer per argument. Each adapter only
// calls the readable <op>_backward. Clad's generated reverse pass calls these when it
// differentiates a model's loss; rootclad's own reverse sweep (the `pullback` engine) calls the
// very same functions, so both engines share one hand-written derivative per op.
// The losses' pullbacks are in rootclad/loss_pullbacks.h.
#pragma once

#include "rootclad/kernels.h"
#include "rootclad/loss_pullbacks.h"

namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void linear_forward_pullback(T* out, const T* inp, const T* weight, const T* bias, int R, int C,
                             int OC, T* d_out, T* d_inp, T* d_weight, T* d_bias, int* d_R, int* d_C,
                             int* d_OC) {
  ::rootclad::linear_backward(d_inp, d_weight, bias ? d_bias : (T*)nullptr, d_out, inp, weight, R,
                              C, OC);
}

template <typename T>
void conv1d_forward_pullback(T* out, T* tmp, T* cols, const T* inp, const T* weight, const T* bias,
                             int B, int C, int L, int OC, int K, int S, int P, int D, T* d_out,
                             T* d_tmp, T* d_cols, T* d_inp, T* d_weight, T* d_bias, int* d_B,
                             int* d_C, int* d_L, int* d_OC, int* d_K, int* d_S, int* d_P,
                             int* d_D) {
  ::rootclad::conv1d_backward(d_inp, d_weight, bias ? d_bias : (T*)nullptr, d_tmp, d_cols, d_out,
                              cols, inp, weight, B, C, L, OC, K, S, P, D);
}

template <typename T>
void maxpool1d_forward_pullback(T* out, const T* inp, int R, int L, int K, int S, int P, T* d_out,
                                T* d_inp, int* d_R, int* d_L, int* d_K, int* d_S, int* d_P) {
  ::rootclad::maxpool1d_backward(d_inp, d_out, out, inp, R, L, K, S, P);
}

template <typename T>
void avgpool1d_forward_pullback(T* out, const T* inp, int R, int L, int K, int S, int P, int cip,
                                T* d_out, T* d_inp, int* d_R, int* d_L, int* d_K, int* d_S,
                                int* d_P, int* d_cip) {
  ::rootclad::avgpool1d_backward(d_inp, d_out, R, L, K, S, P, cip);
}

template <typename T>
void relu_forward_pullback(T* out, const T* inp, int N, T* d_out, T* d_inp, int* d_N) {
  ::rootclad::relu_backward(d_inp, d_out, inp, N);
}

template <typename T>
void leaky_relu_forward_pullback(T* out, const T* inp, int N, T slope, T* d_out, T* d_inp, int* d_N,
                                 T* d_slope) {
  ::rootclad::leaky_relu_backward(d_inp, d_out, inp, N, slope);
}

template <typename T>
void tanh_forward_pullback(T* out, const T* inp, int N, T* d_out, T* d_inp, int* d_N) {
  ::rootclad::tanh_backward(d_inp, d_out, out, N);
}

template <typename T>
void sigmoid_forward_pullback(T* out, const T* inp, int N, T* d_out, T* d_inp, int* d_N) {
  ::rootclad::sigmoid_backward(d_inp, d_out, out, N);
}

template <typename T>
void gelu_forward_pullback(T* out, const T* inp, int N, int tanh_approx, T* d_out, T* d_inp,
                           int* d_N, int* d_tanh_approx) {
  ::rootclad::gelu_backward(d_inp, d_out, inp, N, tanh_approx);
}

template <typename T>
void dropout_forward_pullback(T* out, const T* inp, int N, T p, ::std::uint64_t seed, long i0,
                              T* d_out, T* d_inp, int* d_N, T* d_p, ::std::uint64_t* d_seed,
                              long* d_i0) {
  ::rootclad::dropout_backward(d_inp, d_out, N, p, seed, i0);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
