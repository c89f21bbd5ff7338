// rootclad/device/elementwise_impl.h — the definitions of the device kernels device/elementwise.h
// declares (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_ELEMENTWISE_IMPL_H
#define ROOTCLAD_DEVICE_ELEMENTWISE_IMPL_H

#include "elementwise.h"

namespace rootclad {
namespace dev {

template <class On, class T, class Op>
void unary_forward(On on, T* out, const T* inp, long n, Op op) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = op.f(inp[i]); });
}

template <class On, class T, class Op>
void unary_backward(On on, T* d_inp, const T* d_out, const T* inp, const T* out, long n, Op op) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_inp[i] += op.grad(d_out[i], inp[i], out[i]); });
}

template <class On, class T, class Op>
void parametric_forward(On on, T* out, const T* inp, const T* a, long B, int C, long S, int A,
                        Op op) {
  each_index(
      on, B * C * S, ROOTCLAD_BODY(long i) {
        const long c = (i / S) % C;
        out[i] = op.f(inp[i], a[A == 1 ? 0 : c]);
      });
}

template <class On, class T, class DY, class Op>
void parametric_backward_input(On on, T* d_inp, DY d_out, const T* inp, const T* out, const T* a,
                               long B, int C, long S, int A, Op op) {
  each_index(
      on, B * C * S, ROOTCLAD_BODY(long i) {
        const long c = (i / S) % C;
        d_inp[i] += op.grad(d_out[i], inp[i], out[i], a[A == 1 ? 0 : c]);
      });
}

template <class On, class T, class DY, class Op>
void parametric_backward_param(On on, T* d_a, DY d_out, const T* inp, const T* out, const T* a,
                               long B, int C, long S, int A, Op op) {
  const long chunks = batch_chunks(A, B);
  const long per = A == 1 ? (long)C * S : S; // values of one sample each parameter reads
  each_index(
      on, A * chunks, ROOTCLAD_BODY(long i) {
        const long p = i % A, chunk = i / A;
        T sum = 0;
        for (long b = B * chunk / chunks; b < B * (chunk + 1) / chunks; ++b)
          for (long k = 0; k < per; ++k) {
            const long j = A == 1 ? b * C * S + k : (b * C + p) * S + k;
            sum += op.param_grad(d_out[j], inp[j], out[j], a[p]);
          }
        add_to(d_a + p, sum);
      });
}

template <class On, class T>
void dropout_forward(On on, T* out, const T* inp, long n, T p, std::uint64_t seed) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = inp[i] * dropout_scale(seed, i, p); });
}

template <class On, class T>
void dropout_backward(On on, T* d_inp, const T* d_out, long n, T p, std::uint64_t seed) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_inp[i] += d_out[i] * dropout_scale(seed, i, p); });
}

template <class On, class T> void normal_forward(On on, T* out, long n, std::uint64_t seed) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = normal_draw<T>(seed, i); });
}

template <class On, class T>
void sample_dropout_forward(On on, T* out, const T* inp, long n, long per, T p, std::uint64_t seed,
                            int whole_batch) {
  each_index(
      on, n, ROOTCLAD_BODY(long i) {
        out[i] = inp[i] * dropout_scale(seed, whole_batch ? 0 : i / per, p);
      });
}

template <class On, class T>
void sample_dropout_backward(On on, T* d_inp, const T* d_out, long n, long per, T p,
                             std::uint64_t seed, int whole_batch) {
  each_index(
      on, n, ROOTCLAD_BODY(long i) {
        d_inp[i] += d_out[i] * dropout_scale(seed, whole_batch ? 0 : i / per, p);
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_ELEMENTWISE_IMPL_H
