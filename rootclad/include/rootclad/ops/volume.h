// rootclad/ops/volume.h — Conv3d, MaxPool3d and AvgPool3d on the CPU: volume_geometry.h's
// elements in loops (the pools' backward scatters into the input they took). Same contract as
// kernels.h: <op>_forward writes, <op>_backward adds. Their pullbacks stay when Clad
// differentiates the kernels themselves.
#ifndef ROOTCLAD_OPS_VOLUME_H
#define ROOTCLAD_OPS_VOLUME_H

#include "core.h"

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
                    ROOTCLAD_VOL_ARGS);

template <typename T>
void conv3d_backward(T* d_inp, T* d_w, T* d_bias, const T* d_out, const T* inp, const T* w, int B,
                     int C, int OC, int G, ROOTCLAD_VOL_ARGS);

template <typename T> void maxpool3d_forward(T* out, const T* inp, int R, ROOTCLAD_VOL_ARGS);

template <typename T>
void maxpool3d_backward(T* d_inp, const T* d_out, const T* inp, int R, ROOTCLAD_VOL_ARGS);

template <typename T>
void avgpool3d_forward(T* out, const T* inp, int R, int count_include_pad, ROOTCLAD_VOL_ARGS);

template <typename T>
void avgpool3d_backward(T* d_inp, const T* d_out, int R, int count_include_pad, ROOTCLAD_VOL_ARGS);

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

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "volume_impl.h"
#endif

#endif // ROOTCLAD_OPS_VOLUME_H
