// rootclad/device/shape.h — permute, cat and slice as device kernels (device_kernels.h says how
// they are written).
#pragma once

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

} // namespace dev
} // namespace rootclad
