// rootclad/ops/shape_impl.h — the definitions of the kernels shape.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_SHAPE_IMPL_H
#define ROOTCLAD_OPS_SHAPE_IMPL_H

#include "core.h"
#include "shape.h"
#include "topk_select.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// Output indices are computed, never counted with o++: Clad (differentiating these loops
// itself with pullbacks=False) mis-handles side effects in a subscript, and the heap was
// corrupted.
inline long permute_index(int b, int i0, int i1, int i2, int i3, int n0, int n1, int n2, int n3) {
  return ((((long)b * n0 + i0) * n1 + i1) * n2 + i2) * n3 + i3;
}

template <typename T>
void permute_forward(T* out, const T* inp, int B, int N, int n0, int n1, int n2, int n3, int s0,
                     int s1, int s2, int s3) {
  ROOTCLAD_REPLAY_SKIP;
  for (int b = 0; b < B; ++b)
    for (int i0 = 0; i0 < n0; ++i0)
      for (int i1 = 0; i1 < n1; ++i1)
        for (int i2 = 0; i2 < n2; ++i2)
          for (int i3 = 0; i3 < n3; ++i3)
            out[permute_index(b, i0, i1, i2, i3, n0, n1, n2, n3)] =
                inp[(long)b * N + (long)i0 * s0 + (long)i1 * s1 + (long)i2 * s2 + (long)i3 * s3];
}
template <typename T>
void permute_backward(T* d_inp, const T* d_out, int B, int N, int n0, int n1, int n2, int n3,
                      int s0, int s1, int s2, int s3) {
  for (int b = 0; b < B; ++b)
    for (int i0 = 0; i0 < n0; ++i0)
      for (int i1 = 0; i1 < n1; ++i1)
        for (int i2 = 0; i2 < n2; ++i2)
          for (int i3 = 0; i3 < n3; ++i3)
            d_inp[(long)b * N + (long)i0 * s0 + (long)i1 * s1 + (long)i2 * s2 + (long)i3 * s3] +=
                d_out[permute_index(b, i0, i1, i2, i3, n0, n1, n2, n3)];
}

template <typename T>
void cat_part_forward(T* out, const T* inp, int R, int n_in, int n_out, int off) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < n_in; ++j)
      out[(long)r * n_out + off + j] = inp[(long)r * n_in + j];
}
template <typename T>
void cat_part_backward(T* d_inp, const T* d_out, int R, int n_in, int n_out, int off) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < n_in; ++j)
      d_inp[(long)r * n_in + j] += d_out[(long)r * n_out + off + j];
}

inline long slice_source(int r, int m, int i, int N, int I, int start, int step) {
  return ((long)r * N + start + (long)m * step) * I + i;
}

template <typename T>
void slice_forward(T* out, const T* inp, int R, int N, int M, int I, int start, int step) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < I; ++i)
        out[((long)r * M + m) * I + i] = inp[slice_source(r, m, i, N, I, start, step)];
}
template <typename T>
void slice_backward(T* d_inp, const T* d_out, int R, int N, int M, int I, int start, int step) {
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < I; ++i)
        d_inp[slice_source(r, m, i, N, I, start, step)] += d_out[((long)r * M + m) * I + i];
}

template <typename T>
void pad_forward(T* out, const T* inp, int R, int M, int N, int I, int before, T value) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < I; ++i)
        out[((long)r * N + n) * I + i] = value;
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < I; ++i)
        out[((long)r * N + before + m) * I + i] = inp[((long)r * M + m) * I + i];
}
template <typename T>
void pad_backward(T* d_inp, const T* d_out, int R, int M, int N, int I, int before) {
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < I; ++i)
        d_inp[((long)r * M + m) * I + i] += d_out[((long)r * N + before + m) * I + i];
}

template <typename T> void parameter_forward(T* out, const T* w, int B, int n) {
  ROOTCLAD_REPLAY_SKIP;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < n; ++j)
      out[(long)b * n + j] = w[j];
}
template <typename T> void parameter_backward(T* d_w, const T* d_out, int B, int n) {
  if (!d_w) // frozen
    return;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < n; ++j)
      d_w[j] += d_out[(long)b * n + j];
}

inline long expand_source(int b, int i0, int i1, int i2, int n, int s0, int s1, int s2) {
  return (long)b * n + (long)i0 * s0 + (long)i1 * s1 + (long)i2 * s2;
}

template <typename T>
void expand_forward(T* out, const T* inp, int B, int n, int d0, int d1, int d2, int s0, int s1,
                    int s2) {
  ROOTCLAD_REPLAY_SKIP;
  for (int b = 0; b < B; ++b)
    for (int i0 = 0; i0 < d0; ++i0)
      for (int i1 = 0; i1 < d1; ++i1)
        for (int i2 = 0; i2 < d2; ++i2)
          out[(((long)b * d0 + i0) * d1 + i1) * d2 + i2] =
              inp[expand_source(b, i0, i1, i2, n, s0, s1, s2)];
}
template <typename T>
void expand_backward(T* d_inp, const T* d_out, int B, int n, int d0, int d1, int d2, int s0, int s1,
                     int s2) {
  for (int b = 0; b < B; ++b)
    for (int i0 = 0; i0 < d0; ++i0)
      for (int i1 = 0; i1 < d1; ++i1)
        for (int i2 = 0; i2 < d2; ++i2)
          d_inp[expand_source(b, i0, i1, i2, n, s0, s1, s2)] +=
              d_out[(((long)b * d0 + i0) * d1 + i1) * d2 + i2];
}

template <typename T>
void topk_forward(T* out, const T* x, int R, int N, int K, int Q, int largest) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < Q; ++q)
      topk_select(out + (long)r * K * Q + q, x + (long)r * N * Q + q, N, K, (long)Q, largest);
}

template <typename T> inline bool gather_ok(T v, int N) {
  return v >= T(0) && v < T(N);
}
inline long gather_source(int r, long v, int q, int N, int Q) {
  return ((long)r * N + v) * Q + q;
}

template <typename T>
void gather_forward(T* out, const T* x, const T* idx, int R, int N, int M, int Q) {
  ROOTCLAD_REPLAY_SKIP;
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m)
      for (int q = 0; q < Q; ++q) {
        const long o = ((long)r * M + m) * Q + q;
        const bool ok = gather_ok(idx[o], N);
        out[o] = ok ? x[gather_source(r, ok ? (long)idx[o] : 0, q, N, Q)] : T(NAN);
      }
}
template <typename T>
void gather_backward(T* d_x, const T* d_out, const T* idx, int R, int N, int M, int Q) {
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m)
      for (int q = 0; q < Q; ++q) {
        const long o = ((long)r * M + m) * Q + q;
        if (gather_ok(idx[o], N))
          d_x[gather_source(r, (long)idx[o], q, N, Q)] += d_out[o];
      }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_SHAPE_IMPL_H
