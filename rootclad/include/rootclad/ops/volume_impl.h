// rootclad/ops/volume_impl.h — the definitions of the kernels volume.h declares (its comments say
// what each computes); compiled once into the runtime library (runtime.cpp).
#ifndef ROOTCLAD_OPS_VOLUME_IMPL_H
#define ROOTCLAD_OPS_VOLUME_IMPL_H

#include "core.h"
#include "volume.h"
#include "volume_geometry.h"

namespace rootclad {

template <typename T>
void conv3d_forward(T* out, const T* inp, const T* w, const T* bias, int B, int C, int OC, int G,
                    ROOTCLAD_VOL_ARGS) {
  ROOTCLAD_REPLAY_SKIP;
  const Vol v ROOTCLAD_VOL;
  for (long i = 0; i < (long)B * OC * v.out_size(); ++i)
    out[i] = conv3d_at(v, C, OC, G, inp, w, bias, i);
}
template <typename T>
void conv3d_backward(T* d_inp, T* d_w, T* d_bias, const T* d_out, const T* inp, const T* w, int B,
                     int C, int OC, int G, ROOTCLAD_VOL_ARGS) {
  const Vol v ROOTCLAD_VOL;
  if (d_inp) // null: the network input, when no input gradient is wanted
    for (long i = 0; i < (long)B * C * v.in_size(); ++i)
      d_inp[i] += conv3d_dinp_at(v, C, OC, G, d_out, w, i);
  if (d_w) // null: frozen, or an input gradient alone
    for (long j = 0; j < (long)OC * (C / G) * v.taps(); ++j)
      d_w[j] += conv3d_dweight_at(v, B, C, OC, G, d_out, inp, j);
  if (d_bias)
    for (int o = 0; o < OC; ++o)
      d_bias[o] += conv3d_dbias_at(v, B, OC, d_out, o);
}

template <typename T> void maxpool3d_forward(T* out, const T* inp, int R, ROOTCLAD_VOL_ARGS) {
  ROOTCLAD_REPLAY_SKIP;
  const Vol v ROOTCLAD_VOL;
  for (long i = 0; i < (long)R * v.out_size(); ++i) {
    const long at = maxpool3d_arg(v, inp, i);
    out[i] = at >= 0 ? inp[at] : T(-INFINITY);
  }
}
template <typename T>
void maxpool3d_backward(T* d_inp, const T* d_out, const T* inp, int R, ROOTCLAD_VOL_ARGS) {
  const Vol v ROOTCLAD_VOL;
  for (long i = 0; i < (long)R * v.out_size(); ++i) {
    const long at = maxpool3d_arg(v, inp, i);
    if (at >= 0)
      d_inp[at] += d_out[i];
  }
}

template <typename T>
void avgpool3d_forward(T* out, const T* inp, int R, int count_include_pad, ROOTCLAD_VOL_ARGS) {
  ROOTCLAD_REPLAY_SKIP;
  const Vol v ROOTCLAD_VOL;
  for (long i = 0; i < (long)R * v.out_size(); ++i)
    out[i] = avgpool3d_at(v, inp, count_include_pad, i);
}
template <typename T>
void avgpool3d_backward(T* d_inp, const T* d_out, int R, int count_include_pad, ROOTCLAD_VOL_ARGS) {
  const Vol v ROOTCLAD_VOL;
  for (long i = 0; i < (long)R * v.out_size(); ++i) {
    const long p = i % v.out_size(), base = i / v.out_size() * v.in_size();
    const int div = avgpool3d_div(v, p, count_include_pad);
    for (long t = 0; div > 0 && t < v.taps(); ++t) {
      const long src = vol_source(v, p, t);
      if (src >= 0)
        d_inp[base + src] += d_out[i] / T(div);
    }
  }
}

} // namespace rootclad

#endif // ROOTCLAD_OPS_VOLUME_IMPL_H
