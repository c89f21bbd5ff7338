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
//
// The kernels are compiled once per executor into the device runtime library
// (device_runtime.cpp); a model's device program (codegen/cuda.py) sees their declarations only
// (ROOTCLAD_DECLARATIONS_ONLY) and calls into the library, so the host compiler builds it, for
// the GPU too: dev::Cuda is declared without CUDA's headers, and ROOTCLAD_ON_CUDA says which
// executor a program runs on.
#ifndef ROOTCLAD_DEVICE_H
#define ROOTCLAD_DEVICE_H

#include "hd.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#else
// cuda_runtime.h's stream type (driver_types.h), for code that passes a stream on
typedef struct CUstream_st* cudaStream_t;
#endif

// A device program's C API: exported, the rest of the program hidden (-fvisibility=hidden)
#define ROOTCLAD_DEVICE_API extern "C" __attribute__((visibility("default")))

namespace rootclad {
namespace dev {

// Runs on the calling CPU thread, index after index.
struct Host {};

// Runs on the GPU, on `stream` (torch's current stream when called from Python).
struct Cuda {
  cudaStream_t stream = nullptr;
};

constexpr int BLAS_ERROR_BASE = 10000; // launch_status: BLAS_ERROR_BASE + a cuBLAS status

// What the launches so far left behind: 0, or (on the GPU) the CUDA error that a launch or an
// earlier kernel raised, or BLAS_ERROR_BASE + the status a cuBLAS call returned; error_text
// names it.
template <class On> int launch_status(On on);
template <class On> const char* error_text(On on, int code);

// The launches a GPU would make, counted on the host since the library was loaded (each
// each_index over a non-empty range: one kernel launch; a product: one cuBLAS call).
template <class On> long launch_count(On on);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include <atomic>

#if defined(__CUDACC__)
// a lambda that nvcc compiles for the device too (needs nvcc --extended-lambda)
#define ROOTCLAD_BODY [=] __host__ __device__
#else
#define ROOTCLAD_BODY [=]
#endif

namespace rootclad {
namespace dev {

inline std::atomic<long>& host_launches() {
  static std::atomic<long> n{0};
  return n;
}

template <class Body> void each_index(Host, long n, Body body) {
  if (n > 0)
    host_launches().fetch_add(1, std::memory_order_relaxed);
  for (long i = 0; i < n; ++i)
    body(i);
}

#if defined(__CUDACC__)
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

inline int status_of(Host) {
  return 0;
}
inline long launches_of(Host) {
  return host_launches().load(std::memory_order_relaxed);
}
inline const char* cuda_error_text(Host, int code) {
  return code ? "unknown error" : "no error";
}
#if defined(__CUDACC__)
inline int status_of(Cuda) {
  const int cuda = (int)cudaGetLastError(); // read (and cleared) whatever cuBLAS says
  const int blas = blas_status();
  blas_status() = 0;
  return blas ? BLAS_ERROR_BASE + blas : cuda;
}
inline const char* cuda_error_text(Cuda, int code) {
  return cudaGetErrorString((cudaError_t)code);
}
#endif

template <class On> int launch_status(On on) {
  return status_of(on);
}

template <class On> const char* error_text(On on, int code) {
  if (code >= BLAS_ERROR_BASE)
    return "a cuBLAS call failed (the code is 10000 + its cublasStatus_t)";
  return cuda_error_text(on, code);
}

template <class On> long launch_count(On on) {
  return launches_of(on);
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
#endif // ROOTCLAD_DECLARATIONS_ONLY

#endif // ROOTCLAD_DEVICE_H
