// rootclad/blas.h — row-major GEMM, C(M,N) = alpha * op(A) @ op(B) + beta * C.
//
// By default this calls a maintained BLAS (OpenBLAS's CBLAS from the scipy-openblas32
// wheel when ROOTCLAD_CBLAS_SCIPY is defined, any CBLAS otherwise). When Clad has to
// differentiate the kernels itself (ROOTCLAD_NO_PULLBACKS), it cannot see inside a
// BLAS call, so the same product is written as plain loops it can differentiate.
#pragma once

#ifndef ROOTCLAD_NO_PULLBACKS
#include <cblas.h>

#include "rootclad/parallel.h"
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
inline void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                      const float* B, int ldb, float beta, float* C, int ldc) {
  ROOTCLAD_SGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                 N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void blas_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
                      const double* B, int ldb, double beta, double* C, int ldc) {
  ROOTCLAD_DGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                 N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// A product outside any parallel section (a batch run in one chunk, e.g. an MLP at batch
// 64) is shared by rootclad's threads, each taking a block of rows or columns of C; OpenBLAS
// itself stays single-threaded (parallel.h). Below GEMM_SPLIT_MIN multiply-adds, waking a
// thread costs more than it saves.
constexpr double GEMM_SPLIT_MIN = 1 << 20;
template <typename T> struct GemmJob {
  bool ta, tb, by_rows;
  int M, N, K;
  T alpha;
  const T* A;
  int lda;
  const T* B;
  int ldb;
  T beta;
  T* C;
  int ldc;
};
template <typename T> void gemm_part(void* ctx, int t, int n) {
  const GemmJob<T>& j = *static_cast<const GemmJob<T>*>(ctx);
  int b0, b1;
  chunk_range(j.by_rows ? j.M : j.N, n, t, b0, b1);
  if (b0 >= b1)
    return;
  if (j.by_rows) // rows b0..b1 of C and of op(A)
    blas_gemm(j.ta, j.tb, b1 - b0, j.N, j.K, j.alpha, j.A + (j.ta ? b0 : (long)b0 * j.lda), j.lda,
              j.B, j.ldb, j.beta, j.C + (long)b0 * j.ldc, j.ldc);
  else // columns b0..b1 of C and of op(B)
    blas_gemm(j.ta, j.tb, j.M, b1 - b0, j.K, j.alpha, j.A, j.lda,
              j.B + (j.tb ? (long)b0 * j.ldb : b0), j.ldb, j.beta, j.C + b0, j.ldc);
}
template <typename T>
void gemm(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
          T beta, T* C, int ldc) {
  ThreadPool* pool = nullptr;
  if (!in_pool_task() && (double)M * N * K >= GEMM_SPLIT_MIN && (M > 1 || N > 1))
    pool = &ThreadPool::instance();
  if (!pool || pool->size() < 2)
    return blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  GemmJob<T> job{ta, tb, M >= N, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
  pool->run(gemm_part<T>, &job, pool->size());
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
