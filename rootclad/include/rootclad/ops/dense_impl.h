// rootclad/ops/dense_impl.h — the definitions of the kernels dense.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_DENSE_IMPL_H
#define ROOTCLAD_OPS_DENSE_IMPL_H

#include "core.h"
#include "dense.h"

namespace rootclad {

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

inline long matmul_at(int s, int g, long n, long st) {
  return (long)s * n + (long)g * st;
}

template <typename T>
void matmul_forward(T* out, const T* a, const T* b, int B, int G, int M, int K, int N, int na,
                    int sa, int nb, int sb) {
  ROOTCLAD_REPLAY_SKIP;
  for (int s = 0; s < B; ++s)
    for (int g = 0; g < G; ++g) {
#ifdef ROOTCLAD_NO_PULLBACKS // loops Clad differentiates itself (no pointer arithmetic)
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          T acc = 0;
          for (int k = 0; k < K; ++k)
            acc += a[matmul_at(s, g, na, sa) + i * K + k] * b[matmul_at(s, g, nb, sb) + k * N + j];
          out[((long)s * G + g) * M * N + i * N + j] = acc;
        }
#else
      gemm(false, false, M, N, K, T(1), a + matmul_at(s, g, na, sa), K, b + matmul_at(s, g, nb, sb),
           N, T(0), out + ((long)s * G + g) * M * N, N);
#endif
    }
}

template <typename T>
void matmul_backward(T* d_a, T* d_b, const T* d_out, const T* a, const T* b, int B, int G, int M,
                     int K, int N, int na, int sa, int nb, int sb) {
  for (int s = 0; s < B; ++s)
    for (int g = 0; g < G; ++g) {
      const T* dy = d_out + ((long)s * G + g) * M * N;
      if (d_a)
        gemm(false, true, M, K, N, T(1), dy, N, b + matmul_at(s, g, nb, sb), N, T(1),
             d_a + matmul_at(s, g, na, sa), K);
      if (d_b)
        gemm(true, false, K, N, M, T(1), a + matmul_at(s, g, na, sa), K, dy, N, T(1),
             d_b + matmul_at(s, g, nb, sb), N);
    }
}

template <typename T> inline bool embedding_ok(T v, int V) {
  return v >= T(0) && v < T(V);
}

template <typename T>
void embedding_forward(T* out, const T* idx, const T* w, long n, int V, int D, int pad) {
  ROOTCLAD_REPLAY_SKIP;
  for (long i = 0; i < n; ++i) {
    const bool ok = embedding_ok(idx[i], V);
    const long row = ok ? (long)idx[i] : 0;
    for (int j = 0; j < D; ++j)
      out[i * D + j] = ok ? w[row * D + j] : T(NAN);
  }
}

template <typename T>
void embedding_backward(T* d_w, const T* d_out, const T* idx, long n, int V, int D, int pad) {
  if (!d_w) // frozen
    return;
  for (long i = 0; i < n; ++i) {
    if (!embedding_ok(idx[i], V) || (long)idx[i] == pad)
      continue;
    const long row = (long)idx[i];
    for (int j = 0; j < D; ++j)
      d_w[row * D + j] += d_out[i * D + j];
  }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_DENSE_IMPL_H
