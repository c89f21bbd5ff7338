// rootclad/ops/distance_impl.h — the definitions of the kernels distance.h declares (its comments
// say what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_DISTANCE_IMPL_H
#define ROOTCLAD_OPS_DISTANCE_IMPL_H

#include "core.h"
#include "distance.h"
#include <cmath>

namespace rootclad {

template <typename T>
void cdist_forward(T* out, const T* a, const T* b, int B, int P, int R, int M) {
  ROOTCLAD_REPLAY_SKIP;
  for (int s = 0; s < B; ++s)
    for (int p = 0; p < P; ++p)
      for (int r = 0; r < R; ++r) {
        const T* x = a + ((long)s * P + p) * M;
        const T* y = b + ((long)s * R + r) * M;
        T acc = 0;
        for (int m = 0; m < M; ++m)
          acc += (x[m] - y[m]) * (x[m] - y[m]);
        // 0 at 0, not sqrt(0): where Clad differentiates this loop (pullbacks=False), the
        // gradient there is 0 (torch's), not 0 * inf; a NaN stays NaN
        out[((long)s * P + p) * R + r] = acc == T(0) ? T(0) : std::sqrt(acc);
      }
}

template <typename T>
void cdist_backward(T* d_a, T* d_b, const T* d_out, const T* out, const T* a, const T* b, int B,
                    int P, int R, int M) {
  for (int s = 0; s < B; ++s)
    for (int p = 0; p < P; ++p)
      for (int r = 0; r < R; ++r) {
        const long o = ((long)s * P + p) * R + r;
        if (out[o] == T(0))
          continue;
        const T g = d_out[o] / out[o];
        const long ia = ((long)s * P + p) * M, ib = ((long)s * R + r) * M;
        for (int m = 0; m < M; ++m) {
          const T diff = a[ia + m] - b[ib + m];
          if (d_a)
            d_a[ia + m] += g * diff;
          if (d_b)
            d_b[ib + m] -= g * diff;
        }
      }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_DISTANCE_IMPL_H
