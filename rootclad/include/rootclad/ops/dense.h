// rootclad/ops/dense.h — Linear, on the last axis.
#pragma once

#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Linear: out(R,OC) = inp(R,C) @ weight(OC,C)^T + bias(OC); R = product of leading dims.
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int R, int C, int OC) {
  ROOTCLAD_REPLAY_SKIP;
  if (bias) {
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < OC; ++o)
        out[r * OC + o] = bias[o];
  }
  gemm(false, true, R, OC, C, T(1), inp, C, weight, C, bias ? T(1) : T(0), out, OC);
}

// d_inp(R,C) += d_out(R,OC) @ weight(OC,C);  d_weight(OC,C) += d_out^T @ inp;
// d_bias(OC) += column sums of d_out. Null d_inp / d_bias are skipped.
template <typename T>
void linear_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                     const T* weight, int R, int C, int OC) {
  if (d_inp)
    gemm(false, false, R, C, OC, T(1), d_out, OC, weight, C, T(1), d_inp, C);
  if (d_weight) // null: an input gradient alone was asked for
    gemm(true, false, OC, C, R, T(1), d_out, OC, inp, C, T(1), d_weight, C);
  if (d_bias)
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < OC; ++o)
        d_bias[o] += d_out[r * OC + o];
}

} // namespace rootclad

// Linear's Clad pullback is in linear_update.h, beside the fused backward and update that
// train_step's sweep has it call at small batches.
