// rootclad/ops/volume.h — Conv3d, MaxPool3d and AvgPool3d on the CPU: volume_geometry.h's
// elements in loops (the pools' backward scatters into the input they took). Same contract as
// kernels.h: <op>_forward writes, <op>_backward adds. Their pullbacks stay when Clad
// differentiates the kernels themselves.
#ifndef ROOTCLAD_OPS_VOLUME_H
#define ROOTCLAD_OPS_VOLUME_H

#include "core.h"
#include "volume_geometry.h"

// The kernels' shape arguments, and their adjoints in a pullback
#define ROOTCLAD_VOL_ARGS                                                                          \
  int D, int H, int W, int OD, int OH, int OW, int KD, int KH, int KW, int SD, int SH, int SW,     \
      int PD, int PH, int PW, int DD, int DH, int DW
#define ROOTCLAD_VOL {D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW}
#define ROOTCLAD_VOL_DUMMIES                                                                       \
  int*, int*, int*, int*, int*, int*, int*, int*, int*, int*, int*, int*, int*, int*, int*, int*,  \
      int*, int*

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

// Clad-convention pullbacks (core.h says how they are written); kept when Clad differentiates
// the kernels themselves.
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void conv3d_forward_pullback(T* out, const T* inp, const T* w, const T* bias, int B, int C, int OC,
                             int G, ROOTCLAD_VOL_ARGS, T* d_out, T* d_inp, T* d_w, T* d_bias, int*,
                             int*, int*, int*, ROOTCLAD_VOL_DUMMIES) {
  ::rootclad::conv3d_backward(d_inp, d_w, d_bias, d_out, inp, w, B, C, OC, G, D, H, W, OD, OH, OW,
                              KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW);
}

template <typename T>
void maxpool3d_forward_pullback(T* out, const T* inp, int R, ROOTCLAD_VOL_ARGS, T* d_out, T* d_inp,
                                int*, ROOTCLAD_VOL_DUMMIES) {
  ::rootclad::maxpool3d_backward(d_inp, d_out, inp, R, D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW,
                                 PD, PH, PW, DD, DH, DW);
}

template <typename T>
void avgpool3d_forward_pullback(T* out, const T* inp, int R, int count_include_pad,
                                ROOTCLAD_VOL_ARGS, T* d_out, T* d_inp, int*, int*,
                                ROOTCLAD_VOL_DUMMIES) {
  ::rootclad::avgpool3d_backward(d_inp, d_out, R, count_include_pad, D, H, W, OD, OH, OW, KD, KH,
                                 KW, SD, SH, SW, PD, PH, PW, DD, DH, DW);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad

#endif // ROOTCLAD_OPS_VOLUME_H
