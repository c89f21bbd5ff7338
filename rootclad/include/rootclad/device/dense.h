// rootclad/device/dense.h — Linear, the product of two values and Embedding as device kernels
// (device_kernels.h says how they are written).
#ifndef ROOTCLAD_DEVICE_DENSE_H
#define ROOTCLAD_DEVICE_DENSE_H

#include "core.h"

namespace rootclad {
namespace dev {

// -- Linear: out(R, OC) = act(inp(R, C) @ weight(OC, C)^T + bias) (bias: null for none); from
// GEMM_MIN_ROWS rows on, the products go to gemm (cuBLAS on the GPU, device_gemm.h) ----------
template <class On, class T, class Act = NoAct>
void linear_forward(On on, T* out, const T* inp, const T* weight, const T* bias, int R, int C,
                    int OC, Act act = {});

// The whole pullback: d_inp (null: not wanted), d_weight and d_bias (null: skipped); from
// GEMM_MIN_ROWS rows on through gemm, which reads the adjoint as a matrix (as_matrix)
template <class On, class T, class DY>
void linear_backward(On on, T* d_inp, T* d_weight, T* d_bias, DY d_out, const T* inp,
                     const T* weight, int R, int C, int OC);

// -- a product of two values: per sample s and group g < G, out[s, g](M, N) =
// a[s, g](M, K) @ b[s, g](K, N); a sample's a holds na values and group g starts at g * sa
// (sa = 0: one matrix shared by the G products); b likewise (ops/dense.h). Where neither
// operand is shared by several products, the B G products are one strided batched gemm
// (cuBLAS's gemmStridedBatched on the GPU); otherwise loops, one output value each.
struct Matmul {
  int G, M, K, N;
  long na, sa, nb, sb;
};

template <class On, class T>
void matmul_forward(On on, T* out, const T* a, const T* b, long B, Matmul g);

// d_a += d_out @ b^T, per value of a (a shared a sums over its sample's groups)
template <class On, class T>
void matmul_backward_a(On on, T* d_a, const T* d_out, const T* b, long B, Matmul g);

// d_b += a^T @ d_out, per value of b
template <class On, class T>
void matmul_backward_b(On on, T* d_b, const T* d_out, const T* a, long B, Matmul g);

// -- Embedding: out(n, D) = w[idx[i]]; an index outside [0, V) or NaN gives a row of NaN ------
template <class On, class T>
void embedding_forward(On on, T* out, const T* idx, const T* w, long n, int V, int D);

// d_w[idx[i]] += d_out[i] but for the padding_idx row (pad; -1: none); rows that several
// indices share meet through add_to
template <class On, class T>
void embedding_backward(On on, T* d_w, const T* d_out, const T* idx, long n, int V, int D, int pad);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "dense_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_DENSE_H
