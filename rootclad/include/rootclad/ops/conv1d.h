// rootclad/ops/conv1d.h — Conv1d: im2col and one GEMM, or direct (conv1d_s1.h, conv1d_sparse.h).
#ifndef ROOTCLAD_OPS_CONV1D_H
#define ROOTCLAD_OPS_CONV1D_H

#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Conv1d (groups=1) over inp(B, C, L) -> out(B, OC, LO) with weight(OC, C, K): as one GEMM over
// the whole batch (im2col):
//   cols(C*K, B*LO)[c*K+k, b*LO+l] = inp[b, c, l*S - P + k*D]   (0 outside the input)
//   tmp(OC, B*LO) = weight(OC, C*K) @ cols
//   out[b, o, l] = tmp[o, b*LO + l] + bias[o]
// or directly, for stride 1 (the register-blocked kernels of conv1d_s1.h) and for layers with
// few input taps. One large product lets BLAS use all cores even for small layers; cols and
// tmp are kept in the activation arena (tmp's adjoint region is the backward pass's scratch).
// For B == 1 the two layouts coincide and tmp is not used. With ROOTCLAD_NO_PULLBACKS (Clad
// writes the whole backward) the forward is the convolution's definition as plain loops.
template <typename T>
void conv1d_forward(T* out, T* tmp, T* cols, const T* inp, const T* weight, const T* bias, int B,
                    int C, int L, int OC, int K, int S, int P, int D);

// With g(OC, B*LO) = d_out laid out like tmp (d_tmp is its scratch):
//   d_weight(OC, C*K) += g @ cols^T;   d_bias(OC) += row sums of g;
//   d_cols(C*K, B*LO) = weight^T @ g, scattered back into d_inp by the inverse of im2col.
// A null d_inp skips that half (the network input, when no input gradient is wanted).
template <typename T>
void conv1d_backward(T* d_inp, T* d_weight, T* d_bias, T* d_tmp, T* d_cols, const T* d_out,
                     const T* cols, const T* inp, const T* weight, int B, int C, int L, int OC,
                     int K, int S, int P, int D);

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void conv1d_forward_pullback(T* out, T* tmp, T* cols, const T* inp, const T* weight, const T* bias,
                             int B, int C, int L, int OC, int K, int S, int P, int D, T* d_out,
                             T* d_tmp, T* d_cols, T* d_inp, T* d_weight, T* d_bias, int* d_B,
                             int* d_C, int* d_L, int* d_OC, int* d_K, int* d_S, int* d_P,
                             int* d_D) {
  ::rootclad::conv1d_backward(::rootclad::wanted(d_inp), d_weight, bias ? d_bias : (T*)nullptr,
                              d_tmp, d_cols, d_out, cols, inp, weight, B, C, L, OC, K, S, P, D);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "conv1d_impl.h"
#endif

#endif // ROOTCLAD_OPS_CONV1D_H
