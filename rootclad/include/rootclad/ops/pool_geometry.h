// rootclad/ops/pool_geometry.h — the windows of a pooling along one axis, as torch lays them
// out; shared by the CPU kernels (pool.h, conv2d.h) and the device's (device/pool.h).
#ifndef ROOTCLAD_OPS_POOL_GEOMETRY_H
#define ROOTCLAD_OPS_POOL_GEOMETRY_H

#include <cmath>

#include "../hd.h"

namespace rootclad {

// The number of windows over n positions (window K, stride S, padding P on both sides). With
// ceil_mode the last window may run past the end, but it starts inside the input or its left
// padding (torch's rule: a window starting in the right padding is dropped).
ROOTCLAD_HD inline int pool_out(int n, int K, int S, int P, int ceil_mode) {
  int o = (n + 2 * P - K + (ceil_mode ? S - 1 : 0)) / S + 1;
  if (ceil_mode && (o - 1) * S >= n + P)
    --o;
  return o;
}

// The positions an average window starting at `start` (= o*S - P) divides by along one axis:
// with count_include_pad its positions up to the end of the right padding (a ceil_mode window
// reaching past that counts only up to it, as in torch), else those inside the input.
ROOTCLAD_HD inline int pool_span(int start, int K, int n, int P, int count_include_pad) {
  const int end = start + K < n + P ? start + K : n + P;
  if (count_include_pad)
    return end - start;
  return (end < n ? end : n) - (start > 0 ? start : 0);
}

// Adaptive pooling of n positions to O windows: window o covers [adaptive_start, adaptive_end)
// (torch's: floor(o n / O) to ceil((o + 1) n / O); windows overlap, or repeat a position when
// O > n).
ROOTCLAD_HD inline int adaptive_start(int o, int n, int O) {
  return (int)((long)o * n / O);
}
ROOTCLAD_HD inline int adaptive_end(int o, int n, int O) {
  return (int)(((long)(o + 1) * n + O - 1) / O);
}

} // namespace rootclad

namespace rootclad {

// Upsampling along one axis of n positions to O, as torch's kernels index it: output o reads
// positions i0 and i1 (i0 + 1, or i0 at the end), weighted 1 - l and l. mode 0: nearest (l = 0;
// i0 = floor(o * scale) in float, scale = float(n) / O or 1 / scale_factor); 1: linear with
// half-pixel centres (source (o + 0.5) scale - 0.5, at least 0); 2: linear with aligned corners
// (source o scale, scale = (n - 1) / (O - 1)); 3: nearest as torch's 1-d forward indexes it
// (floor(o * scale) in T, no shortcuts). `scale` is torch's, in the kernels' type T (torch
// computes in float for float tensors). O = n reads position o alone (but for mode 3).
template <typename T> ROOTCLAD_HD inline T upsample_source(int o, int mode, T scale) {
  const T src = mode == 2 ? scale * T(o) : scale * (T(o) + T(0.5)) - T(0.5);
  return src < T(0) ? T(0) : src;
}
template <typename T> ROOTCLAD_HD inline int upsample_i0(int o, int n, int O, int mode, T scale) {
  int i;
  if (mode == 3) {
    i = (int)(T(o) * scale); // >= 0: truncation is floor
    return i < n - 1 ? i : n - 1;
  }
  if (O == n)
    return o;
  if (mode == 0) {
    if (O == 2 * n)
      return o >> 1;
    i = (int)floorf((float)o * (float)scale);
  } else {
    i = (int)upsample_source(o, mode, scale); // a source >= 0: truncation is floor
  }
  return i < n - 1 ? i : n - 1;
}
template <typename T> ROOTCLAD_HD inline T upsample_lambda(int o, int n, int O, int mode, T scale) {
  if (mode == 0 || mode == 3 || O == n)
    return T(0);
  const T l = upsample_source(o, mode, scale) - T(upsample_i0(o, n, O, mode, scale));
  return l < T(0) ? T(0) : (l > T(1) ? T(1) : l);
}
ROOTCLAD_HD inline int upsample_i1(int i0, int n, int O, int mode) {
  return (mode == 1 || mode == 2) && O != n && i0 < n - 1 ? i0 + 1 : i0;
}

// torch.amax over a row x[0, L): the maximum, NaN where the row holds one (a NaN, once met,
// stays); its backward is torch's: each element equal to the maximum gets g over their count
// (a NaN row: none is equal, and every element gets 0 * (g / 0), NaN).
template <class T> ROOTCLAD_HD inline T amax_row(const T* x, int L) {
  T m = x[0];
  for (int l = 1; l < L; ++l)
    m = (x[l] > m || x[l] != x[l]) ? x[l] : m;
  return m;
}
template <class T> ROOTCLAD_HD inline void amax_row_backward(T* d_x, const T* x, int L, T g) {
  const T m = amax_row(x, L);
  int n = 0;
  for (int l = 0; l < L; ++l)
    n += x[l] == m;
  const T s = g / T(n);
  for (int l = 0; l < L; ++l)
    d_x[l] += (x[l] == m ? T(1) : T(0)) * s;
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_POOL_GEOMETRY_H
