// rootclad/device_gemm.h — matrix products of the device programs: cuBLAS on the GPU.
//
// gemm() takes a row-major product, as blas.h does on the CPU, and turns it into the
// column-major call BLAS defines (C^T = op(B)^T op(A)^T: the operands swap). That call goes to
// cublasSgemm/cublasDgemm on the GPU, and on the host to colmajor_gemm's loops, which follow
// BLAS's definition of gemm; so the host tests check the very arguments cuBLAS gets.
// gemm_batched() likewise: many products at fixed strides, one cublas{S,D}gemmStridedBatched.
//
// cuBLAS's own header is used where the compiler finds it (the CUDA toolkit's, or the
// nvidia-cublas wheel's include directory); otherwise the six entry points used here are
// declared below, as cublas_api.h declares them (the library is linked by path at build time).
#ifndef ROOTCLAD_DEVICE_GEMM_H
#define ROOTCLAD_DEVICE_GEMM_H

#include "device.h"

#if defined(__CUDACC__)
#if __has_include(<cublas_v2.h>)
#include <cublas_v2.h>
#else
extern "C" {
typedef struct cublasContext* cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc);
cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const double* alpha,
                              const double* A, int lda, const double* B, int ldb,
                              const double* beta, double* C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb,
                                         long long int strideB, const float* beta, float* C,
                                         int ldc, long long int strideC, int batchCount);
cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const double* alpha, const double* A, int lda,
                                         long long int strideA, const double* B, int ldb,
                                         long long int strideB, const double* beta, double* C,
                                         int ldc, long long int strideC, int batchCount);
}
#endif
#endif

namespace rootclad {
namespace dev {

// C(m, n) = alpha op(A) op(B) + beta C, column-major as BLAS's gemm (op(A): m x k, element
// (i, l) at A[i + l lda], or A[l + i lda] transposed); beta = 0 ignores C's old values.
template <class T>
void colmajor_gemm(Host on, int ta, int tb, int m, int n, int k, T alpha, const T* A, int lda,
                   const T* B, int ldb, T beta, T* C, int ldc) {
  each_index(on, (long)m * n, [=](long e) {
    const int i = (int)(e % m), j = (int)(e / m);
    T s = 0;
    for (int l = 0; l < k; ++l)
      s += (ta ? A[l + (long)i * lda] : A[i + (long)l * lda]) *
           (tb ? B[j + (long)l * ldb] : B[l + (long)j * ldb]);
    T& c = C[i + (long)j * ldc];
    c = alpha * s + (beta == T(0) ? T(0) : beta * c);
  });
}

// count products as colmajor_gemm's, product t reading A + t sA and B + t sB and writing
// C + t sC (cuBLAS's gemmStridedBatched)
template <class T>
void colmajor_gemm_batched(Host on, int ta, int tb, int m, int n, int k, T alpha, const T* A,
                           int lda, long sA, const T* B, int ldb, long sB, T beta, T* C, int ldc,
                           long sC, int count) {
  const long mn = (long)m * n;
  each_index(on, count * mn, [=](long e) {
    const long t = e / mn;
    const int i = (int)(e % mn % m), j = (int)(e % mn / m);
    const T *a = A + t * sA, *b = B + t * sB;
    T s = 0;
    for (int l = 0; l < k; ++l)
      s += (ta ? a[l + (long)i * lda] : a[i + (long)l * lda]) *
           (tb ? b[j + (long)l * ldb] : b[l + (long)j * ldb]);
    T& c = C[t * sC + i + (long)j * ldc];
    c = alpha * s + (beta == T(0) ? T(0) : beta * c);
  });
}

#if defined(__CUDACC__)
// One handle per host thread and GPU (cuBLAS handles are not to be shared between threads),
// bound to the call's stream; kept for the thread's life.
inline cublasHandle_t blas_handle(cudaStream_t stream) {
  static thread_local cublasHandle_t handles[64] = {};
  int device = 0;
  cudaGetDevice(&device);
  cublasHandle_t& h = handles[device & 63];
  if (!h) {
    const int status = (int)cublasCreate_v2(&h);
    if (status) {
      blas_status() = status;
      h = nullptr;
      return nullptr;
    }
  }
  const int status = (int)cublasSetStream_v2(h, stream);
  if (status)
    blas_status() = status;
  return h;
}

inline cublasStatus_t blas_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                int n, int k, const float* alpha, const float* A, int lda,
                                const float* B, int ldb, const float* beta, float* C, int ldc) {
  return cublasSgemm_v2(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline cublasStatus_t blas_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                int n, int k, const double* alpha, const double* A, int lda,
                                const double* B, int ldb, const double* beta, double* C, int ldc) {
  return cublasDgemm_v2(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void colmajor_gemm(Cuda on, int ta, int tb, int m, int n, int k, T alpha, const T* A, int lda,
                   const T* B, int ldb, T beta, T* C, int ldc) {
  cublasHandle_t h = blas_handle(on.stream);
  if (!h)
    return;
  const int status =
      (int)blas_gemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                     &alpha, A, lda, B, ldb, &beta, C, ldc);
  if (status)
    blas_status() = status;
}

inline cublasStatus_t blas_gemm_batched(cublasHandle_t h, cublasOperation_t ta,
                                        cublasOperation_t tb, int m, int n, int k,
                                        const float* alpha, const float* A, int lda, long sA,
                                        const float* B, int ldb, long sB, const float* beta,
                                        float* C, int ldc, long sC, int count) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc,
                                   sC, count);
}
inline cublasStatus_t blas_gemm_batched(cublasHandle_t h, cublasOperation_t ta,
                                        cublasOperation_t tb, int m, int n, int k,
                                        const double* alpha, const double* A, int lda, long sA,
                                        const double* B, int ldb, long sB, const double* beta,
                                        double* C, int ldc, long sC, int count) {
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc,
                                   sC, count);
}

template <class T>
void colmajor_gemm_batched(Cuda on, int ta, int tb, int m, int n, int k, T alpha, const T* A,
                           int lda, long sA, const T* B, int ldb, long sB, T beta, T* C, int ldc,
                           long sC, int count) {
  cublasHandle_t h = blas_handle(on.stream);
  if (!h)
    return;
  const int status =
      (int)blas_gemm_batched(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m,
                             n, k, &alpha, A, lda, sA, B, ldb, sB, &beta, C, ldc, sC, count);
  if (status)
    blas_status() = status;
}
#endif

// Row-major C(M, N) = alpha op(A) op(B) + beta C (op(A): M x K), as blas.h's gemm on the CPU.
template <class On, class T>
void gemm(On on, bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc) {
  colmajor_gemm(on, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
}

// count row-major products as gemm's, product t at A + t sA, B + t sB and C + t sC
template <class On, class T>
void gemm_batched(On on, bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda,
                  long sA, const T* B, int ldb, long sB, T beta, T* C, int ldc, long sC,
                  int count) {
  colmajor_gemm_batched(on, tb, ta, N, M, K, alpha, B, ldb, sB, A, lda, sA, beta, C, ldc, sC,
                        count);
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_GEMM_H
