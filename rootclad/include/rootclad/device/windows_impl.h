// rootclad/device/windows_impl.h — the definitions of the device kernels device/windows.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_WINDOWS_IMPL_H
#define ROOTCLAD_DEVICE_WINDOWS_IMPL_H

#include "windows.h"

namespace rootclad {
namespace dev {

template <class On, class T>
void window_bias_forward(On on, T* out, const T* x, const T* table, long B, Win w) {
  const long n = w.per_sample();
  each_index(
      on, B * n, ROOTCLAD_BODY(long i) { out[i] = win_biased(w, x + i / n * n, table, i % n); });
}

template <class On, class T>
void window_bias_backward(On on, T* d_x, T* d_table, const T* d_out, long B, Win w) {
  const long n = w.per_sample();
  if (d_x)
    each_index(on, B * n, ROOTCLAD_BODY(long i) { d_x[i] += d_out[i]; });
  if (d_table)
    each_index(
        on, (long)w.table_rows() * w.heads, ROOTCLAD_BODY(long e) {
          T s = 0;
          for (long b = 0; b < B; ++b)
            s += win_table_grad(w, d_out + b * n, e);
          d_table[e] += s;
        });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_WINDOWS_IMPL_H
