// rootclad/conv2d.h — 2-D convolution (any stride, padding, dilation, groups) and 2-D pooling
// (included by kernels.h). Same contract as kernels.h: <op>_forward writes, <op>_backward adds.
//
// Conv2d over inp(B, C, H, W) -> out(B, OC, OH, OW) with weight(OC, C/G, KH, KW), G groups.
// Per sample and group, im2col then one GEMM:
//   cols(Cg*KH*KW, OH*OW)[(c*KH + kh)*KW + kw, oh*OW + ow] = inp[b, g*Cg + c, ih, iw],
//   ih = oh*SH - PH + kh*DH, iw = ow*SW - PW + kw*DW (0 outside the input);
//   out[b, g*OCg:(g+1)*OCg] = weight_g(OCg, Cg*KH*KW) @ cols + bias.
// cols is the op's scratch (C*KH*KW*OH*OW values per sample); in the backward its adjoint
// region holds d_cols = weight_g^T @ d_out, scattered back into d_inp. Conv1d with groups
// runs here too, as H = KH = 1. With ROOTCLAD_NO_PULLBACKS (Clad writes the whole backward)
// the forward is the convolution's definition as plain loops.
#pragma once

#include <cmath>

namespace rootclad {

struct Conv2dShape {
  int B, C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G;
  int OH() const { return (H + 2 * PH - DH * (KH - 1) - 1) / SH + 1; }
  int OW() const { return (W + 2 * PW - DW * (KW - 1) - 1) / SW + 1; }
  int Cg() const { return C / G; }
  int OCg() const { return OC / G; }
  int taps() const { return Cg() * KH * KW; } // rows of one group's cols
};

#ifdef ROOTCLAD_NO_PULLBACKS
template <typename T>
void conv2d_forward(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B, int C,
                    int H, int W, int OC, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                    int DW, int G) {
  ROOTCLAD_REPLAY_SKIP;
  const int OH = (H + 2 * PH - DH * (KH - 1) - 1) / SH + 1;
  const int OW = (W + 2 * PW - DW * (KW - 1) - 1) / SW + 1;
  const int Cg = C / G;
  const int OCg = OC / G;
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < OC; ++o)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          // one declarator per statement: Clad mis-differentiated "const int a = .., b = ..;"
          T s = bias ? bias[o] : T(0);
          int g = o / OCg;
          for (int c = 0; c < Cg; ++c)
            for (int kh = 0; kh < KH; ++kh)
              for (int kw = 0; kw < KW; ++kw) {
                int ih = oh * SH - PH + kh * DH;
                int iw = ow * SW - PW + kw * DW;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                  s += weight[((o * Cg + c) * KH + kh) * KW + kw] *
                       inp[(((long)b * C + g * Cg + c) * H + ih) * W + iw];
              }
          out[(((long)b * OC + o) * OH + oh) * OW + ow] = s;
        }
}
#else
// cols of sample b, group g (see the top of this file)
template <typename T> void conv2d_im2col(T* cols, const T* inp, const Conv2dShape& s, int g) {
  const int OH = s.OH(), OW = s.OW(), Cg = s.Cg();
  for (int c = 0; c < Cg; ++c)
    for (int kh = 0; kh < s.KH; ++kh)
      for (int kw = 0; kw < s.KW; ++kw) {
        T* row = cols + ((long)(c * s.KH + kh) * s.KW + kw) * OH * OW;
        const T* x = inp + (long)(g * Cg + c) * s.H * s.W;
        for (int oh = 0; oh < OH; ++oh) {
          const int ih = oh * s.SH - s.PH + kh * s.DH;
          for (int ow = 0; ow < OW; ++ow) {
            const int iw = ow * s.SW - s.PW + kw * s.DW;
            row[oh * OW + ow] =
                ih >= 0 && ih < s.H && iw >= 0 && iw < s.W ? x[(long)ih * s.W + iw] : T(0);
          }
        }
      }
}

// d_inp += the scatter of d_cols (the adjoint of conv2d_im2col)
template <typename T> void conv2d_col2im(T* d_inp, const T* d_cols, const Conv2dShape& s, int g) {
  const int OH = s.OH(), OW = s.OW(), Cg = s.Cg();
  for (int c = 0; c < Cg; ++c)
    for (int kh = 0; kh < s.KH; ++kh)
      for (int kw = 0; kw < s.KW; ++kw) {
        const T* row = d_cols + ((long)(c * s.KH + kh) * s.KW + kw) * OH * OW;
        T* dx = d_inp + (long)(g * Cg + c) * s.H * s.W;
        for (int oh = 0; oh < OH; ++oh) {
          const int ih = oh * s.SH - s.PH + kh * s.DH;
          if (ih < 0 || ih >= s.H)
            continue;
          for (int ow = 0; ow < OW; ++ow) {
            const int iw = ow * s.SW - s.PW + kw * s.DW;
            if (iw >= 0 && iw < s.W)
              dx[(long)ih * s.W + iw] += row[oh * OW + ow];
          }
        }
      }
}

template <typename T>
void conv2d_forward(T* out, T* cols, const T* inp, const T* weight, const T* bias, int B, int C,
                    int H, int W, int OC, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                    int DW, int G) {
  ROOTCLAD_REPLAY_SKIP;
  const Conv2dShape s{B, C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G};
  const int OHW = s.OH() * s.OW(), taps = s.taps(), OCg = s.OCg();
  const long cols_per_sample = (long)C * KH * KW * OHW;
  for (int b = 0; b < B; ++b) {
    const T* x = inp + (long)b * C * H * W;
    T* y = out + (long)b * OC * OHW;
    if (bias)
      for (int o = 0; o < OC; ++o)
        for (int i = 0; i < OHW; ++i)
          y[(long)o * OHW + i] = bias[o];
    for (int g = 0; g < G; ++g) {
      T* c = cols + b * cols_per_sample + (long)g * taps * OHW;
      conv2d_im2col(c, x, s, g);
      gemm(false, false, OCg, OHW, taps, T(1), weight + (long)g * OCg * taps, taps, c, OHW,
           bias ? T(1) : T(0), y + (long)g * OCg * OHW, OHW);
    }
  }
}

// d_weight_g += d_out_g @ cols^T;  d_bias += row sums of d_out;
// d_cols = weight_g^T @ d_out_g (in d_cols, the scratch's adjoint), scattered into d_inp.
// A null d_inp skips that half (the network input, when no input gradient is wanted).
template <typename T>
void conv2d_backward(T* d_inp, T* d_weight, T* d_bias, T* d_cols, const T* d_out, const T* cols,
                     const T* inp, const T* weight, int B, int C, int H, int W, int OC, int KH,
                     int KW, int SH, int SW, int PH, int PW, int DH, int DW, int G) {
  const Conv2dShape s{B, C, H, W, OC, KH, KW, SH, SW, PH, PW, DH, DW, G};
  const int OHW = s.OH() * s.OW(), taps = s.taps(), OCg = s.OCg();
  const long cols_per_sample = (long)C * KH * KW * OHW;
  for (int b = 0; b < B; ++b) {
    const T* dy = d_out + (long)b * OC * OHW;
    if (d_bias)
      for (int o = 0; o < OC; ++o)
        for (int i = 0; i < OHW; ++i)
          d_bias[o] += dy[(long)o * OHW + i];
    for (int g = 0; g < G; ++g) {
      const T* c = cols + b * cols_per_sample + (long)g * taps * OHW;
      const T* dyg = dy + (long)g * OCg * OHW;
      if (d_weight) // null: an input gradient alone was asked for
        gemm(false, true, OCg, taps, OHW, T(1), dyg, OHW, c, OHW, T(1),
             d_weight + (long)g * OCg * taps, taps);
      if (!d_inp)
        continue;
      T* dc = d_cols + b * cols_per_sample + (long)g * taps * OHW;
      gemm(true, false, taps, OHW, OCg, T(1), weight + (long)g * OCg * taps, taps, dyg, OHW, T(0),
           dc, OHW);
      conv2d_col2im(d_inp + (long)b * C * H * W, dc, s, g);
    }
  }
}
#endif

// ---------------------------------------------------------------------------------------
// 2-D pooling over inp(R, H, W) -> out(R, OH, OW), R = B*C; windows KH x KW, strides SH, SW,
// zero padding PH, PW (never more than half a window). MaxPool takes the first maximum in
// row-major window order (as torch does) and its backward finds it again; AvgPool divides by
// the window size, or with count_include_pad = 0 by its elements inside the input.
inline int pool2d_out(int n, int K, int S, int P) {
  return (n + 2 * P - K) / S + 1;
}

template <typename T>
void maxpool2d_forward(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH, int SW,
                       int PH, int PW) {
  ROOTCLAD_REPLAY_SKIP;
  const int OH = pool2d_out(H, KH, SH, PH);
  const int OW = pool2d_out(W, KW, SW, PW);
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        // with pullbacks=False Clad differentiates these loops: one declarator per statement
        // (Clad mis-differentiated "const int a = .., b = ..;")
        T m = -INFINITY;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W &&
                (inp[((long)r * H + ih) * W + iw] > m ||
                 std::isnan(inp[((long)r * H + ih) * W + iw]))) // NaN propagates, as in torch
              m = inp[((long)r * H + ih) * W + iw];
          }
        out[((long)r * OH + oh) * OW + ow] = m;
      }
}
template <typename T>
void maxpool2d_backward(T* d_inp, const T* d_out, const T* out, const T* inp, int R, int H, int W,
                        int KH, int KW, int SH, int SW, int PH, int PW) {
  const int OH = pool2d_out(H, KH, SH, PH);
  const int OW = pool2d_out(W, KW, SW, PW);
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        const long o = ((long)r * OH + oh) * OW + ow;
        const T m = out[o];
        // the first maximum, as torch; a NaN window's last NaN (torch's `v > max || isnan(v)`
        // lets each later NaN take over)
        long at = -1;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W)
              continue;
            const long i = ((long)r * H + ih) * W + iw;
            if (m != m ? inp[i] != inp[i] : (at < 0 && inp[i] == m))
              at = i;
          }
        if (at >= 0)
          d_inp[at] += d_out[o];
      }
}

template <typename T>
void avgpool2d_forward(T* out, const T* inp, int R, int H, int W, int KH, int KW, int SH, int SW,
                       int PH, int PW, int count_include_pad) {
  ROOTCLAD_REPLAY_SKIP;
  const int OH = pool2d_out(H, KH, SH, PH);
  const int OW = pool2d_out(W, KW, SW, PW);
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        T s = 0;
        int n = 0;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
              s += inp[((long)r * H + ih) * W + iw];
              ++n;
            }
          }
        const int div = count_include_pad ? KH * KW : n;
        out[((long)r * OH + oh) * OW + ow] = div > 0 ? s / div : T(0);
      }
}
template <typename T>
void avgpool2d_backward(T* d_inp, const T* d_out, int R, int H, int W, int KH, int KW, int SH,
                        int SW, int PH, int PW, int count_include_pad) {
  const int OH = pool2d_out(H, KH, SH, PH);
  const int OW = pool2d_out(W, KW, SW, PW);
  for (int r = 0; r < R; ++r)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        int n = 0;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            n += ih >= 0 && ih < H && iw >= 0 && iw < W;
          }
        const int div = count_include_pad ? KH * KW : n;
        if (div == 0)
          continue;
        const T g = d_out[((long)r * OH + oh) * OW + ow] / div;
        for (int kh = 0; kh < KH; ++kh)
          for (int kw = 0; kw < KW; ++kw) {
            const int ih = oh * SH - PH + kh;
            const int iw = ow * SW - PW + kw;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W)
              d_inp[((long)r * H + ih) * W + iw] += g;
          }
      }
}

} // namespace rootclad
