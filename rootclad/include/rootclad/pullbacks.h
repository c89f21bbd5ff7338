// rootclad/pullbacks.h — Clad custom derivatives for every kernel in rootclad/kernels.h.
//
// Clad's convention for a pullback: the primal arguments, then (for a function that returns
// a value) the adjoint of that value, then one adjoint pointer per argument. Each adapter only
// calls the readable <op>_backward. Clad's generated reverse pass calls these when it
// differentiates a model's loss; rootclad's own reverse sweep (the `pullback` engine) calls the
// very same functions, so both engines share one hand-written derivative per op.
// The losses' pullbacks are in rootclad/loss_pullbacks.h.
#pragma once

#include <cstdint>

#include "kernels.h"
#include "linear_update.h"
#include "loss_pullbacks.h"

namespace rootclad {
// Adjoints in [no_grad_lo, no_grad_hi) are not wanted: the model inputs' when no input
// gradient is asked for. The clad engine's sweep passes Clad's own adjoint pointers, so
// Linear and Conv skip their d_input half by this range (the pullback engine passes null).
inline thread_local const void* no_grad_lo = nullptr;
inline thread_local const void* no_grad_hi = nullptr;
template <typename T> inline T* wanted(T* d) {
  const auto p = reinterpret_cast<std::uintptr_t>(d); // unrelated pointers: compare addresses
  const auto lo = reinterpret_cast<std::uintptr_t>(no_grad_lo);
  const auto hi = reinterpret_cast<std::uintptr_t>(no_grad_hi);
  return p >= lo && p < hi ? (T*)nullptr : d;
}

// train_step at small batches (linear_update.h) in the clad engine: while one lives, the
// Linear pullback of a layer whose weight starts at one of `fused` (offsets into params)
// updates the layer's weight and bias with the optimizer instead of storing their gradient.
template <typename T> struct FusedUpdate {
  T* params;
  T* d_params;
  T* state; // the optimizer's m (n_params values), then v
  long n_params;
  const double* cfg;
  long step;
  const long* fused;
  int n_fused;
  FusedUpdate(T* p, T* dp, T* st, long n, const double* c, long s, const long* f, int nf)
      : params(p), d_params(dp), state(st), n_params(n), cfg(c), step(s), fused(f), n_fused(nf) {
    active = this;
  }
  ~FusedUpdate() { active = nullptr; }
  FusedUpdate(const FusedUpdate&) = delete;
  FusedUpdate& operator=(const FusedUpdate&) = delete;
  bool fuses(const T* weight) const {
    for (int i = 0; i < n_fused; ++i)
      if (weight == params + fused[i])
        return true;
    return false;
  }
  static inline thread_local FusedUpdate* active = nullptr;
};

// While one lives, the forward kernels replay (kernels.h) and adjoints in [lo, hi) are not
// wanted: the clad engine's reverse sweeps run inside one.
struct Replay {
  Replay(const void* lo, const void* hi) {
    replaying = true;
    no_grad_lo = lo;
    no_grad_hi = hi;
  }
  ~Replay() {
    replaying = false;
    no_grad_lo = no_grad_hi = nullptr;
  }
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;
};
} // namespace rootclad

namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void linear_forward_pullback(T* out, const T* inp, const T* weight, const T* bias, int R, int C,
                             int OC, T* d_out, T* d_inp, T* d_weight, T* d_bias, int* d_R, int* d_C,
                             int* d_OC) {
  if (const auto* fu = ::rootclad::FusedUpdate<T>::active; fu && fu->fuses(weight)) {
    const long w = weight - fu->params, b = bias ? bias - fu->params : 0;
    const long n = fu->n_params;
    ::rootclad::linear_backward_update(
        ::rootclad::wanted(d_inp), d_out, inp, const_cast<T*>(weight), const_cast<T*>(bias), R, C,
        OC, fu->state + w, fu->state + n + w, bias ? fu->d_params + b : (T*)nullptr,
        bias ? fu->state + b : (T*)nullptr, bias ? fu->state + n + b : (T*)nullptr, fu->cfg,
        fu->step);
    return;
  }
  ::rootclad::linear_backward(::rootclad::wanted(d_inp), d_weight, bias ? d_bias : (T*)nullptr,
                              d_out, inp, weight, R, C, OC);
}

template <typename T>
void conv1d_forward_pullback(T* out, T* tmp, T* cols, const T* inp, const T* weight, const T* bias,
                             int B, int C, int L, int OC, int K, int S, int P, int D, T* d_out,
                             T* d_tmp, T* d_cols, T* d_inp, T* d_weight, T* d_bias, int* d_B,
                             int* d_C, int* d_L, int* d_OC, int* d_K, int* d_S, int* d_P,
                             int* d_D) {
  ::rootclad::conv1d_backward(::rootclad::wanted(d_inp), d_weight, bias ? d_bias : (T*)nullptr,
                              d_tmp, d_cols, d_out, cols, inp, weight, B, C, L, OC, K, S, P, D);
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

// Every elementwise op (ops/activations.h): the functor's own grad. DF is whatever Clad passes
// for the functor's adjoint (the functor holds constants: nothing flows into it).
template <typename T, class F, class DF>
void unary_forward_pullback(T* out, const T* inp, int N, F f, T* d_out, T* d_inp, int* d_N, DF) {
  ::rootclad::unary_backward(d_inp, d_out, inp, out, N, f);
}

template <typename T>
void dropout_forward_pullback(T* out, const T* inp, int N, T p, ::std::uint64_t seed, long i0,
                              T* d_out, T* d_inp, int* d_N, T* d_p, ::std::uint64_t* d_seed,
                              long* d_i0) {
  ::rootclad::dropout_backward(d_inp, d_out, N, p, seed, i0);
}

// -- rootclad/conv2d.h ----------------------------------------------------------------------
template <typename T>
void conv2d_forward_pullback(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B,
                             int C, int H, int W, int OC, int KH, int KW, int SH, int SW, int PH,
                             int PW, int DH, int DW, int G, T* d_out, T* d_cols, T* d_inp,
                             T* d_weight, T* d_bias, int*, int*, int*, int*, int*, int*, int*, int*,
                             int*, int*, int*, int*, int*, int*) {
  ::rootclad::conv2d_backward(::rootclad::wanted(d_inp), d_weight, bias ? d_bias : (T*)nullptr,
                              d_cols, d_out, cols, inp, weight, B, C, H, W, OC, KH, KW, SH, SW, PH,
                              PW, DH, DW, G);
}

template <typename T>
void maxpool2d_forward_pullback(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH,
                                int SW, int PH, int PW, T* d_out, T* d_inp, int*, int*, int*, int*,
                                int*, int*, int*, int*, int*) {
  ::rootclad::maxpool2d_backward(d_inp, d_out, out, inp, R, H, W, KH, KW, SH, SW, PH, PW);
}

template <typename T>
void avgpool2d_forward_pullback(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH,
                                int SW, int PH, int PW, int cip, T* d_out, T* d_inp, int*, int*,
                                int*, int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::avgpool2d_backward(d_inp, d_out, R, H, W, KH, KW, SH, SW, PH, PW, cip);
}

// -- rootclad/graph_ops.h -------------------------------------------------------------------
// The arena planner's marker (codegen/cpu.py): the forward does nothing; in the reverse sweep it
// zeroes a value's adjoint just before the last of its readers' pullbacks adds into it, so that
// values whose adjoints live at different times can share memory.
template <typename T> void adjoint_start_forward_pullback(T* x, long n, T* d_x, long* d_n) {
  ::rootclad::zero(d_x, n);
}

template <typename T>
void binary_forward_pullback(T* out, const T* a, const T* b, int kind, int B, int n0, int n1,
                             int n2, int sa0, int sa1, int sa2, int na, int sb0, int sb1, int sb2,
                             int nb, T* d_out, T* d_a, T* d_b, int*, int*, int*, int*, int*, int*,
                             int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::binary_backward(d_a, d_b, d_out, a, b, kind, B, n0, n1, n2, sa0, sa1, sa2, na, sb0,
                              sb1, sb2, nb);
}

template <typename T>
void permute_forward_pullback(T* out, const T* inp, int B, int N, int n0, int n1, int n2, int n3,
                              int s0, int s1, int s2, int s3, T* d_out, T* d_inp, int*, int*, int*,
                              int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::permute_backward(d_inp, d_out, B, N, n0, n1, n2, n3, s0, s1, s2, s3);
}

template <typename T>
void cat_part_forward_pullback(T* out, const T* inp, int R, int n_in, int n_out, int off, T* d_out,
                               T* d_inp, int* d_R, int* d_n_in, int* d_n_out, int* d_off) {
  ::rootclad::cat_part_backward(d_inp, d_out, R, n_in, n_out, off);
}

template <typename T>
void softmax_forward_pullback(T* out, const T* inp, int R, int N, int S, T* d_out, T* d_inp,
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
