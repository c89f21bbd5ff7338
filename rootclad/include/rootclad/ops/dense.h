// rootclad/ops/dense.h — Linear, on the last axis; the batched product of two values; Embedding.
#ifndef ROOTCLAD_OPS_DENSE_H
#define ROOTCLAD_OPS_DENSE_H

#include "core.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Linear: out(R,OC) = inp(R,C) @ weight(OC,C)^T + bias(OC); R = product of leading dims.
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int R, int C, int OC);

// d_inp(R,C) += d_out(R,OC) @ weight(OC,C);  d_weight(OC,C) += d_out^T @ inp;
// d_bias(OC) += column sums of d_out. Null d_inp / d_bias are skipped.
template <typename T>
void linear_backward(T* d_inp, T* d_weight, T* d_bias, const T* d_out, const T* inp,
                     const T* weight, int R, int C, int OC);

// ---------------------------------------------------------------------------------------
// A product of two values (attention's Q K^T and A V): per sample s and group g < G,
// out[s, g](M, N) = a[s, g](M, K) @ b[s, g](K, N). A sample's a holds na values and group g
// starts at g * sa (sa = 0: one matrix shared by the G products); b likewise (nb, sb).
template <typename T>
void matmul_forward(T* out, const T* a, const T* b, int B, int G, int M, int K, int N, int na,
                    int sa, int nb, int sb);

// d_a[s, g] += d_out[s, g] @ b[s, g]^T;  d_b[s, g] += a[s, g]^T @ d_out[s, g] (null: skipped);
// a shared operand (stride 0) sums over its sample's groups.
template <typename T>
void matmul_backward(T* d_a, T* d_b, const T* d_out, const T* a, const T* b, int B, int G, int M,
                     int K, int N, int na, int sa, int nb, int sb);

// ---------------------------------------------------------------------------------------
// Embedding: out(n, D) = w[idx[i]] for n = B * (indices per sample) indices, held as values of
// type T (exact integers: the model's input converted). An index outside [0, V), or NaN,
// gives a row of NaN (the Python side refuses such inputs first, naming them; a C++ caller
// sees NaN, never a read outside the weight).
template <typename T>
void embedding_forward(T* out, const T* idx, const T* w, long n, int V, int D, int pad);

// d_w[idx[i]] += d_out[i] but for the padding_idx row (pad; -1: none), as torch; the indices
// get no gradient.
template <typename T>
void embedding_backward(T* d_w, const T* d_out, const T* idx, long n, int V, int D, int pad);

} // namespace rootclad

// Embedding's pullback stays when Clad differentiates the kernels themselves (as the losses'
// do): Clad's derivative of the loop would give the padding row a gradient.
namespace clad {
namespace custom_derivatives {
namespace rootclad {
template <typename T>
void embedding_forward_pullback(T* out, const T* idx, const T* w, long n, int V, int D, int pad,
                                T* d_out, T* d_idx, T* d_w, long*, int*, int*, int*) {
  ::rootclad::embedding_backward(d_w, d_out, idx, n, V, D, pad);
}
} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void matmul_forward_pullback(T* out, const T* a, const T* b, int B, int G, int M, int K, int N,
                             int na, int sa, int nb, int sb, T* d_out, T* d_a, T* d_b, int*, int*,
                             int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::matmul_backward(d_a, d_b, d_out, a, b, B, G, M, K, N, na, sa, nb, sb);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

// Linear's Clad pullback is in linear_update.h, beside the fused backward and update that
// train_step's sweep has it call at small batches.

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "dense_impl.h"
#endif

#endif // ROOTCLAD_OPS_DENSE_H
