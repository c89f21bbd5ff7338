// The device kernels (rootclad/device_kernels.h) run on the CPU through dev::Host, behind a C
// API that tests/cuda/test_device_kernels.py loads with ctypes and checks against torch
// (1-D convolution and pooling as the 2-D kernels with H = 1, as the device programs call them).
#include <rootclad/device_kernels.h>

using rootclad::dev::Host;
namespace k = rootclad::dev;

// the convolution of the 13 ints (C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G)
static k::Conv conv_of(const int* g) {
  return k::conv2d_shape(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11],
                         g[12]);
}

#define ROOTCLAD_HOST_KERNELS(T, S)                                                                \
  extern "C" void linear_forward_##S(T* out, const T* x, const T* w, const T* b, int R, int C,     \
                                     int OC) {                                                     \
    k::linear_forward(Host{}, out, x, w, b, R, C, OC);                                             \
  }                                                                                                \
  extern "C" void linear_backward_##S(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w,    \
                                      int R, int C, int OC) {                                      \
    k::linear_backward_input(Host{}, dx, dy, w, R, C, OC);                                         \
    k::linear_backward_params(Host{}, dw, db, dy, x, R, C, OC);                                    \
  }                                                                                                \
  extern "C" void relu_forward_##S(T* out, const T* x, long n) {                                   \
    k::unary_forward(Host{}, out, x, n, rootclad::Relu{});                                         \
  }                                                                                                \
  extern "C" void relu_backward_##S(T* dx, const T* dy, const T* out, long n) {                    \
    k::unary_backward(Host{}, dx, dy, out, out, n, rootclad::Relu{});                              \
  }                                                                                                \
  extern "C" void conv1d_forward_##S(T* out, const T* x, const T* w, const T* b, int B, int C,     \
                                     int L, int OC, int K, int St, int P, int D) {                 \
    k::conv2d_forward(Host{}, out, x, w, b, B, k::conv1d_shape(C, L, OC, K, St, P, D));            \
  }                                                                                                \
  extern "C" void conv1d_backward_##S(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w,    \
                                      int B, int C, int L, int OC, int K, int St, int P, int D) {  \
    k::conv2d_backward_input(Host{}, dx, dy, w, B, k::conv1d_shape(C, L, OC, K, St, P, D));        \
    k::conv2d_backward_params(Host{}, dw, db, dy, x, B, k::conv1d_shape(C, L, OC, K, St, P, D));   \
  }                                                                                                \
  extern "C" void conv2d_##S(T* out, T* dx, T* dw, T* db, const T* dy, const T* x, const T* w,     \
                             const T* b, int B, const int* g, T* work) {                           \
    k::conv2d_forward(Host{}, out, x, w, b, B, conv_of(g), k::NoAct{}, work);                      \
    k::conv2d_backward(Host{}, dx, dw, db, dy, x, w, B, conv_of(g), work);                         \
  }                                                                                                \
  /* with a Tanh fused into the convolution: out = tanh(conv), dy is out's adjoint */              \
  extern "C" void conv2d_tanh_##S(T* out, T* dx, T* dw, T* db, T* dy, const T* x, const T* w,      \
                                  const T* b, int B, const int* g, T* work) {                      \
    k::conv2d_forward(Host{}, out, x, w, b, B, conv_of(g), rootclad::Tanh{}, work);                \
    k::conv2d_backward(Host{}, dx, dw, db, k::act_grad(dy, (const T*)out, rootclad::Tanh{}), x, w, \
                       B, conv_of(g), work);                                                       \
  }                                                                                                \
  extern "C" void pool2d_##S(T* out, T* dx, const T* dy, const T* x, long R, const int* g,         \
                             int avg, int count_include_pad) {                                     \
    const k::Pool p = k::pool2d_shape(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);             \
    if (avg) {                                                                                     \
      k::avgpool2d_forward(Host{}, out, x, R, p, count_include_pad);                               \
      k::avgpool2d_backward(Host{}, dx, dy, R, p, count_include_pad);                              \
    } else {                                                                                       \
      k::maxpool2d_forward(Host{}, out, x, R, p);                                                  \
      k::maxpool2d_backward(Host{}, dx, dy, x, R, p);                                              \
    }                                                                                              \
  }                                                                                                \
  extern "C" void maxpool1d_forward_##S(T* out, const T* x, long R, int L, int K, int St, int P) { \
    k::maxpool2d_forward(Host{}, out, x, R, k::pool2d_shape(1, L, 1, K, 1, St, 0, P));             \
  }                                                                                                \
  extern "C" void maxpool1d_backward_##S(T* dx, const T* dy, const T* x, long R, int L, int K,     \
                                         int St, int P) {                                          \
    k::maxpool2d_backward(Host{}, dx, dy, x, R, k::pool2d_shape(1, L, 1, K, 1, St, 0, P));         \
  }                                                                                                \
  extern "C" void bce_with_logits_##S(T* loss, T* dz, const T* z, const T* y, long n) {            \
    k::loss_and_gradient(Host{}, loss, dz, z, y, (const T*)nullptr, 1, n, T(1),                    \
                         k::BceWithLogits{});                                                      \
  }                                                                                                \
  extern "C" void gemm_##S(int ta, int tb, int M, int N, int K, double alpha, const T* A, int lda, \
                           const T* B, int ldb, double beta, T* C, int ldc) {                      \
    k::gemm(Host{}, ta != 0, tb != 0, M, N, K, T(alpha), A, lda, B, ldb, T(beta), C, ldc);         \
  }                                                                                                \
  extern "C" void optim_step_##S(T* p, const T* g, T* state, long n, const double* cfg, long t) {  \
    k::optim_step(Host{}, p, g, state, state + n, n,                                               \
                  *reinterpret_cast<const rootclad::OptimConfig*>(cfg), t);                        \
  }                                                                                                \
  extern "C" void optim_step_in_memory_##S(T* p, const T* g, T* state, long n, const double* cfg,  \
                                           long* t) {                                              \
    rootclad::OptimStep<T> constants;                                                              \
    k::optim_step_in_memory(Host{}, p, g, state, state + n, n,                                     \
                            reinterpret_cast<const rootclad::OptimConfig*>(cfg), t, &constants);   \
  }

extern "C" long conv_gemm_workspace(int B, const int* g) {
  return k::conv_gemm_workspace(B, conv_of(g));
}

ROOTCLAD_HOST_KERNELS(float, f32)
ROOTCLAD_HOST_KERNELS(double, f64)
