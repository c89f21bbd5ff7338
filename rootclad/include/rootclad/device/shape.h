// rootclad/device/shape.h — permute, cat, slice, pad, expand, topk's indices and gather as device
// kernels (device_kernels.h says how they are written).
#ifndef ROOTCLAD_DEVICE_SHAPE_H
#define ROOTCLAD_DEVICE_SHAPE_H

#include "../ops/topk_select.h"
#include "core.h"

namespace rootclad {
namespace dev {

// -- permute: per sample, out's element j = (j0..j3) over dims reads inp at sum j_k st[k] -------
struct Permute {
  int dims[4], st[4];
  long n; // values per sample
};

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

// a permutation: every input element is read once, so the scatter writes each place once
template <class On, class T>
void permute_backward(On on, T* d_inp, const T* d_out, long B, Permute g) {
  each_index(
      on, B * g.n,
      ROOTCLAD_BODY(long i) { d_inp[i / g.n * g.n + permute_source(g, i % g.n)] += d_out[i]; });
}

// -- cat: input part inp(R, n_in) goes to columns [off, off + n_in) of out(R, n_out) ----------
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

// -- slice: inp(R, N, I) -> out(R, M, I), out[r, m, i] = inp[r, start + m*step, i] ------------
struct Slice {
  int N, M, I, start, step;
};

inline ROOTCLAD_HD long slice_source(const Slice& g, long i) {
  const long r = i / ((long)g.M * g.I), m = i / g.I % g.M;
  return (r * g.N + g.start + m * g.step) * g.I + i % g.I;
}

template <class On, class T> void slice_forward(On on, T* out, const T* inp, long R, Slice g) {
  each_index(on, R * g.M * g.I, ROOTCLAD_BODY(long i) { out[i] = inp[slice_source(g, i)]; });
}

// distinct outputs read distinct inputs (step >= 1): the scatter writes each place once
template <class On, class T> void slice_backward(On on, T* d_inp, const T* d_out, long R, Slice g) {
  each_index(on, R * g.M * g.I, ROOTCLAD_BODY(long i) { d_inp[slice_source(g, i)] += d_out[i]; });
}

// -- pad: inp(R, M, I) -> out(R, N, I), out[r, before + m, i] = inp[r, m, i], value elsewhere --
struct Pad {
  int M, N, I, before;
};

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

// -- a parameter read directly: out(B, n) = w(n) per sample; its gradient sums over the batch
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

// -- expand: out(B, d0, d1, d2) reads inp at b*n + i0*s0 + i1*s1 + i2*s2 (stride 0 where an
// axis grows from 1); the backward adds each copy's gradient into its source through add_to
struct Expand {
  int d[3], s[3];
  long n; // input values per sample
};

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

// -- topk's indices: x(R, N, Q) -> out(R, K, Q), one thread per row (topk_select.h) ---------
template <class On, class T>
void topk_forward(On on, T* out, const T* x, long R, int N, int K, int Q, int largest) {
  each_index(
      on, R * Q, ROOTCLAD_BODY(long i) {
        const long r = i / Q, q = i % Q;
        topk_select(out + r * K * Q + q, x + r * N * Q + q, N, K, (long)Q, largest);
      });
}

// -- gather: x(R, N, Q), index / out(R, M, Q): out[r, m, q] = x[r, idx[r, m, q], q]; NaN for
// an index outside [0, N); the backward adds into the gathered places through add_to
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

#endif // ROOTCLAD_DEVICE_SHAPE_H
