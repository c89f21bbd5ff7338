// rootclad/device/distance_impl.h — the definitions of the device kernels device/distance.h
// declares (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_DISTANCE_IMPL_H
#define ROOTCLAD_DEVICE_DISTANCE_IMPL_H

#include "distance.h"

namespace rootclad {
namespace dev {

template <class On, class T>
void cdist_forward(On on, T* out, const T* a, const T* b, long B, int P, int R, int M) {
  each_index(
      on, B * P * R, ROOTCLAD_BODY(long i) {
        const long s = i / ((long)P * R);
        const T* x = a + (s * P + i / R % P) * M;
        const T* y = b + (s * R + i % R) * M;
        T acc = 0;
        for (int m = 0; m < M; ++m)
          acc += (x[m] - y[m]) * (x[m] - y[m]);
        out[i] = sqrt(acc);
      });
}

template <class On, class T>
void cdist_backward_a(On on, T* d_a, const T* d_out, const T* out, const T* a, const T* b, long B,
                      int P, int R, int M) {
  each_index(
      on, B * P * M, ROOTCLAD_BODY(long i) {
        const long s = i / ((long)P * M), row = i / M;
        const int m = (int)(i % M);
        T acc = 0;
        for (int r = 0; r < R; ++r) {
          const long o = row * R + r;
          if (out[o] != T(0))
            acc += d_out[o] / out[o] * (a[i] - b[(s * R + r) * M + m]);
        }
        d_a[i] += acc;
      });
}

template <class On, class T>
void cdist_backward_b(On on, T* d_b, const T* d_out, const T* out, const T* a, const T* b, long B,
                      int P, int R, int M) {
  each_index(
      on, B * R * M, ROOTCLAD_BODY(long i) {
        const long s = i / ((long)R * M);
        const int r = (int)(i / M % R), m = (int)(i % M);
        T acc = 0;
        for (int p = 0; p < P; ++p) {
          const long o = (s * P + p) * R + r;
          if (out[o] != T(0))
            acc += d_out[o] / out[o] * (a[(s * P + p) * M + m] - b[i]);
        }
        d_b[i] -= acc;
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_DISTANCE_IMPL_H
