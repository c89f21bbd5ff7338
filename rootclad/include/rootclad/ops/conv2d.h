// rootclad/ops/conv2d.h — 2-D convolution (any stride, padding, dilation, groups) and 2-D pooling
// (included by kernels.h). Same contract as kernels.h: <op>_forward writes, <op>_backward adds.
//
// Conv2d over inp(B, C, H, W) -> out(B, OC, OH, OW) with weight(OC, C/G, KH, KW), G groups.
// Per group, im2col then one GEMM:
//   cols(Cg*KH*KW, OH*OW)[(c*KH + kh)*KW + kw, oh*OW + ow] = inp[b, g*Cg + c, ih, iw],
//   ih = oh*SH - PH + kh*DH, iw = ow*SW - PW + kw*DW (0 outside the input);
//   out[b, g*OCg:(g+1)*OCg] = weight_g(OCg, Cg*KH*KW) @ cols + bias,
// per sample, or, for maps of fewer than 1024 outputs, over the samples of the chunk side by
// side (cols(taps, B*OH*OW): one product per group). cols is the op's scratch (C*KH*KW*OH*OW
// values per sample); in the backward its adjoint region holds d_cols = weight_g^T @ d_out,
// scattered back into d_inp. Pointwise layers (conv2d_pw: 1x1, stride 1, no padding, one
// group), stride 1 with few taps (conv2d_s1) and depthwise layers (conv2d_dw: one input channel
// per group) run without cols (conv2d_direct.h). Conv1d with groups runs here too, as
// H = KH = 1. With ROOTCLAD_NO_PULLBACKS (Clad writes the whole backward)
// the forward is the convolution's definition as plain loops.
#ifndef ROOTCLAD_OPS_CONV2D_H
#define ROOTCLAD_OPS_CONV2D_H

#include "core.h"

namespace rootclad {

template <typename T>
void conv2d_forward(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B, int C,
                    int H, int W, int OC, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                    int DW, int G);

// d_weight_g += d_out_g @ cols^T;  d_bias += row sums of d_out;
// d_cols = weight_g^T @ d_out_g (in d_cols, the scratch's adjoint), scattered into d_inp.
// A null d_inp skips that half (the network input, when no input gradient is wanted).
template <typename T>
void conv2d_backward(T* d_inp, T* d_weight, T* d_bias, T* d_cols, const T* d_out, const T* cols,
                     const T* inp, const T* weight, int B, int C, int H, int W, int OC, int KH,
                     int KW, int SH, int SW, int PH, int PW, int DH, int DW, int G);

// ---------------------------------------------------------------------------------------
// ConvTranspose2d over inp(B, C, H, W) -> out(B, OC, OH, OW) with weight(C, OC/G, KH, KW): the
// input gradient of the convolution s from (OC, OH, OW) to (C, H, W) with the same weight
// (OH = (H-1) SH - 2 PH + DH (KH-1) + output_padding + 1; the output padding only lengthens the
// output, which s maps back to H). Per sample and group: cols = weight_g^T @ inp_g, scattered
// by s's col2im (+ bias). Its backward is s's forward: cols' = im2col_s(d_out) (in d_cols),
// d_inp_g += weight_g @ cols', d_weight_g += inp_g @ cols'^T. ConvTranspose1d runs here as
// H = KH = 1. Its pullback stays when Clad differentiates the kernels themselves.
template <typename T>
void conv_transpose2d_forward(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B,
                              int C, int H, int W, int OC, int OH, int OW, int KH, int KW, int SH,
                              int SW, int PH, int PW, int DH, int DW, int G);

template <typename T>
void conv_transpose2d_backward(T* d_inp, T* d_weight, T* d_bias, T* d_cols, const T* d_out,
                               const T* inp, const T* weight, int B, int C, int H, int W, int OC,
                               int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW,
                               int DH, int DW, int G);

template <typename T>
void maxpool2d_forward(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH, int SW,
                       int PH, int PW, int ceil_mode);

template <typename T>
void maxpool2d_backward(T* d_inp, const T* d_out, const T* out, const T* inp, int R, int H, int W,
                        int KH, int KW, int SH, int SW, int PH, int PW, int ceil_mode);

template <typename T>
void avgpool2d_forward(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH, int SW,
                       int PH, int PW, int count_include_pad, int ceil_mode);

template <typename T>
void avgpool2d_backward(T* d_inp, const T* d_out, int R, int H, int W, int KH, int KW, int SH,
                        int SW, int PH, int PW, int count_include_pad, int ceil_mode);

} // namespace rootclad

// Clad-convention pullbacks (core.h says how they are written).
#ifndef ROOTCLAD_NO_PULLBACKS // Clad differentiates the kernels themselves
namespace clad {
namespace custom_derivatives {
namespace rootclad {

template <typename T>
void conv2d_forward_pullback(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B,
                             int C, int H, int W, int OC, int KH, int KW, int SH, int SW, int PH,
                             int PW, int DH, int DW, int G, T* d_out, T* d_cols, T* d_inp,
                             T* d_weight, T* d_bias, int*, int*, int*, int*, int*, int*, int*, int*,
                             int*, int*, int*, int*, int*, int*) {
  ::rootclad::conv2d_backward(::rootclad::wanted(d_inp), d_weight, bias ? d_bias : (T*)nullptr,
                              d_cols, d_out, cols, inp, weight, B, C, H, W, OC, KH, KW, SH, SW, PH,
                              PW, DH, DW, G);
}

template <typename T>
void maxpool2d_forward_pullback(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH,
                                int SW, int PH, int PW, int ceil, T* d_out, T* d_inp, int*, int*,
                                int*, int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::maxpool2d_backward(d_inp, d_out, out, inp, R, H, W, KH, KW, SH, SW, PH, PW, ceil);
}

template <typename T>
void avgpool2d_forward_pullback(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH,
                                int SW, int PH, int PW, int cip, int ceil, T* d_out, T* d_inp, int*,
                                int*, int*, int*, int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::avgpool2d_backward(d_inp, d_out, R, H, W, KH, KW, SH, SW, PH, PW, cip, ceil);
}

} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad
#endif

// ConvTranspose2d's pullback stays when Clad differentiates the kernels themselves (its
// forward is products, not loops Clad can take apart).
namespace clad {
namespace custom_derivatives {
namespace rootclad {
template <typename T>
void conv_transpose2d_forward_pullback(T* out, T* cols, const T* inp, const T* weight,
                                       const T* bias, int B, int C, int H, int W, int OC, int OH,
                                       int OW, int KH, int KW, int SH, int SW, int PH, int PW,
                                       int DH, int DW, int G, T* d_out, T* d_cols, T* d_inp,
                                       T* d_weight, T* d_bias, int*, int*, int*, int*, int*, int*,
                                       int*, int*, int*, int*, int*, int*, int*, int*, int*, int*) {
  ::rootclad::conv_transpose2d_backward(::rootclad::wanted(d_inp), d_weight,
                                        bias ? d_bias : (T*)nullptr, d_cols, d_out, inp, weight, B,
                                        C, H, W, OC, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, G);
}
} // namespace rootclad
} // namespace custom_derivatives
} // namespace clad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "conv2d_impl.h"
#endif

#endif // ROOTCLAD_OPS_CONV2D_H
