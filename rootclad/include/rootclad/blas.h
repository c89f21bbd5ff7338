// rootclad/blas.h — row-major GEMM, C(M,N) = alpha * op(A) @ op(B) + beta * C.
//
// By default this calls a maintained BLAS (OpenBLAS's CBLAS from the scipy-openblas32
// wheel when ROOTCLAD_CBLAS_SCIPY is defined, any CBLAS otherwise; ROOTCLAD_NO_BLAS: plain
// loops, for the standalone headers `rootclad emit` writes). When Clad has to
// differentiate the kernels itself (ROOTCLAD_NO_PULLBACKS), it cannot see inside a
// BLAS call, so the same product is written as plain loops it can differentiate.
#ifndef ROOTCLAD_BLAS_H
#define ROOTCLAD_BLAS_H

#ifndef ROOTCLAD_NO_PULLBACKS
#ifndef ROOTCLAD_NO_BLAS
#include <cblas.h>
#endif

#include "parallel.h"
#if defined(ROOTCLAD_CBLAS_SCIPY)
#define ROOTCLAD_CBLAS(name) scipy_cblas_##name
#else
#define ROOTCLAD_CBLAS(name) cblas_##name
#endif
#endif

namespace rootclad {

#if !defined(ROOTCLAD_NO_PULLBACKS) && defined(ROOTCLAD_NO_BLAS)
// No BLAS at hand (a standalone header from `rootclad emit` compiled with the compiler alone):
// the three routines as plain loops, in an order that streams rows of B and C.
template <typename T>
void blas_gemm_only(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
                    int ldb, T beta, T* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    T* c = C + (long)i * ldc;
    for (int j = 0; j < N; ++j)
      c[j] = beta == T(0) ? T(0) : beta * c[j];
    for (int k = 0; k < K; ++k) {
      const T a = alpha * (ta ? A[(long)k * lda + i] : A[(long)i * lda + k]);
      if (tb)
        for (int j = 0; j < N; ++j)
          c[j] += a * B[(long)j * ldb + k];
      else
        for (int j = 0; j < N; ++j)
          c[j] += a * B[(long)k * ldb + j];
    }
  }
}
template <typename T>
void blas_gemv(bool trans, int M, int N, T alpha, const T* A, int lda, const T* x, int incx, T beta,
               T* y, int incy) {
  const int rows = trans ? N : M, cols = trans ? M : N;
  for (int i = 0; i < rows; ++i) {
    T acc = 0;
    for (int j = 0; j < cols; ++j)
      acc += (trans ? A[(long)j * lda + i] : A[(long)i * lda + j]) * x[(long)j * incx];
    y[(long)i * incy] = beta == T(0) ? alpha * acc : alpha * acc + beta * y[(long)i * incy];
  }
}
template <typename T>
void blas_ger(int M, int N, T alpha, const T* x, int incx, const T* y, int incy, T* A, int lda) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      A[(long)i * lda + j] += alpha * x[(long)i * incx] * y[(long)j * incy];
}
#elif !defined(ROOTCLAD_NO_PULLBACKS)
inline void blas_gemm_only(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                           int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  ROOTCLAD_CBLAS(sgemm)(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                        ldc);
}
inline void blas_gemm_only(bool ta, bool tb, int M, int N, int K, double alpha, const double* A,
                           int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  ROOTCLAD_CBLAS(dgemm)(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                        ldc);
}
inline void blas_gemv(bool trans, int M, int N, float alpha, const float* A, int lda,
                      const float* x, int incx, float beta, float* y, int incy) {
  ROOTCLAD_CBLAS(sgemv)(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, M, N, alpha, A, lda, x,
                        incx, beta, y, incy);
}
inline void blas_gemv(bool trans, int M, int N, double alpha, const double* A, int lda,
                      const double* x, int incx, double beta, double* y, int incy) {
  ROOTCLAD_CBLAS(dgemv)(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, M, N, alpha, A, lda, x,
                        incx, beta, y, incy);
}
inline void blas_ger(int M, int N, float alpha, const float* x, int incx, const float* y, int incy,
                     float* A, int lda) {
  ROOTCLAD_CBLAS(sger)(CblasRowMajor, M, N, alpha, x, incx, y, incy, A, lda);
}
inline void blas_ger(int M, int N, double alpha, const double* x, int incx, const double* y,
                     int incy, double* A, int lda) {
  ROOTCLAD_CBLAS(dger)(CblasRowMajor, M, N, alpha, x, incx, y, incy, A, lda);
}

#endif

#ifndef ROOTCLAD_NO_PULLBACKS
// A product with one row, one column or a depth of one (a Linear layer at batch 1) goes to
// GEMV or GER: OpenBLAS's GEMM packs the whole weight matrix first, which made batch-1
// Linear(2048, 256) about 3x slower than GEMV here (an ad-hoc timing).
template <typename T>
void blas_gemm(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
               int ldb, T beta, T* C, int ldc) {
  if (M == 1 && K > 1) // C(1,N) = a(1,K) op(B)(K,N): a is A's row (or column if ta)
    return blas_gemv(!tb, tb ? N : K, tb ? K : N, alpha, B, ldb, A, ta ? lda : 1, beta, C, 1);
  if (N == 1 && K > 1) // C(M,1) = op(A)(M,K) b(K,1)
    return blas_gemv(ta, ta ? K : M, ta ? M : K, alpha, A, lda, B, tb ? 1 : ldb, beta, C, ldc);
  if (K == 1 && beta == T(1)) // C(M,N) += a(M,1) b(1,N)
    return blas_ger(M, N, alpha, A, ta ? 1 : lda, B, tb ? ldb : 1, C, ldc);
  blas_gemm_only(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// A product outside any parallel section (a batch run in one chunk, e.g. an MLP at batch
// 64) is shared by rootclad's threads, each taking a block of rows or columns of C; OpenBLAS
// itself stays single-threaded (parallel.h). Below GEMM_SPLIT_MIN multiply-adds, waking a
// thread costs more than it saves.
constexpr double GEMM_SPLIT_MIN = 1 << 18;
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

#endif // ROOTCLAD_BLAS_H
