// rootclad/device/binary_impl.h — the definitions of the device kernels device/binary.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_BINARY_IMPL_H
#define ROOTCLAD_DEVICE_BINARY_IMPL_H

#include "binary.h"

namespace rootclad {
namespace dev {

template <class On, class T, class Act>
void add_forward(On on, T* out, const T* a, const T* b, long n, T sign, Act act) {
  each_index(on, n, ROOTCLAD_BODY(long i) { out[i] = act.f(a[i] + sign * b[i]); });
}

template <class On, class T, class DY> void add_backward(On on, T* d_x, DY d_out, long n, T scale) {
  each_index(on, n, ROOTCLAD_BODY(long i) { d_x[i] += scale * d_out[i]; });
}

template <class T> ROOTCLAD_HD inline T binary_value(int kind, T a, T b) {
  if (kind >= 4) // a mask (ops/binary.h): a where it keeps, else -inf (kinds 4, 5) or 0 (6, 7)
    return (b != T(0)) == (kind == 5 || kind == 6) ? a : kind < 6 ? -T(INFINITY) : T(0);
  return kind == 0 ? a + b : kind == 1 ? a - b : kind == 2 ? a * b : a / b;
}

// d (a op b) / d a (which = 0) or / d b (which = 1); a mask takes none
template <class T> ROOTCLAD_HD inline T binary_partial(int kind, int which, T a, T b) {
  if (kind >= 4)
    return !which && (b != T(0)) == (kind == 5 || kind == 6) ? T(1) : T(0);
  if (kind == 0)
    return T(1);
  if (kind == 1)
    return which ? T(-1) : T(1);
  if (kind == 2)
    return which ? a : b;
  return which ? -a / (b * b) : T(1) / b;
}

template <class On, class T, class Act>
void binary_forward(On on, T* out, const T* a, const T* b, long B, Broadcast g, int kind, Act act) {
  const long n = (long)g.dims[0] * g.dims[1] * g.dims[2];
  each_index(
      on, B * n, ROOTCLAD_BODY(long i) {
        const long s = i / n, j = i % n;
        const int j2 = (int)(j % g.dims[2]), j1 = (int)(j / g.dims[2] % g.dims[1]);
        const int j0 = (int)(j / ((long)g.dims[2] * g.dims[1]));
        const long ia = (long)j0 * g.sa[0] + (long)j1 * g.sa[1] + (long)j2 * g.sa[2];
        const long ib = (long)j0 * g.sb[0] + (long)j1 * g.sb[1] + (long)j2 * g.sb[2];
        out[i] = act.f(binary_value(kind, a[s * g.na + ia], b[s * g.nb + ib]));
      });
}

template <class On, class T, class DY>
void binary_backward(On on, T* d_x, DY d_out, const T* a, const T* b, long B, Broadcast g, int kind,
                     int which) {
  const long n = (long)g.dims[0] * g.dims[1] * g.dims[2];
  const long nx = which ? g.nb : g.na;
  each_index(
      on, B * nx, ROOTCLAD_BODY(long i) {
        const long s = i / nx, k = i % nx;
        const int* st = which ? g.sb : g.sa;
        int lo[3], hi[3];
        for (int d = 0; d < 3; ++d) {
          lo[d] = st[d] ? (int)(k / st[d] % g.dims[d]) : 0;
          hi[d] = st[d] ? lo[d] + 1 : g.dims[d];
        }
        T sum = 0;
        for (int j0 = lo[0]; j0 < hi[0]; ++j0)
          for (int j1 = lo[1]; j1 < hi[1]; ++j1)
            for (int j2 = lo[2]; j2 < hi[2]; ++j2) {
              const long j = ((long)j0 * g.dims[1] + j1) * g.dims[2] + j2;
              const long ia = (long)j0 * g.sa[0] + (long)j1 * g.sa[1] + (long)j2 * g.sa[2];
              const long ib = (long)j0 * g.sb[0] + (long)j1 * g.sb[1] + (long)j2 * g.sb[2];
              const T p = binary_partial(kind, which, a[s * g.na + ia], b[s * g.nb + ib]);
              if (kind < 4 || p != T(0)) // a mask's 0 stops what it masks, a NaN too
                sum += d_out[s * n + j] * p;
            }
        d_x[i] += sum;
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_BINARY_IMPL_H
