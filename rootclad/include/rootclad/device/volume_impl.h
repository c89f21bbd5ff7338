// rootclad/device/volume_impl.h — the definitions of the device kernels device/volume.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_VOLUME_IMPL_H
#define ROOTCLAD_DEVICE_VOLUME_IMPL_H

#include "volume.h"

namespace rootclad {
namespace dev {

template <class On, class T>
void conv3d_forward(On on, T* out, const T* inp, const T* w, const T* bias, long B, int C, int OC,
                    int G, Vol v) {
  each_index(
      on, B * OC * v.out_size(),
      ROOTCLAD_BODY(long i) { out[i] = conv3d_at(v, C, OC, G, inp, w, bias, i); });
}

template <class On, class T>
void conv3d_backward_input(On on, T* d_inp, const T* d_out, const T* w, long B, int C, int OC,
                           int G, Vol v) {
  each_index(
      on, B * C * v.in_size(),
      ROOTCLAD_BODY(long i) { d_inp[i] += conv3d_dinp_at(v, C, OC, G, d_out, w, i); });
}

template <class On, class T>
void conv3d_backward_params(On on, T* d_w, T* d_bias, const T* d_out, const T* inp, long B, int C,
                            int OC, int G, Vol v) {
  if (d_w)
    each_index(
        on, (long)OC * (C / G) * v.taps(),
        ROOTCLAD_BODY(long j) { d_w[j] += conv3d_dweight_at(v, (int)B, C, OC, G, d_out, inp, j); });
  if (d_bias)
    each_index(
        on, (long)OC,
        ROOTCLAD_BODY(long o) { d_bias[o] += conv3d_dbias_at(v, (int)B, OC, d_out, (int)o); });
}

template <class On, class T> void maxpool3d_forward(On on, T* out, const T* inp, long R, Vol v) {
  each_index(
      on, R * v.out_size(), ROOTCLAD_BODY(long i) {
        const long at = maxpool3d_arg(v, inp, i);
        out[i] = at >= 0 ? inp[at] : T(-INFINITY);
      });
}

template <class On, class T>
void maxpool3d_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, Vol v) {
  each_index(
      on, R * v.out_size(), ROOTCLAD_BODY(long i) {
        const long at = maxpool3d_arg(v, inp, i);
        if (at >= 0)
          add_to(d_inp + at, d_out[i]);
      });
}

template <class On, class T>
void avgpool3d_forward(On on, T* out, const T* inp, long R, int count_include_pad, Vol v) {
  each_index(
      on, R * v.out_size(),
      ROOTCLAD_BODY(long i) { out[i] = avgpool3d_at(v, inp, count_include_pad, i); });
}

template <class On, class T>
void avgpool3d_backward(On on, T* d_inp, const T* d_out, long R, int count_include_pad, Vol v) {
  each_index(
      on, R * v.out_size(), ROOTCLAD_BODY(long i) {
        const long p = i % v.out_size(), base = i / v.out_size() * v.in_size();
        const int div = avgpool3d_div(v, p, count_include_pad);
        for (long t = 0; div > 0 && t < v.taps(); ++t) {
          const long src = vol_source(v, p, t);
          if (src >= 0)
            add_to(d_inp + base + src, d_out[i] / T(div));
        }
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_VOLUME_IMPL_H
