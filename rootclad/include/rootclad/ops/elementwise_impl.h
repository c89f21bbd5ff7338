// rootclad/ops/elementwise_impl.h — the definitions of the kernels elementwise.h declares (its
// comments say what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_ELEMENTWISE_IMPL_H
#define ROOTCLAD_OPS_ELEMENTWISE_IMPL_H

#include "../dropout_mask.h"
#include "activations.h"
#include "core.h"
#include "elementwise.h"

namespace rootclad {

template <typename T, class F> void unary_forward(T* out, const T* inp, int N, F f) {
  ROOTCLAD_REPLAY_SKIP;
  ROOTCLAD_SIMD
  for (int i = 0; i < N; ++i)
    out[i] = f.f(inp[i]);
}
template <typename T, class F>
void unary_backward(T* d_inp, const T* d_out, const T* inp, const T* out, int N, F f) {
  for (int i = 0; i < N; ++i)
    d_inp[i] += f.grad(d_out[i], inp[i], out[i]);
}

template <typename T, class F>
void parametric_forward(T* out, const T* inp, const T* a, int B, int C, int S, int A, F f) {
  ROOTCLAD_REPLAY_SKIP;
  const int stride = A == 1 ? 0 : 1; // a's stride over the channels
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int s = 0; s < S; ++s)
        out[((long)b * C + c) * S + s] = f.f(inp[((long)b * C + c) * S + s], a[c * stride]);
}
template <typename T, class F>
void parametric_backward(T* d_inp, T* d_a, const T* d_out, const T* inp, const T* out, const T* a,
                         int B, int C, int S, int A, F f) {
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) {
      const T ac = a[A == 1 ? 0 : c];
      const long at = ((long)b * C + c) * S;
      T sum = 0;
      for (int s = 0; s < S; ++s) {
        if (d_inp)
          d_inp[at + s] += f.grad(d_out[at + s], inp[at + s], out[at + s], ac);
        sum += f.param_grad(d_out[at + s], inp[at + s], out[at + s], ac);
      }
      if (d_a)
        d_a[A == 1 ? 0 : c] += sum;
    }
}

template <typename T>
void dropout_forward(T* out, const T* inp, int N, T p, std::uint64_t seed, long i0) {
  ROOTCLAD_REPLAY_SKIP;
  for (int i = 0; i < N; ++i)
    out[i] = inp[i] * dropout_scale(seed, i0 + i, p);
}
template <typename T>
void dropout_backward(T* d_inp, const T* d_out, int N, T p, std::uint64_t seed, long i0) {
  for (int i = 0; i < N; ++i)
    d_inp[i] += d_out[i] * dropout_scale(seed, i0 + i, p);
}

template <typename T>
void normal_forward(T* out, const T* inp, int N, std::uint64_t seed, long i0) {
  ROOTCLAD_REPLAY_SKIP;
  (void)inp;
  for (int i = 0; i < N; ++i)
    out[i] = normal_draw<T>(seed, i0 + i);
}

template <typename T>
void sample_dropout_forward(T* out, const T* inp, int R, int n, T p, std::uint64_t seed, long r0,
                            int whole_batch) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < n; ++j)
      out[(long)r * n + j] =
          inp[(long)r * n + j] * dropout_scale(seed, whole_batch ? 0 : r0 + r, p);
}
template <typename T>
void sample_dropout_backward(T* d_inp, const T* d_out, int R, int n, T p, std::uint64_t seed,
                             long r0, int whole_batch) {
  for (int r = 0; r < R; ++r) {
    const T s = dropout_scale(seed, whole_batch ? 0 : r0 + r, p);
    for (int j = 0; j < n; ++j)
      d_inp[(long)r * n + j] += d_out[(long)r * n + j] * s;
  }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_ELEMENTWISE_IMPL_H
