// rootclad/device.h — one kernel source for the CPU and for NVIDIA GPUs.
//
// A kernel is written once, as a body run for every index i of a range:
//
//   template <class On, class T> void relu_forward(On on, T* out, const T* in, long n) {
//     dev::each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = in[i] > T(0) ? in[i] : T(0); });
//   }
//
// `On` says where it runs. dev::Host runs the body in a plain loop over i: the indexing and
// arithmetic of every CUDA kernel then run, and are tested against torch, on machines without
// a GPU (tests/cuda/). Compiled by nvcc, dev::Cuda launches the body as a grid-stride kernel
// on a stream. Sums that many indices add into one place (a loss, a bias gradient) go
// through dev::add_to: atomicAdd on the GPU, a plain += on the host.
#ifndef ROOTCLAD_DEVICE_H
#define ROOTCLAD_DEVICE_H

#include "hd.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
// a lambda that nvcc compiles for the device too (needs nvcc --extended-lambda)
#define ROOTCLAD_BODY [=] __host__ __device__
#else
#define ROOTCLAD_BODY [=]
#endif

namespace rootclad {
namespace dev {

// Runs on the calling CPU thread, index after index.
struct Host {};

#if defined(ROOTCLAD_COUNT_LAUNCHES)
// Built with -DROOTCLAD_COUNT_LAUNCHES, the host counts the launches a GPU would make (each
// each_index over a non-empty range: one kernel launch).
inline long& launch_count() {
  static long n = 0;
  return n;
}
#endif

template <class Body> void each_index(Host, long n, Body body) {
#if defined(ROOTCLAD_COUNT_LAUNCHES)
  launch_count() += n > 0;
#endif
  for (long i = 0; i < n; ++i)
    body(i);
}

#if defined(__CUDACC__)
// Runs on the GPU, on `stream` (torch's current stream when called from Python).
struct Cuda {
  cudaStream_t stream = nullptr;
};

constexpr int BLOCK = 256;
// grid-stride: any n with a bounded grid; blocks beyond the GPU's resident ones only queue
constexpr long MAX_BLOCKS = 65535L * 8;

template <class Body> __global__ void each_index_kernel(Body body, long n) {
  const long stride = (long)gridDim.x * blockDim.x;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    body(i);
}

template <class Body> void each_index(Cuda on, long n, Body body) {
  if (n <= 0)
    return;
  long blocks = (n + BLOCK - 1) / BLOCK;
  if (blocks > MAX_BLOCKS)
    blocks = MAX_BLOCKS;
  each_index_kernel<<<(unsigned)blocks, BLOCK, 0, on.stream>>>(body, n);
}
#endif

// A cuBLAS call's failure (its cublasStatus_t), kept for launch_status (device_gemm.h).
inline int& blas_status() {
  static thread_local int status = 0;
  return status;
}
constexpr int BLAS_ERROR_BASE = 10000; // launch_status: BLAS_ERROR_BASE + a cuBLAS status

// What the launches so far left behind: 0, or (on the GPU) the CUDA error that a launch or an
// earlier kernel raised, or BLAS_ERROR_BASE + the status a cuBLAS call returned; error_text
// names it.
inline int launch_status(Host) {
  return 0;
}
#if defined(__CUDACC__)
inline int launch_status(Cuda) {
  const int cuda = (int)cudaGetLastError(); // read (and cleared) whatever cuBLAS says
  const int blas = blas_status();
  blas_status() = 0;
  return blas ? BLAS_ERROR_BASE + blas : cuda;
}
#endif
inline const char* error_text(int code) {
  if (code >= BLAS_ERROR_BASE)
    return "a cuBLAS call failed (the code is 10000 + its cublasStatus_t)";
#if defined(__CUDACC__)
  return cudaGetErrorString((cudaError_t)code);
#else
  return code ? "unknown error" : "no error";
#endif
}

// *p += v where several indices may add into *p at once
template <class T> ROOTCLAD_HD inline void add_to(T* p, T v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_H
