// rootclad/linear_update.h — a Linear layer's backward pass fused with its optimizer update.
//
// At small batches a training step is bound by memory traffic, not arithmetic: for the MLP
// 2048-256-64-1 at batch 1, writing d_weight of Linear(2048, 256) (2 MB), zeroing it first and
// reading it back in the optimizer were about a third of the step's memory traffic (6 of
// ~21 MB, counted from the arrays each pass reads and writes). Here d_weight is formed one
// row at a time in a buffer that stays in L1 and is consumed by the update at once, so it
// never reaches memory. The generated train_step uses this in its reverse sweep for batches
// of at most FUSED_UPDATE_MAX_BATCH samples: the pullback engine calls it in place of the
// Linear pullback (codegen/cpu_ops.py), and in the clad engine the Linear pullback that Clad's
// sweep calls does, while a FusedUpdate lives (below; codegen/cpu_sweeps.py).
#ifndef ROOTCLAD_LINEAR_UPDATE_H
#define ROOTCLAD_LINEAR_UPDATE_H

#include "kernels.h"
#include "optim.h"

namespace rootclad {

// Measured on the MLP 2048-256-64-1 (docs/design.md): the fused pass wins up to about this
// batch; above it, the d_weight GEMM's blocking is worth its extra traffic.
constexpr int FUSED_UPDATE_MAX_BATCH = 8;

// The backward pass of linear_forward (kernels.h) for R rows, followed by one optimizer step
// on its weight and bias:
//   d_inp(R,C) += d_out(R,OC) @ weight(OC,C), with the weight before its update (null: skipped);
//   weight -= step(d_out^T @ inp), bias -= step(column sums of d_out).
// w_m/w_v and b_m/b_v are the weight's and bias's slices of the optimizer state (optim.h);
// d_bias (OC values of the gradient block) is overwritten with the bias's gradient.
template <typename T>
void linear_backward_update(T* d_inp, const T* d_out, const T* inp, T* weight, T* bias, int R,
                            int C, int OC, T* w_m, T* w_v, T* d_bias, T* b_m, T* b_v,
                            const double* cfg_raw, long step);

// train_step at small batches in the clad engine: while one lives (on this thread), the Linear
// pullback of a layer whose weight starts at one of `fused` (offsets into params) updates its
// weight and bias with the optimizer instead of storing their gradient.
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

} // namespace rootclad

// Linear's Clad-convention pullback (ops/core.h says how they are written)
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void linear_forward_pullback(T* out, const T* inp, const T* weight, const T* bias, int R, int C,
                             int OC, T* d_out, T* d_inp, T* d_weight, T* d_bias, int* d_R, int* d_C,
                             int* d_OC) {
  if (const auto* fu = ::rootclad::FusedUpdate<T>::active; fu && fu->fuses(weight)) {
    const long w = weight - fu->params, b = bias ? bias - fu->params : 0, n = fu->n_params;
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

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "linear_update_impl.h"
#endif

#endif // ROOTCLAD_LINEAR_UPDATE_H
