// rootclad/blas.h — row-major GEMM, C(M,N) = alpha * op(A) @ op(B) + beta * C.
//
// By default this calls a maintained BLAS (OpenBLAS's CBLAS from the scipy-openblas32
// wheel when ROOTCLAD_CBLAS_SCIPY is defined, any CBLAS otherwise). When Clad has to
// differentiate the kernels itself (ROOTCLAD_NO_PULLBACKS), it cannot see inside a
// BLAS call, so the same product is written as plain loops it can differentiate.
#pragma once

#ifndef ROOTCLAD_NO_PULLBACKS
#include <cblas.h>
#if defined(ROOTCLAD_CBLAS_SCIPY)
#define ROOTCLAD_SGEMM scipy_cblas_sgemm
#define ROOTCLAD_DGEMM scipy_cblas_dgemm
#else
#define ROOTCLAD_SGEMM cblas_sgemm
#define ROOTCLAD_DGEMM cblas_dgemm
#endif
#endif

namespace rootclad {

#ifndef ROOTCLAD_NO_PULLBACKS
inline void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  ROOTCLAD_SGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                 N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* C, int ldc) {
  ROOTCLAD_DGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                 N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#else
// Loops Clad can differentiate. Only the (no-trans, trans) and (no-trans, no-trans) forms
// occur in forward passes, which is all Clad differentiates in this mode.
template <typename T>
void gemm(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
          T beta, T* C, int ldc) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      T acc = 0;
      for (int k = 0; k < K; ++k) {
        T a = ta ? A[k * lda + i] : A[i * lda + k];
        T b = tb ? B[j * ldb + k] : B[k * ldb + j];
        acc += a * b;
      }
      C[i * ldc + j] = beta == 0 ? alpha * acc : alpha * acc + beta * C[i * ldc + j];
    }
}
#endif

} // namespace rootclad
