// rootclad/device/shape_impl.h — the definitions of the device kernels device/shape.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_SHAPE_IMPL_H
#define ROOTCLAD_DEVICE_SHAPE_IMPL_H

#include "shape.h"

namespace rootclad {
namespace dev {

inline ROOTCLAD_HD long permute_source(const Permute& g, long j) {
  long src = 0;
  for (int d = 3; d >= 0; --d) {
    src += (j % g.dims[d]) * g.st[d];
    j /= g.dims[d];
  }
  return src;
}

template <class On, class T> void permute_forward(On on, T* out, const T* inp, long B, Permute g) {
  each_index(
      on, B * g.n,
      ROOTCLAD_BODY(long i) { out[i] = inp[i / g.n * g.n + permute_source(g, i % g.n)]; });
}

template <class On, class T>
void permute_backward(On on, T* d_inp, const T* d_out, long B, Permute g) {
  each_index(
      on, B * g.n,
      ROOTCLAD_BODY(long i) { d_inp[i / g.n * g.n + permute_source(g, i % g.n)] += d_out[i]; });
}

template <class On, class T>
void cat_part_forward(On on, T* out, const T* inp, long R, int n_in, int n_out, int off) {
  each_index(
      on, R * n_in, ROOTCLAD_BODY(long i) { out[i / n_in * n_out + off + i % n_in] = inp[i]; });
}

template <class On, class T>
void cat_part_backward(On on, T* d_inp, const T* d_out, long R, int n_in, int n_out, int off) {
  each_index(
      on, R * n_in,
      ROOTCLAD_BODY(long i) { d_inp[i] += d_out[i / n_in * n_out + off + i % n_in]; });
}

inline ROOTCLAD_HD long slice_source(const Slice& g, long i) {
  const long r = i / ((long)g.M * g.I), m = i / g.I % g.M;
  return (r * g.N + g.start + m * g.step) * g.I + i % g.I;
}

template <class On, class T> void slice_forward(On on, T* out, const T* inp, long R, Slice g) {
  each_index(on, R * g.M * g.I, ROOTCLAD_BODY(long i) { out[i] = inp[slice_source(g, i)]; });
}

template <class On, class T> void slice_backward(On on, T* d_inp, const T* d_out, long R, Slice g) {
  each_index(on, R * g.M * g.I, ROOTCLAD_BODY(long i) { d_inp[slice_source(g, i)] += d_out[i]; });
}

template <class On, class T> void pad_forward(On on, T* out, const T* inp, long R, Pad g, T value) {
  each_index(
      on, R * g.N * g.I, ROOTCLAD_BODY(long i) {
        const long r = i / ((long)g.N * g.I), m = i / g.I % g.N - g.before;
        out[i] = (m >= 0 && m < g.M) ? inp[(r * g.M + m) * g.I + i % g.I] : value;
      });
}

template <class On, class T> void pad_backward(On on, T* d_inp, const T* d_out, long R, Pad g) {
  each_index(
      on, R * g.M * g.I, ROOTCLAD_BODY(long i) {
        const long r = i / ((long)g.M * g.I), m = i / g.I % g.M;
        d_inp[i] += d_out[(r * g.N + g.before + m) * g.I + i % g.I];
      });
}

template <class On, class T> void parameter_forward(On on, T* out, const T* w, long B, long n) {
  each_index(on, B * n, ROOTCLAD_BODY(long i) { out[i] = w[i % n]; });
}

template <class On, class T>
void parameter_backward(On on, T* d_w, const T* d_out, long B, long n) {
  each_index(
      on, n, ROOTCLAD_BODY(long j) {
        T s = 0;
        for (long b = 0; b < B; ++b)
          s += d_out[b * n + j];
        d_w[j] += s;
      });
}

inline ROOTCLAD_HD long expand_source(const Expand& g, long j) {
  const long per = (long)g.d[0] * g.d[1] * g.d[2];
  const long i2 = j % g.d[2], i1 = j / g.d[2] % g.d[1], i0 = j / ((long)g.d[1] * g.d[2]) % g.d[0];
  return j / per * g.n + i0 * g.s[0] + i1 * g.s[1] + i2 * g.s[2];
}

template <class On, class T> void expand_forward(On on, T* out, const T* inp, long B, Expand g) {
  each_index(
      on, B * g.d[0] * g.d[1] * g.d[2],
      ROOTCLAD_BODY(long j) { out[j] = inp[expand_source(g, j)]; });
}

template <class On, class T>
void expand_backward(On on, T* d_inp, const T* d_out, long B, Expand g) {
  each_index(
      on, B * g.d[0] * g.d[1] * g.d[2],
      ROOTCLAD_BODY(long j) { add_to(d_inp + expand_source(g, j), d_out[j]); });
}

template <class On, class T>
void topk_forward(On on, T* out, const T* x, long R, int N, int K, int Q, int largest) {
  each_index(
      on, R * Q, ROOTCLAD_BODY(long i) {
        const long r = i / Q, q = i % Q;
        topk_select(out + r * K * Q + q, x + r * N * Q + q, N, K, (long)Q, largest);
      });
}

template <class On, class T>
void gather_forward(On on, T* out, const T* x, const T* idx, long R, int N, int M, int Q) {
  each_index(
      on, R * M * Q, ROOTCLAD_BODY(long o) {
        const T v = idx[o];
        out[o] = v >= T(0) && v < T(N) ? x[(o / ((long)M * Q) * N + (long)v) * Q + o % Q] : T(NAN);
      });
}

template <class On, class T>
void gather_backward(On on, T* d_x, const T* d_out, const T* idx, long R, int N, int M, int Q) {
  each_index(
      on, R * M * Q, ROOTCLAD_BODY(long o) {
        const T v = idx[o];
        if (v >= T(0) && v < T(N))
          add_to(d_x + (o / ((long)M * Q) * N + (long)v) * Q + o % Q, d_out[o]);
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_SHAPE_IMPL_H
