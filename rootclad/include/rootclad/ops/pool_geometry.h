// rootclad/ops/pool_geometry.h — the windows of a pooling along one axis, as torch lays them
// out; shared by the CPU kernels (pool.h, conv2d.h) and the device's (device/pool.h).
#pragma once

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
